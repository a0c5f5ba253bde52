"""Retention: storage that does not grow without limit.

Two rules, as a ``KVSaver`` option and as an explicit ``saver.sweep()``:

* **keep last N**: every (thread, namespace) keeps its newest ``keep_last``
  checkpoints, with their pending writes and the channel values they use;
* **TTL**: a thread idle for longer than ``ttl_minutes`` is deleted
  (``strategy="delete"``) or pruned to its latest checkpoint
  (``strategy="keep_latest"``), as LangGraph Platform's checkpointer ``ttl``
  settings (``strategy``, ``default_ttl`` in minutes,
  ``sweep_interval_minutes``; ``Retention.from_ttl_config`` reads that shape).

What LangGraph needs to continue a thread is never removed: the latest
checkpoint of every namespace with its pending writes (an unanswered
``interrupt()`` resumes from exactly that: its ``__interrupt__`` write and the
writes of the tasks that finished beside it; a subgraph's own namespace keeps
its latest too), and, for a ``DeltaChannel``, every ancestor back to the
nearest snapshot with its writes, so ``get_delta_channel_history`` rebuilds
the same value. Both rules use ``threads.keep_latest``, the walk
``prune("keep_latest")`` uses, generalized to N.

Idle time is the later of the thread's activity record (``put`` and
``put_writes`` write one, at most once a second, in the saver's ``clock``)
and the ``ts`` of its latest checkpoint in each namespace. Taking the later
of the two means a thread is never deleted while either says it is in use
(e.g. written by an older kvsaver that keeps no activity record).

Sweeps are background-less and bounded: with ``sweep_interval_minutes`` set,
a ``put`` that finds the interval elapsed runs one step of at most
``batch_threads`` threads after its own commit, and the following puts
continue the pass until it is done. Every thread is handled in its own short
write transaction, so writers wait at most for one thread's pruning. A pass
reads only what it needs through the idle index: threads idle past the
cutoff (TTL) and threads written since the last pass (keep last N). The first
pass on a store, and ``sweep(full=True)``, walk every thread instead (and
give threads written before activity was recorded their record). Processes
sharing a store coordinate through the sweep record: a pass started by one
process less than an interval ago is not started again by another.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, TypeVar

from kvsaver.kv import Store, Txn
from langgraph.checkpoint.serde.base import SerializerProtocol

from . import schema as S
from . import threads as TH

T = TypeVar("T")


class KVSaver(Protocol):
    """What a sweep uses of a saver (``KVSaver`` is one); a protocol, so this
    module does not import ``kvsaver.py``, which imports it."""

    store: Store
    serde: SerializerProtocol
    clock: Callable[[], float]
    retention: Retention | None

    def _maintain(self, fn: Callable[[Any], T]) -> T: ...


__all__ = ["Retention", "SweepReport"]

logger = logging.getLogger(__name__)

Strategy = Literal["delete", "keep_latest"]
Progress = Callable[[int, "int | None"], None]

_SLACK_MS = 2 * TH.TOUCH_RESOLUTION_MS  # overlap between incremental passes


@dataclass(frozen=True)
class Retention:
    """A retention policy for ``KVSaver(retention=...)`` and ``saver.sweep()``.

    Args:
        keep_last: keep this many newest checkpoints per thread and namespace
            (plus what DeltaChannels need); None keeps all.
        ttl_minutes: a thread idle for longer is handled by ``strategy``;
            None: no TTL.
        strategy: ``"delete"`` removes idle threads; ``"keep_latest"`` keeps
            only their latest checkpoint of each namespace.
        sweep_interval_minutes: how often a ``put`` starts a sweep pass;
            None: only explicit ``saver.sweep()`` calls sweep.
        batch_threads: threads handled by one opportunistic sweep step (the
            most work one ``put`` can pick up).
    """

    keep_last: int | None = None
    ttl_minutes: float | None = None
    strategy: Strategy = "delete"
    sweep_interval_minutes: float | None = 60.0
    batch_threads: int = 32

    def __post_init__(self) -> None:
        if self.keep_last is not None and (
            not isinstance(self.keep_last, int)
            or isinstance(self.keep_last, bool)
            or self.keep_last < 1
        ):
            raise ValueError(
                f"Retention: keep_last must be an int >= 1 or None, got {self.keep_last!r}"
            )
        for name in ("ttl_minutes", "sweep_interval_minutes"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0
            ):
                raise ValueError(
                    f"Retention: {name} must be a positive number of minutes or None, got {value!r}"
                )
        if self.strategy not in ("delete", "keep_latest"):
            raise ValueError(
                f"Retention: unknown strategy {self.strategy!r}; use 'delete' or 'keep_latest'"
            )
        if not isinstance(self.batch_threads, int) or self.batch_threads < 1:
            raise ValueError(
                f"Retention: batch_threads must be an int >= 1, got {self.batch_threads!r}"
            )
        if self.keep_last is None and self.ttl_minutes is None:
            raise ValueError(
                "Retention: set keep_last, ttl_minutes or both "
                "(a policy that keeps everything needs no sweeping)"
            )

    @classmethod
    def from_ttl_config(cls, ttl: Mapping[str, Any], *, keep_last: int | None = None) -> Retention:
        """From LangGraph Platform's checkpointer ``ttl`` settings, e.g.
        ``{"strategy": "delete", "default_ttl": 43200, "sweep_interval_minutes": 10}``
        (``default_ttl`` in minutes)."""
        known = {"strategy", "default_ttl", "sweep_interval_minutes"}
        unknown = set(ttl) - known
        if unknown:
            raise ValueError(f"ttl config: unknown keys {sorted(unknown)}; known: {sorted(known)}")
        kwargs: dict[str, Any] = {"keep_last": keep_last, "ttl_minutes": ttl.get("default_ttl")}
        if "strategy" in ttl:
            kwargs["strategy"] = ttl["strategy"]
        if "sweep_interval_minutes" in ttl:
            kwargs["sweep_interval_minutes"] = ttl["sweep_interval_minutes"]
        return cls(**kwargs)


def coerce(value: Retention | Mapping[str, Any] | None) -> Retention | None:
    """The ``retention=`` option: a Retention, a Platform ``ttl`` dict, or None."""
    if value is None or isinstance(value, Retention):
        return value
    if isinstance(value, Mapping):
        return Retention.from_ttl_config(value)
    raise TypeError(f"retention must be a Retention, a ttl dict or None, got {value!r}")


@dataclass
class SweepReport:
    """What a sweep did."""

    threads_checked: int = 0
    threads_deleted: int = 0
    threads_pruned: int = 0  # threads that lost at least one checkpoint, not deleted
    checkpoints_deleted: int = 0
    complete: bool = False  # False: an opportunistic step; later puts continue the pass


# -- activity records (called inside KVSaver's write transactions) -------------


def now_ms(clock: Callable[[], float]) -> int:
    return int(clock() * 1000)


def last_activity(saver: KVSaver, txn: Txn, thread: str) -> tuple[int | None, int | None]:
    """(activity record ms, latest checkpoint ts ms over the namespaces)."""
    raw = txn.get(S.activity_key(thread))
    recorded = None if raw is None else S.decode_activity(raw)[0]
    latest = None
    for ns in TH.namespaces(txn, thread):
        raw = TH.find_record(txn, thread, ns, None)
        if raw is None:
            continue
        ms = _ts_ms(saver.serde.loads_typed(S.decode_checkpoint(raw).checkpoint))
        if ms is not None and (latest is None or ms > latest):
            latest = ms
    return recorded, latest


def _ts_ms(checkpoint: Any) -> int | None:
    try:
        return int(datetime.fromisoformat(str(checkpoint["ts"])).timestamp() * 1000)
    except (KeyError, TypeError, ValueError):
        return None


# -- sweeping ---------------------------------------------------------------------


@dataclass
class _Pass:
    started: int  # ms, the pass's "now"
    full: bool
    since: int  # incremental keep-last: threads active at or after this
    phase: int = 0  # full: 0 only; incremental: 0 = TTL, 1 = keep last
    cursor: bytes | None = None
    report: SweepReport = field(default_factory=SweepReport)


class Sweeper:
    """Sweep state of one saver (shared by its ``with_allowlist`` clones)."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._pass: _Pass | None = None
        self._next_check = 0

    def _check_fork(self) -> None:
        if self._pid != os.getpid():  # a lock held by a parent thread is not ours
            self._reset()

    # -- entry points ---------------------------------------------------------

    def maybe_step(self, saver: KVSaver) -> None:
        """After a put: one bounded step of a sweep, when one is due."""
        r = saver.retention
        if r is None or r.sweep_interval_minutes is None or saver.store.readonly:
            return
        self._check_fork()
        now = now_ms(saver.clock)
        if self._pass is None and now < self._next_check:
            return
        if not self._lock.acquire(blocking=False):
            return  # another thread is stepping
        interval = int(r.sweep_interval_minutes * 60_000)
        try:
            if self._pass is None:
                state = _read_state(saver)
                due = state.get("started", -interval) + interval
                if now < due:
                    self._next_check = due
                    return
                self._pass = _start(saver, now, full=not state.get("full", False), state=state)
            if _step(saver, r, self._pass, r.batch_threads):
                _finish(saver, self._pass)
                self._pass = None
                self._next_check = now + interval
        except Exception:
            # Housekeeping must never fail the put that triggered it.
            logger.warning("kvsaver: retention sweep step failed", exc_info=True)
            self._pass = None
            self._next_check = now + interval
        finally:
            self._lock.release()

    def sweep(
        self,
        saver: KVSaver,
        retention: Retention | None,
        *,
        full: bool,
        progress: Progress | None,
    ) -> SweepReport:
        r = retention if retention is not None else saver.retention
        if r is None:
            raise ValueError(
                "sweep: this saver has no retention policy; pass one, e.g. "
                "saver.sweep(Retention(keep_last=20, ttl_minutes=43200))"
            )
        self._check_fork()
        with self._lock:
            state = _read_state(saver)
            p = _start(saver, now_ms(saver.clock), full=full or not state.get("full"), state=state)
            total = _count(saver, r, p) if progress is not None else None
            while True:
                done = _step(saver, r, p, r.batch_threads)
                if progress is not None:
                    progress(p.report.threads_checked, total)
                if done:
                    break
            # The pass covered the policy's threads only if it is the saver's
            # own policy (the incremental window is kept for that one).
            if r == saver.retention or saver.retention is None:
                _finish(saver, p)
            self._pass = None
            return p.report


