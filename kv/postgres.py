"""``PostgresStore``: the ``Store`` protocol on one PostgreSQL table.

For applications deployed on several machines: every instance opens the same
table on a shared server. One table of ordered byte keys::

    CREATE TABLE kv_store (key bytea PRIMARY KEY, value bytea NOT NULL)

``bytea`` compares as unsigned bytes (memcmp, then length), exactly the order
of Python ``bytes``, so scans return what every other backend returns. The
table's comment is the store's schema record (``kvsaver.kv PostgresStore
format 1``); ``setup()`` creates the table idempotently on first use (under an
advisory lock, so concurrent first openers do not race) and refuses a table
of another kind or of a newer format.

Transactions
    ``read()`` is one consistent snapshot: ``REPEATABLE READ, READ ONLY``,
    taken at the transaction's first read (PostgreSQL takes it then).
    ``write()`` and ``transact()`` are ``SERIALIZABLE``. ``transact(fn)``
    reruns ``fn`` on a serialization failure or a deadlock (bounded, with
    exponential backoff and jitter), and when the connection was lost before
    ``COMMIT`` was sent (the transaction cannot have committed). A rerun starts
    from a fresh transaction: writes buffered by an attempt are discarded with
    it, so no change is applied twice. ``write()`` cannot rerun a ``with``
    body: a conflict there raises ``StoreConflictError`` (use ``transact``).
    Inside one process, write transactions run one at a time (as on LMDB);
    across machines, PostgreSQL serializes them.

Round trips (what a network costs; counted by tests/test_postgres.py)
    Writes are buffered in the transaction and sent as one statement
    (``INSERT ... SELECT unnest(...) ON CONFLICT DO UPDATE``, plus a
    ``DELETE`` of each deleted key, or one ``DELETE ... = ANY(...)`` of more
    than ``_DELETE_EACH``), pipelined with ``COMMIT`` or with the next read
    that must go to the server. A write-only transaction that deletes
    nothing (a speculated put or put_writes) is one statement, a
    server-side prepared statement of ours
    (``_exec_prepared``: parsed and planned once per connection, not through
    psycopg's cache; ``prepare=False`` parses it every time). The statements
    of a round trip before the commit (reads, scans, a guard, buffered
    writes) are named prepared statements too, sent with ``BEGIN`` in one
    libpq pipeline (``_exchange``), each prepared in that same pipeline the
    first time a connection needs it: the server neither parses nor plans them
    again, and planning is a large part of a short read's server time; so are
    the statements that commit a transaction (with ``prepare=False``, psycopg's
    pipeline). ``BEGIN`` is pipelined with the first statement. A connection is
    not given back to the pool after a transaction that went well: it lingers
    for the store's next one (a write's session idle, a read's still in its
    snapshot, whose ``ROLLBACK`` goes in the first round trip of that next
    transaction), and a reaper thread gives it back after ``_LINGER`` seconds
    unused (rolling a read back first), so no session stays idle in a
    transaction for long.
    A scan's first chunk is queued and sent with the next round trip (so a
    scan followed by ``get_many`` costs one). Point reads are remembered for
    the rest of the transaction
    (the snapshot cannot change under it), so ``get_many`` followed by ``get``
    of the same keys costs one round trip. Scans fetch keyset-paginated
    chunks (``WHERE key > last ORDER BY key LIMIT n``), never the whole range
    at once; ``limit`` bounds the first chunk.

Speculation (``transact`` only; ``speculate=False`` turns it off)
    A write transaction's first reads are answered from a cache of what this
    process's committed write transactions wrote and read (a key not in it is
    assumed absent, as a new checkpoint's keys are), with no round trip. A
    guard statement sent first in the committing pipeline checks, under
    SERIALIZABLE and with one index lookup per key, that each of those keys
    still holds the value assumed; when one does not, the transaction fails
    whole and ``fn`` is rerun at once, reading from the server. So a KVSaver
    ``put`` or ``put_writes`` is one round trip, ``BEGIN`` to ``COMMIT``,
    when this process wrote the thread's last checkpoint, and a wrong guess
    (another machine wrote it) costs a rerun, never a wrong write.

Faults
    A dropped connection or a server restart: the first statement of a
    transaction is resent on a new connection (nothing was committed or
    returned yet); a later statement fails with ``StoreUnavailableError``
    (the transaction is rolled back by the server); a failure while
    committing raises ``CommitUnknownError`` (the commit may or may not have
    been applied). The pool replaces dead connections, so the same store works
    again as soon as the server is back. ``statement_timeout`` (a statement
    running longer is cancelled: ``StoreTimeoutError``) and
    ``connect_timeout`` are options.

Space
    PostgreSQL reuses the space of deleted rows by itself (autovacuum);
    ``vacuum(full=True)`` (``VACUUM FULL``, which locks the table while it
    rewrites it) returns it to the operating system.

psycopg 3 and psycopg_pool are an optional extra (``pip install
"kvsaver[postgres]"``), imported when a store is opened.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import select
import struct
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, cast

from .store import (
    CorruptStoreError,
    FormatVersionError,
    KeyTooLongError,
    KVError,
    MissingDependencyError,
    ReadOnlyError,
    Store,
    StoreClosedError,
    StoreFullError,
)

__all__ = [
    "CommitUnknownError",
    "PostgresStore",
    "StoreConflictError",
    "StoreTimeoutError",
    "StoreUnavailableError",
    "is_postgres_url",
]

T = TypeVar("T")

FORMAT_VERSION = 1
_MARK = "kvsaver.kv PostgresStore format "
MAX_KEY = 2000  # a btree index entry must fit a third of an 8 KiB page
_FIRST_CHUNK = 64
_MAX_CHUNK = 1024
_HASH_OVER = 64  # a guard compares a longer assumed value by its SHA-256
_DELETE_EACH = 8  # up to this many keys deleted: a statement each (see _Queries)
_CACHE_BYTES = 8 << 20  # the cache of committed values that transact speculates from
_CACHE_ENTRY = 256 << 10  # a longer value is not cached (a read of it is not speculated)
_SPECULATE_BELOW = 0.25  # speculate while fewer guesses than this fail (moving average)
_POLL_SECONDS = 0.5  # a call waiting in a group commit checks its state this often


class StoreUnavailableError(KVError):
    """The server cannot be reached, or the connection broke during a
    transaction, which the server rolled back: nothing of it was written."""


class CommitUnknownError(StoreUnavailableError):
    """The connection broke while ``COMMIT`` was in flight: the transaction
    may or may not have been applied. Check before redoing it (a KVSaver
    ``put`` of the same checkpoint is idempotent and can simply be redone)."""


class StoreConflictError(KVError):
    """A ``SERIALIZABLE`` write transaction conflicted with a concurrent one
    (or deadlocked) and was rolled back; ``transact`` retries these itself."""


class SpeculationFailed(StoreConflictError):
    """Internal to ``transact``: a read answered from the cache did not hold
    (its guard failed, so nothing was applied); the function is rerun at once,
    reading from the server."""


class StoreTimeoutError(KVError):
    """A statement ran longer than ``statement_timeout`` and was cancelled."""


def is_postgres_url(value: object) -> bool:
    """True for a ``postgresql://`` or ``postgres://`` connection URL."""
    return isinstance(value, str) and value.startswith(("postgresql://", "postgres://"))


def _psycopg() -> Any:
    try:
        import psycopg
        import psycopg_pool  # noqa: F401
    except ImportError as e:  # .ci/bare_install.py runs this without the extra
        raise MissingDependencyError(
            "PostgresStore needs psycopg 3 and psycopg_pool: pip install 'kvsaver[postgres]'"
        ) from e
    if not _LIB:
        from psycopg import errors
        from psycopg.adapt import Transformer
        from psycopg.generators import execute, fetch_many, send

        _LIB.update(
            errors=errors, Transformer=Transformer, execute=execute, fetch_many=fetch_many,
            send=send,
        )  # fmt: skip
    return psycopg


# What the hot paths use of psycopg, imported once (an import statement in a
# function looks every name up again, at every put and read); libpq's result
# statuses (PGRES_*).
_LIB: dict[str, Any] = {}
_COMMAND_OK, _TUPLES_OK, _FATAL_ERROR, _PIPELINE_SYNC = 1, 2, 7, 10


def _error(res: Any, conn: Any) -> Exception:
    """The exception psycopg raises for a failed result."""
    return _LIB["errors"].error_from_result(res, encoding=conn.info.encoding)


_ABANDONED: list[Any] = []  # pools inherited through fork: never closed in the child


