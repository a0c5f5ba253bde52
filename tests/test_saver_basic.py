"""KVSaver on its own: hostile ids, what put stores, ordering of checkpoints
and writes, versions, prune, list merging, and the async methods against the
sync ones (DeltaChannel history: tests/test_saver_delta.py). Runs on the
lowest LangGraph pyproject allows too (.ci/run)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kvsaver import KVSaver
from kvsaver import schema as S
from kvsaver._compat import writes_sort_key
from kvsaver.kv.keys import pack, prefix_range, unpack
from langgraph.checkpoint.base import WRITES_IDX_MAP
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT, RESUME, SCHEDULED
from saver_helpers import (
    BACKENDS,
    assert_indexes_consistent,
    blob_keys,
    config,
    core_image,
    keys_of,
    make_checkpoint,
    open_kv,
    scan_all,
    tuples,
)


@pytest.fixture
def mem() -> Iterator[KVSaver]:
    saver = KVSaver(":memory:")
    yield saver
    saver.close()


def ver(n: int) -> str:
    return f"{n:032}.{0:016}"


def ids(items: Any) -> list[str]:
    return [t.config["configurable"]["checkpoint_id"] for t in items]


# -- hostile ids ------------------------------------------------------------------

LONG = "x" * 10_000
HOSTILE_THREADS = [
    "",
    "a\x00b",
    "a",
    "a\x00",
    "a\x00x",
    "\x00",
    "a\xff",
    "🧵",
    LONG,
    LONG[:-1] + "y",  # same 24-byte prefix as LONG: the surrogate digest differs
]
LONG_NS = "ns:" + "n" * 10_000
LONG_CID = "c" * 600
LONG_CHANNEL = "ch" * 300


def _fill(saver: KVSaver, thread: str) -> None:
    tag = repr(thread)[:40]
    for ns in ("", "child:1", LONG_NS):
        v = {"who": ver(1), LONG_CHANNEL: ver(1)}
        saver.put(
            config(thread, ns),
            make_checkpoint("1", {"who": [tag, ns[:8]], LONG_CHANNEL: tag}, v),
            {"tag": tag},
            v,
        )
        v2 = {**v, "who": ver(2)}
        saver.put(
            config(thread, ns, "1"),
            make_checkpoint("2", {"who": [tag, ns[:8], 2], LONG_CHANNEL: tag}, v2),
            {"tag": tag},
            {"who": ver(2)},
        )
        saver.put_writes(
            config(thread, ns, "2"), [(LONG_CHANNEL, tag), ("who", 1)], "t" * 600, "p" * 600
        )
    # A 600-character checkpoint id, alone in its namespace.
    saver.put(
        config(thread, "long-id"),
        make_checkpoint(LONG_CID, {"who": tag}, {"who": 1}),
        {},
        {"who": 1},
    )


def _check(saver: KVSaver, thread: str) -> None:
    tag = repr(thread)[:40]
    for ns in ("", "child:1", LONG_NS):
        latest = saver.get_tuple(config(thread, ns))
        assert latest is not None, (thread[:20], ns[:20])
        assert latest.config == config(thread, ns, "2")
        assert latest.checkpoint["channel_values"] == {"who": [tag, ns[:8], 2], LONG_CHANNEL: tag}
        assert latest.metadata["tag"] == tag
        assert latest.parent_config == config(thread, ns, "1")
        assert latest.pending_writes == [("t" * 600, LONG_CHANNEL, tag), ("t" * 600, "who", 1)]
        first = saver.get_tuple(config(thread, ns, "1"))
        assert first.checkpoint["channel_values"] == {"who": [tag, ns[:8]], LONG_CHANNEL: tag}
        assert ids(saver.list(config(thread, ns))) == ["2", "1"]
    long_one = saver.get_tuple(config(thread, "long-id", LONG_CID))
    assert long_one.checkpoint["channel_values"] == {"who": tag}
    assert (
        saver.get_tuple(config(thread, "long-id")).config["configurable"]["checkpoint_id"]
        == LONG_CID
    )
    everything = list(saver.list({"configurable": {"thread_id": thread}}))
    assert len(everything) == 7
    assert {t.config["configurable"]["thread_id"] for t in everything} == {thread}
    assert {t.config["configurable"]["checkpoint_ns"] for t in everything} == {
        "",
        "child:1",
        LONG_NS,
        "long-id",
    }


def test_hostile_ids_never_collide(kv: KVSaver) -> None:
    for thread in HOSTILE_THREADS:
        _fill(kv, thread)
    for key, _ in scan_all(kv.store):
        assert len(key) < 511  # LMDB's limit; KeyTooLongError otherwise
    for thread in HOSTILE_THREADS:
        _check(kv, thread)
    assert len(list(kv.list(None))) == 7 * len(HOSTILE_THREADS)
    # Delete them one at a time: the rest stay whole.
    remaining = list(HOSTILE_THREADS)
    for thread in list(HOSTILE_THREADS):
        kv.delete_thread(thread)
        remaining.remove(thread)
        assert kv.get_tuple(config(thread)) is None
        assert list(kv.list({"configurable": {"thread_id": thread}})) == []
        for other in remaining:
            _check(kv, other)
        assert len(list(kv.list(None))) == 7 * len(remaining)
    assert core_image(kv) == []  # nothing left behind


async def test_hostile_ids_async(kv: KVSaver) -> None:
    for thread in ("", "a\x00", LONG):
        v = {"c": ver(1)}
        await kv.aput(
            config(thread, LONG_NS), make_checkpoint(LONG_CID, {"c": thread[:3]}, v), {}, v
        )
        await kv.aput_writes(config(thread, LONG_NS, LONG_CID), [("c", 1)], "task")
    for thread in ("", "a\x00", LONG):
        t = await kv.aget_tuple(config(thread, LONG_NS))
        assert t.checkpoint["channel_values"] == {"c": thread[:3]}
        assert t.pending_writes == [("task", "c", 1)]
    await kv.adelete_thread("a\x00")
    assert await kv.aget_tuple(config("a\x00", LONG_NS)) is None
    assert await kv.aget_tuple(config("", LONG_NS)) is not None
    assert len([t async for t in kv.alist(None)]) == 2


# -- what put stores ---------------------------------------------------------------


def test_put_writes_blobs_only_for_new_versions(kv: KVSaver) -> None:
    values = {"a": "A" * 100, "b": [1, 2, 3], "c": {"deep": True}}
    v1 = {"a": ver(1), "b": ver(1), "c": ver(1)}
    kv.put(config("t"), make_checkpoint("1", values, v1), {}, v1)
    assert len(blob_keys(kv)) == 3
    # Only "b" changed: one new blob, and the checkpoint still reads all three.
    v2 = {**v1, "b": ver(2)}
    kv.put(config("t", "", "1"), make_checkpoint("2", {**values, "b": [4]}, v2), {}, {"b": ver(2)})
    keys = blob_keys(kv)
    assert len(keys) == 4
    assert sorted(k[3:] for k in keys) == [
        ("a", ver(1)),
        ("b", ver(1)),
        ("b", ver(2)),
        ("c", ver(1)),
    ]
    assert kv.get_tuple(config("t")).checkpoint["channel_values"] == {**values, "b": [4]}
    assert kv.get_tuple(config("t", "", "1")).checkpoint["channel_values"] == values
    # No new version at all: no blob at all.
    kv.put(config("t", "", "2"), make_checkpoint("3", {**values, "b": [4]}, v2), {}, {})
    assert len(blob_keys(kv)) == 4
    # A channel in new_versions without a value gets no record (before format
    # 4: the "empty" marker), and reads back as absent (as InMemorySaver's
    # "empty" blobs do).
    v4 = {**v2, "c": ver(2)}
    kv.put(
        config("t", "", "3"),
        make_checkpoint("4", {"a": values["a"], "b": [4]}, v4),
        {},
        {"c": ver(2)},
    )
    with kv.store.read() as txn:
        marker = S.decode_blob(txn.get(S.blob_key("t", "", "c", ver(2))))
    assert marker is None
    assert kv.get_tuple(config("t")).checkpoint["channel_values"] == {"a": values["a"], "b": [4]}
    assert [unpack(k)[1:] for k, _ in scan_all(kv.store) if unpack(k)[0] == S.CHECKPOINT] == [
        ("t", "", "1"),
        ("t", "", "2"),
        ("t", "", "3"),
        ("t", "", "4"),
    ]


def test_latest_is_the_newest_checkpoint_id(kv: KVSaver) -> None:
    made = [str(uuid6(clock_seq=i)) for i in range(5)]
    assert made == sorted(made)
    for cid in (made[3], made[0], made[4], made[1], made[2]):  # not in id order
        kv.put(
            config("t"),
            make_checkpoint(cid, {"id": cid}, {"id": ver(int(cid == made[4]) + 1)}),
            {},
            {"id": ver(int(cid == made[4]) + 1)},
        )
    assert kv.get_tuple(config("t")).config["configurable"]["checkpoint_id"] == made[4]
    assert ids(kv.list(config("t"))) == made[::-1]
    kv.put(config("t"), make_checkpoint("0", {}, {}), {}, {})  # sorts first as text
    assert kv.get_tuple(config("t")).config["configurable"]["checkpoint_id"] == made[4]


def test_pending_writes_follow_writes_sort_key(kv: KVSaver) -> None:
    kv.put(config("t"), make_checkpoint("1"), {}, {})
    c = config("t", "", "1")
    batches = [
        ("task-b", "~__pregel_pull, z", [(f"ch{i}", i) for i in range(12)]),  # idx 10 > 2
        ("task-a", "~__pregel_push, 0, 10", [("x", "a0"), ("y", "a1")]),
        ("task-c", "~__pregel_push, 0, 2", [(ERROR, "e"), (INTERRUPT, "i")]),
        ("task-0", "", [("x", "root"), (SCHEDULED, "s"), (RESUME, "r")]),
        ("\x00", "~__pregel_pull, z", [("x", "nul")]),
    ]
    stored = []
    for task_id, path, writes in batches:
        kv.put_writes(c, writes, task_id, path)
        for idx, (channel, value) in enumerate(writes):
            stored.append(
                (
                    writes_sort_key(path, task_id, WRITES_IDX_MAP.get(channel, idx)),
                    (task_id, channel, value),
                )
            )
    want = [w for _, w in sorted(stored)]
    assert kv.get_tuple(c).pending_writes == want
    assert kv.get_tuple(config("t")).pending_writes == want
    assert next(iter(kv.list(config("t")))).pending_writes == want
    # Idx 10 and 11 after 9, never between 1 and 2.
    b = [w[1] for w in want if w[0] == "task-b"]
    assert b == [f"ch{i}" for i in range(12)]


def test_list_gives_each_checkpoint_its_own_writes(kv: KVSaver) -> None:
    """list() reads the pending writes of a page of consecutive
    checkpoints by one scan. Each checkpoint gets exactly its own, as
    get_tuple gives them: ids whose key element is a prefix of another's
    ("a" and "a\\x00b": an escaped NUL), an id long enough for a surrogate
    key, writes of an id with no checkpoint, checkpoints with none; in a
    merge of namespaces, past a filter and below ``before`` too."""
    cids = ["a", "a\x00", "a\x00b", "ab", "b" * 150, "c", "d\x00\xff"]
    for ns in ("", "sub"):
        for i, cid in enumerate(cids):
            kv.put(config("t", ns), make_checkpoint(cid), {"source": "loop", "i": i % 2}, {})
            if i % 3 != 1:
                writes = [("x", f"{ns}{cid}-{j}") for j in range(i % 3 + 1)]
                kv.put_writes(config("t", ns, cid), writes, "task")
        kv.put_writes(config("t", ns, "a\x00a"), [("x", "orphan")], "task")  # no checkpoint
    want = {
        (ns, cid): kv.get_tuple(config("t", ns, cid)).pending_writes
        for ns in ("", "sub")
        for cid in cids
    }
    assert want[("", "a\x00b")] == [("task", "x", f"a\x00b-{j}") for j in range(3)]
    assert want[("", "a\x00")] == [] and want[("sub", "ab")] == [("task", "x", "subab-0")]
    for conf, kw in [
        (config("t", ""), {}),
        (config("t", "sub"), {"limit": 5}),
        ({"configurable": {"thread_id": "t"}}, {}),  # every namespace, merged
        (config("t", ""), {"filter": {"i": 0}}),
        (config("t", "sub"), {"before": config("t", "sub", "c")}),
    ]:
        got = list(kv.list(conf, **kw))
        assert got, (conf, kw)
        for t in got:
            c = t.config["configurable"]
            assert t.pending_writes == want[(c["checkpoint_ns"], c["checkpoint_id"])], (conf, kw)


def test_checkpoint_tuple_fields_are_in_the_order_load_tuple_builds_them() -> None:
    # KVSaver._load_tuple builds CheckpointTuple positionally, for speed.
    from langgraph.checkpoint.base import CheckpointTuple

    assert CheckpointTuple._fields == (
        "config",
        "checkpoint",
        "metadata",
        "parent_config",
        "pending_writes",
    )


def test_retried_writes_are_ignored_and_special_ones_replace(kv: KVSaver) -> None:
    kv.put(config("t"), make_checkpoint("1"), {}, {})
    c = config("t", "", "1")
    kv.put_writes(c, [("x", 1), ("y", 2)], "task")
    kv.put_writes(c, [("x", 10), ("y", 20), ("z", 30)], "task")  # a retry
    kv.put_writes(c, [(ERROR, "first")], "task")
    kv.put_writes(c, [(ERROR, "second")], "task")
    assert kv.get_tuple(c).pending_writes == [
        ("task", ERROR, "second"),
        ("task", "x", 1),
        ("task", "y", 2),
        ("task", "z", 30),
    ]


def _write_records(kv: KVSaver) -> list[tuple[Any, ...]]:
    with kv.store.read() as txn:
        return [
            (unpack(key)[-1], [(w.channel, w.idx) for w in S.decode_writes(raw)])
            for key, raw in txn.scan(*S.keyspace_range(S.WRITE))
        ]


def test_a_tasks_regular_writes_are_one_record() -> None:
    kv = KVSaver(":memory:")
    kv.put(config("t"), make_checkpoint("1"), {}, {})
    c = config("t", "", "1")
    kv.put_writes(c, [("x", 1), ("y", 2), ("z", 3)], "task")
    assert _write_records(kv) == [(0, [("x", 0), ("y", 1), ("z", 2)])]
    # a retry with one more: only the new write, in a record of its own
    kv.put_writes(c, [("x", 10), ("y", 20), ("z", 30), ("w", 40)], "task")
    # special writes: each its own record, the last of a replacing batch wins
    kv.put_writes(c, [(ERROR, "first"), (ERROR, "second")], "task")
    kv.put_writes(c, [("a", 1), (INTERRUPT, "stop"), ("b", 2)], "other")
    stop = WRITES_IDX_MAP[INTERRUPT]
    assert _write_records(kv) == [  # key order: task "other" first
        (stop, [(INTERRUPT, stop)]),
        (0, [("a", 0), ("b", 2)]),
        (WRITES_IDX_MAP[ERROR], [(ERROR, WRITES_IDX_MAP[ERROR])]),
        (0, [("x", 0), ("y", 1), ("z", 2)]),
        (3, [("w", 3)]),
    ]
    assert kv.get_tuple(c).pending_writes == [
        ("other", INTERRUPT, "stop"),
        ("other", "a", 1),
        ("other", "b", 2),
        ("task", ERROR, "second"),
        ("task", "x", 1),
        ("task", "y", 2),
        ("task", "z", 3),
        ("task", "w", 40),
    ]


def test_a_later_batch_filling_a_gap_reads_in_idx_order() -> None:
    """A batch holding idx 0 and 2 (a special write took 1), then a retry
    that adds 1 and 3: the record keyed at 1 sorts before the batch's idx 2
    ends, and reads still come in idx order, as SqliteSaver's."""
    kv = KVSaver(":memory:")
    kv.put(config("t"), make_checkpoint("1"), {}, {})
    c = config("t", "", "1")
    kv.put_writes(c, [("a", 1), (ERROR, "boom"), ("c", 3)], "task")
    kv.put_writes(c, [("a", 10), ("b", 20), ("c", 30), ("d", 40)], "task")
    want = [("task", ERROR, "boom"), ("task", "a", 1), ("task", "b", 20)]
    want += [("task", "c", 3), ("task", "d", 40)]
    assert kv.get_tuple(c).pending_writes == want
    assert next(iter(kv.list(c))).pending_writes == want


