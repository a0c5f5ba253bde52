"""``kvsaver.lock``: what keeps compaction and the store's openers apart,
across processes.

Every open ``LMDBStore`` holds a shared ``flock`` on it (``_hold_shared``,
taken before LMDB opens its files); compaction takes it exclusively, and
probes LMDB's own ``lock.mdb`` too, for openers that are not ours
(``_refuse_foreign_openers``).
"""

from __future__ import annotations

import fcntl
import os
import time

from ..store import StoreBusyError

LOCK_FILE = "kvsaver.lock"  # shared flock while open, exclusive while compacting
# how the files beside LMDB's are named: the lock above, a caller's (``directory``)
CALLER_FILES = "kvsaver."
_COMPACTION_WAIT_SECONDS = 60.0


def _hold_shared(path: str, readonly: bool) -> int | None:
    """Open ``path/kvsaver.lock`` and hold a shared flock on it, waiting while
    a compaction holds it exclusively. None when a read-only opener cannot
    create the file (a read-only directory: nobody can compact it either)."""
    lock_path = os.path.join(path, LOCK_FILE)
    try:
        fd = os.open(lock_path, (os.O_RDONLY if readonly else os.O_RDWR) | os.O_CREAT, 0o644)
    except OSError:
        if not readonly:
            raise
        try:
            fd = os.open(lock_path, os.O_RDONLY)
        except OSError:
            return None
    deadline = time.monotonic() + _COMPACTION_WAIT_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise StoreBusyError(
                    f"{path} is being compacted by another process (it holds {lock_path} "
                    f"exclusively) for more than {_COMPACTION_WAIT_SECONDS:.0f} s; "
                    "try again when it has finished"
                ) from None
            time.sleep(0.05)


def _refuse_foreign_openers(path: str) -> None:
    """LMDB holds a shared fcntl lock on byte 0 of lock.mdb in every process
    that has the environment open; an exclusive test lock fails if one does.
    (Our process has no environment on ``path`` open, so no lock of ours is
    touched when this descriptor closes.)"""
    lock_mdb = os.path.join(path, "lock.mdb")
    try:
        fd = os.open(lock_mdb, os.O_RDWR)
    except FileNotFoundError:
        return
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    except OSError:
        raise StoreBusyError(
            f"cannot compact {path}: another process has it open through LMDB "
            f"({lock_mdb} is locked); close it first"
        ) from None
    finally:
        os.close(fd)
