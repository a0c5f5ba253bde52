"""Pending writes against SqliteSaver: identity, replace/ignore, order.

SqliteSaver identifies a pending write by (thread, ns, checkpoint, task_id,
idx), with idx = WRITES_IDX_MAP.get(channel, position): ``task_path`` is
stored and used for ordering only. A batch made only of special channels is
``INSERT OR REPLACE``, any other batch ``INSERT OR IGNORE``; reads come back
in ``writes_sort_key`` (task_path, task_id, idx) order.

Each example is a random sequence of operations run on a fresh in-memory
SqliteSaver and a ``":memory:"`` KVSaver, comparing every result: task ids
and task paths are drawn from small pools independently, so one task id is
written under several paths, batches are retried with other values and other
lengths, and special channels (ERROR, INTERRUPT, RESUME, SCHEDULED) come
alone, together and mixed with regular ones. ``get_tuple``, ``list`` and
``get_delta_channel_history`` are compared along the way, and every
checkpoint of every thread at the end. (test_saver_differential.py covers
the rest of the saver's operations, with one path per task id.)
"""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
from hypothesis import given, settings
from kvsaver import KVSaver
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT, RESUME, SCHEDULED
from saver_helpers import config, make_checkpoint, sqlite_saver, tuple_dict, tuples

THREADS = ["t", "u"]
NAMESPACES = ["", "child:1"]
TASK_IDS = ["T", "U", "T2"]
TASK_PATHS = ["", "~__pregel_pull, a", "~__pregel_pull, b", "~__pregel_push, 0, 2"]
CHANNELS = ["a", "b", "a"]  # "a" twice: repeated channels in one batch are common
SPECIAL = [ERROR, INTERRUPT, RESUME, SCHEDULED]

write_value = st.integers(-5, 5) | st.text(max_size=3)
batch = st.lists(
    st.tuples(st.sampled_from(CHANNELS + SPECIAL), write_value), min_size=0, max_size=4
)
special_batch = st.lists(st.tuples(st.sampled_from(SPECIAL), write_value), min_size=1, max_size=3)

ops = st.one_of(
    st.tuples(
        st.just("put"),
        st.sampled_from(THREADS),
        st.sampled_from(NAMESPACES),
        st.booleans(),  # child of the latest checkpoint of (thread, ns), or a root
    ),
    st.tuples(
        st.just("put_writes"),
        st.integers(0, 50),  # which checkpoint
        st.sampled_from(TASK_IDS),
        st.sampled_from(TASK_PATHS),
        batch | special_batch,
    ),
    st.tuples(
        st.just("retry"),  # the last put_writes again: same task id, other path and values
        st.sampled_from(TASK_PATHS),
        batch,
    ),
    st.tuples(st.just("get"), st.integers(0, 50), st.booleans()),
    st.tuples(st.just("list"), st.sampled_from(THREADS), st.none() | st.integers(1, 3)),
    st.tuples(st.just("history"), st.integers(0, 50)),
    st.tuples(st.just("copy"), st.sampled_from(THREADS)),
)


class Pair:
    """The same operations on SqliteSaver (reference) and KVSaver, compared."""

    def __init__(self) -> None:
        self.ref = sqlite_saver()
        self.kv = KVSaver(":memory:")
        self.checkpoints: list[tuple[str, str, str]] = []  # (thread, ns, id) in put order
        self.threads = set(THREADS)
        self.last: tuple[dict[str, Any], str] | None = None  # (config, task_id)
        self.seq = 0

    def close(self) -> None:
        self.kv.close()
        self.ref.conn.close()

    def same(self, op: str, fn: Any) -> None:
        want, got = fn(self.ref), fn(self.kv)
        assert got == want, f"{op}:\n got={got!r}\nwant={want!r}"

    def pick(self, n: int) -> tuple[str, str, str] | None:
        return self.checkpoints[n % len(self.checkpoints)] if self.checkpoints else None

    def put(self, thread: str, ns: str, child: bool) -> None:
        parent = max((c for t, n, c in self.checkpoints if (t, n) == (thread, ns)), default=None)
        self.seq += 1
        cid = f"{self.seq:04d}"
        versions = {"a": f"{self.seq:032}.0", "b": f"{self.seq:032}.1"}
        cp = make_checkpoint(cid, {"a": self.seq, "b": [self.seq]}, versions)
        conf = config(thread, ns, parent if child else None)
        self.same("put", lambda s: s.put(conf, cp, {"step": self.seq}, versions))
        self.checkpoints.append((thread, ns, cid))

    def put_writes(self, conf: dict[str, Any], task_id: str, path: str, writes: list) -> None:
        for s in (self.ref, self.kv):
            s.put_writes(conf, writes, task_id, path)
        self.last = (conf, task_id)
        self.same("get_tuple after put_writes", lambda s: tuple_dict(s.get_tuple(conf)))

    def run(self, op: tuple) -> None:
        kind = op[0]
        if kind == "put":
            self.put(*op[1:])
        elif kind == "put_writes":
            if (target := self.pick(op[1])) is not None:
                self.put_writes(config(*target), *op[2:])
        elif kind == "retry":
            if self.last is not None:
                conf, task_id = self.last
                self.put_writes(conf, task_id, *op[1:])
        elif kind == "get":
            if (target := self.pick(op[1])) is not None:
                thread, ns, cid = target
                conf = config(thread, ns, cid if op[2] else None)
                self.same("get_tuple", lambda s: tuple_dict(s.get_tuple(conf)))
        elif kind == "list":
            conf = {"configurable": {"thread_id": op[1]}}
            self.same("list", lambda s: tuples(s.list(conf, limit=op[2])))
        elif kind == "history":
            if (target := self.pick(op[1])) is not None:
                conf = config(*target)
                self.same(
                    "get_delta_channel_history",
                    lambda s: s.get_delta_channel_history(
                        config=conf, channels=["a", "b", ERROR, INTERRUPT]
                    ),
                )
        elif kind == "copy":
            self.copy(op[1])

    def copy(self, src: str) -> None:
        """copy_thread into a new thread (SqliteSaver has none: its SQL)."""
        dst = f"{src}-copy{len(self.threads)}"
        with self.ref.cursor() as cur:
            cur.execute(
                "INSERT INTO checkpoints SELECT ?, checkpoint_ns, checkpoint_id, "
                "parent_checkpoint_id, type, checkpoint, metadata FROM checkpoints "
                "WHERE thread_id = ?",
                (dst, src),
            )
            cur.execute(
                "INSERT INTO writes (thread_id, checkpoint_ns, checkpoint_id, task_id, "
                "task_path, idx, channel, type, value) SELECT ?, checkpoint_ns, checkpoint_id, "
                "task_id, task_path, idx, channel, type, value FROM writes WHERE thread_id = ?",
                (dst, src),
            )
        self.kv.copy_thread(src, dst)
        self.threads.add(dst)
        self.checkpoints += [(dst, ns, cid) for t, ns, cid in list(self.checkpoints) if t == src]

    def check_all(self) -> None:
        for thread in sorted(self.threads):
            conf = {"configurable": {"thread_id": thread}}
            self.same(f"list({thread!r})", lambda s, c=conf: tuples(s.list(c)))
        for target in self.checkpoints:
            conf = config(*target)
            self.same(f"get_tuple{target}", lambda s, c=conf: tuple_dict(s.get_tuple(c)))