def test_writes_stored_one_per_record_read_the_same() -> None:
    """A store written before batches (format 4: a record per write) reads as
    before, and a retry over it adds only what is missing."""
    kv = KVSaver(":memory:")
    kv.put(config("t"), make_checkpoint("1"), {}, {})
    c = config("t", "", "1")
    dumps = kv.serde.dumps_typed
    with kv.store.write() as txn:
        for idx, (channel, value) in enumerate([("x", 1), ("y", 2)]):
            key = S.write_key("t", "", "1", "task", idx)
            txn.put(key, S.encode_write_fields("task", channel, dumps(value), "", idx))
    assert kv.get_tuple(c).pending_writes == [("task", "x", 1), ("task", "y", 2)]
    kv.put_writes(c, [("x", 10), ("y", 20), ("z", 30)], "task")
    assert kv.get_tuple(c).pending_writes == [
        ("task", "x", 1),
        ("task", "y", 2),
        ("task", "z", 30),
    ]
    assert kv.stats().writes == 3


def test_get_next_version_sorts() -> None:
    saver, ref = KVSaver(":memory:"), InMemorySaver()
    current: Any = None
    seen = []
    for _ in range(1200):
        nxt = saver.get_next_version(current, None)
        assert isinstance(nxt, str)
        assert nxt.split(".")[0] == ref.get_next_version(current, None).split(".")[0]
        seen.append(nxt)
        current = nxt
    assert seen == sorted(seen)
    assert len(set(seen)) == len(seen)
    assert seen[0].startswith("0" * 31 + "1.")
    assert saver.get_next_version(7, None).startswith("0" * 31 + "8.")
    assert saver.get_next_version(ver(99), None) > ver(99)
    assert saver.get_next_version(ver(99), None) < saver.get_next_version(ver(100), None)


