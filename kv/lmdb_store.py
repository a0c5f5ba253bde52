"""``LMDBStore``: the default backend, one LMDB environment per directory.

The rules of LMDB that wrappers usually get wrong are each handled once, here:

* **Map growth.** LMDB fails a write with ``MapFullError`` when the memory map
  is full, and ``set_mapsize`` needs every transaction of the process closed.
  Before each write transaction the map is grown (doubled) when less than
  half of it is free; a single transaction that still overflows it is
  aborted, the map grown, and its logged operations replayed, so no
  ``MapFullError`` reaches the caller. Growth takes an in-process exclusive
  lock that waits for this process's open transactions to finish. A growth
  by another process is adopted (``MapResizedError`` -> ``set_mapsize(0)``).
* **One environment per process.** LMDB must not open the same files twice in
  one process, so stores on one directory share one environment (refcounted).
  If the directory's ``data.mdb`` was deleted or replaced since (``rmtree``
  and open again), a new open gets a fresh environment on the new files and
  the old handles raise ``StoreClosedError`` (``_registered``).
* **Writers.** One write transaction at a time: an in-process lock, and across
  processes LMDB's own writer mutex. Readers never block and never wait.
* **fork().** An environment must not be used in a child after ``fork()``. The
  child reopens the directory on first use and never closes the parent's
  handle (closing it would release the parent's reader slots).
* **Dead readers.** Reader slots left by killed processes are cleared
  (``reader_check``) at open, when the reader table fills up, as the data
  file grows (a dead reader's snapshot keeps freed pages from being reused)
  and before a write is refused at the size cap (``_Env.check_readers``).
* **Interrupts.** A ``KeyboardInterrupt`` (or any exception raised from a
  signal handler) landing anywhere in a write leaves no lock, gate hold,
  lead or open transaction behind, and reaches only its own thread
  (``LMDBStore.transact``).
* **Snapshots.** LMDB 0.9 can give a read transaction begun during two quick
  commits of another process a newer snapshot than its id names, and the
  next read an older one; every read transaction is checked and begun again
  when that may have happened (``_Env._settled``), so reads never go back.
* **Zeroing ahead.** Where commits fsync, the data file is written (zeros)
  a little past LMDB's last page, so commits overwrite blocks rather than
  extend the file, which makes each ``fdatasync`` cheaper
  (``_Env.zero_ahead``).
* **Keys** longer than ``max_key_size()`` (511 bytes) raise ``KeyTooLongError``.

Durability (``durability=``), each exactly as LMDB documents it:

* ``"full"`` (default): data and metadata are fsynced at every commit. A
  commit that returned survives ``kill -9``, an OS crash and power loss.
* ``"meta"``: data pages are fsynced, the metadata page is not
  (``metasync=False``). An OS crash or power loss may undo the *last*
  committed transaction; the store stays consistent. ``kill -9`` loses nothing.
* ``"none"``: no fsync at commit (``sync=False``); the OS writes pages back
  when it chooses. ``kill -9`` of the process loses nothing (the pages are in
  the OS page cache), but an OS crash or power loss can lose any transaction
  committed since the last flush, and the store keeps atomicity only if the
  filesystem preserves write order. Call ``sync()`` to flush explicitly.

``max_size`` caps the data file: a write past it raises ``StoreFullError``
naming the cap, and leaves the store as it was. A transaction that only
deletes may use a small reserve past the cap (1/32 of it, at least 256 KiB),
because a delete needs a few free pages too: a store at its cap can always be
cleaned up (``delete_thread``, ``prune``), and the cap applies again after.

**Compaction.** An LMDB file never shrinks: pages freed by deletes are reused,
never returned. ``compact_lmdb(path)`` rewrites the store offline: every
record, in key order, appended to a new file (full pages, no free ones; see
``_rebuild``) beside ``data.mdb``, which then ``os.replace``s ``data.mdb``, so
a crash leaves the old or the new file, never a mix. Offline means nobody else
has the store open, which the store checks through ``kvsaver.lock`` in its
directory: every ``LMDBStore`` holds a shared ``flock`` on it while open (taken
before LMDB opens its files, released after they are closed), and compaction
takes it exclusively without waiting, or fails with ``StoreBusyError``. An
opener that finds compaction running waits for it (at most
``_COMPACTION_WAIT_SECONDS``) and then opens the compacted file. As a second
check, for LMDB users that are not ``LMDBStore`` (e.g. ``mdb_stat``), the
compactor probes LMDB's own ``lock.mdb``: every process with the environment
open holds a shared ``fcntl`` lock on its first byte.
"""

from __future__ import annotations

import fcntl
import itertools
import mmap
import os
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import lmdb

from ._fs import fsync_dir
from .store import (
    CorruptStoreError,
    KeyTooLongError,
    KVError,
    ReadOnlyError,
    Store,
    StoreBusyError,
    StoreClosedError,
    StoreFullError,
)

__all__ = ["CompactResult", "LMDBStore", "compact_lmdb"]

T = TypeVar("T")

Durability = Literal["full", "meta", "none"]
_DURABILITY: dict[str, dict[str, bool]] = {
    "full": {"sync": True, "metasync": True},
    "meta": {"sync": True, "metasync": False},
    "none": {"sync": False, "metasync": False},
}
_DEFAULT_MAP_SIZE = 64 << 20
_PAGE = 4096
LOCK_FILE = "kvsaver.lock"  # shared flock while open, exclusive while compacting
# how the files beside LMDB's are named: the lock above, a caller's (``directory``)
CALLER_FILES = "kvsaver."
_COMPACTION_WAIT_SECONDS = 60.0


