"""The libpq exchange, below psycopg's cursors, for fewer round trips and less
CPU on both sides: psycopg imported on first use (``_psycopg``; ``_LIB``: the
few of its names the hot paths use); several statements sent in one pipeline,
one round trip, each prepared by name the first time a connection needs it
rather than parsed and planned at every run (``_exchange``,
``_prepared_names``); a connection's state read without a round trip
(``_ended``). It knows statements and connections, not transactions.
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
_IDLE = 0  # libpq's PQTRANS_IDLE: no transaction open on the connection


def _error(res: Any, conn: Any) -> Exception:
    """The exception psycopg raises for a failed result."""
    return _LIB["errors"].error_from_result(res, encoding=conn.info.encoding)


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