# -- prune and friends on plain threads ---------------------------------------------------


def test_prune_keep_latest_and_delete(kv: KVSaver) -> None:
    for ns in ("", "child:1"):
        for i in range(1, 5):
            v = {"a": ver(i), "b": ver(1)}
            kv.put(
                config("t", ns, f"{i - 1}" if i > 1 else None),
                make_checkpoint(f"{i}", {"a": [i], "b": ["B"]}, v),  # lists: blobs
                {},
                {"a": ver(i), "b": ver(1)} if i == 1 else {"a": ver(i)},
            )
            kv.put_writes(config("t", ns, f"{i}"), [("a", i)], f"task{i}")
    kv.put(config("u"), make_checkpoint("1", {"z": [1]}, {"z": 1}), {}, {"z": 1})
    latest = {ns: kv.get_tuple(config("t", ns)) for ns in ("", "child:1")}
    kv.prune(["t", "never-seen"])
    for ns in ("", "child:1"):
        assert ids(kv.list(config("t", ns))) == ["4"]
        assert kv.get_tuple(config("t", ns)) == latest[ns]
    assert sorted((k[2], k[3], k[4]) for k in blob_keys(kv) if k[1] == "t") == [
        ("", "a", ver(4)),
        ("", "b", ver(1)),
        ("child:1", "a", ver(4)),
        ("child:1", "b", ver(1)),
    ]
    assert len(keys_of(kv.store, S.WRITE)) == 2
    kv.prune(["t"], strategy="delete")
    assert list(kv.list(config("t"))) == []
    assert kv.get_tuple(config("u")) is not None
    assert {k[1] for k in blob_keys(kv)} == {"u"}