class _Queries:
    """Every statement, composed once from ``psycopg.sql`` identifiers; values
    are always parameters (``%b``: binary bytea)."""

    def __init__(self, table: str) -> None:
        from psycopg import sql

        self._sql = sql
        parts = table.split(".")
        if not 1 <= len(parts) <= 2 or not all(parts):
            raise ValueError(f"table must be 'name' or 'schema.name', got {table!r}")
        t = sql.Identifier(*parts)
        self.ident = t
        digest = hashlib.sha1(table.encode()).hexdigest()[:16]
        self._digest = f"{digest}_{FORMAT_VERSION}"
        self.get = self._stmt("get", "SELECT value FROM {} WHERE key = %b", (_BYTEA,))
        # One index lookup per key (a key not there: NULL), as the guard
        # below does: PostgreSQL's generic plan of ``key = ANY($1)`` (a
        # prepared statement's, from its sixth run) assumes 10 keys and
        # scans the whole table up to a few thousand rows, every time.
        self.get_many = self._stmt(
            "many2",
            "SELECT a.k, (SELECT t.value FROM {} AS t WHERE t.key = a.k) "
            "FROM unnest(%b::bytea[]) AS a(k)",
            (_BYTEA_ARRAY,),
        )
        self.upsert = self._stmt(
            "put",
            "INSERT INTO {} (key, value) SELECT * FROM unnest(%b::bytea[], %b::bytea[]) "
            "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            (_BYTEA_ARRAY, _BYTEA_ARRAY),
        )
        self.delete_many = self._stmt(
            "del", "DELETE FROM {} WHERE key = ANY(%b::bytea[])", (_BYTEA_ARRAY,)
        )
        # A few keys are deleted one statement each (all in the transaction's
        # one pipeline, after its write statement): the generic plan of
        # ``key = ANY($1)`` scans a table
        # of up to a few thousand rows (see get_many); a put deletes one key
        # (its thread's previous activity entry) when a second or more went
        # by since the thread's last put.
        self.delete_one = self._stmt("del1", "DELETE FROM {} WHERE key = %b", (_BYTEA,))
        # Fails (division by zero, which no other statement of ours can raise)
        # unless every key holds the value assumed for it (NULL: absent; a
        # long value is compared by its SHA-256). Not constant-folded: the
        # condition reads the table. One index lookup per key (a correlated
        # subquery: a join could be planned as a scan of the whole table,
        # slow and, under SERIALIZABLE, a lock on all of it).
        check = (
            "1 / (NOT EXISTS (SELECT 1 FROM unnest(%b::bytea[], %b::bytea[], %b::bool[]) "
            "AS a(k, v, h) WHERE (SELECT CASE WHEN a.h THEN sha256(t.value) ELSE t.value END "
            "FROM {} AS t WHERE t.key = a.k) IS DISTINCT FROM a.v))::int"
        )
        self.guard = self._stmt(
            "guard", "SELECT " + check, (_BYTEA_ARRAY, _BYTEA_ARRAY, _BOOL_ARRAY)
        )
        # A write-only transaction's statement (fewer statements, fewer
        # packets and wake-ups): its id, the guard, then the upserts, which
        # run only when the guard passed. Its deletes follow it in the same
        # pipeline and transaction (_delete_statements), not in it: a DELETE
        # of no key in it would still cost the server time at every put (the
        # generic plan of ``key = ANY``, see get_many). A named prepared
        # statement of ours (see _PGTxn._exec_prepared); its name is the
        # table's, so stores of one table on one pool share it.
        self.write_all = self._stmt(
            "wk",
            "WITH g AS MATERIALIZED (SELECT txid_current() AS xid, " + check + " AS ok), "
            "u AS (INSERT INTO {} (key, value) SELECT * FROM unnest(%b::bytea[], %b::bytea[]) "
            "WHERE (SELECT ok FROM g) = 1 ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value) "
            "SELECT xid FROM g",
            (_BYTEA_ARRAY,) * 2 + (_BOOL_ARRAY,) + (_BYTEA_ARRAY,) * 2,
        )
        self.create = sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (key bytea PRIMARY KEY, value bytea NOT NULL)"
        ).format(t)
        self._rendered = False
        self._scans: dict[tuple[bool, bool, bool], _Stmt] = {}
        self._deletes: dict[tuple[bool, bool], _Stmt] = {}

    def _stmt(self, kind: str, template: str, types: tuple[int, ...]) -> _Stmt:
        """A statement from a template of our own (``{}``: the table; ``%b``,
        ``%s``: parameters), for psycopg and as a named prepared statement."""
        sql, t = self._sql, self.ident
        n = template.count("{}")
        return _Stmt(
            sql.SQL(template).format(*[t] * n),
            f"kvsaver_{kind}_{self._digest}".encode(),
            sql.SQL(_numbered(template)).format(*[t] * n),
            types,
        )

    def render(self, conn: Any) -> None:
        """The fixed statements as bytes, composed once (psycopg would compose
        a ``Composed`` again at every execute)."""
        if self._rendered:
            return
        for name in (
            "get",
            "get_many",
            "upsert",
            "delete_many",
            "delete_one",
            "guard",
            "write_all",
        ):
            q = getattr(self, name)
            if isinstance(q, _Stmt):
                q.render(conn)
            elif not isinstance(q, bytes):  # two threads may render at once: the same bytes
                setattr(self, name, q.as_bytes(conn))
        self._rendered = True

    @staticmethod
    def _where(has_start: bool, has_stop: bool) -> str:
        conds = (["key >= %b"] if has_start else []) + (["key < %b"] if has_stop else [])
        return " WHERE " + " AND ".join(conds) if conds else ""

    def scan(self, has_start: bool, has_stop: bool, reverse: bool) -> _Stmt:
        q = self._scans.get((has_start, has_stop, reverse))
        if q is None:
            order = "DESC" if reverse else "ASC"
            q = self._stmt(
                f"scan{int(has_start)}{int(has_stop)}{int(reverse)}",
                f"SELECT key, value FROM {{}}{self._where(has_start, has_stop)} "
                f"ORDER BY key {order} LIMIT %s",
                (_BYTEA,) * (has_start + has_stop) + (_INT8,),
            )
            self._scans[(has_start, has_stop, reverse)] = q
        return q

    def delete_range(self, has_start: bool, has_stop: bool) -> _Stmt:
        q = self._deletes.get((has_start, has_stop))
        if q is None:
            q = self._stmt(
                f"drange{int(has_start)}{int(has_stop)}",
                "DELETE FROM {}" + self._where(has_start, has_stop),
                (_BYTEA,) * (has_start + has_stop),
            )
            self._deletes[(has_start, has_stop)] = q
        return q


_BYTEA, _INT8, _BOOL_ARRAY, _BYTEA_ARRAY = 17, 20, 1000, 1001  # type oids


class _Stmt:
    """One statement: ``text`` for psycopg (``%b`` parameters), and the same
    with numbered parameters (``$1``...), prepared by ``name`` on a
    connection the first time it is sent there (``_exchange``)."""

    __slots__ = ("name", "numbered", "text", "types")

    def __init__(self, text: Any, name: bytes, numbered: Any, types: tuple[int, ...]) -> None:
        self.text = text
        self.name = name
        self.numbered = numbered
        self.types = types

    def render(self, conn: Any) -> None:
        # Two threads may render at once (the same bytes): each attribute is
        # read once, so one never finds bytes where it tested a Composed.
        text, numbered = self.text, self.numbered
        if not isinstance(text, bytes):
            self.text = text.as_bytes(conn)
        if not isinstance(numbered, bytes):
            self.numbered = numbered.as_bytes(conn)


def _numbered(template: str) -> str:
    """``%b`` and ``%s`` placeholders as ``$1``, ``$2``, ... (a template of
    our own: identifiers are still ``{}`` fields, so none can come from a
    name)."""
    parts = re.split("%[bs]", template)
    return "".join(f"{p}${i}" for i, p in enumerate(parts[:-1], 1)) + parts[-1]


def _text(q: Any) -> Any:
    """What psycopg executes for a statement."""
    return q.text if isinstance(q, _Stmt) else q


def _unprepared(e: BaseException) -> bool:
    """A prepared statement of ours that the server does not have."""
    from psycopg import errors

    return isinstance(e, errors.InvalidSqlStatementName)


class _Rows:
    """A statement's result from ``_exchange``, read as from a cursor."""

    __slots__ = ("rowcount", "rows")

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self.rows = rows
        self.rowcount = rowcount

    def fetchone(self) -> Any:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[Any]:
        return self.rows


_INT8_VALUE = struct.Struct("!q")


def _round_trip(pgconn: Any, results: list[Any]) -> Any:
    """One generator for psycopg's ``conn.wait`` (one call, not one per
    result): flush the pipeline, then append each statement's last result
    to ``results`` (kept by the caller if the connection breaks) up to the
    pipeline's Sync."""
    yield from _LIB["send"](pgconn)
    fetch_many = _LIB["fetch_many"]
    while True:
        got = yield from fetch_many(pgconn)
        if got and got[-1].status == _PIPELINE_SYNC:
            return
        results.append(got[-1] if got else None)