class _SharedExclusive:
    """A lock with many shared holders or one exclusive holder (writer-preferring).

    Interrupt-safe: the raw lock is entered with ``with`` (a Condition's
    ``__exit__`` is Python code, where an interrupt can land before it releases
    anything), and every change of a count happens with the matching record of
    who holds it in one locked step without a call in between, so an exception
    raised asynchronously (KeyboardInterrupt from a signal handler) cannot
    separate the two; ``restore()`` then puts a thread's holds back to what
    they were, whatever point it was interrupted at. Waits sleep with the lock
    released and look again every ``_GATE_POLL_SECONDS``: no Condition.wait,
    which releases and retakes the lock inside ``with``, where an interrupt
    landing in between leaves ``with`` releasing a lock nobody holds.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shared = 0
        self._exclusive = False
        self._owner: tuple[int, int] | None = None  # (thread, serial) holding it exclusively
        self._serial = 0
        self._waiting_exclusive = 0
        self._mine = threading.local()  # .n: this thread's shared holds

    def held_shared_by_me(self) -> int:
        return getattr(self._mine, "n", 0)

    # acquire_shared/release_shared run around every read: the common case (no
    # exclusive request anywhere) takes the plain lock once and nothing else.
    def acquire_shared(self) -> None:
        mine = self._mine
        while True:
            with self._lock:
                held = getattr(mine, "n", 0)
                # A thread already holding it shared must not wait behind a
                # pending exclusive request (it would wait for itself).
                if not (self._exclusive or (self._waiting_exclusive and not held)):
                    self._shared += 1
                    mine.n = held + 1
                    return
            # Waits sleep with the lock released, never Condition.wait (it
            # releases and retakes the lock inside ``with``: an interrupt in
            # between leaves ``with`` releasing a lock nobody holds).
            time.sleep(_GATE_POLL_SECONDS)

    def release_shared(self) -> None:
        mine = self._mine
        with self._lock:
            self._shared -= 1
            mine.n -= 1

    def acquire_exclusive(self, timeout: float | None = None) -> tuple[int, int] | None:
        """Wait until no transaction of this process is open; the owner token
        (for release_exclusive), or None on timeout."""
        me = threading.get_ident()
        deadline = None if timeout is None else time.monotonic() + timeout
        counted = False
        try:
            with self._lock:
                self._waiting_exclusive += 1
                counted = True  # no call in between: an interrupt cannot separate them
            while True:
                with self._lock:
                    if not (self._exclusive or self._shared):
                        self._serial += 1
                        owner = self._owner = (me, self._serial)
                        self._exclusive = True
                        return owner
                    if deadline is not None and time.monotonic() >= deadline:
                        return None
                time.sleep(_GATE_POLL_SECONDS)  # see acquire_shared
        finally:
            if counted:
                with self._lock:
                    self._waiting_exclusive -= 1

    def release_exclusive(self, owner: tuple[int, int] | None) -> None:
        with self._lock:
            if owner is not None and self._owner == owner:  # not one restore() gave back
                self._exclusive = False
                self._owner = None

    def restore(self, held: int) -> None:
        """Give back whatever this thread took beyond ``held`` shared holds
        (and an exclusive hold): the cleanup after an interrupt."""
        me = threading.get_ident()
        mine = self._mine
        with self._lock:
            n = getattr(mine, "n", 0)
            self._shared += held - n
            mine.n = held
            if self._owner is not None and self._owner[0] == me:
                self._exclusive = False
                self._owner = None

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        if self.held_shared_by_me():
            raise KVError(
                "the LMDB map must grow, but this thread holds an open transaction on "
                "the same store; finish it (e.g. exhaust or close a scan) and retry"
            )
        owner = self.acquire_exclusive()
        try:
            yield
        finally:
            self.release_exclusive(owner)


class _Env:
    """One process's handle on one LMDB directory, shared by its stores."""

    def __init__(self, path: str, readonly: bool, options: dict[str, Any]) -> None:
        self.path = path
        self.readonly = readonly
        self.options = options
        self.refs = 0
        self.quiet_at_fork = True
        self.stale = False  # its files were deleted or replaced (see _registered())
        self.fork_owner: tuple[int, int] | None = None  # the gate, held across fork()
        self.lock_fd: int | None = None
        self._open()

    def _open(self) -> None:
        self.write_lock = threading.Lock()
        # Taken with ``with env.write_lock:`` only: a lock's own __enter__ and
        # __exit__ are C, so an interrupt cannot fall between taking it and
        # the block that releases it (a Python context manager's __exit__ can
        # be interrupted before its first line).
        self.writer: int | None = None  # thread holding write_lock (check_not_writing)
        self.noop_txnid = -1  # see commit_noop()
        self.over_cap = False  # a delete-only transaction is using the reserve
        self.headroom_skips = 0  # see ensure_headroom()
        self.queue_lock = threading.Lock()
        self.queue: list[_Request] = []
        # Group commit (transact()): the request whose thread commits batches
        # now, and the batch it took. Both change only under queue_lock.
        self.leader: _Request | None = None
        self.batch: list[_Request] = []
        self.batch_sizes = (1, 1)  # the last two batches
        # A leader waiting for its batch to fill (gather()): its wake-up lock
        # and how many queued requests release it. Changes only under queue_lock.
        self.gatherer: tuple[threading.Lock, int] | None = None
        # Whether waiting pays (see gather): after a gather that found its
        # batch short, whether a request queued within the wait's limit
        # (``came``, until ``watch_until``; 0.0: no gather being watched), and
        # per kind of leading request (``watched``, see _kind), a moving
        # average of that over its last such gathers (``gains``). Change only
        # under queue_lock.
        self.gains: dict[Any, float] = {}
        self.watched: Any = None
        self.came = False
        self.watch_until = 0.0
        self.commit_seconds = 0.0  # how long the last batch took
        self.gate = _SharedExclusive()
        # Zeroing ahead (see zero_ahead()): the data file's end we know is
        # written, and the fd we write through; only where commits fsync.
        if (inherited_fd := getattr(self, "data_fd", None)) is not None:
            os.close(inherited_fd)  # inherited through fork()
        self.data_fd: int | None = None
        self.zeroed_to = 0
        self.zeroing = not self.readonly and self.options["durability"] != "none"
        if self.lock_fd is not None:
            os.close(self.lock_fd)  # inherited through fork(); the parent keeps its lock
        self.lock_fd = _hold_shared(self.path, self.readonly)
        try:
            self.env = lmdb.open(
                self.path,
                map_size=self.options["map_size"],
                subdir=True,
                readonly=self.readonly,
                create=not self.readonly,
                max_readers=self.options["max_readers"],
                max_dbs=0,
                max_spare_txns=0,
                readahead=False,
                lock=True,
                **_DURABILITY[self.options["durability"]],
            )
        except BaseException as e:
            if self.lock_fd is not None:
                os.close(self.lock_fd)
                self.lock_fd = None
            if isinstance(e, lmdb.Error):
                _check_data_file(self.path)  # a clearer reason, if the file has one
            if isinstance(e, lmdb.InvalidError):
                raise CorruptStoreError(f"{self.path} does not hold a valid LMDB store: {e}") from e
            if isinstance(e, lmdb.VersionMismatchError):
                raise CorruptStoreError(
                    f"{self.path} was written by an incompatible LMDB version: {e}"
                ) from e
            raise
        try:
            # After LMDB's open, which waits for a creating process to have
            # written the meta pages; before any page is read through the map.
            _check_data_file(self.path)
        except BaseException:
            self.env.close()
            if self.lock_fd is not None:
                os.close(self.lock_fd)
                self.lock_fd = None
            raise
        self.identity = _identity(self.path)
        self.env.reader_check()
        self.max_key = self.env.max_key_size()
        self.psize = int(self.env.stat()["psize"])
        self.metas = _map_metas(self.path, self.psize)  # see last_txnid()
        # Both meta pages' transaction ids in one unpack (every read begins
        # with last_txnid()): the first, psize - 8 bytes skipped, the second.
        self.txnids = struct.Struct(f"<Q{self.psize - _TXNID.size}xQ").unpack_from
        self.readers_checked_at = self.used_bytes()  # see check_readers()
        self.mapsize = int(self.env.info()["map_size"])  # see set_mapsize()
        # Last: check_fork()'s unlocked fast path reads pid, so another thread
        # of a forked child must not see our pid before the new env is ready.
        self.pid = os.getpid()

    def check_fork(self) -> None:
        if self.pid == _PID:  # not os.getpid(): a system call, at every transaction
            return
        with _REGISTRY_LOCK:
            if self.pid == os.getpid():
                return
            if not self.quiet_at_fork:
                # Not "open a new store here": py-lmdb refuses to open the
                # same files twice in one process, and the inherited handle
                # cannot be closed (that would end the parent's transactions).
                raise KVError(
                    f"the store at {self.path} had a transaction open when this process "
                    "forked, so the inherited handle cannot be used or closed safely here, "
                    "and LMDB cannot open the same store twice in one process; use it from "
                    "a process started with the 'spawn' method, or fork while no "
                    "transaction is open"
                )
            # No transaction was open at fork() (the pre-fork hook made sure),
            # so closing the inherited handle touches no reader slot of the
            # parent's; then open the directory afresh.
            self.env.close()
            self._open()

    def gather(self) -> list[_Request]:
        """The next batch, for its leader. When the last batches were shared
        by several threads, those threads are busy preparing their next
        request right now: without waiting, the first to come back would
        commit alone and the rest queue behind it, so batches alternate
        between one and all-but-one. Wait until as many requests as the
        larger of the last two batches are queued, for at most as long as the
        last commit took (and _GATHER_MAX_SECONDS): a request that misses
        this batch waits that long anyway, for the next one, and costs a flush
        of its own (a shorter wait often leaves a batch of many writer threads
        short by one or two). A lone writer never waits.

        And only while waiting pays, learned per kind of leading request
        (its function's code: one per call site, e.g. KVSaver.put's and
        put_writes'): after every gather that found its batch short, waiting
        or not, the store watches whether a request queues within the wait's
        limit, and a leader waits only if that happened for at least half of
        its kind's recent such gathers (``gains``, a moving average).
        Requests that depend on the leader's do not come: LangGraph issues a
        thread's next put only when its previous put returned, so a put
        leading the last steps of an invoke mostly finds nobody to wait for,
        and would wait a whole commit for each; a wait that put_writes leads
        nearly always gains (the put of its step), and so does nearly every
        wait in an agent loop (a put and the next step's put_writes, arriving
        together) and with many writer threads. Not waiting, a gather is
        still watched, so waiting resumes when requests come back.

        The request that fills the batch wakes the leader (``gatherer``,
        released in LMDBStore._group_commit): no polling, whose sleeps would
        each give the GIL to the writers preparing their requests and then wait
        to get it back. The wait is a lock created held, as a request's
        ``wake``: not Condition.wait, which releases and retakes its lock
        inside the caller's ``with`` block, where an interrupt landing between
        the two leaves ``with`` releasing a lock nobody holds. A wake-up lost
        to an interrupt only ends the wait at its timeout; a stale ``gatherer``
        is replaced by the next gather."""
        waker = None
        limit = min(_GATHER_MAX_SECONDS, self.commit_seconds)
        now = time.monotonic()
        kind = _kind(self.leader)
        with self.queue_lock:
            gains = self.gains
            if self.watch_until:  # the last watched gather's outcome
                gain = gains.get(self.watched, 1.0)
                gains[self.watched] = gain + _GAIN_WEIGHT * (float(self.came) - gain)
                self.watch_until = 0.0
            expect = max(self.batch_sizes)
            if expect > 1 and len(self.queue) < expect:
                if len(gains) >= _GAIN_KINDS and kind not in gains:
                    gains.clear()  # bounded: a caller making functions at run time
                self.came = False
                self.watched = kind
                self.watch_until = now + limit
                if gains.get(kind, 1.0) >= 0.5:
                    waker = threading.Lock()
                    waker.acquire()
                    self.gatherer = (waker, expect)
        if waker is not None:
            waker.acquire(timeout=limit)
        with self.queue_lock:
            self.gatherer = None
            batch, self.queue = self.queue, []
            self.batch = batch  # with the line above: no call in between
        self.batch_sizes = (self.batch_sizes[1], len(batch))
        return batch

    def hand_over(self, lead: _Request) -> None:
        """The leader ``lead`` is done, normally or interrupted: its batch's
        requests that are not done (their commit did not happen) go back to
        the front of the queue, unless their caller was interrupted too; the
        oldest queued request leads next; done requests are woken. The state
        changes first, each in one step; wake-ups last (a waiter also polls,
        so one cut short by an interrupt only delays it). Caller holds
        queue_lock."""
        if self.leader is not lead:
            return
        batch = self.batch
        undone = [r for r in batch if not r.done and not r.abandoned and r is not lead]
        self.queue[:0] = undone
        self.batch = []
        nxt = self.queue[0] if self.queue else None
        self.leader = nxt
        if nxt is not None:
            _wake(nxt)
        for r in batch:
            if r.done and r is not lead:
                _wake(r)

    def withdraw(self, req: _Request) -> None:
        """``req``'s caller was interrupted: take it out of the queue, and if
        it leads, hand over. A request inside another leader's running batch
        may still be committed (as an interrupted commit may have been).
        Caller holds queue_lock."""
        req.abandoned = True
        for i, r in enumerate(self.queue):
            if r is req:
                del self.queue[i]
                break
        self.hand_over(req)

    def last_txnid(self) -> int:
        """The newest meta page's transaction id, as ``env.info()`` gives it,
        read from our own map of the two meta pages: ``info()`` releases the
        GIL, so an event loop reading inline (aget_tuple) would give it away at
        every read to threads that then keep it for a switch interval; and it
        builds a dict. The same bytes info() reads, through the same page
        cache, so the same value whenever LMDB's own would be."""
        a, b = self.txnids(self.metas, _TXNID_AT)
        return a if a > b else b

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

    def check_not_writing(self) -> None:
        if self.writer == threading.get_ident():
            raise RuntimeError("a write transaction is already open in this thread")

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

    def begin(self, write: bool) -> lmdb.Transaction:
        """Begin a transaction; adopt another process's growth; clear dead
        readers; a write transaction zeroes the file ahead (zero_ahead)."""
        for _ in range(8):
            try:
                txn = self.env.begin(write=write, buffers=False)
                return self._ready(txn, write)
            except lmdb.MapResizedError:
                self.gate.release_shared()
                try:
                    self.grow(adopt_only=True)
                finally:
                    self.gate.acquire_shared()
            except lmdb.ReadersFullError:
                if not self.env.reader_check():
                    raise
        return self._ready(self.env.begin(write=write, buffers=False), write)

    def begin_read(self) -> lmdb.Transaction:
        """``begin(write=False)``, its common case first: every read comes here."""
        txn = None
        try:
            txn = self.env.begin(buffers=False)
            if self.last_txnid() <= txn.id():
                return txn  # no commit newer than ours: settled (see _settled)
            # _settled begins again: another process may grow the map meanwhile
            return self._settled(txn)
        except (lmdb.MapResizedError, lmdb.ReadersFullError):
            return self.begin(write=False)  # adopts the growth, clears dead readers
        except BaseException:
            # An interrupt between begin and return: end the transaction now, or
            # its reader slot pins old pages until the traceback is collected.
            if txn is not None:
                txn.abort()
            raise

    def _ready(self, txn: lmdb.Transaction, write: bool) -> lmdb.Transaction:
        if not write:
            return self._settled(txn)
        if self.zeroing:
            try:
                self.zero_ahead()
            except BaseException:
                txn.abort()
                raise
        return txn

    def _settled(self, txn: lmdb.Transaction) -> lmdb.Transaction:
        """A read transaction whose snapshot is the one its id names.

        LMDB 0.9 begins a read by taking the last committed txnid N from the
        lock table and only then copying the roots from meta slot N % 2. A
        reader paused between the two while another process commits N+1 and
        N+2 (which overwrites that slot) copies N+2's roots: its snapshot is
        newer than N, and a read that starts a moment later, while N+2's
        writer is between writing its meta page and publishing N+2, gets N+1,
        so a thread could see the store go back in time (rarely, against a
        busy writer). Overwriting slot N % 2 needs N+1 published first, so
        when no meta page newer than N exists after the copy, the copy was
        N's. The pages of a too-new snapshot are safe meanwhile (LMDB keeps
        every page a reader of N may see).

        A newer meta page is nearly always N+1's, written but not yet
        published: at durability "full" its writer holds it so for a whole
        device flush (LMDB writes the meta page through a synchronous fd, then
        publishes), and re-beginning until then would cost every read that
        begins in that window up to ``_SETTLE_TRIES`` begins, and beside a busy
        writer many reads begin in that window. So the probe is a second begin:
        it reads the published id after our copy, and if that is still N, N+1
        was not published before the copy, so N+2's meta page was not begun:
        the copy was N's. Otherwise the probe is the next candidate. A writer
        publishing faster than we can begin falls back, after
        ``_SETTLE_TRIES``, to accepting a meta page one newer than the id."""
        attempt = 0
        probe = None
        try:
            while self.last_txnid() > txn.id() + (attempt >= _SETTLE_TRIES):
                probe = self.env.begin(write=False, buffers=False)
                if probe.id() == txn.id():
                    probe.abort()
                    return txn
                txn.abort()
                txn = probe
                attempt += 1
        except BaseException:
            # An interrupt: leave no reader slot pinned (see begin_read).
            txn.abort()
            if probe is not None:
                probe.abort()
            raise
        return txn