def test_copy_thread_and_delete_for_runs(kv: KVSaver) -> None:
    for i, run in enumerate(["r1", "r1", "r2"], start=1):
        v = {"a": ver(i)}
        parent = str(i - 1) if i > 1 else None
        cp = make_checkpoint(str(i), {"a": [i]}, v)  # a list: a blob
        kv.put(config("src", "", parent), cp, {"run_id": run}, v)
        kv.put_writes(config("src", "", str(i)), [("a", -i)], "task")
    kv.copy_thread("src", "dst")
    src, dst = tuples(kv.list(config("src"))), tuples(kv.list(config("dst")))
    for item in src + dst:
        for key in ("config", "parent_config"):
            if item[key]:
                item[key]["configurable"]["thread_id"] = "*"
    assert src == dst
    assert len(dst) == 3
    kv.copy_thread("src", "src")  # a no-op
    assert len(list(kv.list(config("src")))) == 3
    kv.delete_for_runs(["r1"])
    assert ids(kv.list(config("src"))) == ["3"] and ids(kv.list(config("dst"))) == ["3"]
    # The run-2 checkpoint still reads (its own blob kept), its r1 blobs are gone.
    assert kv.get_tuple(config("dst")).checkpoint["channel_values"] == {"a": [3]}
    assert sorted(k[3:] for k in blob_keys(kv) if k[1] == "src") == [("a", ver(3))]
    kv.delete_for_runs(["r2", "unknown"])
    assert list(kv.list(None)) == []


