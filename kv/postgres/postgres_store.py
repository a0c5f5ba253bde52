"""``PostgresStore``: its options and state, the schema record (``setup``: the
table created, or checked), read and write transactions opened and closed, and
maintenance. Its connections (connections.py) and ``transact`` with its group
commit (transact.py, on ``kv.group_commit``'s queue) are base classes of their
own, to keep modules small.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from ..group_commit import CommitQueue
from ..store import CorruptStoreError, FormatVersionError, KVError, ReadOnlyError, Store
from .cache import _Cache
from .connections import _close_pool, _Connections, _Lingering
from .driver import _IDLE, _psycopg
from .errors import _translate
from .statements import FORMAT_VERSION, _Queries, _VectorQueries, vectors_table
from .transact import POLL_SECONDS, _GroupCommit
from .txn import _PGTxn

_MARK = "kvsaver.kv PostgresStore format "


def is_postgres_url(value: object) -> bool:
    """True for a ``postgresql://`` or ``postgres://`` connection URL."""
    return isinstance(value, str) and value.startswith(("postgresql://", "postgres://"))


class _ReadContext:
    __slots__ = ("_store", "_txn")

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    def __enter__(self) -> _PGTxn:
        self._txn = self._store._open_txn(write=False)
        return self._txn

    def __exit__(self, *exc: object) -> None:
        self._store._close_txn(self._txn, commit=False)


class _WriteContext:
    __slots__ = ("_store", "_txn")

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    def __enter__(self) -> _PGTxn:
        store = self._store
        store._enter_writer()
        try:
            self._txn = store._open_txn(write=True)
        except BaseException:
            store._leave_writer()
            raise
        return self._txn

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        try:
            self._store._close_txn(self._txn, commit=exc_type is None)
        finally:
            self._store._leave_writer()


