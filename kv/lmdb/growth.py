"""How the map and the data file grow, and the delete-only reserve past ``max_size``.

LMDB fails a write with ``MapFullError`` when its map is full, and changes
the map size only while no transaction of the process is open: the map is
grown ahead of need (``ensure_headroom``) and when a write overflows it
(``grow``), with the gate held exclusively. At the cap, a transaction that
only deletes may use a small reserve (``_with_reserve``), so that a full
store can always be cleaned up. Where commits fsync, the file is written
ahead of need (``zero_ahead``); dead readers, whose snapshots keep freed
pages from being reused, are cleared as the file grows (``check_readers``).

``_MapGrowth`` is a part of ``environment._Env``, whose ``_open`` sets the
state declared here.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import lmdb

from ..store import StoreFullError
from .datafile import _LAST_PG_AT, _TXNID, _TXNID_AT
from .gate import _SharedExclusive

_PAGE = 4096
_ZERO_MIN = 256 << 10  # a small store stays small on disk
_ZERO_MAX = 8 << 20
_HEADROOM_SKIPS = 15
_READER_CHECK_GROWTH = 1 << 20


class _MapGrowth:
    """The map size and the data file's growth, for ``_Env``."""

    # Set by _Env._open (see there).
    path: str
    readonly: bool
    options: dict[str, Any]
    env: lmdb.Environment
    gate: _SharedExclusive
    psize: int
    metas: mmap.mmap
    mapsize: int
    noop_txnid: int
    over_cap: bool
    headroom_skips: int
    readers_checked_at: int
    data_fd: int | None
    zeroed_to: int
    zeroing: bool

    def used_by_meta(self) -> int:
        """Bytes in use (``env.info()``'s ``last_pgno`` + 1 pages), read from
        our map of the meta pages as ``last_txnid`` is: info() releases the
        GIL, and every write needs this (zero_ahead), so a committing leader
        would give the GIL to the writer threads preparing their next request
        and wait to get it back. The newest meta page, picked as LMDB picks
        it (``mdb_env_pick_meta``)."""
        m, at, ps = self.metas, _TXNID_AT, self.psize
        newer = _TXNID.unpack_from(m, at)[0] < _TXNID.unpack_from(m, ps + at)[0]
        return (_TXNID.unpack_from(m, ps * newer + _LAST_PG_AT)[0] + 1) * ps

    # -- map size -----------------------------------------------------------
    def map_size(self) -> int:
        return int(self.env.info()["map_size"])

    def set_mapsize(self, size: int) -> None:
        """``env.set_mapsize`` (0: adopt the size another process grew the
        map to), and the size it leaves kept in ``mapsize``: LMDB changes an
        environment's map size only here, so ensure_headroom reads it there
        instead of asking env.info() at every write."""
        self.env.set_mapsize(size)
        self.mapsize = int(self.env.info()["map_size"])

    def used_bytes(self) -> int:
        return (int(self.env.info()["last_pgno"]) + 1) * self.psize

    def grow(
        self, minimum: int | None = None, *, adopt_only: bool = False, shrinking: bool = False
    ) -> None:
        """Grow the map (or adopt another process's growth); waits for this
        process's open transactions. Raises StoreFullError at the cap, unless
        ``shrinking`` (a delete-only transaction) and the reserve is left."""
        cap = self.options["max_size"]
        with self.gate.exclusive():
            if adopt_only:
                self.set_mapsize(0)
                return
            current = self.map_size()
            target = max(current * 2, (minimum or 0) * 2, current + (1 << 20))
            if cap is not None:
                if current >= cap:
                    if self.env.reader_check():
                        return  # a dead reader pinned freed pages; the caller retries
                    if self.commit_noop():
                        return  # the caller retries; the freed pages are usable now
                    if shrinking and current < _with_reserve(cap):
                        self.set_mapsize(_with_reserve(cap))  # settle_cap() undoes it
                        self.over_cap = True
                        return
                    raise StoreFullError(
                        f"the store at {self.path} reached its size cap of {cap:,} bytes "
                        f"(max_size); delete threads or prune, or open it with a larger "
                        f"max_size"
                    )
                target = min(target, cap)
            target = (target + _PAGE - 1) // _PAGE * _PAGE
            self.set_mapsize(target)

    def settle_cap(self, cleaned: bool) -> None:
        """After a delete-only commit (``cleaned``) at the cap: one no-op commit,
        allowed into the reserve, so that the next write can use the pages the
        delete freed (see commit_noop); then the cap again (LMDB keeps the map
        at least as large as the pages in use). Caller holds the write lock."""
        cap = self.options["max_size"]
        if cap is None or not (self.over_cap or cleaned):
            return
        if self.gate.held_shared_by_me():
            return  # a read of this thread is open: settle after a later write
        with self.gate.exclusive():
            if not self.over_cap and self.map_size() < cap:
                return  # not at the cap: nothing to settle
            if cleaned:
                self.set_mapsize(_with_reserve(cap))
                self.commit_noop()
            self.set_mapsize(cap)
            self.over_cap = False

    def commit_noop(self) -> bool:
        """Commit one transaction that changes no data; False if pointless or failed.

        LMDB reuses the pages a commit freed only from the second transaction
        after it, so at the size cap, right after a large delete, every retry of
        the next write (each aborted, so each is again "the next") would fail
        although the delete freed plenty. One commit makes those pages usable.
        Only once per outside commit: if nothing was committed since our last
        no-op, the store is genuinely full. Caller holds the write lock."""
        if int(self.env.info()["last_txnid"]) == self.noop_txnid:
            return False
        try:
            with self.env.begin(write=True) as txn, txn.cursor() as cur:
                if cur.first():
                    txn.put(cur.key(), cur.value())  # rewrite: dirties a page
                else:
                    txn.put(b"\x00", b"")
                    txn.delete(b"\x00")
        except lmdb.Error:
            return False
        self.noop_txnid = int(self.env.info()["last_txnid"])
        return True

    def sizes(self) -> tuple[int, int]:
        """(bytes in use, map size), read under the gate like every other call
        into the environment: py-lmdb releases the GIL during each one, and a
        fork() meanwhile would leave the child waiting forever for it when it
        closes its inherited handle. Not for a holder of the exclusive gate."""
        self.gate.acquire_shared()
        try:
            info = self.env.info()  # one call: each builds a dict
        finally:
            self.gate.release_shared()
        return (int(info["last_pgno"]) + 1) * self.psize, int(info["map_size"])

    def ensure_headroom(self) -> None:
        """Grow before a write when less than half of the map is free. When
        less than a quarter is used, the next _HEADROOM_SKIPS writes skip the
        check (a write that overflows anyway is rerun after growing)."""
        if self.readonly:
            return
        if self.headroom_skips:
            self.headroom_skips -= 1
            return
        # Not sizes(): env.info() releases the GIL, and at every write that
        # would be a hand-off to the threads preparing their next request (as
        # in zero_ahead); the meta pages and mapsize say the same.
        used, size = self.used_by_meta(), self.mapsize
        self.check_readers(used)
        cap = self.options["max_size"]
        if used * 2 > size and (cap is None or size < cap):
            self.grow(used)
        elif used * 4 < size:
            self.headroom_skips = _HEADROOM_SKIPS

    def check_readers(self, used: int) -> None:
        """Clear dead readers' slots when the data in use grew by an eighth
        (at least _READER_CHECK_GROWTH) since the last check.

        A reader killed inside a read transaction (OOM killer, a worker
        timeout) leaves its slot, and the snapshot it names keeps every page
        freed after it from being reused: a long-running writer's store
        would grow without bound. LMDB clears such slots only when asked
        (``reader_check``: one lock probe per reader process), so ask whenever
        the file had to grow: each write where commits sync (zero_ahead knows
        the size anyway), every _HEADROOM_SKIPS + 1 writes otherwise, and
        before refusing a write at the size cap (grow())."""
        if used >= self.readers_checked_at + max(
            _READER_CHECK_GROWTH, self.readers_checked_at // 8
        ):
            self.env.reader_check()
            self.readers_checked_at = used

    def zero_ahead(self) -> None:
        """Write zeros to the data file past LMDB's last page, ahead of need.

        A commit whose pages extend the file (every commit of a growing
        store: checkpoints accumulate) makes ``fdatasync`` also commit the
        filesystem's block allocation and size change, which on ext4 costs
        about as much again as flushing the data. So the file is kept written
        ahead: zeros, which LMDB overwrites in place, as PostgreSQL zeroes a
        WAL segment before use. ``fallocate`` would not do: it leaves
        unwritten extents, whose first write is an allocation again.

        Caller is inside a write transaction, so it holds LMDB's writer
        mutex: no process writes pages meanwhile (LMDB writes pages only when
        it commits), and bytes past the file's end belong to nobody. A chunk
        is 1/16 of the data in use, from 256 KiB to 8 MiB, never past the map
        size; nothing is written when the disk has less than 16 chunks free,
        and any failure (a full disk) truncates the zeros away and stops
        zeroing for this process: it is only an optimization."""
        used = self.used_by_meta()  # not env.info(): see used_by_meta
        self.check_readers(used)
        chunk = min(max(used // 16, _ZERO_MIN), _ZERO_MAX) // _PAGE * _PAGE
        if used + chunk // 2 <= self.zeroed_to:
            return
        info = self.env.info()  # the map size: only when zeroing is due
        path = os.path.join(self.path, "data.mdb")
        if self.data_fd is None:
            self.data_fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        end = os.fstat(self.data_fd).st_size  # another process may have zeroed
        target = min(used + chunk, int(info["map_size"]), self.options["max_size"] or 1 << 62)
        if end >= target - chunk // 2:
            self.zeroed_to = end
            return
        try:
            vfs = os.statvfs(self.path)
            if vfs.f_bavail * vfs.f_frsize < 16 * chunk:
                return
            zeros = bytes(min(target - end, _ZERO_MIN))
            at = end
            while at < target:
                at += os.pwrite(self.data_fd, zeros[: target - at], at)
        except OSError:
            self.zeroing = False
            try:
                os.ftruncate(self.data_fd, end)
            except OSError:
                pass
            return
        self.zeroed_to = target


def _with_reserve(cap: int) -> int:
    """The map size a delete-only transaction may use at the cap."""
    return cap + max(64 * _PAGE, cap // 32 // _PAGE * _PAGE)


def _no_puts(log: list[tuple[str, bytes | None, bytes | None]]) -> bool:
    """A transaction that only deletes (it may use the reserve past the cap)."""
    return all(op != "put" for op, _, _ in log)