# -- list ordering ------------------------------------------------------------------


def test_list_none_orders_across_threads(kv: KVSaver) -> None:
    made = [str(uuid6(clock_seq=i)) for i in range(40)]
    threads = ["b", "a", "", "🧵", "a\x00"]
    for i, cid in enumerate(made):
        kv.put(
            config(threads[i % 5], "" if i % 3 else "child:1"), make_checkpoint(cid), {"i": i}, {}
        )
    assert ids(kv.list(None)) == made[::-1]
    assert ids(kv.list(None, limit=7)) == made[::-1][:7]
    before = {"configurable": {"checkpoint_id": made[20]}}
    assert ids(kv.list(None, before=before)) == made[:20][::-1]
    assert ids(kv.list(None, before=before, limit=3)) == made[17:20][::-1]
    assert ids(kv.list(None, filter={"i": 5})) == [made[5]]
    assert list(kv.list(None, limit=0)) == []


def test_list_thread_merges_namespaces_newest_first(kv: KVSaver) -> None:
    namespaces = ["", "child:1", "child:1|grand:2", "z"]
    made = [str(uuid6(clock_seq=i)) for i in range(90)]  # more than two list chunks
    for i, cid in enumerate(made):
        kv.put(config("t", namespaces[i % 4]), make_checkpoint(cid), {"ns": namespaces[i % 4]}, {})
    kv.put(config("other"), make_checkpoint(made[-1]), {}, {})
    got = list(kv.list({"configurable": {"thread_id": "t"}}))
    assert ids(got) == made[::-1]
    assert [t.config["configurable"]["checkpoint_ns"] for t in got] == [
        namespaces[i % 4] for i in range(89, -1, -1)
    ]
    before = {"configurable": {"checkpoint_id": made[50]}}
    assert (
        ids(kv.list(config("t") | {"configurable": {"thread_id": "t"}}, before=before, limit=5))
        == made[45:50][::-1]
    )
    assert ids(kv.list(config("t", "z"))) == made[3::4][::-1]
    assert (
        ids(kv.list({"configurable": {"thread_id": "t"}}, filter={"ns": "z"}, limit=4))
        == made[3::4][::-1][:4]
    )


