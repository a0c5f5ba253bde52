"""DeltaChannel (langgraph-checkpoint 4.1+): get_delta_channel_history against
InMemorySaver and LangGraph's generic walk, and prune keeping a delta chain.
Not in the lowest-versions run of .ci/run: langgraph-checkpoint 4.0 has no
DeltaChannel (and KVSaver then has no get_delta_channel_history,
tests/test_dropin.py)."""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from typing import Annotated, Any

import pytest
from kvsaver import KVSaver
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.types import ERROR
from langgraph.graph import END, START, StateGraph
from saver_helpers import blob_keys, config, make_checkpoint
from typing_extensions import TypedDict


@pytest.fixture
def mem() -> Iterator[KVSaver]:
    saver = KVSaver(":memory:")
    yield saver
    saver.close()


def ver(n: int) -> str:
    return f"{n:032}.{0:016}"


# -- DeltaChannel history --------------------------------------------------------------


def _delta_ops(saver: Any) -> list[dict[str, Any]]:
    """Checkpoints with "empty" delta blobs, snapshots, writes and a fork."""
    put, pw = saver.put, saver.put_writes
    v = {"d": ver(1), "x": ver(1)}
    put(config("t"), make_checkpoint("01", {"d": ["seed"], "x": 0}, v), {}, v)
    pw(config("t", "", "01"), [("d", ["w1"]), ("x", 1)], "t1", "~b")
    pw(config("t", "", "01"), [("d", ["w2"])], "t2", "~a")
    v = {**v, "d": ver(2), "x": ver(2)}
    put(config("t", "", "01"), make_checkpoint("02", {"x": 1}, v), {}, {"d": ver(2), "x": ver(2)})
    pw(config("t", "", "02"), [("d", ["w3"]), ("d", ["w3b"])], "t3", "")
    v3 = {**v, "d": ver(3)}
    put(config("t", "", "02"), make_checkpoint("03", {"x": 1}, v3), {}, {"d": ver(3)})
    pw(config("t", "", "03"), [("d", ["w4"]), (ERROR, "nope")], "t4", "")
    v4 = {**v3, "d": ver(4)}
    put(config("t", "", "03"), make_checkpoint("04", {"x": 1, "d": None}, v4), {}, {"d": ver(4)})
    pw(config("t", "", "04"), [("d", ["w5"])], "t5", "")
    put(
        config("t", "", "04"),
        make_checkpoint("05", {"x": 1}, {**v4, "d": ver(5)}),
        {},
        {"d": ver(5)},
    )
    # A fork from 01, and a thread in another namespace with no seed at all.
    vf = {"d": ver(6), "x": ver(1)}
    put(config("t", "", "01"), make_checkpoint("06", {"x": 0}, vf), {}, {"d": ver(6)})
    pw(config("t", "", "06"), [("d", ["f1"])], "tf", "")
    put(
        config("t", "", "06"),
        make_checkpoint("07", {"x": 0}, {"d": ver(7), "x": ver(1)}),
        {},
        {"d": ver(7)},
    )
    vs = {"d": ver(1)}
    put(config("t", "sub"), make_checkpoint("01", {}, vs), {}, vs)
    pw(config("t", "sub", "01"), [("d", ["s1"])], "ts", "")
    put(config("t", "sub", "01"), make_checkpoint("02", {}, {"d": ver(2)}), {}, {"d": ver(2)})
    targets = [config("t", "", f"0{i}") for i in range(1, 8)]
    return [
        *targets,
        config("t"),
        config("t", "sub"),
        config("t", "sub", "02"),
        config("t", "", "99"),
        config("nobody"),
    ]


def test_delta_channel_history_matches_inmemorysaver(kv: KVSaver) -> None:
    ref = InMemorySaver()
    targets = _delta_ops(kv)
    assert _delta_ops(ref) == targets
    channels = ["d", "x", "never"]
    for target in targets:
        got = kv.get_delta_channel_history(config=target, channels=channels)
        assert got == ref.get_delta_channel_history(config=target, channels=channels), target
        assert got == BaseCheckpointSaver.get_delta_channel_history(
            kv, config=target, channels=channels
        )
    assert kv.get_delta_channel_history(config=config("t"), channels=[]) == {}
    # Spot checks of the semantics, so a shared misreading would show too.
    five = kv.get_delta_channel_history(config=config("t", "", "05"), channels=["d"])["d"]
    assert five == {"seed": None, "writes": [("t5", "d", ["w5"])]}
    three = kv.get_delta_channel_history(config=config("t", "", "03"), channels=["d"])["d"]
    assert three["seed"] == ["seed"]
    assert [w[2] for w in three["writes"]] == [["w2"], ["w1"], ["w3"], ["w3b"]]  # "~a" < "~b"
    fork = kv.get_delta_channel_history(config=config("t", "", "07"), channels=["d"])["d"]
    assert [w[2] for w in fork["writes"]] == [
        ["w2"],
        ["w1"],
        ["f1"],
    ]  # parent chain, not list order