def _read_state(saver: KVSaver) -> dict[str, Any]:
    with saver.store.read() as txn:
        return S.decode_sweep(txn.get(S.SWEEP_KEY))


def _update_state(saver: KVSaver, **changes: Any) -> None:
    def update(txn: Txn) -> None:  # may be rerun (a conflict on PostgreSQL)
        state = S.decode_sweep(txn.get(S.SWEEP_KEY))
        state.update(changes)
        txn.put(S.SWEEP_KEY, S.encode_sweep(state))

    saver._maintain(update)


def _start(saver: KVSaver, now: int, *, full: bool, state: dict[str, Any]) -> _Pass:
    _update_state(saver, started=now)
    since = int(state.get("completed", 0)) - _SLACK_MS
    return _Pass(started=now, full=full, since=since)


def _finish(saver: KVSaver, p: _Pass) -> None:
    p.report.complete = True
    _update_state(saver, completed=p.started, full=True)


def _count(saver: KVSaver, r: Retention, p: _Pass) -> int:
    """How many threads the pass will handle (for a progress bar)."""
    with saver.store.read() as txn:
        if p.full:
            return sum(len(chunk) for chunk in _thread_chunks(saver, txn))
        n = 0
        if r.ttl_minutes is not None:
            n += sum(1 for _ in txn.scan(*S.idle_range(None, _cutoff(r, p))))
        if r.keep_last is not None:
            n += sum(1 for _ in txn.scan(*S.idle_range(p.since, p.started + 1)))
        return n