def _exchange(conn: Any, items: Sequence[tuple[Any, Any]]) -> list[_Rows]:
    """Send ``items`` (statement, parameters) in one libpq pipeline ending in
    one Sync: one round trip, and read every result. A ``_Stmt`` is sent as
    a named prepared statement (Bind/Execute, no parsing or planning on the
    server), preceded in the same pipeline by its Parse where this connection
    does not have it yet; anything else (BEGIN, ROLLBACK, ...) is sent unnamed,
    without parameters. Results are binary. The first error is raised (as
    psycopg raises it) once the whole pipeline has been read, so the connection
    is left ready for the next statement; when the server reports one of ours
    unknown (deallocated behind our back), every name of the connection is
    forgotten, to be prepared again next time."""
    lib = _LIB
    pgconn = conn.pgconn
    names = _prepared_names(conn)
    parses: list[bytes | None] = []  # per result: the name its Parse prepares
    results: list[Any] = []
    broken = True
    with conn.lock:
        try:
            pgconn.enter_pipeline_mode()
            for q, params in items:
                if isinstance(q, _Stmt):
                    if not isinstance(q.numbered, bytes):  # a scan's, made after render()
                        q.render(conn)
                    if q.name not in names and q.name not in parses:
                        pgconn.send_prepare(q.name, q.numbered, q.types)
                        parses.append(q.name)
                    values = [_INT8_VALUE.pack(v) if isinstance(v, int) else v for v in params]
                    pgconn.send_query_prepared(q.name, values, (1,) * len(values), 1)
                else:
                    pgconn.send_query_params(
                        q.encode() if isinstance(q, str) else q, None, result_format=1
                    )
                parses.append(None)
            pgconn.pipeline_sync()
            conn.wait(_round_trip(pgconn, results))
            pgconn.exit_pipeline_mode()
            broken = False
        except lib["errors"].OperationalError as e:
            # Lost mid-way. When the server's first answer says why (a restart:
            # "57P01 terminating connection due to administrator command"),
            # that is the error: results come in order, so it executed nothing
            # of ours. After any other answer, nothing is known (a COMMIT may
            # have been applied): the connection's error, carrying the results
            # that came before it as ``kv_rows`` (a commit's caller learns its
            # transaction's id there, to ask the server what became of it).
            first = results[0] if results else None
            if first is not None and first.status == _FATAL_ERROR:
                raise _error(first, conn) from e
            try:
                came, failed = _collect(conn, parses, results, names)
                if failed is None:  # (a failed statement has no rows: the rest would shift)
                    e.kv_rows = came  # type: ignore[attr-defined]
            except Exception:
                pass
            raise
        finally:
            if broken:  # lost, or interrupted mid-pipeline: unusable
                conn.close()
    out, error = _collect(conn, parses, results, names)
    if error is not None:
        if _unprepared(error):
            # Deallocated behind our back: DEALLOCATE ALL or DISCARD ALL (a
            # pool's reset) drop every statement of the session, so every
            # name is forgotten, not only the one the error names: else the
            # transaction's next round trip would name another one gone.
            names.clear()
        raise error
    return out


def _collect(
    conn: Any, parses: list[bytes | None], results: list[Any], names: set[bytes]
) -> tuple[list[_Rows], Exception | None]:
    """``_exchange``'s results read: the rows of each statement (a Parse's
    result names the statement prepared), and the first error."""
    lib = _LIB
    out: list[_Rows] = []
    error: Exception | None = None
    tx: Any = None
    for name, res in zip(parses, results):
        status = None if res is None else res.status
        if status == _FATAL_ERROR:
            if error is None:
                error = _error(res, conn)
        elif name is not None:
            if status == _COMMAND_OK:
                names.add(name)
        elif status == _TUPLES_OK:
            if tx is None:
                tx = lib["Transformer"]()
            tx.set_pgresult(res)
            out.append(_Rows(tx.load_rows(0, res.ntuples, tuple), res.ntuples))
        else:
            out.append(_Rows([], int(res.command_tuples or 0) if res is not None else 0))
    return out, error


# Connections on which a statement of ours is prepared (by name): module-wide,
# since stores of one table on one pool share the statement's name.
_PREPARED: weakref.WeakKeyDictionary[Any, set[bytes]] = weakref.WeakKeyDictionary()
_PREPARED_LOCK = threading.Lock()


def _prepared_names(conn: Any) -> set[bytes]:
    """The names of our statements prepared on ``conn`` (the reads'
    ``_exchange`` and the write's ``_exec_prepared``). A missing statement
    (DEALLOCATE ALL, DISCARD ALL) empties the whole set: every statement of
    the session went."""
    with _PREPARED_LOCK:
        return _PREPARED.setdefault(conn, set())


_allocate_lock = threading.Lock  # a group commit's wake-up locks (a test stands one in)
_BIG = object()  # a key whose value is too long to cache: never guessed
_MISSING = object()


class _ByteaArray(bytes):
    """A ``bytea[]`` in PostgreSQL's binary array format, built here: psycopg's
    list dumper looks up each element's type, a good part of a put's CPU."""

    __slots__ = ()


class _BoolArray(bytes):
    """A ``bool[]`` in the binary array format."""

    __slots__ = ()


_HEAD = struct.Struct("!iiiii")  # ndim 1, has nulls, element oid, length, lower bound
_LEN = struct.Struct("!i")
_NULL = _LEN.pack(-1)


_EMPTY_BYTEA_ARRAY = _ByteaArray(struct.pack("!iii", 0, 0, 17))  # empty: no dimension


def _bytea_array(items: Sequence[bytes | None]) -> _ByteaArray:
    if not items:
        return _EMPTY_BYTEA_ARRAY
    nulls = None in items
    parts = [_HEAD.pack(1, nulls, 17, len(items), 1)]
    pack = _LEN.pack
    if nulls:
        for v in items:
            parts += (_NULL,) if v is None else (pack(len(v)), v)
    else:
        for v in cast("Sequence[bytes]", items):
            parts += (pack(len(v)), v)
    return _ByteaArray(b"".join(parts))


def _bool_array(items: Sequence[bool]) -> _BoolArray:
    if not items:
        return _BoolArray(struct.pack("!iii", 0, 0, 16))
    body = b"".join(b"\x00\x00\x00\x01\x01" if v else b"\x00\x00\x00\x01\x00" for v in items)
    return _BoolArray(_HEAD.pack(1, 0, 16, len(items), 1) + body)


_DUMPERS: list[tuple[type, type]] = []


def _register_arrays(conn: Any) -> None:
    """Teach a connection to send our arrays as they are (bytea[]: oid 1001,
    bool[]: oid 1000, binary)."""
    if not _DUMPERS:
        from psycopg import pq
        from psycopg.adapt import Dumper

        arrays: tuple[tuple[type, int], ...] = ((_ByteaArray, 1001), (_BoolArray, 1000))
        for cls, oid in arrays:

            class ArrayDumper(Dumper):
                format = pq.Format.BINARY

                def dump(self, obj: Any) -> Any:
                    return obj

            ArrayDumper.oid = oid
            _DUMPERS.append((cls, ArrayDumper))
    for cls, dumper in _DUMPERS:
        conn.adapters.register_dumper(cls, dumper)


