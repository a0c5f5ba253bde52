"""Retention: keep the last N checkpoints, TTL sweeps, opportunistic
bounded sweeps on put; never breaking what LangGraph needs to continue a
thread (the latest checkpoint and its writes, an unanswered interrupt, the
ancestors a DeltaChannel rebuilds from). Time is a fake clock, never a sleep."""

from __future__ import annotations

import operator
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypedDict

import pytest
from kvsaver import KVSaver, Retention, threads
from kvsaver import schema as S
from kvsaver.kv import MemoryStore
from kvsaver.kv.keys import unpack
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.graph import START, StateGraph
from langgraph.types import Command, interrupt
from saver_helpers_graphs import chain

MINUTE = 60.0


class FakeClock:
    """Seconds since the epoch, moved by hand. Starts at the real time because
    LangGraph stamps checkpoints ("ts") with the wall clock, and a thread is
    idle only when both its activity record and its latest "ts" say so."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, minutes: float) -> None:
        self.now += minutes * MINUTE


def cfg(thread: str, **extra: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, **extra}}


def count(saver: KVSaver, thread: str, ns: str | None = None) -> int:
    with saver.store.read() as txn:
        return sum(1 for _ in txn.scan(*S.checkpoints_range(thread, ns)))


def threads_in(saver: KVSaver) -> set[str]:
    with saver.store.read() as txn:
        return {unpack(k)[1] for k, _ in txn.scan(*S.keyspace_range(S.CHECKPOINT))}


def put_direct(saver: KVSaver, thread: str, n: int = 1) -> None:
    """n checkpoints on a thread, each the child of the previous one."""
    parent = None
    latest = saver.get_tuple(cfg(thread))
    if latest is not None:
        parent = latest.checkpoint["id"]
    for i in range(n):
        cp = empty_checkpoint()
        cp["id"] = str(uuid6(clock_seq=i))
        version = saver.get_next_version(None, None)
        cp["channel_values"] = {"x": f"{thread}-{i}"}
        cp["channel_versions"] = {"x": version}
        conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
        if parent is not None:
            conf["checkpoint_id"] = parent
        saver.put({"configurable": conf}, cp, {"source": "loop", "step": i}, {"x": version})
        parent = cp["id"]


# -- graphs ---------------------------------------------------------------------------------


class Chat(TypedDict):
    messages: Annotated[list[str], operator.add]


def chat_graph(saver: KVSaver) -> Any:
    def reply(state: Chat) -> dict[str, Any]:
        return {"messages": [f"reply {len(state['messages'])}"]}

    b = StateGraph(Chat)
    b.add_node("reply", reply)
    chain(b, "reply")
    return b.compile(checkpointer=saver)


def approval_graph(saver: KVSaver, *, subgraph: bool = False) -> Any:
    """reply, then ask a human (interrupt); the answer is appended. With
    ``subgraph=True`` the asking happens inside a subgraph (its own namespace)."""

    def reply(state: Chat) -> dict[str, Any]:
        return {"messages": [f"reply {len(state['messages'])}"]}

    def ask(state: Chat) -> dict[str, Any]:
        answer = interrupt({"question": "ok?", "seen": len(state["messages"])})
        return {"messages": [f"human said {answer}"]}

    if subgraph:
        inner = StateGraph(Chat)
        inner.add_node("ask", ask)
        inner.add_edge(START, "ask")
        ask_node: Any = inner.compile()
    else:
        ask_node = ask
    b = StateGraph(Chat)
    b.add_node("reply", reply)
    b.add_node("ask", ask_node)
    chain(b, "reply", "ask")
    return b.compile(checkpointer=saver)


def _extend(state: list[str], writes: list[list[str]]) -> list[str]:
    return [*state, *(x for w in writes for x in w)]


class DeltaState(TypedDict):
    items: Annotated[list[str], DeltaChannel(_extend, snapshot_frequency=4)]
    n: int


def delta_graph(saver: KVSaver) -> Any:
    def node(state: DeltaState) -> dict[str, Any]:
        return {"items": [f"item-{len(state['items'])}"], "n": state.get("n", 0) + 1}

    b = StateGraph(DeltaState)
    b.add_node("node", node)
    chain(b, "node")
    return b.compile(checkpointer=saver)


NO_AUTO = {"sweep_interval_minutes": None}  # explicit sweeps only


# -- keep the last N ------------------------------------------------------------------------


def test_keep_last_keeps_n_per_thread_and_the_thread_continues() -> None:
    saver = KVSaver(":memory:")
    graph = chat_graph(saver)
    for thread in ("a", "b"):
        for i in range(8):
            graph.invoke({"messages": [f"{thread} {i}"]}, cfg(thread))
    before = {t: graph.get_state(cfg(t)).values for t in ("a", "b")}
    assert count(saver, "a") == 8 * 3
    calls: list[tuple[int, int | None]] = []
    report = saver.sweep(
        Retention(keep_last=3, batch_threads=1, **NO_AUTO),
        progress=lambda done, total: calls.append((done, total)),
    )
    assert calls[0] == (1, 2) and calls[-1] == (2, 2)  # a call per batch of one thread
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)
    assert report.complete and report.threads_checked == 2 and report.threads_pruned == 2
    assert report.checkpoints_deleted == 2 * (8 * 3 - 3)
    assert count(saver, "a") == count(saver, "b") == 3
    assert {t: graph.get_state(cfg(t)).values for t in ("a", "b")} == before
    # no blob is left that no checkpoint uses
    with saver.store.read() as txn:
        blobs = {unpack(k)[3:] for k, _ in txn.scan(*S.keyspace_range(S.BLOB))}
    used = set()
    for t in saver.list(None):
        used |= set(t.checkpoint["channel_versions"].items())
        # a version without a value has no record; a small value
        # has none either, it is in the checkpoint's record (format 6)
        empty = set(t.checkpoint["channel_versions"].items()) - blobs
        values = t.checkpoint["channel_values"]
        assert all(S.is_small(values[ch]) for ch, _ in empty if ch in values)
    assert blobs <= used
    graph.invoke({"messages": ["a 8"]}, cfg("a"))
    assert graph.get_state(cfg("a")).values["messages"] == [
        *before["a"]["messages"],
        "a 8",
        "reply 17",
    ]


def test_keep_last_is_the_newest_by_checkpoint_id() -> None:
    saver = KVSaver(":memory:")
    put_direct(saver, "t", 6)
    ids = [t.checkpoint["id"] for t in saver.list(cfg("t"))]
    saver.sweep(Retention(keep_last=2, **NO_AUTO))
    assert [t.checkpoint["id"] for t in saver.list(cfg("t"))] == ids[:2]


@pytest.mark.parametrize("subgraph", [False, True])
def test_interrupted_thread_still_resumes_after_a_sweep(subgraph: bool) -> None:
    """The same conversation on two savers, one swept while the last question
    is unanswered: both resume to the same result."""
    clock = FakeClock()
    swept = KVSaver(":memory:", clock=clock)
    control = KVSaver(":memory:")
    graphs = [approval_graph(s, subgraph=subgraph) for s in (swept, control)]
    for graph in graphs:
        for i in range(4):  # answered turns: history the sweep may drop
            graph.invoke({"messages": [f"turn {i}"]}, cfg("t"))
            graph.invoke(Command(resume=f"yes {i}"), cfg("t"))
        graph.invoke({"messages": ["last turn"]}, cfg("t"))  # stops at the interrupt
    graph = graphs[0]
    state = graph.get_state(cfg("t"), subgraphs=True)
    assert state.next == ("ask",) and state.interrupts
    before = state.values
    # the strictest policies: keep only the latest; prune an idle thread to it
    clock.advance(120)
    report = swept.sweep(Retention(keep_last=1, ttl_minutes=60, strategy="keep_latest", **NO_AUTO))
    assert report.checkpoints_deleted > 0 and report.threads_deleted == 0
    assert count(swept, "t", "") == 1
    state = graph.get_state(cfg("t"), subgraphs=True)
    assert state.next == ("ask",) and state.values == before
    assert [i.value for i in state.interrupts] == [
        {"question": "ok?", "seen": len(before["messages"])}
    ]
    outs = [g.invoke(Command(resume="finally"), cfg("t")) for g in graphs]
    assert outs[0] == outs[1]
    assert outs[0]["messages"][-1] == "human said finally"
    assert graph.get_state(cfg("t")).next == ()


def test_delta_channel_thread_rebuilds_the_same_state_after_a_sweep() -> None:
    saver = KVSaver(":memory:")
    graph = delta_graph(saver)
    for i in range(7):
        graph.invoke({"items": [f"in-{i}"]}, cfg("t"))
    newest = list(saver.list(cfg("t"), limit=2))
    # the check is meaningful only if a kept checkpoint has no snapshot of its own
    assert any(t.metadata.get("counters_since_delta_snapshot") for t in newest)
    before = graph.get_state(cfg("t")).values
    total = count(saver, "t")
    saver.sweep(Retention(keep_last=2, **NO_AUTO))
    kept = count(saver, "t")
    assert 2 < kept < total  # the ancestors back to a snapshot stay, the rest goes
    assert graph.get_state(cfg("t")).values == before
    for t in newest:  # every kept checkpoint still rebuilds
        hist = saver.get_delta_channel_history(config=t.config, channels=["items"])
        assert "seed" in hist["items"] or not t.metadata.get("counters_since_delta_snapshot")
    graph.invoke({"items": ["more"]}, cfg("t"))
    after = graph.get_state(cfg("t")).values
    assert after["items"][: len(before["items"])] == before["items"]
    assert after["items"][len(before["items"]) :] == ["more", f"item-{len(before['items']) + 1}"]


def test_prune_keep_latest_is_the_same_walk() -> None:
    saver = KVSaver(":memory:")
    graph = delta_graph(saver)
    for i in range(7):
        graph.invoke({"items": [f"in-{i}"]}, cfg("t"))
    before = graph.get_state(cfg("t")).values
    saver.prune(["t"], strategy="keep_latest")
    assert graph.get_state(cfg("t")).values == before


# -- TTL -------------------------------------------------------------------------------------


def test_ttl_deletes_idle_threads_and_only_those() -> None:
    clock = FakeClock()
    saver = KVSaver(":memory:", clock=clock)
    policy = Retention(ttl_minutes=40, **NO_AUTO)
    put_direct(saver, "a", 3)  # t = 0
    clock.advance(30)
    put_direct(saver, "b", 3)  # t = 30
    put_direct(saver, "w", 1)
    clock.advance(20)
    put_direct(saver, "c", 3)  # t = 50
    clock.advance(5)
    latest_w = saver.get_tuple(cfg("w"))
    assert latest_w is not None
    saver.put_writes(latest_w.config, [("x", "pending")], task_id="task")  # w active at 55
    clock.advance(5)  # t = 60: a idle 60, b 30, w 5, c 10
    report = saver.sweep(policy, full=False)
    assert threads_in(saver) == {"b", "c", "w"}
    assert report.threads_deleted == 1 and report.checkpoints_deleted == 3
    clock.advance(25)  # t = 85: b idle 55, w 30, c 35
    saver.sweep(policy, full=False)
    assert threads_in(saver) == {"c", "w"}
    # a deleted thread leaves nothing behind, activity records included
    with saver.store.read() as txn:
        assert txn.get(S.activity_key("a")) is None and txn.get(S.activity_key("b")) is None
        idle = [S.decode_thread(v) for _, v in txn.scan(*S.idle_range())]
    assert sorted(idle) == ["c", "w"]
    clock.advance(60)
    saver.sweep(policy)  # full
    assert threads_in(saver) == set()


def test_ttl_keep_latest_prunes_idle_threads_once() -> None:
    clock = FakeClock()
    saver = KVSaver(":memory:", clock=clock)
    policy = Retention(ttl_minutes=10, strategy="keep_latest", **NO_AUTO)
    put_direct(saver, "idle", 5)
    clock.advance(15)
    put_direct(saver, "busy", 5)
    latest = saver.get_tuple(cfg("idle"))
    report = saver.sweep(policy, full=False)
    assert report.threads_pruned == 1 and report.checkpoints_deleted == 4
    assert count(saver, "idle") == 1 and count(saver, "busy") == 5
    again = saver.get_tuple(cfg("idle"))
    assert again is not None and latest is not None
    assert again.checkpoint == latest.checkpoint
    # already pruned: the next incremental sweep does not visit it again
    assert saver.sweep(policy, full=False).threads_checked == 0
    # written again, it is a normal thread again
    put_direct(saver, "idle", 2)
    clock.advance(15)
    assert saver.sweep(policy, full=False).threads_pruned == 2  # idle and busy
    assert count(saver, "idle") == 1 and count(saver, "busy") == 1


def test_threads_without_activity_records_use_the_checkpoint_ts() -> None:
    """A store written before activity was recorded: the first full sweep
    takes the latest checkpoint's ts and records it."""
    clock = FakeClock()
    saver = KVSaver(":memory:", clock=clock)
    put_direct(saver, "old", 2)
    put_direct(saver, "new", 2)
    with saver.store.write() as txn:  # as an older kvsaver left it
        txn.delete_range(*S.keyspace_range(S.ACTIVITY))
        txn.delete_range(*S.keyspace_range(S.IDLE))
    policy = Retention(ttl_minutes=60, **NO_AUTO)
    # The store never had a sweep, so even an incremental one walks every
    # thread: both checked, recent by their ts, and given an activity record.
    report = saver.sweep(policy, full=False)
    assert report.threads_checked == 2 and threads_in(saver) == {"old", "new"}
    with saver.store.read() as txn:
        assert txn.get(S.activity_key("old")) is not None
    clock.advance(120)
    saver.sweep(policy, full=False)
    assert threads_in(saver) == set()