_SETTLE_TRIES = 32
_POLL_SECONDS = 0.05  # waits re-check their condition (a wake-up may be lost to an interrupt)
_ZERO_MIN = 256 << 10  # a small store stays small on disk
_ZERO_MAX = 8 << 20
_GATHER_MAX_SECONDS = 0.002
_GAIN_WEIGHT = 0.25  # of the newest outcome in _Env.gains (see gather)
_GAIN_KINDS = 64
_GATE_POLL_SECONDS = 0.0005
_HEADROOM_SKIPS = 15
_READER_CHECK_GROWTH = 1 << 20


class _Request:
    """One caller's function waiting for a group commit."""

    __slots__ = ("abandoned", "aborted", "done", "error", "fn", "result", "txn", "wake")

    # wake: a lock created held, released by the leader that did this
    # request's batch, or that promotes it to lead, and acquired by the waiter
    # (cheaper than a threading.Event, which builds a Condition). The waiter
    # also polls (_POLL_SECONDS): a release lost to an interrupt only delays.

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False
        self.abandoned = False  # its caller was interrupted (withdraw())
        # As the leader: the batch's write transaction, and whether we ended
        # it other than by committing (see LMDBStore._interrupted).
        self.txn: lmdb.Transaction | None = None
        self.aborted = False
        self.wake = threading.Lock()
        self.wake.acquire()