async def test_delta_channel_history_async(mem: KVSaver) -> None:
    targets = _delta_ops(mem)
    for target in targets:
        assert await mem.aget_delta_channel_history(
            config=target, channels=["d", "x"]
        ) == mem.get_delta_channel_history(config=target, channels=["d", "x"])


def _without_task_ids(history: Any) -> Any:
    return {
        ch: {**entry, "writes": [(c, v) for _, c, v in entry["writes"]]}
        for ch, entry in history.items()
    }


def _concat(state: list[str], writes: Sequence[list[str]]) -> list[str]:
    return state + [item for batch in writes for item in batch]


class DeltaState(TypedDict):
    log: Annotated[list[str], DeltaChannel(_concat, snapshot_frequency=4)]
    count: Annotated[int, operator.add]


def delta_graph(checkpointer: Any) -> Any:
    builder = StateGraph(DeltaState)
    builder.add_node("a", lambda s: {"log": [f"a{s['count']}"], "count": 1})
    builder.add_node("b", lambda s: {"log": ["b"], "count": 1})
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", END)
    return builder.compile(checkpointer=checkpointer)


def test_delta_channel_graph_and_prune(kv: KVSaver) -> None:
    ref = InMemorySaver()
    graph, ref_graph = delta_graph(kv), delta_graph(ref)
    t, copy = config("t"), config("copy")
    for i in range(7):
        for g in (graph, ref_graph):
            g.invoke({"log": [f"in{i}"], "count": 0}, t)
    state = graph.get_state(t)
    assert state.values == ref_graph.get_state(t).values
    assert len(state.values["log"]) == 21
    # The history walk agrees, at every checkpoint, with LangGraph's generic
    # walk over the same data (get_tuple + parent_config), and with
    # InMemorySaver's walk over its own run (task ids differ between runs).
    mine, theirs = list(kv.list(t)), list(ref.list(t))
    assert len(mine) == len(theirs) > 10
    for tup, ref_tup in zip(mine, theirs):
        got = kv.get_delta_channel_history(config=tup.config, channels=["log", "count"])
        generic = BaseCheckpointSaver.get_delta_channel_history(
            kv, config=tup.config, channels=["log", "count"]
        )
        assert got == generic
        want = ref.get_delta_channel_history(config=ref_tup.config, channels=["log", "count"])
        assert _without_task_ids(got) == _without_task_ids(want)
    latest_meta = kv.get_tuple(t).metadata
    assert "log" in latest_meta["counters_since_delta_snapshot"]  # a real delta chain

    kv.copy_thread("t", "copy")
    before = len(list(kv.list(t)))
    kv.prune(["t"], strategy="keep_latest")
    kept = list(kv.list(t))
    assert 1 < len(kept) < before  # the delta chain back to a snapshot, no more
    assert len(list(kv.list(copy))) == before  # the copy is untouched
    assert graph.get_state(t).values == graph.get_state(copy).values == state.values
    # Blobs left are exactly those the kept checkpoints reference.
    referenced = {(ch, v) for tup in kept for ch, v in tup.checkpoint["channel_versions"].items()}
    stored = {(k[3], k[4]) for k in blob_keys(kv) if k[1] == "t"}
    assert stored <= referenced
    # Continue both the pruned thread and the unpruned copy (and the reference).
    for i in range(7, 10):
        for g, c in ((graph, t), (graph, copy), (ref_graph, t)):
            g.invoke({"log": [f"in{i}"], "count": 0}, c)
    final = graph.get_state(t).values
    assert final == graph.get_state(copy).values == ref_graph.get_state(t).values
    assert final["log"][-3:] == ["in9", "a18", "b"]
    assert final["count"] == 20
