"""The group-commit queue: callers' functions waiting to be committed together.

``LMDBStore.transact`` queues a ``_Request``; one request at a time leads:
its thread takes the queue as its batch (``gather``, which waits for more
requests only while waiting has paid), commits the batch in one transaction
and one sync (``LMDBStore._run_batch``), and hands the lead to the oldest
queued request (``hand_over``). A caller that is interrupted takes its
request back (``withdraw``).

``_CommitQueue`` is a part of ``environment._Env``, whose ``_open`` sets the
state declared here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import lmdb

_POLL_SECONDS = 0.05  # waits re-check their condition (a wake-up may be lost to an interrupt)
_GATHER_MAX_SECONDS = 0.002
_GAIN_WEIGHT = 0.25  # of the newest outcome in _Env.gains (see gather)
_GAIN_KINDS = 64


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


class _CommitQueue:
    """The queue of one environment's group commits, for ``_Env``."""

    # Set by _Env._open, which says what each is for.
    queue_lock: threading.Lock
    queue: list[_Request]
    leader: _Request | None
    batch: list[_Request]
    batch_sizes: tuple[int, int]
    gatherer: tuple[threading.Lock, int] | None
    gains: dict[Any, float]
    watched: Any
    came: bool
    watch_until: float
    commit_seconds: float

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