def _kind(req: _Request | None) -> Any:
    """What a request's waits are learned by (see _Env.gather): its
    function's code, the same for every call from one place of the caller."""
    fn = req.fn if req is not None else None
    return getattr(fn, "__code__", type(fn))


def _wake(r: _Request) -> None:
    # Only the thread leading r's batch (or promoting r, under queue_lock)
    # releases r's wake, so nobody releases it between the test and the release.
    if r.wake.locked():
        r.wake.release()


def _run_one(store: LMDBStore, env: _Env, txn: lmdb.Transaction, r: _Request, nested: bool) -> None:
    """Run one request's function; in a batch, inside a nested transaction so
    that its failure undoes only its own changes. MapFullError propagates (the
    whole batch is rerun after the map grows), and so does a BaseException
    that is not an Exception (KeyboardInterrupt, SystemExit): it interrupts
    the leader's thread, and other callers' functions are run again by the
    next leader instead of receiving it."""
    sub = env.env.begin(write=True, parent=txn) if nested else txn
    try:
        r.result = r.fn(_LMDBTxn(store, env, sub, write=True, replay=False))
    except lmdb.MapFullError:
        if nested:
            sub.abort()
        raise
    except Exception as e:
        r.error = _damaged(env.path, e) if isinstance(e, _DAMAGE) else e
        if nested:
            sub.abort()
        return
    except BaseException:
        if nested:
            sub.abort()
        raise
    if nested:
        sub.commit()


_REGISTRY: dict[str, _Env] = {}
_REGISTRY_LOCK = threading.Lock()


_FORK_WAIT_SECONDS = 5.0
# This process's id, kept by _after_fork_child: the fast checks of every read
# and write compare it with the id an environment was opened in, instead of
# calling os.getpid() (a system call) at every transaction.
_PID = os.getpid()


def _before_fork() -> None:
    # Quiesce every environment so the child inherits no open transaction.
    # A thread that forks while holding one, or a transaction that outlives
    # the wait, leaves that environment unusable in the child (clear error).
    _REGISTRY_LOCK.acquire()
    for env in _REGISTRY.values():
        env.fork_owner = (
            None if env.gate.held_shared_by_me() else env.gate.acquire_exclusive(_FORK_WAIT_SECONDS)
        )
        env.quiet_at_fork = env.fork_owner is not None


def _after_fork_parent() -> None:
    for env in _REGISTRY.values():
        if env.quiet_at_fork:
            env.gate.release_exclusive(env.fork_owner)
    _REGISTRY_LOCK.release()


def _after_fork_child() -> None:
    global _REGISTRY_LOCK, _PID
    _PID = os.getpid()  # first: every environment now belongs to another process
    _REGISTRY_LOCK = threading.Lock()
    for env in _REGISTRY.values():
        # Locks may have been held by parent threads that do not exist here.
        env.write_lock = threading.Lock()
        env.writer = None
        env.queue_lock = threading.Lock()
        env.queue = []
        env.leader = None
        env.batch = []
        env.gatherer = None
        env.gate = _SharedExclusive()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child
)