def _cutoff(r: Retention, p: _Pass) -> int:
    assert r.ttl_minutes is not None
    return p.started - int(r.ttl_minutes * 60_000)


def _thread_chunks(saver: KVSaver, txn: Txn, start: bytes | None = None, size: int = 256) -> Any:
    """Thread ids in key order, by skipping from one thread's checkpoints to
    the next thread's (one seek per thread), in lists of ``size``."""
    lo, hi = S.keyspace_range(S.CHECKPOINT)
    start = lo if start is None else start
    chunk: list[str] = []
    while True:
        first = next(iter(txn.scan(start, hi, limit=1)), None)
        if first is None:
            break
        thread = S.decode_checkpoint(first[1]).thread_id
        chunk.append(thread)
        start = S.checkpoints_range(thread)[1]
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _step(saver: KVSaver, r: Retention, p: _Pass, budget: int) -> bool:
    """Handle up to ``budget`` threads; True when the pass is done."""
    if p.full:
        with saver.store.read() as txn:
            threads: list[str] = next(_thread_chunks(saver, txn, p.cursor, budget), [])
        for thread in threads:
            _handle(saver, r, p, thread, ttl=r.ttl_minutes is not None, keep=r.keep_last)
        if len(threads) < budget:
            return True
        p.cursor = S.checkpoints_range(threads[-1])[1]
        return False
    while p.phase < 2:
        if p.phase == 0 and r.ttl_minutes is not None:
            lo, hi = S.idle_range(None, _cutoff(r, p))
        elif p.phase == 1 and r.keep_last is not None:
            lo, hi = S.idle_range(p.since, p.started + 1)
        else:
            p.phase += 1
            continue
        with saver.store.read() as txn:
            batch = []
            for key, raw in txn.scan(max(lo, p.cursor or lo), hi):
                batch.append((key, S.decode_thread(raw)))
                if len(batch) == budget:
                    break
        for _, thread in batch:
            _handle(saver, r, p, thread, ttl=p.phase == 0, keep=r.keep_last if p.phase else None)
        if len(batch) == budget:
            p.cursor = batch[-1][0] + b"\x00"  # the next key after the last one seen
            return False
        p.phase += 1
        p.cursor = None
    return True