@settings(max_examples=300, deadline=None)
@given(st.lists(ops, min_size=1, max_size=30))
def test_pending_writes_match_sqlitesaver(sequence: list[tuple]) -> None:
    pair = Pair()
    try:
        pair.put("t", "", False)  # a checkpoint to write to from the first step
        for op in sequence:
            pair.run(op)
        pair.check_all()
    finally:
        pair.close()


def test_issue_example_one_task_two_paths() -> None:
    """The same task id under two task paths is one
    task's writes, (task_id, idx) their identity: 2 writes, as SqliteSaver."""
    pair = Pair()
    try:
        pair.put("t", "", False)
        cfg = config("t", "", "0001")
        for s in (pair.ref, pair.kv):
            s.put_writes(cfg, [("a", 1)], "T", "path-1")
            s.put_writes(cfg, [("b", 2), ("c", 3)], "T", "path-2")
        got = pair.kv.get_tuple(cfg)
        assert got is not None
        assert got.pending_writes == [("T", "a", 1), ("T", "c", 3)]
        pair.check_all()
    finally:
        pair.close()


def _one_task_many_paths(saver: Any) -> dict[str, Any]:
    """Task "T" under two paths with interleaved indexes: 0 and 3 under
    path-1, 1 and 2 under path-2; special writes of one task under two paths."""
    saver.put(config("t"), make_checkpoint("0001", {"a": 1}, {"a": "1"}), {}, {"a": "1"})
    cfg = config("t", "", "0001")
    saver.put_writes(cfg, [("a", "p1-0")], "T", "path-1")
    saver.put_writes(cfg, [("a", "x"), ("b", "p2-1"), ("a", "p2-2")], "T", "path-2")
    saver.put_writes(cfg, [("a", "x"), ("a", "x"), ("a", "x"), ("b", "p1-3")], "T", "path-1")
    saver.put_writes(cfg, [(ERROR, "e1")], "U", "path-2")
    saver.put_writes(cfg, [(INTERRUPT, "i1"), (ERROR, "e2")], "U", "path-1")
    saver.put_writes(cfg, [("b", "u0")], "U", "path-0")
    return cfg


def test_copy_all_keeps_each_writes_index_and_path() -> None:
    """copy_all through put_writes (which numbers every batch from 0): a task
    whose writes are spread over two paths keeps every write, its idx and its
    path, and verification compares the whole ordered list."""
    from kvsaver.migrate import copy_all

    ref = sqlite_saver()
    cfg = _one_task_many_paths(ref)
    want = ref.get_tuple(cfg).pending_writes
    assert len(want) == 7
    with KVSaver(":memory:") as src:
        _one_task_many_paths(src)
        assert src.get_tuple(cfg).pending_writes == want
        for dest in (KVSaver(":memory:"), sqlite_saver()):
            stats = copy_all(src, dest)  # verify=True: raises on any difference
            assert stats.verified == 1
            assert dest.get_tuple(cfg).pending_writes == want
            # A second run adds nothing (re-runnable).
            copy_all(src, dest, merge=True)
            assert dest.get_tuple(cfg).pending_writes == want
    ref.conn.close()