class _LMDBTxn:
    __slots__ = ("_cur", "_env", "_log", "_store", "_txn", "_write")

    def __init__(
        self,
        store: LMDBStore,
        env: _Env,
        txn: lmdb.Transaction,
        write: bool,
        replay: bool = True,
    ) -> None:
        self._store = store
        self._env = env
        self._txn = txn
        self._cur: lmdb.Cursor | None = None  # _point()
        self._write = write
        # Mutations, replayed into a fresh transaction after a map growth
        # (not kept under transact(), which reruns the caller's function).
        self._log: list[tuple[str, bytes | None, bytes | None]] | None = (
            [] if write and replay else None
        )

    def _check_key(self, key: bytes) -> None:
        if len(key) > self._env.max_key:
            raise KeyTooLongError(
                f"key of {len(key)} bytes is longer than LMDB's limit of {self._env.max_key} bytes"
            )
        if not key:
            raise KeyTooLongError("LMDB does not accept an empty key")

    def _require_write(self) -> None:
        if not self._write:
            raise ReadOnlyError("cannot write in a read transaction")

    def _point(self) -> lmdb.Cursor:
        """The cursor of this transaction's point reads and writes, made on
        first use (``_cur``; None again whenever ``_txn`` is replaced).
        A positioned cursor looks for a key on its current leaf page before
        descending from the root (LMDB's MDB_SET), and the keys a checkpoint
        reads or writes are mostly neighbours, so most gets skip the descent.
        py-lmdb lets go of the GIL around every LMDB call, so the shorter
        call also gives the threads around it less chance to take the GIL
        meanwhile. A lone ``get`` (a head's) makes no cursor: making one
        costs more than it saves."""
        cur = self._cur
        if cur is None:
            cur = self._cur = self._txn.cursor()
        return cur

    def get(self, key: bytes) -> bytes | None:
        if not key or len(key) > self._env.max_key:
            return None
        cur = self._cur
        if cur is None:  # a lone get (a head's) is cheaper without a cursor
            return self._txn.get(key)
        return cur.value() if cur.set_key(key) else None

    def _mutate(self, op: str, a: bytes | None, b: bytes | None) -> Any:
        if self._log is None:
            return self._apply(self._txn, op, a, b, self._env.max_key)
        while True:
            try:
                result = self._apply(self._txn, op, a, b, self._env.max_key)
                self._log.append((op, a, b))
                return result
            except lmdb.MapFullError:
                shrinking = op != "put" and _no_puts(self._log)
                self._cur = None  # first: an interrupt may land between the two
                self._txn = self._store._regrow(self._txn, self._log, shrinking=shrinking)

    @staticmethod
    def _apply(
        txn: lmdb.Transaction, op: str, a: bytes | None, b: bytes | None, max_key: int = 511
    ) -> Any:
        if op == "put":
            return txn.put(a, b)
        if op == "delete":
            return txn.delete(a)
        return _delete_range(txn, a, b, max_key)

    def put(self, key: bytes, value: bytes) -> None:
        # The checks inline and, under transact() (no log), straight to LMDB:
        # a put of a checkpoint makes about ten of these.
        if not self._write:
            self._require_write()
        if not key or len(key) > self._env.max_key:
            self._check_key(key)
        if self._log is None:
            (self._cur or self._point()).put(bytes(key), bytes(value))
        else:
            self._mutate("put", bytes(key), bytes(value))

    def delete(self, key: bytes) -> bool:
        if not self._write:
            self._require_write()
        if not key or len(key) > self._env.max_key:
            return False
        if self._log is None:
            return bool(self._txn.delete(bytes(key)))
        return bool(self._mutate("delete", bytes(key), None))

    def delete_range(self, start: bytes | None, stop: bytes | None) -> int:
        self._require_write()
        return int(self._mutate("delete_range", start, stop))

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        cur = self._cur or self._point()
        at, value, max_key = cur.set_key, cur.value, self._env.max_key
        return [value() if k and len(k) <= max_key and at(k) else None for k in keys]

    def scan(
        self,
        start: bytes | None = None,
        stop: bytes | None = None,
        *,
        reverse: bool = False,
        limit: int | None = None,
    ) -> Iterator[tuple[bytes, bytes]]:
        if limit is None:
            return _scan(self._txn, self._env.max_key, start, stop, reverse)
        if limit == 1:  # "the first/last key in a range": every get_tuple of a latest
            return iter(_one(self._txn, self._env.max_key, start, stop, reverse))
        return itertools.islice(
            _scan(self._txn, self._env.max_key, start, stop, reverse), max(limit, 0)
        )


_new_txn = object.__new__


class _ReadContext:
    """``LMDBStore.read()``: a class rather than a ``@contextmanager``
    generator, which is slower to enter and leave, and every read enters one."""

    __slots__ = ("_env", "_store", "_txn")

    def __init__(self, store: LMDBStore) -> None:
        self._store = store

    def __enter__(self) -> _LMDBTxn:
        store = self._store
        env = self._env = store._env
        if store._closed or env.stale or env.pid != _PID:
            store._check_open()
        gate = env.gate
        held = gate.held_shared_by_me()
        try:
            gate.acquire_shared()
            self._txn = env.begin_read()
        except BaseException:
            gate.restore(held)  # exact, wherever an interrupt landed
            raise
        # The read wrapper built without __init__'s call: every read makes one.
        wrapper = _new_txn(_LMDBTxn)
        wrapper._store, wrapper._env, wrapper._txn = store, env, self._txn
        wrapper._write, wrapper._log, wrapper._cur = False, None, None
        return wrapper

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        try:
            self._txn.abort()
        finally:
            self._env.gate.release_shared()
        if exc is not None and isinstance(exc, _DAMAGE):
            raise _damaged(self._env.path, exc) from exc


