"""A store's connections: taken from the pool and set up for our statements;
left lingering for the store's next transaction and given back by a reaper
thread once unused (``_Lingering``); a dead one replaced, a fork handled, a
server that cannot be reached explained; and, after a commit whose connection
broke, the server asked on another what became of it. ``_Connections`` holds
these methods of ``PostgresStore``, whose ``__init__`` makes their state.
"""

from __future__ import annotations

import os
import re
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..group_commit import CommitQueue
from ..store import KVError, StoreClosedError
from .errors import StoreUnavailableError, _translate
from .statements import _register_arrays
from .txn import _PGTxn

if TYPE_CHECKING:
    from .statements import _Queries


_ABANDONED: list[Any] = []  # pools inherited through fork: never closed in the child


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


class _Connections:
    """``PostgresStore``'s connections (see the module's docstring)."""

    if TYPE_CHECKING:  # made by PostgresStore.__init__
        _q: _Queries
        _closed: bool
        _connected: bool
        _asked_at: float
        _reason: str | None
        _pid: int
        pool_timeout: float
        _owns_pool: bool
        _pool: Any
        _make_pool: Callable[[], Any] | None
        _lingering: _Lingering
        _finalizer: Any
        _errors_before: int
        _adapted: weakref.WeakSet[Any]
        _serializable: weakref.WeakKeyDictionary[Any, bool]
        _write_lock: threading.Lock
        _writer: int | None
        _commits: CommitQueue

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
        self._commits = CommitQueue(
            poll_seconds=self._commits.poll_seconds, gathers=self._commits.gathers
        )

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

    # -- a commit whose connection broke: asked on another -----------------
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