def test_list_same_id_in_many_namespaces_across_chunks(kv: KVSaver) -> None:
    """Chunked reads resume below the last id returned; an id present in
    several namespaces must come back once per namespace, never lost or doubled."""
    made = [f"{i:04d}" for i in range(70)]
    for cid in made:
        for ns in ("", "a", "b"):
            kv.put(config("t", ns), make_checkpoint(cid), {}, {})
    got = [
        (t.config["configurable"]["checkpoint_id"], t.config["configurable"]["checkpoint_ns"])
        for t in kv.list({"configurable": {"thread_id": "t"}})
    ]
    assert len(got) == len(set(got)) == 210
    assert [cid for cid, _ in got] == sorted((cid for cid, _ in got), reverse=True)
    for cid in made:
        kv.put(config(f"thread-{cid}"), make_checkpoint(cid), {}, {})
    every = ids(kv.list(None))
    assert len(every) == 280
    assert every == sorted(every, reverse=True)


# -- async methods behave like the sync ones ---------------------------------------------


def _script_sync(s: KVSaver) -> list[Any]:
    out: list[Any] = []
    for i in range(1, 6):
        v = {"a": ver(i)}
        parent = str(i - 1) if i > 1 else None
        out.append(
            s.put(
                config("t", "", parent),
                make_checkpoint(str(i), {"a": i}, v),
                {"run_id": f"r{i % 2}"},
                v,
            )
        )
        s.put_writes(config("t", "", str(i)), [("a", i), (ERROR, "e")], f"task{i}", "p")
    out.append(tuples([s.get_tuple(config("t"))]))
    out.append(tuples(s.list(config("t"), limit=3, filter={"run_id": "r1"})))
    s.copy_thread("t", "u")
    s.delete_for_runs(["r0"])
    out.append(tuples(s.list(None)))
    s.prune(["u"])
    out.append(tuples(s.list(config("u"))))
    s.delete_thread("t")
    out.append(tuples(s.list(None)))
    return out


async def _script_async(s: KVSaver) -> list[Any]:
    out: list[Any] = []
    for i in range(1, 6):
        v = {"a": ver(i)}
        parent = str(i - 1) if i > 1 else None
        out.append(
            await s.aput(
                config("t", "", parent),
                make_checkpoint(str(i), {"a": i}, v),
                {"run_id": f"r{i % 2}"},
                v,
            )
        )
        await s.aput_writes(config("t", "", str(i)), [("a", i), (ERROR, "e")], f"task{i}", "p")
    out.append(tuples([await s.aget_tuple(config("t"))]))
    out.append(tuples([t async for t in s.alist(config("t"), limit=3, filter={"run_id": "r1"})]))
    await s.acopy_thread("t", "u")
    await s.adelete_for_runs(["r0"])
    out.append(tuples([t async for t in s.alist(None)]))
    await s.aprune(["u"])
    out.append(tuples([t async for t in s.alist(config("u"))]))
    await s.adelete_thread("t")
    out.append(tuples([t async for t in s.alist(None)]))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
async def test_async_methods_match_sync(tmp_path: Path, backend: str) -> None:
    sync_saver = open_kv(backend, tmp_path / f"sync-{backend}")
    async_saver = open_kv(backend, tmp_path / f"async-{backend}")
    try:
        want = _script_sync(sync_saver)
        got = await _script_async(async_saver)
        assert got == want, backend
        assert core_image(async_saver) == core_image(sync_saver), backend
        assert len(want[-2]) == 1 and len(want[-1]) == 1  # the script did something
    finally:
        sync_saver.close()
        async_saver.close()


async def test_alist_is_lazy_and_chunked(mem: KVSaver) -> None:
    for i in range(100):
        mem.put(config("t"), make_checkpoint(f"{i:03d}"), {}, {})
    seen = []
    async for t in mem.alist(config("t")):
        seen.append(t.config["configurable"]["checkpoint_id"])
        if len(seen) == 40:
            break
    assert seen == [f"{i:03d}" for i in range(99, 59, -1)]
    assert [t async for t in mem.alist(config("t"), limit=2)] == list(
        mem.list(config("t"), limit=2)
    )


def test_context_manager_closes_owned_store(tmp_path: Path) -> None:
    with KVSaver(tmp_path / "cm") as saver:
        saver.put(config("t"), make_checkpoint("1"), {}, {})
    with KVSaver(tmp_path / "cm") as again:
        assert again.get_tuple(config("t")).checkpoint["id"] == "1"