class PostgresStore(_Connections, _GroupCommit, Store):
    """An ordered ``Store`` in one PostgreSQL table, shared by every process
    and machine that opens it. ``pipelines_reads``: a scan's first chunk is
    queued until the next round trip; ``write_conflicts``: a write transaction
    can fail on a conflict with another writer (see ``kv.store``).

    Args:
        conninfo_or_pool: a connection string or URL (``postgresql://...``), or
            a ``psycopg_pool.ConnectionPool`` (not closed by ``close()``; its
            connections are switched to autocommit, transactions are explicit).
        table: the table's name (``"name"`` or ``"schema.name"``).
        readonly: every write raises ``ReadOnlyError``; the table is not created.
        min_size, max_size: the pool's size (when a conninfo is given).
        connect_timeout: seconds to wait for a new connection.
        statement_timeout: seconds a statement may run (0: no limit).
        pool_timeout: seconds to wait for a free pooled connection. Until the
            store's first connection, a server the pool fails to reach is
            not waited for: the first use raises StoreUnavailableError with
            the server's reason (refused, no such database, authentication).
        retries: how many times ``transact`` reruns a function after a conflict
            or a lost connection before raising.
        speculate: ``transact`` answers a function's first reads from a cache
            of committed values and verifies them in the round trip that
            commits (a put in one round trip; see ``transact``). False: every
            read goes to the server.
        prepare: a write-only transaction's statement is a server-side
            prepared statement (planned once per connection). False where
            sessions are shared between clients (PgBouncer in transaction
            mode), where a prepared statement would not be found again.
        pool_options: more ``psycopg_pool.ConnectionPool`` keyword arguments.
    """

    pipelines_reads = True
    write_conflicts = True

    def __init__(
        self,
        conninfo_or_pool: Any,
        *,
        table: str = "kv_store",
        readonly: bool = False,
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout: float = 10.0,
        statement_timeout: float = 30.0,
        pool_timeout: float = 30.0,
        retries: int = 10,
        speculate: bool = True,
        prepare: bool = True,
        pool_options: dict[str, Any] | None = None,
    ) -> None:
        _psycopg()
        from psycopg_pool import ConnectionPool

        self.readonly = readonly
        self.table = table
        self.retries = retries
        self.speculate = speculate
        self.prepare = prepare
        self._q = _Queries(table)
        self._advisory = f"kvsaver.kv:{table}"  # setup's advisory lock, and the vectors'
        self._vq: _VectorQueries | None = None  # open_vectors
        self._begin_write = "BEGIN ISOLATION LEVEL SERIALIZABLE"
        self._begin_read = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
        self._closed = False
        self._ready = False
        self._connected = False  # a pooled connection was set up once (_wait_for_connection)
        self._asked_at = -1e9  # _unreachable's last attempt of its own, and its reason
        self._reason: str | None = None
        self._setup_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._writer: int | None = None
        # transact's group commit (see transact): a leader takes every call
        # queued, waiting for none (a commit is a network round trip)
        self._commits = CommitQueue(poll_seconds=POLL_SECONDS, gathers=False)
        self._statements = 0  # statements sent (tests count round trips with these)
        self._cache = _Cache()
        self._adapted: weakref.WeakSet[Any] = weakref.WeakSet()
        self._misses = 0.0  # moving average of failed speculations
        self.speculations = [0, 0]  # transact calls that speculated: [held, failed]
        self._round_trips = 0
        self._pid = os.getpid()
        self.pool_timeout = pool_timeout
        # Connections whose sessions are SERIALIZABLE by default (our own
        # pool's, checked once each): a write-only transaction has no BEGIN
        # and COMMIT (its statements are one implicit transaction).
        self._serializable: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
        if isinstance(conninfo_or_pool, ConnectionPool):
            self._owns_pool = False
            self._pool = conninfo_or_pool
            self._make_pool: Callable[[], Any] | None = None
            self.conninfo = conninfo_or_pool.conninfo
        elif isinstance(conninfo_or_pool, str):
            self._owns_pool = True
            self.conninfo = conninfo_or_pool
            ms = int(statement_timeout * 1000)
            # SERIALIZABLE by default in our own sessions: a write-only
            # transaction then needs no BEGIN and COMMIT around it.
            kwargs = {
                "autocommit": True,
                "connect_timeout": max(2, int(connect_timeout)),
                "options": f"-c statement_timeout={ms} "
                "-c default_transaction_isolation=serializable",
            }
            options: dict[str, Any] = {
                "min_size": min_size,
                "max_size": max_size,
                "timeout": pool_timeout,
            }
            options.update(pool_options or {})

            def make() -> Any:
                return ConnectionPool(
                    conninfo_or_pool,
                    kwargs=kwargs,
                    open=True,
                    name=f"kvsaver-{table}",
                    **options,
                )

            self._make_pool = make
            self._pool = make()
        else:
            raise TypeError(
                "PostgresStore takes a connection string (postgresql://...) or a "
                f"psycopg_pool.ConnectionPool, got {type(conninfo_or_pool).__name__}"
            )
        self._lingering = _Lingering(self._pool)  # see _close_txn
        # A pool passed in may have failed before: only its failures from
        # here on say that this store cannot connect (_unreachable).
        self._errors_before = 0 if self._owns_pool else self._pool_errors()
        if self._owns_pool:
            self._finalizer = weakref.finalize(self, _close_pool, self._pool, self._pid)

    # -- transactions -------------------------------------------------------
    def _open_txn(self, write: bool) -> _PGTxn:
        self._check_open()
        self.setup()
        conn, holds_snapshot = self._connection()
        txn = _PGTxn(self, conn, write)
        txn._pre_rollback = holds_snapshot
        return txn

    def _close_txn(self, txn: _PGTxn, commit: bool) -> None:
        # A connection that went well lingers for this store's next
        # transaction (or the reaper, after _LINGER seconds) instead of going
        # back to the pool: a read leaves its ROLLBACK to that transaction's
        # first round trip (one round trip less per read). So does a write's
        # (its session idle), on the store's own pool: the pool's getconn and
        # putconn, a noticeable part of a put's client CPU, are skipped; a
        # pool passed in, perhaps shared, gets it back at once.
        if not txn._write and not txn.lost and txn.failed is None and not txn._queue:
            txn._open = False
            self._lingering.add(txn._conn, txn._begun or txn._pre_rollback)
            return
        try:
            txn.finish(commit)
        except BaseException:
            self._putconn(txn._conn, txn.lost)
            raise
        conn = txn._conn
        if (
            not self._owns_pool
            or txn.lost
            or txn.failed is not None
            or conn.pgconn.transaction_status != _IDLE
        ):
            self._putconn(conn, txn.lost)
        else:
            self._lingering.add(conn, False)
        if txn._write and commit:  # committed: what it read and wrote is the latest we know
            self._cache.learn(txn._known, txn._ranges)

    def _enter_writer(self) -> None:
        self._check_open()
        if self.readonly:
            raise ReadOnlyError(f"{self!r} was opened read-only")
        me = threading.get_ident()
        if self._writer == me:
            raise RuntimeError("a write transaction is already open in this thread")
        self._write_lock.acquire()
        self._writer = me

    def _leave_writer(self) -> None:
        self._writer = None
        self._write_lock.release()

    # -- setup --------------------------------------------------------------------
    def setup(self) -> None:
        """Create the table (and its schema record) if it does not exist;
        check the record if it does. Idempotent; called on first use."""
        if self._ready:
            return
        with self._setup_lock:
            if self._ready:
                return
            self._check_open()
            conn = self._getconn()
            lost = True
            try:
                self._setup_on(conn)
                lost = False
            except KVError:
                lost = bool(conn.broken)
                raise
            except Exception as e:
                raise _translate(e, f"setup of table {self.table!r}") from e
            finally:
                if conn.pgconn.transaction_status != 0 and not conn.closed:  # not idle
                    try:
                        conn.execute("ROLLBACK")
                    except Exception:
                        lost = True
                self._putconn(conn, lost)
            self._ready = True

    def _setup_on(self, conn: Any) -> None:
        from psycopg import sql

        name = self._q.ident.as_string(conn)
        marker = f"{_MARK}{FORMAT_VERSION}"
        with conn.transaction():
            if not self.readonly:
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self._advisory,))
            row = conn.execute(
                "SELECT obj_description(c.oid, 'pg_class'), true FROM pg_class c "
                "WHERE c.oid = to_regclass(%s)",
                (name,),
            ).fetchone()
            if row is None:
                if self.readonly:
                    raise CorruptStoreError(
                        f"table {self.table!r} does not exist; open the store writable once "
                        "to create it"
                    )
                conn.execute(self._q.create)
                conn.execute(
                    sql.SQL("COMMENT ON TABLE {} IS {}").format(self._q.ident, sql.Literal(marker))
                )
                return
            comment = row[0] or ""
            if not comment.startswith(_MARK):
                raise CorruptStoreError(
                    f"table {self.table!r} exists but is not a kvsaver store (its comment, the "
                    f"schema record, is {comment!r})"
                )
            try:
                version = int(comment[len(_MARK) :])
            except ValueError:
                raise CorruptStoreError(
                    f"table {self.table!r} has a damaged schema record {comment!r}"
                ) from None
            if version > FORMAT_VERSION:
                raise FormatVersionError(
                    f"table {self.table!r} was written by PostgresStore format {version}; "
                    f"this version reads format {FORMAT_VERSION} and older. Upgrade kvsaver."
                )

    # -- vectors (SupportsVectors) ---------------------------------------------------
    def open_vectors(
        self,
        dims: int,
        hnsw: dict[str, int] | None = None,
        fill: Callable[[Any], None] | None = None,
    ) -> bool:
        """The vectors' table (``<table>_vectors``, see ``_VectorQueries``),
        made if missing, with pgvector's extension (``CREATE EXTENSION IF NOT
        EXISTS vector``) where the server has it available and lets us; and
        ``hnsw``'s index, made if missing. False: no pgvector, or a read-only
        store that finds no table."""
        vq = self._vq
        if vq is not None:
            if (vq.dims, vq.hnsw) != (dims, hnsw):
                raise ValueError(
                    f"{self!r}'s vectors are open with dims={vq.dims}, hnsw={vq.hnsw}; "
                    f"asked for dims={dims}, hnsw={hnsw}"
                )
            return True
        self._check_open()
        self.setup()
        found = self._pgvector(dims)
        if found is None:
            return False
        oid, exists = found
        vq = _VectorQueries(self.table, dims, oid, hnsw)
        if self.readonly:
            if not exists:
                return False
        else:
            try:
                self.transact(lambda txn: self._make_vectors(txn, vq, fill))
            except KVError as e:
                if not _denied(e):
                    raise
                return False  # a role that may not make the table (or index): no vectors
        self._vq = vq
        return True

    def _pgvector(self, dims: int) -> tuple[int, bool] | None:
        """(the ``vector`` type's oid, whether the vectors' table exists), the
        extension created if it can be; None: the server has no pgvector."""
        from psycopg import errors

        conn = self._getconn()
        lost = False
        try:
            have, available = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'vector'), "
                "EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector')"
            ).fetchone()
            if not have:
                if not available or self.readonly:
                    return None
                try:
                    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                except (errors.InsufficientPrivilege, errors.FeatureNotSupported):
                    return None
            name = vectors_table(self.table).as_string(conn)
            oid, typmod = conn.execute(
                "SELECT 'vector'::regtype::oid, (SELECT a.atttypmod FROM pg_attribute a "
                "WHERE a.attrelid = to_regclass(%s) AND a.attname = 'embedding')",
                (name,),
            ).fetchone()
        except Exception as e:
            lost = bool(conn.broken)
            raise _translate(e, "vectors' setup") from e
        finally:
            self._putconn(conn, lost)
        if typmod is not None and typmod != dims:
            raise ValueError(
                f"table {name!r} holds vectors of {typmod} dims; the index config says dims={dims}"
            )
        return int(oid), typmod is not None

    def _make_vectors(
        self, txn: _PGTxn, vq: _VectorQueries, fill: Callable[[Any], None] | None
    ) -> None:
        """In one transaction, under the store's setup lock: the table made
        (and ``fill`` run) if missing, the HNSW index if asked for and
        missing."""
        from psycopg import sql

        txn._vq = vq
        conn = txn._conn
        # (an int: the driver loads no void)
        lock = sql.SQL("SELECT 1 FROM pg_advisory_xact_lock(hashtext({}))").format(
            sql.Literal(self._advisory)
        )
        txn._run(lock.as_string(conn), None)
        exists = sql.SQL("SELECT to_regclass({}) IS NOT NULL").format(
            sql.Literal(vq.table.as_string(conn))
        )
        if not txn._run(exists.as_string(conn), None).fetchone()[0]:
            txn._run(vq.create.as_string(conn), None)
            if fill is not None:
                fill(txn)
        if vq.hnsw is not None:
            options = sql.SQL(", ").join(
                sql.SQL("{} = {}").format(sql.Identifier(k), sql.Literal(int(v)))
                for k, v in sorted(vq.hnsw.items())
            )
            index = sql.SQL(
                "CREATE INDEX IF NOT EXISTS {} ON {} USING hnsw (embedding vector_cosine_ops)"
            ).format(vq.index_name, vq.table)
            if vq.hnsw:
                index = sql.SQL("{} WITH ({})").format(index, options)
            txn._run(index.as_string(conn), None)

    # -- the Store protocol ----------------------------------------------------------
    def read(self) -> _ReadContext:
        return _ReadContext(self)

    def write(self) -> _WriteContext:
        return _WriteContext(self)

    # -- maintenance ------------------------------------------------------------------
    def disk_usage(self) -> int:
        """Bytes of the table with its index and TOAST (pg_total_relation_size)."""
        row = self._admin(
            "SELECT pg_total_relation_size(to_regclass(%s))", with_name=True
        ).fetchone()
        return int(row[0] or 0)

    def vacuum(self, *, full: bool = False) -> None:
        """``VACUUM ANALYZE`` the table (``full=True``: ``VACUUM FULL``, which
        rewrites it and returns free space to the OS, under an exclusive lock)."""
        if self.readonly:
            raise ReadOnlyError(f"{self!r} was opened read-only")
        from psycopg import sql

        word = "VACUUM (FULL, ANALYZE) {}" if full else "VACUUM (ANALYZE) {}"
        self._admin(sql.SQL(word).format(self._q.ident))

    def _admin(self, query: Any, *, with_name: bool = False) -> Any:
        self._check_open()
        self.setup()
        conn = self._getconn()
        lost = False
        try:
            params = (self._q.ident.as_string(conn),) if with_name else None
            return conn.execute(query, params)
        except Exception as e:
            lost = bool(conn.broken)
            raise _translate(e, "maintenance") from e
        finally:
            self._putconn(conn, lost)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if os.getpid() == self._pid:
            self._lingering.release(self._lingering.drain(None))
        if self._owns_pool and os.getpid() == self._pid:
            self._finalizer()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PostgresStore(table={self.table!r})"


def _denied(e: BaseException) -> bool:
    """Whether an error was the server refusing a privilege."""
    from psycopg import errors

    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, errors.InsufficientPrivilege):
            return True
        seen = seen.__cause__
    return False