class _Cache:
    """What this process last knew each key to hold (written or read by its
    committed write transactions; ``None``: absent), least recently used
    out, at most ``max_bytes``. Only ever a guess: ``transact`` verifies
    every value it takes from here in the same transaction (a guard
    statement), so a stale entry costs a rerun, never a wrong write."""

    def __init__(self, max_bytes: int = _CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.items: OrderedDict[bytes, Any] = OrderedDict()
        self.lock = threading.Lock()

    @staticmethod
    def _cost(k: bytes, v: Any) -> int:
        return 64 + len(k) + (len(v) if isinstance(v, bytes) else 0)

    def guess(self, keys: Sequence[bytes]) -> list[bytes | None] | None:
        """The cached values (a key without an entry: assumed absent, which
        a new checkpoint's keys are); None when one cannot be guessed."""
        out: list[bytes | None] = []
        with self.lock:
            for k in keys:
                v = self.items.get(k)
                if v is _BIG:
                    return None
                out.append(v)
        return out

    def learn(self, known: dict[bytes, bytes | None], ranges: Sequence[Any]) -> None:
        with self.lock:
            items = self.items
            if ranges:
                for k in [k for k in items if any(_inside(k, a, b) for a, b in ranges)]:
                    self.size -= self._cost(k, items.pop(k))
            size = self.size
            pop = items.pop
            for k, value in known.items():  # _cost, inline: a put learns a dozen keys
                v: Any = value
                if v is not None and len(v) > _CACHE_ENTRY:
                    v = _BIG
                old = pop(k, _MISSING)
                if old is _MISSING:
                    size += 64 + len(k)
                elif type(old) is bytes:
                    size -= len(old)
                items[k] = v
                if type(v) is bytes:
                    size += len(v)
            self.size = size
            while self.size > self.max_bytes and items:
                k, v = items.popitem(last=False)
                self.size -= self._cost(k, v)

    def forget(self, keys: Sequence[bytes]) -> None:
        with self.lock:
            for k in keys:
                if k in self.items:
                    self.size -= self._cost(k, self.items.pop(k))


def _classify(e: BaseException) -> str:
    """'conflict', 'lost' (connection), 'timeout', or '' for anything else."""
    from psycopg import errors

    if isinstance(e, (errors.SerializationFailure, errors.DeadlockDetected)):
        return "conflict"
    if _unprepared(e):  # deallocated mid-transaction (DEALLOCATE ALL): rerun it
        return "conflict"
    if isinstance(e, errors.QueryCanceled):
        return "timeout"
    if isinstance(e, errors.OperationalError):
        return "lost"
    return ""


def _shut_down(e: BaseException) -> bool:
    """The server ended the session (class 57: operator intervention: an
    administrator, a shutdown, a restart), and said so."""
    return str(getattr(e, "sqlstate", None) or "").startswith("57")


def _ended(conn: Any) -> bool:
    """True when an idle connection has already been ended by the server
    (its closing message or end of stream is waiting on the socket), found
    without a round trip: a poll of the socket."""
    try:
        pgconn = conn.pgconn
        for _ in range(3):  # the closing message, then the end of the stream
            ready, _, _ = select.select([pgconn.socket], [], [], 0)
            if not ready:
                return False
            pgconn.consume_input()
            pgconn.is_busy()  # parses what arrived (a closing message ends it)
            if pgconn.status != 0:
                return True
    except Exception:
        return True
    return bool(conn.broken or conn.closed)


def _translate(e: BaseException, where: str, *, committing: bool = False) -> KVError:
    from psycopg import errors

    kind = _classify(e)
    if kind == "conflict":
        err: KVError = StoreConflictError(f"{where}: {e} (rolled back; retry the transaction)")
    elif kind == "timeout":
        err = StoreTimeoutError(f"{where}: statement cancelled by statement_timeout ({e})")
    elif kind == "lost" and committing:
        err = CommitUnknownError(
            f"{where}: the connection to PostgreSQL broke while committing ({e}); the "
            "transaction may or may not have been applied"
        )
    elif kind == "lost":
        err = StoreUnavailableError(
            f"{where}: PostgreSQL unavailable or the connection broke ({e}); "
            "the transaction was not committed"
        )
    elif isinstance(e, errors.ReadOnlySqlTransaction):
        err = ReadOnlyError(f"{where}: {e}")
    elif isinstance(e, errors.ProgramLimitExceeded):
        err = KeyTooLongError(f"{where}: {e}")
    elif isinstance(e, errors.DiskFull):
        err = StoreFullError(f"{where}: {e}")
    else:
        err = KVError(f"{where}: {type(e).__name__}: {e}")
    err.__cause__ = e
    return err


class _PGTxn:
    """One transaction on one pooled connection. ``_known`` holds what this
    transaction knows of a key's current value (point reads and its own
    writes); ``_dirty`` the writes not yet sent (``None``: delete)."""

    def __init__(self, store: PostgresStore, conn: Any, write: bool) -> None:
        self._store = store
        self._q = store._q
        self._conn = conn
        self._cursor: Any = None  # made on first use (a write-only put needs none)
        self._write = write
        self._begin = store._begin_write if write else store._begin_read
        self._begun = False
        self._open = True
        self._known: dict[bytes, bytes | None] = {}
        self._dirty: dict[bytes, bytes | None] = {}
        # First chunks of scans not yet sent: they go with the next round trip.
        self._queue: list[tuple[Any, Any, _Pending | None]] = []
        self._xid = _Pending((), 1)
        # The connection still holds the previous read's snapshot: its
        # ROLLBACK goes first in this transaction's first round trip.
        self._pre_rollback = False
        self._unclaimed: dict[tuple[Any, ...], _Pending] = {}
        self.lost = False  # the connection broke (the store discards it)
        self.failed: KVError | None = None  # a statement failed: the txn is rolled back
        self.may_resend = True  # nothing committed or returned yet: a retry is safe
        # Speculation (transact only): reads answered from the store's cache of
        # committed values, verified by a guard statement in the same round
        # trip as the writes and COMMIT (see PostgresStore.transact).
        self.speculate = False
        self._assumed: dict[bytes, bytes | None] = {}  # not yet in a guard
        self.assumed_keys: list[bytes] = []
        self._ranges: list[tuple[bytes | None, bytes | None]] = []  # delete_range calls
        self._sent = 0  # round trips made (a mark is restorable only with none since)

    @property
    def _cur(self) -> Any:
        cur = self._cursor
        if cur is None:
            cur = self._cursor = self._conn.cursor(binary=True)
        return cur

    # -- statements -------------------------------------------------------------
    def _run(self, query: Any, params: Sequence[Any] | None) -> Any:
        """Execute one statement (``None``: only what is queued) after BEGIN,
        the buffered writes and the queued scans, all in one round trip; the
        cursor, ready to fetch."""
        if not self._open:
            raise StoreClosedError("transaction is finished")
        if self.failed is not None:
            raise self.failed
        pre: list[tuple[Any, Any, _Pending | None]] = []
        if not self._begun:
            pre.append((self._begin, None, None))
            if self._write:  # the id whose fate a lost COMMIT is checked by
                pre.append((_XID, None, self._xid))
        pre.extend((q, p, None) for q, p in self._guard_statements())
        pre.extend(self._queue)
        pre.extend((q, p, None) for q, p in self._flush_statements())
        self.speculate = False  # a round trip is paid now: read for real from here on
        self._sent += 1
        out: Any = None
        resent = 0
        while True:
            try:
                self._store._statements += len(pre) + (query is not None)
                self._store._round_trips += 1
                if self._store.prepare:
                    out = self._exchange(pre, query, params)
                elif pre:
                    with self._conn.pipeline():
                        if self._pre_rollback:
                            self._cur.execute("ROLLBACK")
                        for q, p, pending in pre:
                            if pending is None:
                                self._cur.execute(_text(q), p)
                            else:
                                pending.cur = self._conn.cursor(binary=True)
                                pending.cur.execute(_text(q), p)
                        if query is not None:
                            self._cur.execute(_text(query), params)
                    for _, _, pending in pre:
                        if pending is not None:
                            pending.rows = pending.cur.fetchall()
                            pending.cur = None
                else:
                    self._cur.execute(_text(query), params)
                break
            except Exception as e:
                if not self._begun and self.may_resend:
                    if _classify(e) == "lost" and self._store._reconnect(self):
                        continue  # the first statement on a dead pooled connection: resend
                    if _unprepared(e) and not resent:
                        resent += 1
                        # Our statements were deallocated behind our back
                        # (DEALLOCATE ALL, DISCARD ALL of a pool's reset): it
                        # failed before anything ran; end what BEGIN opened,
                        # prepare them all again (_exchange forgot every name)
                        # and resend, once.
                        self._pre_rollback = True
                        continue
                self._fail(e, "statement")
        self._begun = True
        self._pre_rollback = False
        self.may_resend = False
        self._dirty.clear()
        self._queue.clear()
        return self._cur if out is None else out

    def _exchange(
        self, pre: list[tuple[Any, Any, _Pending | None]], query: Any, params: Any
    ) -> _Rows | None:
        """``_run``'s round trip as prepared statements in one libpq pipeline;
        the last statement's result (None: there is none)."""
        items: list[tuple[Any, Any]] = [("ROLLBACK", None)] if self._pre_rollback else []
        items.extend((q, p) for q, p, _ in pre)
        if query is not None:
            items.append((query, params))
        results = _exchange(self._conn, items)
        first = len(items) - len(pre) - (query is not None)
        for (_, _, pending), res in zip(pre, results[first:]):
            if pending is not None:
                pending.rows = res.rows
        return results[-1] if query is not None else None

    def _mark(self) -> tuple[Any, ...]:
        """What ``_restore`` needs to undo one caller's function in a group
        commit (see PostgresStore.transact): everything it did is still in
        this process until the transaction's next round trip."""
        return (
            self._sent,
            dict(self._known),
            dict(self._dirty),
            dict(self._assumed),
            len(self.assumed_keys),
            len(self._ranges),
            len(self._queue),
            dict(self._unclaimed),
        )

    def _restore(self, mark: tuple[Any, ...]) -> bool:
        """Back to ``mark``; False when that cannot be (a round trip since
        sent some of it, or a statement failed)."""
        if mark[0] != self._sent or self.failed is not None or not self._open:
            return False
        _, self._known, self._dirty, self._assumed, keys, ranges, queued, self._unclaimed = mark
        del self.assumed_keys[keys:]
        del self._ranges[ranges:]
        del self._queue[queued:]
        return True

    def _fail(self, e: Exception, where: str) -> None:
        if _classify(e) == "lost" or self._conn.broken or self._conn.closed:
            self.lost = True
        self.failed = self._guard_failed(e) or _translate(e, where)
        raise self.failed from e

    def _guard_failed(self, e: BaseException) -> KVError | None:
        from psycopg import errors

        if self.assumed_keys and isinstance(e, errors.DivisionByZero):
            err = SpeculationFailed("a value read from the cache had changed; rerun")
            err.__cause__ = e
            return err
        return None

    def _assume(self, keys: list[bytes]) -> bool:
        """Answer reads of ``keys`` from the store's cache (a key it has no
        entry for is assumed absent), to be verified by a guard; False when
        one cannot be (a value too large to cache)."""
        guesses = self._store._cache.guess(keys)
        if guesses is None:
            return False
        for k, v in zip(keys, guesses):
            self._known[k] = self._assumed[k] = v
        self.assumed_keys.extend(keys)
        return True

    def _guard_statements(self) -> list[tuple[Any, Any]]:
        if not self._assumed:
            return []
        keys, values, hashed = [], [], []
        for k, v in self._assumed.items():
            keys.append(k)
            big = v is not None and len(v) > _HASH_OVER
            values.append(hashlib.sha256(v).digest() if big and v is not None else v)
            hashed.append(big)
        self._assumed = {}
        return [(self._q.guard, (_bytea_array(keys), _bytea_array(values), _bool_array(hashed)))]

    def _flush_statements(self) -> list[tuple[Any, Any]]:
        if not self._dirty:
            return []
        puts = [(k, v) for k, v in self._dirty.items() if v is not None]
        dels = [k for k, v in self._dirty.items() if v is None]
        out: list[tuple[Any, Any]] = []
        if puts:
            params = (_bytea_array([k for k, _ in puts]), _bytea_array([v for _, v in puts]))
            out.append((self._q.upsert, params))
        return out + self._delete_statements(dels)

    def _delete_statements(self, dels: list[bytes]) -> list[tuple[Any, Any]]:
        if len(dels) > _DELETE_EACH:
            return [(self._q.delete_many, (_bytea_array(dels),))]
        one = self._q.delete_one
        return [(one, (k,)) for k in dels]

    def _unsent_writes(self) -> list[tuple[Any, Any]]:
        queued = [(q, p) for q, p, pending in self._queue if pending is None]
        self._queue.clear()
        return queued + self._flush_statements()

    def finish(self, commit: bool) -> None:
        """COMMIT (with the buffered writes, one round trip) or ROLLBACK. A
        transaction one of whose statements failed is rolled back, and asked
        to commit, raises that failure (its function may have caught it)."""
        self._open = False
        if commit and self.failed is not None:
            if not self.lost:
                self._rollback_quietly()
            raise self.failed
        if commit and not self._begun and not self._queue and not self.lost:
            # Only writes (and guesses), no read: BEGIN, one statement doing
            # them all (and one per deleted key, of a few), and COMMIT, in one go.
            writes = self._write_all()
            if writes:
                self._commit_first(writes, xid_in=True)
            elif self._pre_rollback:
                self._rollback_quietly()
            return
        writes = self._guard_statements() + self._unsent_writes() if commit else []
        if not self._begun or self.lost:
            if writes and not self.lost:
                self._commit_first(writes, xid_in=False)
            elif self._pre_rollback and not self.lost:
                self._rollback_quietly()
            return
        if commit and self.failed is None:
            self._commit(writes)
            return
        try:
            self._store._round_trips += 1
            self._cur.execute("ROLLBACK")
        except Exception:
            self.lost = True  # the server rolls back a broken session itself

    def _commit_first(self, writes: list[tuple[Any, Any]], *, xid_in: bool) -> None:
        """Commit a transaction that has sent nothing yet. On a connection the
        server already ended (a restart), send nothing: a new connection, or
        a clear "not committed"."""
        if _ended(self._conn) and not self._store._reconnect(self):
            self.failed = StoreUnavailableError(
                "commit: PostgreSQL unavailable; the transaction was not sent"
            )
            raise self.failed
        first = [("ROLLBACK", None)] if self._pre_rollback else []
        if xid_in and self._store._serializable.get(self._conn, False):
            self._commit([*first, *writes], len(first) - 1, xid_in=True, implicit=True)
            return
        self._commit([*first, (self._begin, None), *writes], xid_after=len(first), xid_in=xid_in)

    def _write_all(self) -> list[tuple[Any, Any]]:
        """The statements of a write-only transaction (none: nothing to do):
        its one statement, then its deletes."""
        assumed, dirty = self._assumed, self._dirty
        if not assumed and not dirty:
            return []
        self._assumed = {}
        av: list[bytes | None] = []
        ah: list[bool] = []
        for v in assumed.values():
            if v is not None and len(v) > _HASH_OVER:
                av.append(hashlib.sha256(v).digest())
                ah.append(True)
            else:
                av.append(v)
                ah.append(False)
        pk: list[bytes] = []
        pv: list[bytes] = []
        dels: list[bytes] = []
        for k, value in dirty.items():
            if value is None:
                dels.append(k)
            else:
                pk.append(k)
                pv.append(value)
        params = (
            *(_bytea_array(list(assumed)), _bytea_array(av), _bool_array(ah)),
            *(_bytea_array(pk), _bytea_array(pv)),
        )
        return [(self._q.write_all, params), *self._delete_statements(dels)]

    def _commit(
        self,
        pre: list[tuple[Any, Any]],
        xid_after: int | None = None,
        xid_in: bool = False,
        implicit: bool = False,
    ) -> None:
        """The buffered writes and COMMIT in one pipeline (one round trip). An
        error the server reports aborts the transaction (nothing committed).
        A connection lost on the way: the transaction's id, fetched with its
        first statement, is looked up on a new connection (txid_status), so
        the outcome is known unless the server cannot be reached.
        ``implicit``: ``pre`` is a whole transaction by itself on a
        SERIALIZABLE session (its statements up to the pipeline's Sync are
        one implicit transaction), after ``ROLLBACK`` of a lingering read if
        any: no BEGIN, no COMMIT."""
        with_xid = xid_after is not None
        self._store._statements += (not implicit) + len(pre) + (with_xid and not xid_in)
        self._store._round_trips += 1
        try:
            if self._store.prepare:
                q = self._q.write_all
                if (
                    implicit
                    and len(pre) == 1
                    and pre[0][0] is q
                    and q.name in _prepared_names(self._conn)
                ):
                    self._xid.rows = self._exec_prepared(pre[0][1])
                else:
                    self._xid.rows = self._exchange_commit(pre, xid_after, xid_in, implicit)
                return
            if implicit and len(pre) == 1:  # one statement: no pipeline needed
                self._xid.cur = self._conn.cursor()
                self._xid.cur.execute(_text(pre[0][0]), pre[0][1])
                self._xid.rows = self._xid.cur.fetchall()
                return
            with self._conn.pipeline():
                for i, (q, params) in enumerate(pre):
                    if xid_in and xid_after is not None and i == xid_after + 1:
                        # this statement's result is the transaction's id
                        self._xid.cur = self._conn.cursor()
                        self._xid.cur.execute(_text(q), params)
                        continue
                    self._cur.execute(_text(q), params)
                    if i == xid_after and not xid_in:
                        self._xid.cur = self._conn.cursor()
                        self._xid.cur.execute(_XID)
                if not implicit:
                    self._cur.execute("COMMIT")
            if with_xid:  # after the pipeline: fetched inside, it would wait for a Flush
                self._xid.rows = self._xid.cur.fetchall()
        except Exception as e:
            lost = _classify(e) == "lost" or self._conn.broken or self._conn.closed
            if not lost:
                if not implicit:  # an implicit transaction ended with its statement
                    self._rollback_quietly()
                self.failed = self._guard_failed(e) or _translate(e, "commit")
                raise self.failed from e
            self.lost = True
            if with_xid and self._xid.rows is None and self._xid.cur is not None:
                try:
                    self._xid.rows = self._xid.cur.fetchall()
                except Exception:
                    pass
            if with_xid and not self._xid.rows and _shut_down(e):
                # The server's results come in order, and the first one is its
                # notice that it ended the session: it executed nothing of ours.
                self.failed = _translate(e, "commit")
                raise self.failed from e
            fate = self._store._fate(self._xid.rows[0][0] if self._xid.rows else None)
            # xid_in: a write-only transaction (its statement returns its id),
            # whose every write is in _dirty (cleared only below, in finally).
            if fate is None and xid_in and self._dirty and self._store._holds(self._dirty):
                fate = "committed"  # its id never came back, its writes are there
            if fate == "committed":
                return
            self.failed = _translate(e, "commit", committing=fate != "aborted")
            raise self.failed from e
        finally:
            self._dirty.clear()

    def _exec_prepared(self, params: Sequence[Any]) -> list[tuple[int]]:
        """The write-only statement, prepared on this connection already (see
        _commit), as a server-side prepared statement of our own, parsed and
        planned once per connection as PostgresSaver's statements are (not at
        every put and put_writes): no pipeline, the least client CPU. A
        statement the server no longer has (a pool's reset, DEALLOCATE ALL)
        failed before running, so nothing is applied twice: it is prepared
        again and sent once more. The rows: the transaction's id."""
        stmt = self._q.write_all
        conn = self._conn
        pgconn = conn.pgconn
        with conn.lock:
            # our arrays: bytes already, sent as they are (binary)
            pgconn.send_query_prepared(stmt.name, params, (1,) * len(params), 0)
            results = conn.wait(_LIB["execute"](pgconn))
        res = results[0] if len(results) == 1 else _own_result(results, conn)
        if res.status == _TUPLES_OK:
            return [(int(res.get_value(0, 0) or b"0"),)]
        error = _error(res, conn)
        if not _unprepared(error):
            raise error
        _prepared_names(conn).clear()  # every statement went: see _exchange
        rows = self._exchange_commit([(stmt, params)], -1, True, True)
        assert rows is not None
        return rows

    def _exchange_commit(
        self, pre: list[tuple[Any, Any]], xid_after: int | None, xid_in: bool, implicit: bool
    ) -> list[Any] | None:
        """``_commit``'s pipeline as prepared statements (``_exchange``: one
        round trip, ours named and prepared, not parsed and planned at every
        commit as psycopg's pipeline would); the rows of the transaction's id
        (None: not asked). A statement of ours the server no longer has
        (DEALLOCATE ALL) in a transaction's first round trip failed before
        anything was applied: prepared again and sent once more."""
        items = list(pre)
        xid_at = None if xid_after is None else xid_after + 1
        if xid_at is not None and not xid_in:
            items.insert(xid_at, (_XID, None))
        if not implicit:
            items.append(("COMMIT", None))
        try:
            results = _exchange(self._conn, items)
        except Exception as e:
            came: list[_Rows] | None = getattr(e, "kv_rows", None)
            if xid_at is not None and came is not None and len(came) > xid_at:
                self._xid.rows = came[xid_at].rows or None  # the id, before the break
            if not _unprepared(e) or self._begun:
                raise
            if items[0][0] != "ROLLBACK":  # a failed BEGIN block must end first
                items.insert(0, ("ROLLBACK", None))
                xid_at = None if xid_at is None else xid_at + 1
            results = _exchange(self._conn, items)  # _exchange forgot every name
        return None if xid_at is None else results[xid_at].rows

    def _rollback_quietly(self) -> None:
        try:
            self._cur.execute("ROLLBACK")
        except Exception:
            self.lost = True

    # -- the Txn protocol ---------------------------------------------------------
    def _require_write(self) -> None:
        if not self._write:
            raise ReadOnlyError("cannot write in a read transaction")
        if not self._open:
            raise StoreClosedError("transaction is finished")

    def get(self, key: bytes) -> bytes | None:
        key = bytes(key)
        known = self._known
        if key in known:
            return known[key]
        if len(key) > MAX_KEY:
            return None
        if self.speculate and self._assume([key]):
            return known[key]
        row = self._run(self._q.get, (key,)).fetchone()
        value = None if row is None else row[0]
        known[key] = value
        return value

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Values of ``keys`` (None where missing), in one round trip."""
        keys = [bytes(k) for k in keys]
        known = self._known
        missing = [k for k in dict.fromkeys(keys) if k not in known and len(k) <= MAX_KEY]
        if missing and not (self.speculate and self._assume(missing)):
            found = dict(self._run(self._q.get_many, (_bytea_array(missing),)).fetchall())
            for k in missing:
                known[k] = found.get(k)
        return [known.get(k) for k in keys]

    def put(self, key: bytes, value: bytes) -> None:
        self._require_write()
        key, value = bytes(key), bytes(value)
        if len(key) > MAX_KEY:
            raise KeyTooLongError(
                f"key of {len(key)} bytes is longer than PostgresStore's limit of {MAX_KEY} bytes"
            )
        self._known[key] = self._dirty[key] = value
        self._unclaimed.clear()  # a scan queued before this write must not be shared after it

    def delete(self, key: bytes) -> bool:
        self._require_write()
        key = bytes(key)
        if self.get(key) is None:
            return False
        self._known[key] = self._dirty[key] = None
        self._unclaimed.clear()
        return True

    def delete_range(self, start: bytes | None, stop: bytes | None) -> int:
        self._require_write()
        if start is not None and stop is not None and start >= stop:
            return 0
        params = [b for b in (start, stop) if b is not None]
        q = self._q.delete_range(start is not None, stop is not None)
        n = int(self._run(q, params).rowcount)
        self._unclaimed.clear()
        self._ranges.append((start, stop))
        for k in [k for k in self._known if _inside(k, start, stop)]:
            self._known[k] = None
        return n

    def scan(
        self,
        start: bytes | None = None,
        stop: bytes | None = None,
        *,
        reverse: bool = False,
        limit: int | None = None,
    ) -> Iterator[tuple[bytes, bytes]]:
        """Keyset-paginated chunks: the first of ``min(limit, 64)`` rows, then
        growing to 1024, each resuming after the last key returned.

        The first chunk's query is queued when ``scan`` is called and sent with
        the next round trip (any read's, or this iterator's first ``next``):
        a caller that calls ``scan`` and then ``get_many`` pays one round trip
        for both. Identical scans called before any of them is iterated share
        the queued result: the first one iterated gets it (a later one asks
        again), so a caller may queue a scan that a callee repeats."""
        if limit is not None and limit <= 0:
            return iter(())
        if start is not None and stop is not None and start >= stop:
            return iter(())
        if not self._open:
            raise StoreClosedError("transaction is finished")
        args = (start, stop, reverse, limit)
        token = object()
        pending = self._unclaimed.get(args)
        if pending is None:
            chunk = _FIRST_CHUNK if limit is None else min(limit, _MAX_CHUNK)
            pending = _Pending(args, chunk)
            # Writes made before this scan are sent before it.
            self._queue.extend((q, p, None) for q, p in self._flush_statements())
            self._dirty.clear()
            q, params = self._scan_query(start, stop, reverse, chunk)
            self._queue.append((q, params, pending))
            self._unclaimed[args] = pending
        return self._scan(pending, token)

    def _scan_query(
        self, start: bytes | None, stop: bytes | None, reverse: bool, chunk: int
    ) -> tuple[Any, list[Any]]:
        q = self._q.scan(start is not None, stop is not None, reverse)
        params: list[Any] = [b for b in (start, stop) if b is not None]
        params.append(chunk)
        return q, params

    def _scan(self, pending: _Pending, token: object) -> Iterator[tuple[bytes, bytes]]:
        start, stop, reverse, limit = pending.args
        chunk = pending.chunk
        if pending.owner is None:  # the first one iterated gets the queued result
            pending.owner = token
            if self._unclaimed.get(pending.args) is pending:
                del self._unclaimed[pending.args]
        if pending.owner is token:
            if pending.rows is None:
                self._run(None, None)  # sends the queue, this scan's first chunk with it
            rows = pending.rows
        else:  # another identical scan was iterated first: ask again
            q, params = self._scan_query(start, stop, reverse, chunk)
            rows = self._run(q, params).fetchall()
        left = limit
        while True:
            assert rows is not None
            for row in rows:
                yield row[0], row[1]
            if left is not None:
                left -= len(rows)
                if left <= 0:
                    return
            if len(rows) < chunk:
                return
            last = rows[-1][0]
            if reverse:
                stop = last
            else:
                start = last + b"\x00"  # the smallest key after the last one
            chunk = min(chunk * 4, _MAX_CHUNK)
            if left is not None:
                chunk = min(chunk, left)
            q, params = self._scan_query(start, stop, reverse, chunk)
            rows = self._run(q, params).fetchall()


class _Pending:
    """A scan's first chunk: queued, then its rows."""

    __slots__ = ("args", "chunk", "cur", "owner", "rows")

    def __init__(self, args: tuple[Any, ...], chunk: int) -> None:
        self.args = args
        self.chunk = chunk
        self.cur: Any = None
        self.owner: object | None = None
        self.rows: list[Any] | None = None


def _inside(k: bytes, start: bytes | None, stop: bytes | None) -> bool:
    return (start is None or k >= start) and (stop is None or k < stop)


class _Call:
    """One ``transact`` call in a group commit: its function, and what it
    gave. A call queued behind a leader waits on ``wake`` (a lock held from
    the start), released once: when it is done, or when its thread is to
    lead."""

    __slots__ = ("done", "error", "fn", "result", "wake", "withdrawn")

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False
        self.withdrawn = False  # its caller was interrupted while it waited
        self.wake = _allocate_lock()
        self.wake.acquire()


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


class PostgresStore(Store):
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
        # transact's group commit: calls waiting for a leader (see transact)
        self._calls: list[_Call] = []
        self._calls_lock = threading.Lock()
        self._leader: _Call | None = None
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

    # -- connections ------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"{self!r} is closed")
        if os.getpid() != self._pid:
            self._after_fork()

    def _after_fork(self) -> None:
        # A forked child must not use (or close: that would end the parent's
        # sessions) the parent's connections: it gets a pool of its own.
        if self._make_pool is None:
            raise KVError(
                "a PostgresStore opened on a pool cannot be used after fork(); "
                "open a new one in the child"
            )
        _ABANDONED.append((self._pool, self._lingering))
        self._pid = os.getpid()
        self._pool = self._make_pool()
        self._lingering = _Lingering(self._pool)
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _close_pool, self._pool, self._pid)
        self._write_lock = threading.Lock()
        self._writer = None
        self._calls = []
        self._calls_lock = threading.Lock()
        self._leader = None

    def _getconn(self) -> Any:
        """A connection of the pool, ready for our statements."""
        return self._wait_for_connection(lingering=False)[0]

    def _connection(self) -> tuple[Any, bool]:
        """A connection for a transaction, and whether it still holds a
        read's snapshot: one of ours that lingers (see _close_txn), else the
        pool's. A pool with every connection out is asked in slices, so a
        caller waiting for it also takes one that another thread of this
        store just let linger, not only one the reaper gives back to the
        pool up to ``_LINGER`` s later."""
        return self._lingering.take() or self._wait_for_connection(lingering=True)

    def _wait_for_connection(self, lingering: bool) -> tuple[Any, bool]:
        from psycopg_pool import PoolTimeout

        start = time.monotonic()
        deadline = start + self.pool_timeout
        dead = 0
        while True:
            left = deadline - time.monotonic()
            # In slices also until this store's first connection: the reason
            # why the pool cannot connect is looked at between two (_unreachable).
            sliced = lingering or not self._connected
            try:
                conn = self._pool.getconn(timeout=min(left, _POOL_SLICE) if sliced else left)
                try:
                    return self._set_up_conn(conn), False
                except StoreUnavailableError:
                    # It died while idle in the pool (a killed session, a
                    # restart): nothing of the caller's was sent. The pool's
                    # other idle connections are checked, and one taken.
                    dead += 1
                    if dead > 2 or time.monotonic() >= deadline:
                        raise
                    self._pool.check()
                    continue
            except PoolTimeout as e:
                got = self._lingering.take() if lingering else None
                if got is not None:
                    return got
                reason = None if self._connected else self._unreachable(start, deadline)
                if time.monotonic() >= deadline:
                    why = f"; the last attempt: {reason}" if reason else ""
                    raise StoreUnavailableError(
                        f"no connection to PostgreSQL within {self.pool_timeout:g} s ({e}){why}"
                    ) from e
            except KVError:
                raise
            except Exception as e:
                raise _translate(e, "connect") from e

    def _unreachable(self, start: float, deadline: float) -> str | None:
        """For a store that has not connected yet, whose pool has failed to
        since the store was made: why, from a connection attempt of our own
        (one a second per store; the pool logs its errors but keeps none).
        Raises StoreUnavailableError when waiting on cannot help: at once for
        a reason that lasts (no such database or role, authentication), and
        ``_FIRST_CONNECT_GRACE`` s into the wait for a server that refuses or
        cannot be found (a wrong host or port; one still starting up: ask
        again). Any other reason (too many clients, starting up, recovery)
        is waited for, up to ``pool_timeout``, as a store that has connected
        waits for a restart."""
        now = time.monotonic()
        if now < self._asked_at + 1.0 or self._pool_errors() <= self._errors_before:
            return self._reason
        self._asked_at = now
        error = self._connect_error(deadline - now)
        self._reason = None if error is None else " ".join(str(error).split())  # one line
        if self._reason is not None and (
            _LASTING.search(self._reason)
            or (_UNREACHABLE.search(self._reason) and now >= start + _FIRST_CONNECT_GRACE)
        ):
            raise StoreUnavailableError(f"cannot connect to PostgreSQL: {self._reason}") from error
        return self._reason

    def _pool_errors(self) -> int:
        """The connection attempts the pool has failed (since it was made)."""
        try:
            return int(self._pool.get_stats().get("connections_errors", 0))
        except Exception:
            return 0

    def _connect_error(self, left: float) -> Exception | None:
        """The error of a connection attempt with the pool's settings, or
        None when it connects; it gives up within ``left`` s."""
        pool = self._pool
        try:
            # (psycopg_pool 3.3: the conninfo and kwargs may be functions returning them)
            conninfo = pool.conninfo() if callable(pool.conninfo) else pool.conninfo
            kwargs = dict((pool.kwargs() if callable(pool.kwargs) else pool.kwargs) or {})
            limit = max(1, int(min(float(kwargs.get("connect_timeout") or left), left)))
            kwargs["connect_timeout"] = limit
            pool.connection_class.connect(conninfo, **kwargs).close()
        except Exception as e:
            return e
        return None

    def _set_up_conn(self, conn: Any) -> Any:
        """A connection just taken from the pool, set up for our statements."""
        self._connected = True
        if not conn.autocommit:
            conn.autocommit = True  # transactions are explicit BEGIN ... COMMIT
        # No prepared statements of psycopg's: its cache can name a statement
        # the server no longer has (a ROLLBACK's result makes it queue a
        # DEALLOCATE ALL, sent after the next statement it prepares). Ours
        # are prepared by name, each the first time a connection needs it
        # (_exchange).
        conn.prepare_threshold = None
        if conn not in self._adapted:  # our arrays go as they are (_bytea_array)
            _register_arrays(conn)
            self._adapted.add(conn)
            self._q.render(conn)
            if self._owns_pool:
                try:
                    row = conn.execute("SHOW default_transaction_isolation").fetchone()
                except Exception as e:
                    self._putconn(conn, lost=True)
                    raise _translate(e, "connect") from e
                self._serializable[conn] = bool(row and row[0] == "serializable")
        return conn

    def _putconn(self, conn: Any, lost: bool) -> None:
        _give_back(self._pool, conn, lost)

    def _reconnect(self, txn: _PGTxn) -> bool:
        """Swap a dead connection under a transaction that has sent nothing
        yet; False when the store cannot (the error then propagates)."""
        self._putconn(txn._conn, lost=True)
        try:
            self._pool.check()  # after a restart every idle connection is dead
            conn = self._getconn()
        except Exception:
            txn._conn = _DeadConn()
            txn.lost = True
            return False
        txn._conn = conn
        txn._cursor = None  # the next statement makes one on the new connection
        txn._pre_rollback = False  # a fresh connection has no snapshot to end
        return True

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
                conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"kvsaver.kv:{self.table}",)
                )
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

    # -- the Store protocol ----------------------------------------------------------
    def read(self) -> _ReadContext:
        return _ReadContext(self)

    def write(self) -> _WriteContext:
        return _WriteContext(self)

    def transact(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(txn)`` in a SERIALIZABLE transaction and commit. Reruns
        ``fn`` on a fresh transaction after a serialization failure, a
        deadlock, or a connection lost before ``COMMIT`` was sent (bounded by
        ``retries``, exponential backoff with jitter); an exception of ``fn``
        rolls back its changes and reaches the caller. ``fn`` must act only
        through ``txn``, and may run more than once.

        Group commit (a graph's put_writes and put of one step come at once
        from two threads, which would otherwise often wait for each other's
        commit): calls made while another thread's transaction is running
        are queued, and the next leader runs all of them in one
        transaction, one after the other (each sees the changes of those
        before it), and commits them with one round trip and one WAL flush.
        A function that raises undoes only its own changes (they are still
        buffered in this process: else the transaction is rolled back and
        the others rerun) and its error reaches only its caller; a failed
        commit is every caller's.

        Speculation (a put in one round trip, COMMIT included): ``fn``'s
        first reads are answered from a cache of the values this process's
        committed write transactions wrote and read (a key not cached is
        assumed absent: a new checkpoint's keys are), with no round trip; one
        guard statement, sent in the same pipeline as the writes and
        ``COMMIT``, checks under SERIALIZABLE that every such key still holds
        the value assumed, and fails the transaction when one does not. Then
        (or when a function raised an ordinary exception after a guess,
        since a wrong guess may be why) the functions are rerun at once
        reading from the server, so a wrong guess costs a rerun, never a
        wrong write. Reads after the transaction's first round trip are
        always real. Speculation pauses while more than a quarter of recent
        guesses fail (another machine writing the same threads)."""
        self._check_open()
        if self.readonly:
            raise ReadOnlyError(f"{self!r} was opened read-only")
        if self._writer == threading.get_ident():
            raise RuntimeError("a write transaction is already open in this thread")
        call = _Call(fn)
        with self._calls_lock:
            self._calls.append(call)
            lead = self._leader is None
            if lead:
                self._leader = call
        try:
            if not lead:
                # Until a leader ran it, or made this thread lead (woken by a
                # release; the check covers a wake-up an interrupt swallowed).
                while not call.wake.acquire(timeout=_POLL_SECONDS):
                    if call.done or self._leader is call:
                        break
            if not call.done:
                self._lead(call)
        except BaseException:  # an interrupt: no call of ours left queued or leading
            self._withdraw(call)
            raise
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[no-any-return]

    def _lead(self, call: _Call) -> None:
        """Run every queued call (``call`` among them) as one batch, then make
        the first call queued meanwhile the next leader."""
        batch: list[_Call] = []
        try:
            self._enter_writer()  # write() blocks of other threads wait (and we for them)
            try:
                with self._calls_lock:
                    batch, self._calls = self._calls, []
                self._run_batch(batch)
            finally:
                self._leave_writer()
        except BaseException as e:
            # Not run (the store closed, an interrupt): the next leader runs
            # the others' calls (an interrupt while committing made them done,
            # with CommitUnknownError); an interrupt is this thread's alone.
            # This call leaves the queue (not taken when _enter_writer failed):
            # else it would be made the next leader, done, and lead nobody.
            others = [c for c in batch if not c.done and c is not call]
            with self._calls_lock:
                if call in self._calls:
                    self._calls.remove(call)
                self._calls[:0] = others
            if not isinstance(e, Exception):
                raise
            if not call.done:
                call.error, call.done = e, True
        finally:
            with self._calls_lock:
                nxt = self._next_leader()
            for c in batch:
                if c is not call and c.done:
                    c.wake.release()
            if nxt is not None:
                nxt.wake.release()

    def _withdraw(self, call: _Call) -> None:
        """An interrupted caller's call leaves the queue, and the lead passes
        on if it had just been handed to it. A call a leader has taken
        already is run (or was): as with any interrupted commit, the caller
        cannot know whether it was applied."""
        call.withdrawn = True  # a leader that took it already skips it if it can
        with self._calls_lock:
            if call in self._calls:
                self._calls.remove(call)
            if self._leader is not call:
                return
            nxt = self._next_leader()
        if nxt is not None:
            nxt.wake.release()

    def _next_leader(self) -> _Call | None:
        """Under ``_calls_lock``: the first call queued leads next (the
        caller wakes it), or none does."""
        self._leader = self._calls[0] if self._calls else None
        return self._leader

    def _close_quietly(self, txn: _PGTxn) -> None:
        try:
            self._close_txn(txn, commit=False)
        except Exception:
            pass

    def _run_batch(self, batch: list[_Call]) -> None:
        """One transaction for ``batch``'s functions, committed once; reruns
        as ``transact`` says; every call ends done, with its result or error
        (an interrupt propagates: see _lead). A call whose function raised
        where its changes could not be undone alone leaves the batch, the
        transaction is rolled back, and it runs after the others' commit, by
        itself: its error is then that of a function run as if alone, after
        them (not one seen in changes of theirs that were never committed)."""
        later: list[_Call] = []
        self._run_together(batch, later)
        for c in later:
            self._run_together([c], later)

    def _run_together(self, batch: list[_Call], later: list[_Call]) -> None:
        attempt = 0
        speculate = self.speculate and self._misses < _SPECULATE_BELOW
        if self.speculate and not speculate:
            self._misses *= 0.95  # so that it is tried again some time
        todo = list(batch)
        while todo:
            try:
                txn = self._open_txn(write=True)
            except StoreUnavailableError as e:
                if attempt >= self.retries:
                    for c in todo:
                        if not c.done:
                            c.error, c.done = e, True
                    return
            else:
                txn.speculate = speculate
                try:
                    ran, raised, error = self._run_calls(txn, todo)
                except BaseException:  # an interrupt in a function: nothing committed
                    self._close_quietly(txn)
                    raise
                committing = error is None and raised is None
                try:
                    self._close_txn(txn, commit=committing)
                except Exception as e:
                    error = error or e
                except BaseException:
                    if committing:  # an interrupt while committing: the batch's fate is unknown
                        unknown = CommitUnknownError(
                            "the thread committing this call's transaction (a group commit) "
                            "was interrupted; the transaction may or may not have been applied"
                        )
                        for c in ran:  # (one whose function raised keeps its error)
                            c.error, c.done = c.error or unknown, True
                    raise
                if txn.assumed_keys:
                    wrong = isinstance(error, SpeculationFailed) or raised is not None
                    self.speculations[0 if error is None and raised is None else 1] += 1
                    self._misses = self._misses * 0.9 + (0.1 if wrong else 0.0)
                    if error is not None or raised is not None:
                        self._cache.forget(txn.assumed_keys)
                    if wrong:
                        speculate = False
                        continue  # at once, every function reading from the server
                if raised is not None:  # the others run again; it, alone, after them
                    if len(todo) > 1:
                        later.append(raised)
                    else:
                        raised.done = True  # run alone: its error is final
                    todo.remove(raised)
                    continue
                if error is None:
                    for c in ran:
                        c.done = True
                    return
                if not _retryable(error, txn) or attempt >= self.retries:
                    for c in todo:
                        if not c.done:  # not those whose own error was final
                            c.error, c.done = error, True
                    return
            attempt += 1
            time.sleep(min(2.0, 0.01 * 2**attempt) * (0.5 + random.random()))

    def _run_calls(
        self, txn: _PGTxn, todo: list[_Call]
    ) -> tuple[list[_Call], _Call | None, BaseException | None]:
        """Run the functions of ``todo`` in ``txn``: (the calls whose function
        returned, or raised and had its changes undone alone (its error kept
        for when the transaction commits; rerun with the others if it does
        not), a call whose function raised and whose changes could not be
        undone alone (the transaction must be rolled back), the store's own
        error that failed the transaction)."""
        ran: list[_Call] = []
        alone = len(todo) == 1
        for c in todo:
            if c.done or c.withdrawn:
                continue
            mark = None if alone else txn._mark()
            c.result, c.error = None, None
            try:
                c.result = c.fn(txn)
                if txn.failed is not None:  # it caught the store's error: nothing can commit
                    c.result = None
                    return ran, None, txn.failed
            except Exception as e:
                c.error = e
                if txn.failed is not None and _retryable(txn.failed, txn):
                    return ran, None, txn.failed  # a conflict, a lost connection: all again
                if txn.assumed_keys:
                    return ran, c, None  # maybe a wrong guess: all again, reading for real
                if mark is not None and txn._restore(mark):
                    ran.append(c)
                    continue
                return ran, c, None
            ran.append(c)
        return ran, None, None

    def _ask(self, query: Any, params: Any, deadline: float) -> list[Any] | None:
        """The rows of ``query`` on a pooled connection, after a commit whose
        connection broke; a dead connection (after a restart every idle one
        is) is dropped and the next one tried until ``deadline``. None: no
        answer by then."""
        while True:
            try:
                conn = self._getconn()
            except KVError:
                return None
            rows = None
            try:
                rows = conn.execute(query, params).fetchall()
            except Exception:
                pass
            finally:
                self._putconn(conn, rows is None)
            if rows is not None or time.monotonic() > deadline:
                return rows
            time.sleep(0.05)

    def _fate(self, xid: int | None, wait: float = 2.0) -> str | None:
        """'committed', 'aborted' or None (unknown) for a transaction whose
        COMMIT was lost on the way: asked on a new connection, waiting a
        little while the server still shows it in progress."""
        if xid is None:
            return None
        deadline = time.monotonic() + wait
        while True:
            rows = self._ask("SELECT txid_status(%s)", (xid,), deadline)
            status = rows[0][0] if rows else None
            if status in ("committed", "aborted"):
                return str(status)
            if rows is None or time.monotonic() > deadline:  # no answer, or still in progress
                return None
            time.sleep(0.05)

    def _holds(self, written: dict[bytes, bytes | None], wait: float = 2.0) -> bool:
        """Whether the table holds every write of a transaction whose commit
        was lost on the way with its id (the connection broke before the
        result came back): every value as written, every deleted key absent.
        Then it committed (or another transaction wrote the very same, which
        leaves the caller's write there as well). False when it does not, or
        when it cannot be read: the outcome stays unknown."""
        from psycopg import sql

        query = sql.SQL("SELECT key, value FROM {} WHERE key = ANY(%s)").format(self._q.ident)
        rows = self._ask(query, (list(written),), time.monotonic() + wait)
        if rows is None:
            return False
        stored = {bytes(k): bytes(v) for k, v in rows}
        return all(
            (k not in stored) if v is None else stored.get(k) == v for k, v in written.items()
        )

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


_XID = "SELECT txid_current()"
_IDLE = 0  # libpq's PQTRANS_IDLE: no transaction open on the connection


def _retryable(error: BaseException, txn: _PGTxn) -> bool:
    if isinstance(error, CommitUnknownError):
        return False
    if isinstance(error, StoreConflictError):
        return True
    return isinstance(error, StoreUnavailableError) and error is txn.failed


_LINGER = 0.5  # seconds a read's snapshot may stay open waiting for the next transaction
_POOL_SLICE = 0.1  # seconds between looks at lingering connections while the pool is empty
# A store's first connection (_unreachable): reasons no wait cures, raised at
# once; a server that refuses or cannot be found, raised this many seconds into
# the wait (a server still starting refuses for a moment); others waited for.
_LASTING = re.compile(
    r"does not exist|authentication failed|no pg_hba\.conf entry|no password supplied"
    r"|permission denied|invalid (?:dsn|connection option|sslmode)",
    re.IGNORECASE,
)
_UNREACHABLE = re.compile(
    r"connection refused|could not translate host name|name or service not known"
    r"|no route to host|network is unreachable|no such file or directory",
    re.IGNORECASE,
)
_FIRST_CONNECT_GRACE = 3.0


class _Lingering:
    """Connections kept for a store's next transaction: (since when, the
    connection, whether it still holds a read's snapshot to roll back). A
    reaper thread gives back to the pool what lingers ``_LINGER`` seconds
    unused. It holds this object and the pool, not the store: a store
    dropped without ``close()`` still gives its connections back (a shared
    pool would lose them for good)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.items: list[tuple[float, Any, bool]] = []
        self.lock = threading.Lock()
        self.reaper: threading.Thread | None = None
        self.added = False  # since the reaper's last check

    def add(self, conn: Any, dirty: bool) -> None:
        with self.lock:
            self.items.append((time.monotonic(), conn, dirty))
            self.added = True
            if self.reaper is None:
                self.reaper = threading.Thread(
                    target=self._reap, name="kvsaver-pg-reaper", daemon=True
                )
                self.reaper.start()

    def take(self) -> tuple[Any, bool] | None:
        """The connection kept last, and whether it holds a read's snapshot."""
        with self.lock:
            if self.items:
                _, conn, dirty = self.items.pop()
                return conn, dirty
        return None

    def drain(self, older_than: float | None) -> list[tuple[float, Any, bool]]:
        """Take out what lingers since before ``older_than`` (None: all)."""
        with self.lock:
            if older_than is None:
                out, self.items = self.items, []
            else:
                out = [e for e in self.items if e[0] < older_than]
                self.items = [e for e in self.items if e[0] >= older_than]
            return out

    def release(self, entries: list[tuple[float, Any, bool]]) -> None:
        for _, conn, dirty in entries:
            lost = False
            if dirty:
                try:
                    conn.execute("ROLLBACK")
                except Exception:
                    lost = True
            _give_back(self.pool, conn, lost)

    def _reap(self) -> None:
        # Ends when nothing lingers and nothing was added since the last
        # check: a store in steady use has its connection out during each
        # transaction, so a reaper that ended whenever nothing lingered would
        # be started again at nearly every transaction.
        while True:
            time.sleep(_LINGER / 2)
            old = self.drain(time.monotonic() - _LINGER)
            if old:
                self.release(old)
            with self.lock:
                if not self.items and not self.added:
                    self.reaper = None
                    return
                self.added = False


def _give_back(pool: Any, conn: Any, lost: bool) -> None:
    if isinstance(conn, _DeadConn):
        return
    if lost and not conn.closed:
        conn.close()  # the pool replaces it
    try:
        pool.putconn(conn)
    except Exception:
        if pool.closed:  # the store was closed meanwhile: nothing to give back to
            return
        raise


def _close_pool(pool: Any, pid: int) -> None:
    if os.getpid() == pid:
        pool.close()


class _DeadConn:
    """Stands in for a connection that could not be replaced."""

    closed = True
    broken = True


def _own_result(results: Sequence[Any], conn: Any) -> Any:
    """The result of the statement just sent: the last one. Results before
    it belong to statements sent earlier and not read yet (a lingering
    read's ROLLBACK, sent by the reaper while this connection was idle), as
    happens with two processes writing at once; taking the first result then
    fails (e.g. "too many values to unpack"). One of those that failed fails
    this call too (it is not ours to ignore)."""
    from psycopg import errors, pq

    for res in results[:-1]:
        if res.status not in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
            raise errors.error_from_result(res, encoding=conn.info.encoding)
    return results[-1]