def test_copy_thread_over_an_existing_checkpoint_keeps_indexes_right(kv: KVSaver) -> None:
    """Regression: copy_thread overwrote a target checkpoint's record but kept
    its old run and metadata index entries, so delete_for_runs([old run])
    deleted the copy, which belongs to another run."""
    kv.put(
        config("dst"),
        make_checkpoint("1", {"a": 1}, {"a": 1}),
        {"run_id": "old", "tag": "old"},
        {"a": 1},
    )
    kv.put(
        config("src"),
        make_checkpoint("1", {"a": 2}, {"a": 2}),
        {"run_id": "new", "tag": "new"},
        {"a": 2},
    )
    kv.copy_thread("src", "dst")
    assert kv.get_tuple(config("dst")).metadata == {"run_id": "new", "tag": "new"}
    assert_indexes_consistent(kv)
    assert list(kv.list(None, filter={"tag": "old"})) == []
    kv.delete_for_runs(["old"])
    assert kv.get_tuple(config("dst")).checkpoint["channel_values"] == {"a": 2}
    kv.delete_for_runs(["new"])
    assert list(kv.list(None)) == []
    assert_indexes_consistent(kv)


def test_where_sqlitesaver_differs_kvsaver_follows_inmemorysaver() -> None:
    """Deliberate differences from SqliteSaver, each as InMemorySaver does it:
    a negative limit returns nothing (SQLite's LIMIT -1 means no limit), a
    ``before`` without a checkpoint_id does not filter (SQLite compares with
    NULL and returns nothing), and metadata need not be JSON (it goes through
    the serializer; SqliteSaver's json.dumps rejects a datetime)."""
    import datetime

    savers = [KVSaver(":memory:"), InMemorySaver()]
    results = []
    for s in savers:
        for i in range(3):
            s.put(config("t"), make_checkpoint(str(i)), {}, {})
        when = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
        s.put(config("t"), make_checkpoint("9"), {"when": when}, {})
        results.append(
            (
                list(s.list(None, limit=-1)),
                ids(s.list(config("t"), before={"configurable": {}})),
                s.get_tuple(config("t")).metadata,
            )
        )
    assert results[0] == results[1]
    assert results[0][0] == []
    assert results[0][1] == ["9", "2", "1", "0"]


async def test_concurrent_async_calls(kv: KVSaver) -> None:
    """Many aput/aput_writes in flight at once (they share commits where the
    store groups them) lose nothing and mix nothing up."""
    import asyncio

    async def one(i: int) -> None:
        v = {"a": ver(i)}
        c = await kv.aput(
            config(f"t{i % 7}"),
            make_checkpoint(f"{i:05d}", {"a": i}, v),
            {"i": i, "run_id": f"r{i % 3}"},
            v,
        )
        await kv.aput_writes(c, [("a", i), ("b", -i)], f"task{i}")

    await asyncio.gather(*(one(i) for i in range(150)))
    got = [t async for t in kv.alist(None)]
    assert ids(got) == [f"{i:05d}" for i in range(149, -1, -1)]
    for t in got:
        i = t.metadata["i"]
        assert t.config["configurable"]["thread_id"] == f"t{i % 7}"
        assert t.checkpoint["channel_values"] == {"a": i}
        assert t.pending_writes == [(f"task{i}", "a", i), (f"task{i}", "b", -i)]
    await asyncio.gather(*(kv.adelete_thread(f"t{k}") for k in range(0, 7, 2)))
    await kv.adelete_for_runs(["r1"])
    await asyncio.gather(kv.acopy_thread("t1", "copy"), kv.aprune(["t3"]))
    assert_indexes_consistent(kv)
    left = [t.metadata["i"] for t in kv.list(None)]
    # t1, t5 keep their r0/r2 checkpoints, "copy" has t1's, t3 keeps its latest.
    t1 = [i for i in range(150) if i % 7 == 1 and i % 3 != 1]
    t5 = [i for i in range(150) if i % 7 == 5 and i % 3 != 1]
    t3 = max(i for i in range(150) if i % 7 == 3 and i % 3 != 1)
    assert sorted(left) == sorted([*t1, *t1, *t5, t3])


_ids = st.text(max_size=40) | st.sampled_from(["", "a\x00b", "🦜", "x" * 600])


@given(
    thread=_ids,
    ns=_ids,
    cid=_ids,
    task=_ids,
    idxs=st.lists(st.integers(min_value=-10, max_value=10**6) | st.booleans(), max_size=5),
)
def test_write_keys_are_write_key_of_each_idx(
    thread: str, ns: str, cid: str, task: str, idxs: list[int]
) -> None:
    assert S.write_keys(S.task_write_prefix(thread, ns, cid, task), idxs) == [
        S.write_key(thread, ns, cid, task, i) for i in idxs
    ]


