"""``compact_lmdb``: rewrite a store offline into a dense new file.

An LMDB file never shrinks: pages freed by deletes are reused, never
returned. Compaction appends every record, in key order, to a new file
beside ``data.mdb`` (full pages, no free ones), which then replaces it, so a
crash leaves the old or the new file. It runs only while nobody has the
store open, which ``kvsaver.lock`` tells (``lockfile``).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from dataclasses import dataclass

import lmdb

from .._fs import fsync_dir
from ..store import CorruptStoreError, StoreBusyError

# _REGISTRY_LOCK through the module: a forked child sets it anew.
from . import environment as _environment
from .datafile import _check_data_file
from .environment import _DEFAULT_MAP_SIZE, _registered
from .growth import _PAGE
from .lockfile import LOCK_FILE, _refuse_foreign_openers


@dataclass(frozen=True)
class CompactResult:
    """File sizes of a compaction, in bytes."""

    before: int
    after: int


def compact_lmdb(
    path: str | os.PathLike[str], *, progress: Callable[[int, int], None] | None = None
) -> CompactResult:
    """Rewrite the LMDB store at ``path`` into a dense new file (offline).

    Refuses with ``StoreBusyError`` while any process (this one included) has
    the store open; openers that arrive during the compaction wait for it.
    ``progress(records_copied, records_total)`` is called as it goes. The new
    file is built beside ``data.mdb`` (``data.mdb.compact``) and replaces it
    atomically; a crash leaves the old store (and a stale temporary file,
    overwritten by the next compaction).
    """
    path = os.path.abspath(os.fspath(path))
    data = os.path.join(path, "data.mdb")
    if not os.path.isfile(data):
        raise CorruptStoreError(f"{path} is not an LMDB store (no data.mdb)")
    with _environment._REGISTRY_LOCK:
        busy = _registered(os.path.realpath(path)) is not None
    if busy:
        raise StoreBusyError(
            f"cannot compact {path}: this process has it open; close every "
            "LMDBStore/KVSaver on it first (compaction is offline)"
        )
    fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreBusyError(
                f"cannot compact {path}: another process has it open (it holds "
                f"{LOCK_FILE}); close it first (compaction is offline)"
            ) from None
        _refuse_foreign_openers(path)
        _check_data_file(path)
        before = os.path.getsize(data)
        tmp = data + ".compact"
        try:
            _rebuild(path, tmp, before, progress)
        except (lmdb.InvalidError, lmdb.CorruptedError, lmdb.PageNotFoundError) as e:
            raise CorruptStoreError(f"{data} is damaged, compaction stopped: {e}") from e
        os.replace(tmp, data)
        fsync_dir(path)
        return CompactResult(before=before, after=os.path.getsize(data))
    finally:
        os.close(fd)  # releases the exclusive lock


_COMPACT_BATCH = 20_000  # records per write transaction of the rebuild ...
_COMPACT_BATCH_BYTES = 64 << 20  # ... or bytes, whichever comes first


def _rebuild(path: str, tmp: str, size: int, progress: Callable[[int, int], None] | None) -> None:
    """Copy every record, in key order, into a new file with MDB_APPEND.

    Why not ``copy(compact=True)``: that drops free pages but copies the
    B-tree's pages as they are, and pages filled by ordered inserts are about
    half full (LMDB splits a full page in the middle). Appending in key order
    fills every leaf page, so the copy is close to the size of the records
    themselves (values above ~2 KB still occupy whole overflow pages; that
    rounding is LMDB's, and no copy removes it).

    No lock files on either side: nobody else has the source open (checked by
    the caller) and nobody knows the temporary file.
    """
    try:
        os.unlink(tmp)  # a stale one from an interrupted compaction
    except FileNotFoundError:
        pass
    src = lmdb.open(
        path, readonly=True, lock=False, subdir=True, max_dbs=0, map_size=max(size, _PAGE * 8)
    )
    try:
        total = int(src.stat()["entries"])
        map_size = max(size + (16 << 20), _DEFAULT_MAP_SIZE)
        while True:
            dst = lmdb.open(
                tmp,
                subdir=False,
                lock=False,
                max_dbs=0,
                map_size=map_size,
                sync=False,
                metasync=False,
            )
            try:
                _append_all(src, dst, total, progress)
                dst.sync(True)
                return
            except lmdb.MapFullError:
                map_size *= 2  # denser pages never need more; but be safe
            finally:
                dst.close()
            os.unlink(tmp)
    finally:
        src.close()


def _append_all(
    src: lmdb.Environment,
    dst: lmdb.Environment,
    total: int,
    progress: Callable[[int, int], None] | None,
) -> None:
    done = 0
    with src.begin(buffers=False) as rtxn:
        cur = rtxn.cursor()
        ok = cur.first()
        while ok:
            batch: list[tuple[bytes, bytes]] = []
            size = 0
            while ok and len(batch) < _COMPACT_BATCH and size < _COMPACT_BATCH_BYTES:
                key, value = cur.key(), cur.value()
                batch.append((key, value))
                size += len(key) + len(value)
                ok = cur.next()
            with dst.begin(write=True) as wtxn:
                added = wtxn.cursor().putmulti(batch, append=True)[1]
            if added != len(batch):
                raise CorruptStoreError("compaction: the copy lost records (keys out of order?)")
            done += len(batch)
            if progress is not None:
                progress(done, total)
    if progress is not None:
        progress(done, total)