def _handle(
    saver: KVSaver, r: Retention, p: _Pass, thread: str, *, ttl: bool, keep: int | None
) -> None:
    """Apply the policy to one thread, in one write transaction (through
    ``_maintain``: rerun on a conflict on PostgreSQL, so the counts reach the
    report once, after the commit)."""
    report = p.report
    report.threads_checked += 1

    def apply(txn: Txn) -> tuple[int, bool]:  # (checkpoints deleted, thread deleted)
        recorded, latest = last_activity(saver, txn, thread)
        namespaces = TH.namespaces(txn, thread)
        seen = [x for x in (recorded, latest) if x is not None]
        last = max(seen) if seen else None
        idle = ttl and last is not None and last < _cutoff(r, p)
        if not namespaces:
            # Writes or blobs without a checkpoint (or nothing at all).
            if recorded is None or idle:
                TH.delete_thread(txn, thread)
            return 0, False
        if last is not None and (recorded is None or last - recorded >= TH.TOUCH_RESOLUTION_MS):
            TH.touch(txn, thread, last)  # backfill, or a checkpoint newer than the record
        if idle and r.strategy == "delete":
            n = sum(1 for _ in txn.scan(*S.checkpoints_range(thread)))
            TH.delete_thread(txn, thread)
            return n, True
        n = 0
        if idle:  # keep_latest: prune once, then leave the idle index until written again
            n = sum(TH.keep_latest(txn, saver.serde, thread, ns) for ns in namespaces)
            raw = txn.get(S.activity_key(thread))
            if raw is not None:
                txn.delete(S.idle_key(S.decode_activity(raw)[0], thread))
        elif keep is not None:
            n = sum(TH.keep_latest(txn, saver.serde, thread, ns, keep) for ns in namespaces)
        return n, False

    n, deleted = saver._maintain(apply)
    report.checkpoints_deleted += n
    report.threads_deleted += deleted
    report.threads_pruned += bool(n) and not deleted