def _with_reserve(cap: int) -> int:
    """The map size a delete-only transaction may use at the cap."""
    return cap + max(64 * _PAGE, cap // 32 // _PAGE * _PAGE)


def _no_puts(log: list[tuple[str, bytes | None, bytes | None]]) -> bool:
    """A transaction that only deletes (it may use the reserve past the cap)."""
    return all(op != "put" for op, _, _ in log)


def _position(cur: lmdb.Cursor, bound: bytes, max_key: int) -> bool:
    """set_range that accepts bounds longer than a key can be: no stored key
    is longer than max_key, so positioning on the truncated bound lands at or
    before the true position (callers then skip keys below the bound)."""
    return bool(cur.set_range(bound[:max_key]))


def _seek(
    cur: lmdb.Cursor, max_key: int, start: bytes | None, stop: bytes | None, reverse: bool
) -> bool:
    """Put ``cur`` on the first key a scan yields, unless it is out of the
    range at the other end: forward, the first key >= start; reverse, the
    last key < stop. False when there is no such key."""
    # A bound LMDB takes as it is (every scan of ours, every get_tuple of a
    # latest checkpoint and every pending-writes read): one call.
    if not reverse:
        if start is not None and 0 < len(start) <= max_key:
            return bool(cur.set_range(start))
    elif stop is not None and 0 < len(stop) <= max_key:
        # The key before the first key >= stop, else the last key.
        return bool(cur.prev() if cur.set_range(stop) else cur.last())
    if not reverse:
        ok = cur.first() if start is None else _position(cur, start, max_key)
        while ok and start is not None and cur.key() < start:  # a truncated bound
            ok = cur.next()
        return bool(ok)
    # set_range lands on the first key >= stop (step back one), or past the
    # end (start from the last key).
    if stop is None or not _position(cur, stop, max_key):
        return bool(cur.last())
    ok = True
    while ok and cur.key() >= stop:
        ok = cur.prev()
    return bool(ok)


def _beyond(key: bytes, start: bytes | None, stop: bytes | None, reverse: bool) -> bool:
    """Past the far end of a scan's range (a scan's keys come in order)."""
    return (start is not None and key < start) if reverse else (stop is not None and key >= stop)


def _scan(
    txn: lmdb.Transaction, max_key: int, start: bytes | None, stop: bytes | None, reverse: bool
) -> Iterator[tuple[bytes, bytes]]:
    with txn.cursor() as cur:
        if not _seek(cur, max_key, start, stop, reverse):
            return
        # py-lmdb's own iterators (the current pair first, then a pair per C
        # call), checked against the far bound only: a checkpoint's pending
        # writes are read this way, as a list.
        if reverse:
            for key, value in cur.iterprev():
                if start is not None and key < start:
                    return
                yield key, value
        else:
            for key, value in cur.iternext():
                if stop is not None and key >= stop:
                    return
                yield key, value


def _one(
    txn: lmdb.Transaction, max_key: int, start: bytes | None, stop: bytes | None, reverse: bool
) -> list[tuple[bytes, bytes]]:
    """``list(islice(_scan(...), 1))`` without a generator."""
    with txn.cursor() as cur:
        if not _seek(cur, max_key, start, stop, reverse):
            return []
        key = cur.key()
        return [] if _beyond(key, start, stop, reverse) else [(key, cur.value())]


def _delete_range(
    txn: lmdb.Transaction, start: bytes | None, stop: bytes | None, max_key: int
) -> int:
    n = 0
    with txn.cursor() as cur:
        ok = cur.first() if start is None else _position(cur, start, max_key)
        while ok:
            key = cur.key()
            if not key:  # deleted the last key: the cursor is past the end
                break
            if stop is not None and key >= stop:
                break
            if start is not None and key < start:
                ok = cur.next()
                continue
            ok = cur.delete()  # moves to the next item
            n += 1
    return n


class LMDBStore(Store):
    """An ordered ``Store`` in an LMDB environment at directory ``path``.

    Args:
        path: directory of the store; created (with parents) unless readonly.
        readonly: open read-only; any write raises ``ReadOnlyError``. Sees new
            commits of other processes at every new transaction.
        durability: ``"full"`` (default), ``"meta"`` or ``"none"``; see the
            module docstring for exactly what each gives up.
        map_size: initial map size in bytes; the map grows by itself.
        max_size: cap on the data file in bytes, or None for no cap.
        max_readers: reader slots (simultaneous read transactions across all
            processes); only the first opener of a directory sets it.
    """

    nonblocking_reads = True  # reads are memory-map reads (see kv.store)
    path: str  # the directory

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        readonly: bool = False,
        durability: Durability = "full",
        map_size: int = _DEFAULT_MAP_SIZE,
        max_size: int | None = None,
        max_readers: int = 256,
    ) -> None:
        if durability not in _DURABILITY:
            raise ValueError(
                f"unknown durability {durability!r}; choose one of {sorted(_DURABILITY)}"
            )
        if max_size is not None and max_size < _PAGE * 8:
            raise ValueError(f"max_size={max_size} is too small (minimum {_PAGE * 8} bytes)")
        self.path = os.path.abspath(os.fspath(path))
        # The directory of its files alone: a caller may keep files of its
        # own there, named CALLER_FILES* (see kv.store).
        self.directory = self.path
        self.readonly = readonly
        self.durability = durability
        self.max_size = max_size  # the cap on the data file, None for none
        self._closed = False
        _check_dir(self.path, readonly)
        map_size = max(_PAGE * 8, (map_size + _PAGE - 1) // _PAGE * _PAGE)
        if max_size is not None:
            map_size = min(map_size, max_size)
        options = {
            "map_size": map_size,
            "max_size": max_size,
            "durability": durability,
            "max_readers": max_readers,
        }
        key = os.path.realpath(self.path)
        inherited = _REGISTRY.get(key)
        if inherited is not None:
            inherited.check_fork()  # reopen a handle inherited through fork()
        with _REGISTRY_LOCK:
            env = _registered(key)
            if env is not None:
                if env.readonly and not readonly:
                    raise KVError(
                        f"{self.path} is already open read-only in this process; close "
                        "that store before opening it for writing"
                    )
            else:
                env = _Env(key, readonly, options)
                _REGISTRY[key] = env
            env.refs += 1
        self._env = env
        self._finalizer = weakref.finalize(self, _release, key, env)

    def _check_open(self) -> _Env:
        if self._closed:
            raise StoreClosedError(f"the store at {self.path} is closed")
        env = self._env
        if env.stale:
            raise StoreClosedError(
                f"the store at {self.path} was deleted or replaced while this handle was "
                "open (a store opened there since uses the new files); this handle is "
                "closed: open the path again"
            )
        env.check_fork()
        return env

    @property
    def max_key_size(self) -> int:
        return self._env.max_key

    def read(self) -> _ReadContext:
        return _ReadContext(self)

    @contextmanager
    def write(self) -> Iterator[_LMDBTxn]:
        env = self._check_open()
        if self.readonly:
            raise ReadOnlyError(f"the store at {self.path} was opened read-only")
        env.check_not_writing()  # else this thread would wait for itself
        me = threading.get_ident()
        held = env.gate.held_shared_by_me()
        wrapper: _LMDBTxn | None = None
        try:
            with env.write_lock:
                env.writer = me
                try:
                    env.ensure_headroom()
                    env.gate.acquire_shared()
                    cleaned = False
                    try:
                        wrapper = _LMDBTxn(self, env, env.begin(write=True), write=True)
                        try:
                            yield wrapper
                            self._commit(wrapper)
                        except BaseException:
                            # Before the gate is given back: the map may grow
                            # only while no transaction is open. (Nothing if
                            # the commit happened.)
                            wrapper._txn.abort()
                            raise
                        cleaned = bool(wrapper._log) and _no_puts(wrapper._log or [])
                    finally:
                        env.gate.release_shared()
                        env.settle_cap(cleaned)
                finally:
                    env.writer = None
        except BaseException as e:
            if not isinstance(e, Exception):
                # Interrupted, maybe between two steps above:
                # end the transaction, give back the gate, and drop what the
                # interrupted frames still hold (see _drop_orphans).
                if wrapper is not None:
                    wrapper._txn.abort()  # nothing if it committed
                env.gate.restore(held)
                _drop_orphans(e)
            if isinstance(e, _DAMAGE):
                raise _damaged(self.path, e) from e
            raise

    def transact(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(txn)`` in a write transaction and return its result.

        Group commit: functions submitted while another commit is in progress
        are committed together, in one transaction and one sync. Each runs in
        its own nested transaction, so an exception in one caller's function
        rolls back only that function's changes and reaches only that caller.
        Every caller returns only after the commit holding its changes is
        durable (per ``durability``). ``fn`` may run more than once (after a
        map growth, or when the thread committing its batch is interrupted),
        so it must act only through ``txn``; it must not call ``transact`` or
        ``write`` itself.

        An interrupt (``KeyboardInterrupt``, or any ``BaseException`` that is
        not an ``Exception``, e.g. from a signal handler) reaches only the
        thread it was raised in, wherever it lands: the batch that thread was
        committing is rolled back unless its commit already happened, the
        other callers' functions are committed by the next leader, and every
        later write goes through. The interrupted call's own function may or
        may not have been committed, as with any interrupted commit.
        """
        env = self._check_open()
        if self.readonly:
            raise ReadOnlyError(f"the store at {self.path} was opened read-only")
        env.check_not_writing()  # else this thread would wait for itself
        req = _Request(fn)
        held = env.gate.held_shared_by_me()
        try:
            self._group_commit(env, req)
        except BaseException as e:
            self._interrupted(env, req, held, e)
            raise
        if req.error is not None:
            raise req.error
        return req.result  # type: ignore[return-value]

    def _group_commit(self, env: _Env, req: _Request) -> None:
        with env.queue_lock:
            env.queue.append(req)
            if env.watch_until and not env.came and time.monotonic() <= env.watch_until:
                env.came = True  # a wait of the watched gather gains (see gather)
            if env.leader is None:
                env.leader = req
            elif (g := env.gatherer) is not None and len(env.queue) >= g[1]:
                env.gatherer = None  # with the release: only one, of a lock held
                g[0].release()  # the leader waits for no more (see gather)
        if env.leader is not req:
            # Until a leader has done our function, or made us lead.
            while not req.wake.acquire(timeout=_POLL_SECONDS):
                if req.done or env.leader is req:
                    break
            if req.done:
                return
        batch = env.gather()
        with env.write_lock:
            env.writer = threading.get_ident()
            try:
                started = time.monotonic()
                self._run_batch(env, batch)
                env.commit_seconds = time.monotonic() - started
            finally:
                env.writer = None
        for r in batch:
            if r is not req:
                # Before handing over, not under queue_lock: woken callers
                # queue their next request while we still lead, so it joins
                # the next batch instead of leading alone.
                _wake(r)
        with env.queue_lock:
            env.hand_over(req)

    def _interrupted(self, env: _Env, req: _Request, held: int, e: BaseException) -> None:
        """Clean up after an exception escaped the group commit: an interrupt,
        which can land between any two steps of it. Whatever this thread
        held is given back from the state itself, not from how far it got:
        its gate holds (to ``held``), the batch transaction (committed if and
        only if LMDB closed it without our abort; else aborted and the other
        callers' requests queued again), its queue entry and the lead."""
        txn = req.txn
        committed = False
        if txn is not None:
            committed = not req.aborted and _finished(txn)
            if not committed:
                req.aborted = True
                txn.abort()
        env.gate.restore(held)  # after the abort: the map grows only with no transaction open
        with env.queue_lock:
            if committed and env.leader is req:
                for r in env.batch:
                    r.done = True  # results and errors were set before the commit
            env.withdraw(req)
        _drop_orphans(e)

    def _run_batch(self, env: _Env, batch: list[_Request]) -> None:
        """Run ``batch`` in one write transaction (``lead.txn``, ``lead`` the
        request of the thread running it, ``env.leader``) and commit it;
        each request gets its result or error and is marked done. A failure of
        the commit itself (cap reached, disk error) is every caller's failure:
        none of their changes were written. An interrupt propagates as it is,
        nothing marked done (see _interrupted)."""
        lead = env.leader
        assert lead is not None
        failure: BaseException | None = None
        try:
            env.ensure_headroom()
            env.gate.acquire_shared()
            try:
                while True:
                    lead.txn = env.begin(write=True)
                    lead.aborted = False
                    try:
                        for r in batch:
                            r.result, r.error = None, None
                            _run_one(self, env, lead.txn, r, nested=len(batch) > 1)
                        if len(batch) == 1 and batch[0].error is not None:
                            lead.aborted = True
                            lead.txn.abort()
                        else:
                            lead.txn.commit()
                        break
                    except lmdb.MapFullError:
                        lead.aborted = True  # first: the commit may have closed it
                        lead.txn.abort()
                        used = env.used_bytes()  # under the gate (see sizes())
                        env.gate.release_shared()
                        try:
                            env.grow(used)
                        finally:
                            env.gate.acquire_shared()
                    except lmdb.Error as e:
                        lead.aborted = True
                        lead.txn.abort()
                        # Disk full right after a delete: the pages it freed become
                        # usable after one more commit (see commit_noop); retry once.
                        if _disk_full(self.path, e) is e or not env.commit_noop():
                            raise
            except BaseException:
                # Before the gate is given back (the map grows only with no
                # transaction open): end a transaction still open. One LMDB
                # closed was committed, or is marked aborted already.
                if lead.txn is not None and not _finished(lead.txn):
                    lead.aborted = True
                    lead.txn.abort()
                raise
            finally:
                env.gate.release_shared()
        except Exception as e:
            lead.aborted = True
            if lead.txn is not None:
                lead.txn.abort()
            failure = _damaged(self.path, e) if isinstance(e, _DAMAGE) else _disk_full(self.path, e)
        for r in batch:
            if failure is not None:
                r.error = failure
            r.done = True

    def _commit(self, wrapper: _LMDBTxn) -> None:
        while True:
            try:
                wrapper._txn.commit()
                return
            except lmdb.MapFullError:
                assert wrapper._log is not None
                shrinking = _no_puts(wrapper._log)
                wrapper._cur = None  # first, as in _LMDBTxn._mutate
                wrapper._txn = self._regrow(wrapper._txn, wrapper._log, shrinking=shrinking)
            except lmdb.Error as e:
                full = _disk_full(self.path, e)
                if full is e:
                    raise
                if not self._env.commit_noop():  # as in _run_batch: retry once
                    raise full from e
                assert wrapper._log is not None
                wrapper._cur = None
                wrapper._txn = self._regrow(wrapper._txn, wrapper._log, grow=False)

    def _regrow(
        self, txn: lmdb.Transaction, log: list[Any], grow: bool = True, shrinking: bool = False
    ) -> lmdb.Transaction:
        """Abort ``txn``, grow the map, and replay ``log`` into a new one."""
        env = self._env
        txn.abort()
        if grow:
            used = env.used_bytes()  # under the gate (see sizes())
            env.gate.release_shared()
            try:
                env.grow(used, shrinking=shrinking)
            finally:
                env.gate.acquire_shared()
        new = env.begin(write=True)
        try:
            for op, a, b in log:
                _LMDBTxn._apply(new, op, a, b, env.max_key)
        except lmdb.MapFullError:
            return self._regrow(new, log, shrinking=shrinking)
        except BaseException:
            new.abort()
            raise
        return new

    def sync(self) -> None:
        """Flush to disk now (useful with durability ``"none"``)."""
        env = self._check_open()
        env.gate.acquire_shared()  # see _Env.sizes()
        try:
            env.env.sync(True)
        finally:
            env.gate.release_shared()

    def info(self) -> dict[str, int]:
        """Map size, bytes in use, and the data file's size on disk."""
        used, size = self._check_open().sizes()
        return {
            "map_size": size,
            "used_bytes": used,
            "file_bytes": os.path.getsize(os.path.join(self.path, "data.mdb")),
        }

    def used_bytes(self) -> int:
        """``info()["used_bytes"]`` without a system call (the newest meta
        page, read from a map of the data file's first pages)."""
        return self._check_open().used_by_meta()

    def disk_usage(self) -> int:
        """Bytes of the files in the store's directory (data, LMDB's lock
        file, ``kvsaver.lock`` and those a caller keeps there)."""
        self._check_open()
        total = 0
        for entry in os.scandir(self.path):
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
        return total

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._finalizer()

    def __enter__(self) -> LMDBStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LMDBStore({self.path!r}, readonly={self.readonly}, durability={self.durability!r})"


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
    this thread would wait for itself. Clearing the locals of this module's
    finished frames in the traceback (it keeps file and line) drops such a
    transaction, and py-lmdb aborts a transaction nobody refers to."""
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals is globals():
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


# LMDB 0.9's MDB_meta on a 64-bit build (lmdb.h/mdb.c), after the 16-byte page
# header of pages 0 and 1: magic, version, address, mapsize, then two MDB_db
# (pad, flags, depth, branch/leaf/overflow pages, entries, root; the free DB's
# pad is the page size), then the last page number and the transaction id.
_META = struct.Struct("<IIQQ" + "IHHQQQQQ" * 2 + "QQ")
_META_AT = 16
_TXNID = struct.Struct("<Q")
_TXNID_AT = _META_AT + _META.size - _TXNID.size  # the last field: the transaction id
_LAST_PG_AT = _TXNID_AT - _TXNID.size  # the field before it: the last page in use
_META_MAGIC = 0xBEEFC0DE
_META_VERSION = 1
_NO_PAGE = (1 << 64) - 1  # P_INVALID: the root of an empty DB


def _check_data_file(path: str) -> None:
    """Raise CorruptStoreError naming ``path/data.mdb`` if it cannot be the
    file its meta pages describe. LMDB maps the file and reads pages through
    the map: a page past the end of a truncated file kills the process with
    SIGBUS, no exception. So the meta pages are read with ``pread`` first,
    and the newest one (the larger transaction id, as LMDB picks it) must
    have its last page inside the file and its roots at or below its last
    page. A problem is confirmed by reading again (a meta page read while
    another process writes it may be torn). Nothing is checked for a missing
    file."""
    data = os.path.join(path, "data.mdb")
    problem = None
    for attempt in range(3):
        try:
            problem = _data_file_problem(data)
        except FileNotFoundError:
            return
        if problem is None:
            return
        time.sleep(0.01 * (attempt + 1))
    raise CorruptStoreError(
        f"{data} {problem}: the store is damaged and cannot be opened safely; "
        "restore it from a backup"
    )


def _data_file_problem(data: str) -> str | None:
    fd = os.open(data, os.O_RDONLY | os.O_CLOEXEC)
    try:
        metas = []
        at = 0
        for _ in range(2):
            raw = os.pread(fd, _META_AT + _META.size, at)
            if len(raw) < _META_AT + _META.size:
                break
            meta = _META.unpack_from(raw, _META_AT)
            metas.append(meta)
            at = meta[4]  # the page size: meta page 1 starts there
            if not 512 <= at <= 65536 or at & (at - 1):
                break
        # The size after the meta pages: another process may commit (and
        # extend the file) meanwhile, and the file only grows.
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if size == 0:
        return "is empty (0 bytes)"
    if len(metas) < 2 or any(m[0] != _META_MAGIC for m in metas):
        return "is not a valid LMDB data file (no LMDB meta pages)"
    if any(m[1] != _META_VERSION for m in metas):
        return f"has LMDB data format {metas[0][1]}/{metas[1][1]}, not {_META_VERSION}"
    meta = max(metas, key=lambda m: m[21])
    psize, last, roots = meta[4], meta[20], (meta[11], meta[19])
    need = (last + 1) * psize
    if need > size:
        return (
            f"is truncated: {size:,} bytes, but its last transaction uses "
            f"{need:,} ({last + 1:,} pages of {psize:,} bytes)"
        )
    if any(r != _NO_PAGE and r > last for r in roots):
        return f"has a damaged meta page (a root past its last page {last:,})"
    return None


def _map_metas(path: str, psize: int) -> mmap.mmap:
    """A read-only shared map of the data file's two meta pages (see
    _Env.last_txnid): the same page cache LMDB's own map reads."""
    fd = os.open(os.path.join(path, "data.mdb"), os.O_RDONLY | os.O_CLOEXEC)
    try:
        return mmap.mmap(fd, 2 * psize, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)


def _identity(path: str) -> tuple[int, int] | None:
    """Which file ``path/data.mdb`` is (device, inode), or None if none is."""
    try:
        st = os.stat(os.path.join(path, "data.mdb"))
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _registered(key: str) -> _Env | None:
    """The environment this process has open on directory ``key``, unless
    its data file was deleted or replaced since (a notebook or a test
    fixture runs ``shutil.rmtree(path)`` and opens ``path`` again while
    an old store is still open). Reusing it would serve the deleted files,
    and every write would vanish; so it is marked stale (its stores raise
    StoreClosedError from then on) and forgotten, and the caller opens the
    new files. Its own handles are released as its stores close. The old
    file stays open meanwhile, so its inode cannot be reused by the new one.
    Caller holds _REGISTRY_LOCK."""
    env = _REGISTRY.get(key)
    if env is not None and env.pid == os.getpid() and _identity(key) != env.identity:
        env.stale = True
        del _REGISTRY[key]
        return None
    return env


def _release(key: str, env: _Env) -> None:
    with _REGISTRY_LOCK:
        env.refs -= 1
        if env.refs > 0:
            return
        if _REGISTRY.get(key) is env:
            del _REGISTRY[key]
        if env.pid == os.getpid():
            env.env.close()
            env.metas.close()
            if env.data_fd is not None:
                os.close(env.data_fd)
                env.data_fd = None
            if env.lock_fd is not None:  # after the files are closed: compaction may start
                os.close(env.lock_fd)
                env.lock_fd = None


def _check_dir(path: str, readonly: bool) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise CorruptStoreError(f"{path} exists and is not a directory; an LMDB store is one")
    if os.path.isdir(path):
        # Lock files alone are a store being created by another process this
        # moment (LMDB makes lock.mdb, then data.mdb), or an open that failed.
        # (and the files named CALLER_FILES*, ours and a caller's).
        entries = {e for e in os.listdir(path) if not e.startswith(CALLER_FILES)} - {"lock.mdb"}
        if entries and "data.mdb" not in entries:
            raise CorruptStoreError(
                f"{path} is a non-empty directory without data.mdb: not an LMDB store "
                "(refusing to create one among other files)"
            )
        if readonly and "data.mdb" not in entries:  # else lmdb.Error, outside our family
            raise FileNotFoundError(f"no store at {path} (read-only open does not create one)")
    elif readonly:
        raise FileNotFoundError(f"no store at {path} (read-only open does not create one)")
    else:
        os.makedirs(path, exist_ok=True)


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
    with _REGISTRY_LOCK:
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
