"""The group-commit queue that ``LMDBStore.transact`` and
``PostgresStore.transact`` share: callers' functions waiting to be committed
together.

A caller queues a ``Request`` (``submit``); one request at a time leads. A
request that does not lead waits (``wait_turn``) until a leader has done it
or has made it lead. The leader's thread takes the queue as its batch
(``gather``, which, where the backend asks for it, waits for more requests
only while waiting has paid), runs the batch in one transaction and one
commit (the backend's part: how one function's changes are undone alone, what
is rerun after a conflict), wakes the requests it did, and hands the lead to
the oldest queued request (``hand_over``). A caller that is interrupted takes
its request back (``withdraw``).

``CommitQueue`` is a base class of LMDB's ``_Env`` and a part of
``PostgresStore`` (its ``_commits``); ``init_queue`` sets its state, again in
a forked child.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

_GATHER_MAX_SECONDS = 0.002
_GAIN_WEIGHT = 0.25  # of the newest outcome in gains (see gather)
_GAIN_KINDS = 64

_allocate_lock = threading.Lock  # the requests' wake-up locks (a test stands one in)


class Request:
    """One caller's function waiting for a group commit."""

    __slots__ = ("abandoned", "aborted", "done", "error", "fn", "result", "txn", "wake")

    # wake: a lock created held, released by the leader that did this
    # request's batch, or that promotes it to lead, and acquired by the waiter
    # (cheaper than a threading.Event, which builds a Condition). The waiter
    # also polls (``poll_seconds``): a release lost to an interrupt only delays.

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False
        self.abandoned = False  # its caller was interrupted (withdraw())
        # As the leader, the backend's own: the batch's transaction, and
        # whether it ended it other than by committing (LMDB's _interrupted).
        self.txn: Any = None
        self.aborted = False
        self.wake = _allocate_lock()
        self.wake.acquire()


def _kind(req: Request | None) -> Any:
    """What a request's waits are learned by (see gather): its function's
    code, the same for every call from one place of the caller."""
    fn = req.fn if req is not None else None
    return getattr(fn, "__code__", type(fn))


def wake(r: Request) -> None:
    # Only the thread leading r's batch (or promoting r, under queue_lock)
    # releases r's wake, so nobody releases it between the test and the release.
    if r.wake.locked():
        r.wake.release()


class CommitQueue:
    """One store's (or LMDB environment's) queue of group commits."""

    queue_lock: threading.Lock
    queue: list[Request]
    leader: Request | None
    batch: list[Request]
    batch_sizes: tuple[int, int]
    gatherer: tuple[threading.Lock, int] | None
    gains: dict[Any, float]
    watched: Any
    came: bool
    watch_until: float
    commit_seconds: float
    poll_seconds: float
    gathers: bool

    def __init__(self, *, poll_seconds: float, gathers: bool) -> None:
        self.init_queue(poll_seconds=poll_seconds, gathers=gathers)

    def init_queue(self, *, poll_seconds: float, gathers: bool) -> None:
        """The state of an empty queue. ``poll_seconds``: how often a waiter
        looks at its request (a wake-up may be lost to an interrupt);
        ``gathers``: whether a leader may wait for its batch to fill."""
        self.poll_seconds = poll_seconds
        self.gathers = gathers
        self.queue_lock = threading.Lock()
        self.queue = []
        # The request whose thread commits batches now, and the batch it took.
        # Both change only under queue_lock.
        self.leader = None
        self.batch = []
        self.batch_sizes = (1, 1)  # the last two batches
        # A leader waiting for its batch to fill (gather()): its wake-up lock
        # and how many queued requests release it. Changes only under queue_lock.
        self.gatherer = None
        # Whether waiting pays (see gather): after a gather that found its
        # batch short, whether a request queued within the wait's limit
        # (``came``, until ``watch_until``; 0.0: no gather being watched), and
        # per kind of leading request (``watched``, see _kind), a moving
        # average of that over its last such gathers (``gains``). Change only
        # under queue_lock.
        self.gains = {}
        self.watched = None
        self.came = False
        self.watch_until = 0.0
        self.commit_seconds = 0.0  # how long the last batch took

    def submit(self, req: Request) -> bool:
        """Queue ``req``; True when its thread leads now. A request that
        fills the batch a leader is waiting for wakes it (see gather)."""
        with self.queue_lock:
            self.queue.append(req)
            if self.watch_until and not self.came and time.monotonic() <= self.watch_until:
                self.came = True  # a wait of the watched gather gains (see gather)
            if self.leader is None:
                self.leader = req
            elif (g := self.gatherer) is not None and len(self.queue) >= g[1]:
                self.gatherer = None  # with the release: only one, of a lock held
                g[0].release()  # the leader waits for no more (see gather)
        return self.leader is req

    def wait_turn(self, req: Request) -> None:
        """Until a leader has done ``req``, or made its thread lead (woken by
        a release; the look covers a wake-up an interrupt swallowed)."""
        while not req.wake.acquire(timeout=self.poll_seconds):
            if req.done or self.leader is req:
                break

    def gather(self) -> list[Request]:
        """The next batch, for its leader: the whole queue, taken at once
        unless ``gathers``. When the last batches were shared
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
        released in submit): no polling, whose sleeps would
        each give the GIL to the writers preparing their requests and then wait
        to get it back. The wait is a lock created held, as a request's
        ``wake``: not Condition.wait, which releases and retakes its lock
        inside the caller's ``with`` block, where an interrupt landing between
        the two leaves ``with`` releasing a lock nobody holds. A wake-up lost
        to an interrupt only ends the wait at its timeout; a stale ``gatherer``
        is replaced by the next gather."""
        if not self.gathers:
            with self.queue_lock:
                batch, self.queue = self.queue, []
                self.batch = batch  # with the line above: no call in between
            return batch
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

    def wake_done(self, lead: Request, batch: list[Request]) -> None:
        """Wake the requests of ``batch`` that ``lead``'s thread did. Before
        handing over, not under queue_lock: woken callers queue their next
        request while it still leads, so it joins the next batch instead of
        leading alone."""
        for r in batch:
            if r is not lead and r.done:
                wake(r)

    def hand_over(self, lead: Request) -> None:
        """The leader ``lead`` is done, normally or not (interrupted, or
        failed before taking its batch): its batch's requests that are not
        done (their commit did not happen) go back to the front of the
        queue, unless their caller was interrupted too; ``lead`` leaves the
        queue if it is still there (else it would be made the next leader,
        done, and lead nobody); the oldest queued request leads next; done
        requests are woken. The state changes first, each in one step;
        wake-ups last (a waiter also polls, so one cut short by an interrupt
        only delays it). Caller holds queue_lock."""
        if self.leader is not lead:
            return
        batch = self.batch
        undone = [r for r in batch if not r.done and not r.abandoned and r is not lead]
        if lead in self.queue:
            self.queue.remove(lead)
        self.queue[:0] = undone
        self.batch = []
        nxt = self.queue[0] if self.queue else None
        self.leader = nxt
        if nxt is not None:
            wake(nxt)
        for r in batch:
            if r.done and r is not lead:
                wake(r)

    def withdraw(self, req: Request) -> None:
        """``req``'s caller was interrupted: take it out of the queue, and if
        it leads, hand over. A request inside another leader's running batch
        may still be committed (as an interrupted commit may have been); a
        leader that has not run it yet skips it. Caller holds queue_lock."""
        req.abandoned = True
        for i, r in enumerate(self.queue):
            if r is req:
                del self.queue[i]
                break
        self.hand_over(req)