def test_a_newer_checkpoint_ts_keeps_a_thread_alive() -> None:
    """Activity is the later of the record and the latest checkpoint's ts
    (e.g. a thread written by a kvsaver that keeps no record)."""
    clock = FakeClock()
    saver = KVSaver(":memory:", clock=clock)
    clock.now -= 24 * 60 * MINUTE  # the record says: a day ago
    put_direct(saver, "t", 1)
    clock.now += 24 * 60 * MINUTE  # its checkpoint "ts" (wall clock) says: now
    report = saver.sweep(Retention(ttl_minutes=60, **NO_AUTO), full=False)
    assert report.threads_checked == 1 and report.threads_deleted == 0
    assert threads_in(saver) == {"t"}


# -- opportunistic sweeps: bounded work on put ------------------------------------------------


class CountingStore(MemoryStore):
    """Records, for every write transaction, the threads whose keys it deleted."""

    def __init__(self) -> None:
        super().__init__()
        self.deleting: list[set[Any]] = []

    @contextmanager
    def write(self) -> Iterator[Any]:
        with super().write() as txn:
            touched: set[Any] = set()
            delete, delete_range = txn.delete, txn.delete_range

            def tracked_delete(key: bytes) -> bool:
                touched.add(_thread_of(key))
                return delete(key)

            def tracked_range(start: bytes | None, stop: bytes | None) -> int:
                for key, _ in list(txn.scan(start, stop)):
                    touched.add(_thread_of(key))
                return delete_range(start, stop)

            txn.delete, txn.delete_range = tracked_delete, tracked_range  # type: ignore[method-assign]
            yield txn
            if touched:
                self.deleting.append(touched)