@given(
    thread=_ids,
    ns=_ids,
    cid=_ids,
    run=st.none() | _ids,
    metadata=st.dictionaries(
        st.text(max_size=10), st.integers() | st.text(max_size=20) | st.booleans(), max_size=4
    ),
)
def test_index_keys_are_the_keys_of_each_index(
    thread: str, ns: str, cid: str, run: str | None, metadata: dict[str, Any]
) -> None:
    rec = S.make_checkpoint_record(
        thread, ns, cid, None, ("null", b""), {**metadata, "run_id": run}, lambda v: ("x", b"")
    )
    expected = [S.by_id_key(cid, thread, ns)]
    if run is not None:
        expected.append(S.run_key(run, thread, ns, cid))
    expected += [S.meta_key(e, cid, thread, ns) for e in rec.meta]
    assert S.index_keys(rec) == expected


@given(thread=_ids, ns=_ids, cid=_ids, channels=st.lists(_ids, max_size=4))
def test_memoized_checkpoint_and_blob_keys_are_the_packed_tuples(
    thread: str, ns: str, cid: str, channels: list[str]
) -> None:
    # The (keyspace, thread, ns) prefix is packed once and reused.
    for _ in range(2):  # the second time from the memo
        assert S.checkpoint_key(thread, ns, cid) == pack(
            (S.CHECKPOINT, S.k(thread), S.k(ns), S.k(cid))
        )
        assert S.checkpoints_range(thread, ns) == prefix_range((S.CHECKPOINT, S.k(thread), S.k(ns)))
        versions = {ch: cid for ch in channels}
        assert S.blob_keys(thread, ns, versions) == [
            (ch, S.blob_key(thread, ns, ch, cid)) for ch in versions
        ]
        mixed = {ch: [cid, 7, 0.5, True][i % 4] for i, ch in enumerate(channels)}
        assert S.read_blob_keys(thread, ns, mixed) == [
            pack((S.BLOB, S.k(thread), S.k(ns), S.k(ch), S._ver(v))) for ch, v in mixed.items()
        ]


_versions = (
    _ids
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.booleans()
    | st.builds(lambda n, r: f"{n:032}.{r:016}", st.integers(0, 10**6), st.floats(0, 1))
)


@given(thread=_ids, ns=_ids, channel=_ids, version=_versions, task=_ids, cid=_ids)
def test_keys_built_from_parts_are_the_packed_tuples(
    thread: str, ns: str, channel: str, version: Any, task: str, cid: str
) -> None:
    # Put's keys are built from memoized parts and, for plain ASCII
    # ids and versions, encoded directly; the bytes must be pack()'s exactly.
    packed = pack((S.BLOB, S.k(thread), S.k(ns), S.k(channel), S._ver(version)))
    for _ in range(2):  # the second time from the memo
        assert S.blob_key(thread, ns, channel, version) == packed
        assert S.blob_keys(thread, ns, {channel: version}) == [(channel, packed)]
        assert S.blob_keys(thread, ns, {channel: version}, new=True) == [(channel, packed)]
        assert S.activity_key(thread) == pack((S.ACTIVITY, S.k(thread)))
        assert S.write_keys(S.task_write_prefix(thread, ns, cid, task), [0, -3, 7, 10**6]) == [
            pack((S.WRITE, S.k(thread), S.k(ns), S.k(cid), S.k(task), i)) for i in (0, -3, 7, 10**6)
        ]


_ids = st.text(st.sampled_from(["a", "\x00", "é", "😀", "\ud800", "0", ".", "-"]), max_size=120)


@given(_ids, _ids, _ids, st.one_of(_ids, st.integers(-5, 10**12), st.floats(0, 1e9)), _ids)
def test_fast_key_builders_equal_the_schema_tuples(
    thread: str, ns: str, channel: str, version: Any, checkpoint_id: str
) -> None:
    """The read path's memoized and one-step key builders give
    the bytes of the schema's tuples exactly, on a cold and a warm cache:
    hostile ids, lone surrogates, ids long enough for surrogate keys."""
    for _ in range(2):  # cold, then warm
        assert S.blob_keys(thread, ns, {channel: version}) == [
            (channel, pack((S.BLOB, S.k(thread), S.k(ns), S.k(channel), S._ver(version))))
        ]
        assert S.writes_range(thread, ns, checkpoint_id) == prefix_range(
            (S.WRITE, S.k(thread), S.k(ns), S.k(checkpoint_id))
        )
        assert S.checkpoint_key(thread, ns, checkpoint_id) == pack(
            (S.CHECKPOINT, S.k(thread), S.k(ns), S.k(checkpoint_id))
        )
        assert S._str_key_element(channel) == pack((S.k(channel),))
    S._CHANNEL_ELEMENTS.clear()
    S._VERSION_ELEMENTS.clear()
    S._TN_CACHE.clear()
