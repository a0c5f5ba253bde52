"""The libpq exchange, below psycopg's cursors, for fewer round trips and less
CPU on both sides: several statements sent in one pipeline, one round trip,
each prepared by name the first time a connection needs it rather than
parsed and planned at every run (``_exchange``, ``_prepared_names``); a
connection's state read without a round trip (``_ended``). It knows
statements and connections, not transactions.

Only psycopg's documented API: ``Connection.pgconn`` (its libpq wrapper,
``psycopg.pq``), driven by a loop of our own that waits on the socket as
libpq's documentation describes for nonblocking and pipeline mode
(``_flush``, ``_next_result``); results decoded here (binary bytea is the
value's bytes, integers big-endian: ``_load``); errors made from their
SQLSTATE with ``psycopg.errors.lookup`` (``_error``). psycopg's generators,
``Connection.wait`` and ``Transformer`` are its internals and change
between its releases; its cursors cost client CPU at every statement.
"""

from __future__ import annotations

import select
import struct
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from ..store import MissingDependencyError
from .errors import _unprepared
from .statements import _Stmt


def _psycopg() -> Any:
    try:
        import psycopg
        import psycopg_pool  # noqa: F401
    except ImportError as e:  # .ci/bare_install.py runs this without the extra
        raise MissingDependencyError(
            "PostgresStore needs psycopg 3 and psycopg_pool: pip install 'kvsaver[postgres]'"
        ) from e
    if not _LIB:
        from psycopg import errors, pq

        _LIB.update(errors=errors, pq=pq, OperationalError=errors.OperationalError)
    return psycopg


# What the hot paths use of psycopg, imported once (an import statement in a
# function looks every name up again, at every put and read); libpq's result
# statuses (PGRES_*, psycopg.pq.ExecStatus) and connection and transaction
# statuses (psycopg.pq.ConnStatus, psycopg.pq.TransactionStatus), as ints: an
# enum's comparison costs more at every result.
_LIB: dict[str, Any] = {}
_COMMAND_OK, _TUPLES_OK, _FATAL_ERROR, _PIPELINE_SYNC = 1, 2, 7, 10
_BAD = 1  # CONNECTION_BAD
_IDLE = 0  # PQTRANS_IDLE: no transaction open on the connection
_SQLSTATE = ord("C")  # PG_DIAG_SQLSTATE (psycopg.pq.DiagnosticField.SQLSTATE)


def _error(res: Any, conn: Any) -> Exception:
    """The exception psycopg raises for a failed result: the class of its
    SQLSTATE, with libpq's message."""
    state = (res.error_field(_SQLSTATE) or b"").decode("ascii", "replace")
    err = _error_class(state)(_LIB["pq"].error_message(res, conn.info.encoding))
    if state and err.sqlstate != state:  # a code psycopg has no class of its own for
        err.sqlstate = state
    return err


def _error_class(state: str) -> Any:
    """``psycopg.errors.lookup(state)``; for a code it does not know (a newer
    server's), the DB-API class of the code's class (57000 for 57Pxx:
    OperationalError), as psycopg raises it."""
    errors = _LIB["errors"]
    try:
        return errors.lookup(state)
    except KeyError:
        pass
    try:
        generic = errors.lookup(state[:2] + "000")
    except KeyError:
        return errors.DatabaseError
    dbapi = (
        errors.DataError,
        errors.OperationalError,
        errors.IntegrityError,
        errors.InternalError,
        errors.ProgrammingError,
        errors.NotSupportedError,
    )
    return next((c for c in dbapi if issubclass(generic, c)), errors.DatabaseError)


def _lost(pgconn: Any) -> Exception:
    return _LIB["OperationalError"](
        f"the connection is lost: {_LIB['pq'].error_message(pgconn) or 'no more results'}"
    )


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
_BYTEA, _INTS = 17, frozenset((20, 21, 23))  # bytea; int8, int2, int4


def _load(res: Any, conn: Any) -> list[tuple[Any, ...]]:
    """A binary result's rows as tuples: bytea as the value's bytes (in
    binary format a bytea is its bytes), integers big-endian (PostgreSQL's
    binary format); any other type through the connection's own loader
    (``AdaptersMap.get_loader``; none of our statements returns one)."""
    n, get, nf, ftype = res.ntuples, res.get_value, res.nfields, res.ftype
    if nf == 2 and ftype(0) == _BYTEA and ftype(1) == _BYTEA:  # scans and get_many
        return [(get(i, 0), get(i, 1)) for i in range(n)]
    if nf == 1 and ftype(0) == _BYTEA:  # get
        return [(get(i, 0),) for i in range(n)]
    loads = [_loader(ftype(c), conn) for c in range(nf)]
    return [tuple(f(get(i, c)) for c, f in enumerate(loads)) for i in range(n)]


def _loader(oid: int, conn: Any) -> Any:
    if oid == _BYTEA:
        return lambda v: v
    if oid in _INTS:
        return lambda v: None if v is None else int.from_bytes(v, "big", signed=True)
    cls = conn.adapters.get_loader(oid, _LIB["pq"].Format.BINARY)
    if cls is None:
        raise _LIB["errors"].InterfaceError(f"no binary loader for the type of oid {oid}")
    load = cls(oid, conn).load
    return lambda v: None if v is None else load(v)