def _thread_of(key: bytes) -> Any:
    elements = unpack(key)
    if elements[0] in (S.CHECKPOINT, S.BLOB, S.WRITE, S.ACTIVITY, S.HEAD):
        return elements[1]
    if elements[0] in (S.IDLE, S.RUN):
        return elements[2]
    return elements[-2] if elements[0] in (S.BY_ID, S.META) else elements[0]


def test_put_sweeps_in_bounded_steps_when_the_interval_elapsed() -> None:
    clock = FakeClock()
    store = CountingStore()
    policy = Retention(ttl_minutes=10, sweep_interval_minutes=5, batch_threads=2)
    saver = KVSaver(store, retention=policy, clock=clock)
    for t in range(5):
        put_direct(saver, f"old{t}", 2)
    # the first put ran the first step of a pass: nothing was idle yet
    assert threads_in(saver) == {f"old{t}" for t in range(5)}
    clock.advance(20)
    store.deleting.clear()
    put_direct(saver, "new", 1)  # interval elapsed: one step, at most 2 threads
    assert 1 <= 5 - len(threads_in(saver) - {"new"}) <= 2
    steps = 1
    while threads_in(saver) != {"new"}:
        put_direct(saver, "new", 1)  # each put continues the pass by one step
        steps += 1
        assert steps <= 4
    assert steps == 3  # 5 idle threads (+ "new"), 2 per step
    # every write transaction of the sweep touched one thread's keys
    assert store.deleting and all(len(touched) == 1 for touched in store.deleting)
    # the pass is over: nothing until the interval elapses again
    clock.advance(4)
    put_direct(saver, "other", 1)
    clock.advance(20)
    put_direct(saver, "new", 1)  # "other" idle 20 > 10: swept by this step
    assert threads_in(saver) == {"new"}


