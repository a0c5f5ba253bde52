"""What a PostgreSQL failure means to a caller: the store's own exceptions, and
psycopg's errors translated into them (a conflict to rerun, a lost connection,
a timeout, a commit of unknown outcome). Every part that catches a psycopg
error classifies it here, so that all of them agree on what it means.
"""

from __future__ import annotations

from ..store import KeyTooLongError, KVError, ReadOnlyError, StoreFullError


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


def _unprepared(e: BaseException) -> bool:
    """A prepared statement of ours that the server does not have."""
    from psycopg import errors

    return isinstance(e, errors.InvalidSqlStatementName)


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