# -- waiting on the socket --------------------------------------------------------
# libpq's nonblocking mode (its "Asynchronous Command Processing" chapter):
# PQflush until it returns 0, waiting for the socket to be writable (and
# reading what the server sends meanwhile, lest both ends wait for the
# other); then, while PQisBusy, wait for it to be readable and PQconsumeInput;
# then PQgetResult does not block. poll() where there is one (select() cannot
# wait on a descriptor past FD_SETSIZE). A signal (Ctrl-C) interrupts the wait
# (Python retries an interrupted poll after running the handler, PEP 475).


def _wait(fd: int, write: bool, timeout: float | None = None) -> bool:
    """Until ``fd`` is readable (``write``: or writable), or ``timeout``
    seconds went by; True: readable."""
    if _POLL is None:
        r, _, _ = select.select([fd], [fd] if write else [], [], timeout)
        return bool(r)
    p = _POLL()
    p.register(fd, _POLLRW if write else _POLLIN)
    ready = p.poll(None if timeout is None else timeout * 1000)  # one fd: one entry
    return bool(ready) and bool(ready[0][1] & _POLLIN)


_POLL = getattr(select, "poll", None)  # none on Windows: select() there
_POLLIN = _POLLRW = 0
if _POLL is not None:
    _POLLIN = select.POLLIN | select.POLLERR | select.POLLHUP
    _POLLRW = _POLLIN | select.POLLOUT


def _flush(pgconn: Any) -> None:
    """Send everything libpq holds for the server."""
    while pgconn.flush():
        if _wait(pgconn.socket, True):
            pgconn.consume_input()


def _next_result(pgconn: Any) -> Any:
    """The next result (None: the end of a statement's results), waiting on
    the socket while libpq has not received it whole."""
    if pgconn.is_busy():
        fd = pgconn.socket
        while True:
            _wait(fd, False)
            pgconn.consume_input()
            if not pgconn.is_busy():
                break
    return pgconn.get_result()


def _round_trip(pgconn: Any, results: list[Any]) -> None:
    """Flush the pipeline, then append each statement's last result to
    ``results`` (None: it had none; kept by the caller if the connection
    breaks) up to the pipeline's Sync. A connection lost after a statement
    failed ends that statement's results (the failure says why: a restart's
    notice)."""
    _flush(pgconn)
    last = None
    failed = False
    while True:
        try:
            res = _next_result(pgconn) if pgconn.is_busy() else pgconn.get_result()
        except _LIB["OperationalError"]:
            if not failed:
                raise
            res = None
        if res is None:  # the end of a statement's results
            if last is None and pgconn.status == _BAD:
                raise _lost(pgconn)  # nothing more will come
            results.append(last)
            last = None
            failed = False
            continue
        status = res.status
        if status == _PIPELINE_SYNC:
            return
        last = res
        if status == _FATAL_ERROR:
            failed = True


def _results(pgconn: Any) -> list[Any]:
    """The results of what was sent outside pipeline mode, flushed first,
    up to the end of its results."""
    _flush(pgconn)
    out: list[Any] = []
    while True:
        try:
            res = _next_result(pgconn)
        except _LIB["OperationalError"]:
            if any(r.status == _FATAL_ERROR for r in out):
                return out
            raise
        if res is None:
            if not out and pgconn.status == _BAD:
                raise _lost(pgconn)
            return out
        out.append(res)


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
    forgotten, to be prepared again next time. The connection is this
    transaction's alone (no other thread uses it meanwhile). Lost or
    interrupted mid-way (Ctrl-C), it is closed: never left half-read."""
    pgconn = conn.pgconn
    names = _prepared_names(conn)
    parses: list[bytes | None] = []  # per result: the name its Parse prepares
    results: list[Any] = []
    broken = True
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
        _round_trip(pgconn, results)
        pgconn.exit_pipeline_mode()
        broken = False
    except _LIB["OperationalError"] as e:
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
    out: list[_Rows] = []
    error: Exception | None = None
    for name, res in zip(parses, results):
        status = None if res is None else res.status
        if status == _FATAL_ERROR:
            if error is None:
                error = _error(res, conn)
        elif name is not None:
            if status == _COMMAND_OK:
                names.add(name)
        elif status == _TUPLES_OK:
            out.append(_Rows(_load(res, conn), res.ntuples))
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


def _own_result(results: Sequence[Any], conn: Any) -> Any:
    """The result of the statement just sent: the last one. Results before
    it belong to statements sent earlier and not read yet (a lingering
    read's ROLLBACK, sent by the reaper while this connection was idle), as
    happens with two processes writing at once; taking the first result then
    fails (e.g. "too many values to unpack"). One of those that failed fails
    this call too (it is not ours to ignore)."""
    for res in results[:-1]:
        if res.status not in (_COMMAND_OK, _TUPLES_OK):
            raise _error(res, conn)
    return results[-1]


def _ended(conn: Any) -> bool:
    """True when an idle connection has already been ended by the server
    (its closing message or end of stream is waiting on the socket), found
    without a round trip: a poll of the socket."""
    try:
        pgconn = conn.pgconn
        for _ in range(3):  # the closing message, then the end of the stream
            if not _wait(pgconn.socket, False, 0):
                return False
            pgconn.consume_input()
            pgconn.is_busy()  # parses what arrived (a closing message ends it)
            if pgconn.status != 0:  # not CONNECTION_OK
                return True
    except Exception:
        return True
    return bool(conn.broken or conn.closed)