def test_a_failing_sweep_never_fails_the_put(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    saver = KVSaver(
        ":memory:", retention=Retention(keep_last=1, sweep_interval_minutes=1), clock=clock
    )
    put_direct(saver, "t", 2)

    def broken(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(threads, "keep_latest", broken)
    clock.advance(5)
    put_direct(saver, "t", 1)  # the sweep step fails; the put does not
    assert count(saver, "t") == 3
    assert "retention sweep step failed" in caplog.text


def test_with_allowlist_clone_shares_the_sweep_state() -> None:
    saver = KVSaver(":memory:", retention=Retention(keep_last=1, sweep_interval_minutes=1))
    clone = saver.with_allowlist([("x", "Y")])
    assert clone.retention == saver.retention and clone._sweeper is saver._sweeper


# -- the policy object ----------------------------------------------------------------------------


def test_from_ttl_config_reads_langgraph_platform_settings() -> None:
    r = Retention.from_ttl_config(
        {"strategy": "keep_latest", "default_ttl": 43200, "sweep_interval_minutes": 10}
    )
    assert r == Retention(ttl_minutes=43200, strategy="keep_latest", sweep_interval_minutes=10)
    saver = KVSaver(":memory:", retention={"default_ttl": 60})
    assert saver.retention == Retention(ttl_minutes=60)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"keep_last": 0},
        {"keep_last": True},
        {"ttl_minutes": -1},
        {"ttl_minutes": 5, "strategy": "archive"},
        {"keep_last": 1, "sweep_interval_minutes": 0},
        {"keep_last": 1, "batch_threads": 0},
    ],
)
def test_bad_policies_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Retention(**kwargs)


def test_unknown_ttl_keys_and_missing_policy_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown keys"):
        Retention.from_ttl_config({"default_ttl": 5, "ttl": 3})
    with pytest.raises(TypeError):
        KVSaver(":memory:", retention=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no retention policy"):
        KVSaver(":memory:").sweep()


async def test_async_sweep_and_stats() -> None:
    saver = KVSaver(":memory:")
    put_direct(saver, "t", 4)
    report = await saver.asweep(Retention(keep_last=1, **NO_AUTO))
    assert report.checkpoints_deleted == 3
    stats = await saver.astats()
    assert [(t.thread_id, t.checkpoints) for t in stats.threads] == [("t", 1)]
