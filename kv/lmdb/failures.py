"""LMDB's failures as this package's errors, and the cleanup after an interrupt.

A damaged page becomes ``CorruptStoreError`` (``_damaged``), a full disk
``StoreFullError`` (``_disk_full``); ``_drop_orphans`` lets go of a
transaction that an interrupt left referenced only by a frame of this package.
"""

from __future__ import annotations

import os

import lmdb

from ..store import CorruptStoreError, StoreFullError

# LMDB finding a damaged page: the store is corrupt, not a bug of ours.
_DAMAGE = (lmdb.CorruptedError, lmdb.PageNotFoundError)


def _damaged(path: str, e: BaseException) -> CorruptStoreError:
    error = CorruptStoreError(
        f"{os.path.join(path, 'data.mdb')} is damaged ({e}); restore it from a backup"
    )
    error.__cause__ = e
    return error


def _finished(txn: lmdb.Transaction) -> bool:
    """Whether LMDB has ended ``txn`` (committed or aborted it)."""
    try:
        txn.id()
    except lmdb.Error:
        return True
    return False


def _drop_orphans(e: BaseException) -> None:
    """An interrupt can land right after LMDB began a transaction and before
    anything of ours recorded it; the interrupted frames then hold it, and an
    open write transaction holds LMDB's writer lock, so the next write of
    this thread would wait for itself. Clearing the locals of this package's
    finished frames in the traceback (it keeps file and line) drops such a
    transaction, and py-lmdb aborts a transaction nobody refers to."""
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__package__") == __package__:  # a module of ours
            try:
                tb.tb_frame.clear()
            except RuntimeError:  # still executing (the caller's own frame)
                pass
        tb = tb.tb_next


def _disk_full(path: str, e: BaseException) -> BaseException:
    """``e``, or a StoreFullError if ``e`` is LMDB failing to write for lack of
    disk space: ENOSPC or EDQUOT, or the EIO that LMDB reports for a short
    write (which leaves the filesystem with no space available)."""
    if not isinstance(e, lmdb.Error) or isinstance(e, lmdb.MapFullError):
        return e
    text = str(e)
    if "Input/output error" in text:
        try:
            st = os.statvfs(path)
        except OSError:
            return e
        if st.f_bavail * st.f_frsize >= 1 << 20:
            return e  # space left: a genuine I/O error
    elif "No space left" not in text and "Disk quota exceeded" not in text:
        return e
    full = StoreFullError(
        f"the disk holding the store at {path} is full ({text}); the write was rolled "
        "back and the store is as it was. Free disk space and retry (deleting threads "
        "or pruning also makes room inside the store, for later writes)"
    )
    full.__cause__ = e
    return full
