"""Differential test: KVSaver (memory and LMDB, LMDB also with ``fast_paths=True``)
against SqliteSaver.

A hypothesis state machine generates sequences of saver operations and runs
each one on three savers, comparing every result field by field: puts with
parents across namespaces and hostile thread ids, put_writes with special
channels and retried task ids, get_tuple (latest and by id), list (every
config shape, metadata filter, before, limit) and delete_thread.

The contract that makes the results comparable: SqliteSaver stores the whole
checkpoint, KVSaver stores channel values per (channel, version) from
``new_versions`` (as InMemorySaver and PostgresSaver do). So every generated
put lists in ``new_versions`` each channel whose value changed (a new,
never-used version), and unchanged channels keep their parent's version.

Generation restrictions, each because SqliteSaver would answer differently
for a reason that is not a KVSaver bug (see the report / test_saver_basic.py
for the KVSaver-only checks of the same areas):
* checkpoint ids are unique across threads and namespaces, as uuid6 ids are:
  SqliteSaver orders by checkpoint_id only, so equal ids in two threads come
  back in an unspecified order;
* metadata is JSON-like and filters are scalars (SqliteSaver keeps metadata as
  JSON text and filters with json_extract);
* ``limit`` is never negative and ``before`` always has a checkpoint_id.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from kvsaver import KVSaver
from kvsaver.kv import PostgresStore
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT, RESUME, SCHEDULED
from pg_helpers import drop_tables, shared_pool, shared_server, unique_table
from saver_helpers import (
    assert_indexes_consistent,
    config,
    make_checkpoint,
    open_kv,
    sqlite_saver,
    tuple_dict,
    tuples,
)

THREADS = ["", "a", "a\x00", "a\x00b", "b", "🧵", "T" * 300]
NAMESPACES = ["", "child:1", "child:1|grand:2", "n\x00s", "N" * 150]
CHANNELS = ["messages", "x", "y", "c\x00h", "counter"]
SPECIAL = [ERROR, INTERRUPT, SCHEDULED, RESUME]
TASKS = {
    "t1": "~__pregel_pull, a",
    "t2": "~__pregel_push, 0, 2",
    "task-3": "",
    "\x00t": "~__pregel_pull, b",
}
EMPTY = object()  # a channel that has a version but no value

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)
json_like = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
# Channel and write values go through serde on both sides: richer types are fine.
values = (
    json_like
    | st.binary(max_size=8)
    | st.tuples(st.integers(-(2**63), 2**63 - 1), st.text(max_size=3))
)
# LangChain messages: what the fast paths (``fast_paths=True``) serialize and
# decode their own way. EXTEND: the parent's message list, its very objects,
# and one message more (a graph's history, whose elements are reused).
messages_st = st.lists(
    st.builds(HumanMessage, content=st.text(max_size=5))
    | st.builds(AIMessage, content=st.text(max_size=5), id=st.text(max_size=3)),
    max_size=3,
)
values = values | messages_st
EXTEND = object()
filter_values = st.sampled_from([None, True, False, 0, 1, 2, -1, "input", "loop", "", "x"])
metadata_st = st.fixed_dictionaries(
    {},
    optional={
        "source": st.sampled_from(["input", "loop", "update", "fork"]),
        "step": st.integers(-1, 3),
        "k1": json_like | filter_values,
        "k-2": filter_values,
        "run_id": st.sampled_from(["run-1", "run-2"]),
        "parents": st.dictionaries(st.sampled_from(NAMESPACES), st.text(max_size=4), max_size=2),
    },
)


class SaverComparison(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ref = sqlite_saver()
        self.tmp = tempfile.mkdtemp(prefix="kvdiff-")
        self.savers = {
            "memory": KVSaver(":memory:"),
            # durability "none": this test is about semantics, not fsync.
            "lmdb": KVSaver(f"{self.tmp}/db", durability="none"),
            # the speed paths on private upstream names, opt-in
            "lmdb-fast": KVSaver(f"{self.tmp}/fast", durability="none", fast_paths=True),
        }
        # (thread, ns) -> list of (checkpoint id, versions, values)
        self.model: dict[tuple[str, str], list[tuple[str, dict, dict]]] = {}
        self.counters: dict[tuple[str, str, str], int] = {}
        self.ids: list[str] = []  # every id ever used, including deleted ones
        self.runs: dict[str, str] = {}  # checkpoint id -> run_id metadata
        self.seq = 0

    def teardown(self) -> None:
        for saver in self.savers.values():
            saver.close()
        self.ref.conn.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- helpers ------------------------------------------------------------

    def both(self, op: str, fn: Any) -> Any:
        """Run fn(saver) on the reference and on each KVSaver; compare."""
        expected = fn(self.ref)
        for name, saver in self.savers.items():
            got = fn(saver)
            assert got == expected, f"{op} differs on {name}:\n got={got!r}\nwant={expected!r}"
        return expected

    def list_all_threads(self, op: str, limit: int | None = None, **kwargs: Any) -> None:
        """list(None, ...) compared where SqliteSaver's order is defined: copies
        give one checkpoint id in several threads, and SqliteSaver orders by
        id only. So: the same id sequence, and for each id the same records
        (a limit may cut a group of equal ids anywhere on either side)."""
        full = tuples(self.ref.list(None, **kwargs))
        want_ids = [t["config"]["configurable"]["checkpoint_id"] for t in full][:limit]
        for name, saver in self.savers.items():
            got = tuples(saver.list(None, limit=limit, **kwargs))
            got_ids = [t["config"]["configurable"]["checkpoint_id"] for t in got]
            where = f"{op} differs on {name}:\n got={got!r}\nwant={full!r}"
            assert got_ids == want_ids, where
            assert all(t in full for t in got), where
            keys = [tuple(t["config"]["configurable"].values()) for t in got]
            assert len(set(keys)) == len(keys), where

    def existing(self) -> list[tuple[str, str, str]]:
        return [(t, ns, cid) for (t, ns), cps in self.model.items() for cid, _, _ in cps]

    def next_version(self, thread: str, ns: str, channel: str) -> Any:
        n = self.counters.get((thread, ns, channel), 0) + 1
        self.counters[(thread, ns, channel)] = n
        if channel == "counter":
            return n  # int versions are allowed too
        return f"{n:032}.{(n * 7919) % 10**16:016}"

    # -- rules --------------------------------------------------------------

    @rule(
        thread=st.sampled_from(THREADS),
        ns=st.sampled_from(NAMESPACES),
        parent_pick=st.none() | st.integers(0, 10**6),
        changes=st.dictionaries(
            st.sampled_from(CHANNELS), st.just(EMPTY) | st.just(EXTEND) | values, max_size=3
        ),
        order=st.integers(0, 9999),
        metadata=metadata_st,
        extra=st.dictionaries(
            st.sampled_from(["user", "tag", "__hidden"]), st.text(max_size=3), max_size=2
        ),
    )
    def put(
        self,
        thread: str,
        ns: str,
        parent_pick: int | None,
        changes: dict[str, Any],
        order: int,
        metadata: dict[str, Any],
        extra: dict[str, Any],
    ) -> None:
        cps = self.model.setdefault((thread, ns), [])
        parent = None
        versions: dict[str, Any] = {}
        vals: dict[str, Any] = {}
        if parent_pick is not None and cps:
            parent, pversions, pvals = cps[parent_pick % len(cps)]
            versions, vals = dict(pversions), dict(pvals)
        new_versions = {}
        for ch, value in changes.items():
            versions[ch] = new_versions[ch] = self.next_version(thread, ns, ch)
            if value is EMPTY:
                vals.pop(ch, None)
            elif value is EXTEND:
                old = vals.get(ch)
                vals[ch] = [*(old if type(old) is list else []), AIMessage(f"m{self.seq}")]
            else:
                vals[ch] = value
        self.seq += 1
        cid = f"{order:04d}-{self.seq:05d}"  # sortable, unique everywhere
        checkpoint = make_checkpoint(
            cid,
            vals,
            versions,
            versions_seen={"node": dict(versions)},
            updated_channels=sorted(changes) or None,
        )
        conf = config(thread, ns, parent)
        conf["configurable"].update(extra)
        self.both(
            "put",
            lambda s: s.put(conf, checkpoint, metadata, new_versions),
        )
        cps.append((cid, versions, vals))
        self.ids.append(cid)
        if "run_id" in metadata:
            self.runs[cid] = metadata["run_id"]

    @rule(
        pick=st.integers(0, 10**6),
        task_id=st.sampled_from(sorted(TASKS)),
        writes=st.lists(
            st.tuples(st.sampled_from(CHANNELS + SPECIAL), values), min_size=0, max_size=4
        ),
        repeat=st.booleans(),
        own_path=st.integers(0, 3),
        other_path=st.sampled_from(sorted(set(TASKS.values()))),
    )
    def put_writes(
        self,
        pick: int,
        task_id: str,
        writes: list[tuple[str, Any]],
        repeat: bool,
        own_path: int,
        other_path: str,
    ) -> None:
        targets = self.existing()
        if not targets:
            return
        thread, ns, cid = targets[pick % len(targets)]
        conf = config(thread, ns, cid)
        # Mostly the task's own path; sometimes another one: a task id is one
        # task whatever its path, as in SqliteSaver.
        path = TASKS[task_id] if own_path else other_path
        self.both("put_writes", lambda s: s.put_writes(conf, writes, task_id, path))
        if repeat:
            # A retried task: regular writes are ignored, special ones replace.
            retry = [(ch, ("retry", i)) for i, (ch, _) in enumerate(writes)]
            self.both("put_writes", lambda s: s.put_writes(conf, retry, task_id, path))

    @rule(thread=st.sampled_from(THREADS), ns=st.sampled_from(NAMESPACES), with_ns=st.booleans())
    def get_latest(self, thread: str, ns: str, with_ns: bool) -> None:
        conf: dict[str, Any] = {"configurable": {"thread_id": thread}}
        if with_ns:
            conf["configurable"]["checkpoint_ns"] = ns
        self.both("get_tuple(latest)", lambda s: tuple_dict(s.get_tuple(conf)))

    @rule(pick=st.integers(0, 10**6), thread=st.sampled_from(THREADS), own=st.booleans())
    def get_by_id(self, pick: int, thread: str, own: bool) -> None:
        targets = self.existing()
        if own and targets:
            t, ns, cid = targets[pick % len(targets)]
        elif self.ids:
            t, ns, cid = thread, "", self.ids[pick % len(self.ids)]
        else:
            t, ns, cid = thread, "", "0000-00000"
        self.both("get_tuple(id)", lambda s: tuple_dict(s.get_tuple(config(t, ns, cid))))

    @rule(
        shape=st.sampled_from(["none", "thread", "thread+ns", "thread+ns+id", "thread+id"]),
        thread=st.sampled_from(THREADS),
        ns=st.sampled_from(NAMESPACES),
        pick=st.integers(0, 10**6),
        filter=st.none()
        | st.dictionaries(
            st.sampled_from(["source", "step", "k1", "k-2", "run_id"]),
            filter_values | st.sampled_from(["run-1", "run-2"]),
            max_size=2,
        ),
        before=st.none() | st.integers(0, 10**6) | st.sampled_from(["0", "5", "9999-99999"]),
        limit=st.none() | st.integers(0, 4),
    )
    def list_(
        self,
        shape: str,
        thread: str,
        ns: str,
        pick: int,
        filter: dict[str, Any] | None,
        before: int | str | None,
        limit: int | None,
    ) -> None:
        cid = self.ids[pick % len(self.ids)] if self.ids else "0000-00000"
        conf: dict[str, Any] | None
        if shape == "none":
            conf = None
        else:
            c: dict[str, Any] = {"thread_id": thread}
            if "ns" in shape:
                c["checkpoint_ns"] = ns
            if "id" in shape:
                c["checkpoint_id"] = cid
            conf = {"configurable": c}
        before_conf = None
        if isinstance(before, str):
            before_conf = {"configurable": {"checkpoint_id": before}}
        elif before is not None and self.ids:
            before_conf = {"configurable": {"checkpoint_id": self.ids[before % len(self.ids)]}}
        op = f"list({shape}, filter={filter}, before={before_conf}, limit={limit})"
        if conf is None:
            self.list_all_threads(op, limit, filter=filter, before=before_conf)
            return
        self.both(
            op, lambda s: tuples(s.list(conf, filter=filter, before=before_conf, limit=limit))
        )

    @rule(
        thread=st.sampled_from(THREADS),
        ns=st.sampled_from(NAMESPACES),
        changes=st.dictionaries(st.sampled_from(CHANNELS), values, min_size=1, max_size=2),
        order=st.integers(0, 9999),
        step=st.integers(0, 3),
    )
    def put_child_of_latest(
        self, thread: str, ns: str, changes: dict[str, Any], order: int, step: int
    ) -> None:
        """The common case, weighted up: extend the chain under the latest."""
        cps = self.model.get((thread, ns))
        pick = None
        if cps:
            latest = max(cid for cid, _, _ in cps)
            pick = next(i for i, (cid, _, _) in enumerate(cps) if cid == latest)
        self.put(thread, ns, pick, changes, order, {"source": "loop", "step": step}, {})

    @rule(
        pick=st.integers(0, 10**6),
        changes=st.dictionaries(st.sampled_from(CHANNELS), values, max_size=2),
    )
    def fork_becomes_latest(self, pick: int, changes: dict[str, Any]) -> None:
        """A child of any checkpoint of one thread, put as its newest: the
        channels it leaves alone have the parent's versions, which the head
        of the checkpoint before it may hold at other versions."""
        self.put("a", "", pick, changes, 9999, {"source": "fork"}, {})

    @rule(thread=st.sampled_from([*THREADS, "never-used"]), dice=st.integers(0, 3))
    def delete_thread(self, thread: str, dice: int) -> None:
        if dice != 3:
            return  # deleting is rarer than the other rules
        self.both("delete_thread", lambda s: s.delete_thread(thread))
        for key in [key for key in self.model if key[0] == thread]:
            del self.model[key]

    # Extended operations: SqliteSaver has no delete_for_runs or prune, so the
    # reference runs the equivalent SQL (as PostgresSaver implements them).

    @rule(
        runs=st.lists(st.sampled_from(["run-1", "run-2", "run-3"]), max_size=2),
        dice=st.integers(0, 3),
    )
    def delete_for_runs(self, runs: list[str], dice: int) -> None:
        if dice != 3:
            return
        run_of = "json_extract(CAST(metadata AS TEXT), '$.run_id')"
        marks = ",".join("?" * len(runs))
        doomed = (
            "SELECT thread_id, checkpoint_ns, checkpoint_id FROM checkpoints "
            f"WHERE {run_of} IN ({marks})"
        )
        with self.ref.cursor() as cur:
            cur.execute(
                f"DELETE FROM writes WHERE (thread_id, checkpoint_ns, checkpoint_id) IN ({doomed})",
                runs,
            )
            cur.execute(f"DELETE FROM checkpoints WHERE {run_of} IN ({marks})", runs)
        for saver in self.savers.values():
            saver.delete_for_runs(runs)
        for key, cps in self.model.items():
            self.model[key] = [cp for cp in cps if self.runs.get(cp[0]) not in runs]

    @rule(
        threads=st.lists(st.sampled_from(THREADS), max_size=2),
        delete=st.booleans(),
        dice=st.integers(0, 3),
    )
    def prune(self, threads: list[str], delete: bool, dice: int) -> None:
        if dice != 3:
            return
        for thread in threads:
            if delete:
                self.ref.delete_thread(thread)
                continue
            keep = (
                "(SELECT MAX(checkpoint_id) FROM checkpoints c WHERE "
                "c.thread_id = {t}.thread_id AND c.checkpoint_ns = {t}.checkpoint_ns)"
            )
            with self.ref.cursor() as cur:
                for table in ("writes", "checkpoints"):
                    cur.execute(
                        f"DELETE FROM {table} WHERE thread_id = ? AND checkpoint_id < "
                        + keep.format(t=table),
                        (thread,),
                    )
        for saver in self.savers.values():
            saver.prune(threads, strategy="delete" if delete else "keep_latest")
        for key in list(self.model):
            if key[0] in threads:
                if delete:
                    del self.model[key]
                else:
                    latest = max(self.model[key], key=lambda cp: cp[0], default=None)
                    self.model[key] = [] if latest is None else [latest]

    @rule(
        src=st.sampled_from(THREADS),
        dst=st.sampled_from([*THREADS, "copy-1", "copy-2"]),
        dice=st.integers(0, 3),
    )
    def copy_thread(self, src: str, dst: str, dice: int) -> None:
        # Into an empty target only: into a used one, KVSaver merges (its
        # docstring), and deterministic test versions would collide there.
        if dice < 2 or src == dst or any(t == dst and cps for (t, _), cps in self.model.items()):
            return
        with self.ref.cursor() as cur:
            cur.execute(
                "INSERT OR REPLACE INTO checkpoints SELECT ?, checkpoint_ns, checkpoint_id, "
                "parent_checkpoint_id, type, checkpoint, metadata FROM checkpoints "
                "WHERE thread_id = ?",
                (dst, src),
            )
            cur.execute(
                "INSERT OR REPLACE INTO writes (thread_id, checkpoint_ns, checkpoint_id, "
                "task_id, task_path, idx, channel, type, value) SELECT ?, checkpoint_ns, "
                "checkpoint_id, task_id, task_path, idx, channel, type, value FROM writes "
                "WHERE thread_id = ?",
                (dst, src),
            )
        for saver in self.savers.values():
            saver.copy_thread(src, dst)
        for (t, ns), cps in list(self.model.items()):
            if t == src:
                self.model[(dst, ns)] = list(cps)
        for (t, ns, ch), n in list(self.counters.items()):
            if t == src:  # later versions on the copy must not reuse the source's
                key = (dst, ns, ch)
                self.counters[key] = max(self.counters.get(key, 0), n)

    @invariant()
    def everything_equal(self) -> None:
        self.list_all_threads("list(None)")

    @invariant()
    def indexes_consistent(self) -> None:
        for name, saver in self.savers.items():
            assert_indexes_consistent(saver, name)


SaverComparison.TestCase.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
test_kvsaver_matches_sqlitesaver = SaverComparison.TestCase


class SaverComparisonPostgres(SaverComparison):
    """The same machine against KVSaver on PostgreSQL (a fresh table per
    example, one pool for the whole run). Fewer examples: every step costs
    round trips to a server, and the store layer under it is checked
    against a model by tests/test_stores.py."""

    def __init__(self) -> None:
        super().__init__()
        for saver in self.savers.values():
            saver.close()
        self.savers = {
            "postgres": KVSaver(PostgresStore(shared_pool(), table=unique_table("diff"))),
        }

    def teardown(self) -> None:
        table = self.savers["postgres"].store.table
        super().teardown()
        drop_tables(shared_server().url, [table])


SaverComparisonPostgres.TestCase.settings = settings(
    max_examples=20, stateful_step_count=40, deadline=None
)
test_kvsaver_on_postgres_matches_sqlitesaver = SaverComparisonPostgres.TestCase


class SaverComparisonHeads(SaverComparison):
    """The same machine against ``KVSaver(dir, whole_latest=True)`` (its head
    records), with the latest checkpoint of every (thread, ns) the
    model has touched compared after every step: a head left stale by a
    delete, a prune, a copy, an older put or a child put would be served
    there. Fewer examples: each step reads every thread."""

    def __init__(self) -> None:
        super().__init__()
        for saver in self.savers.values():
            saver.close()
        self.savers = {
            "lmdb-whole": KVSaver(f"{self.tmp}/whole", durability="none", whole_latest=True),
            "lmdb-whole-fast": KVSaver(
                f"{self.tmp}/whole-fast", durability="none", whole_latest=True, fast_paths=True
            ),
        }

    @invariant()
    def every_latest_equal(self) -> None:
        for thread, ns in list(self.model):
            conf = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
            self.both(
                f"get_tuple(latest of {thread!r}, {ns!r})",
                lambda s, conf=conf: tuple_dict(s.get_tuple(conf)),
            )


SaverComparisonHeads.TestCase.settings = settings(
    max_examples=30, stateful_step_count=40, deadline=None
)
test_kvsaver_whole_latest_matches_sqlitesaver = SaverComparisonHeads.TestCase


def _empty_id_story(saver: Any) -> list[Any]:
    """ "" as a checkpoint id (hostile, but a str both savers store): a
    checkpoint "", its writes, a child "1ef1", then every read of them."""
    saver.put(config("t"), make_checkpoint(""), {"a": 1}, {})
    saver.put_writes(config("t", checkpoint_id=""), [("ch", 1), (ERROR, "e")], "task")
    saver.put(config("t", checkpoint_id=""), make_checkpoint("1ef1"), {"a": 2}, {})
    saver.put_writes(config("t", checkpoint_id="1ef1"), [("ch", 2)], "task")
    return [
        tuple_dict(saver.get_tuple(config("t", checkpoint_id=""))),  # falsy id: the latest
        tuple_dict(saver.get_tuple(config("t"))),
        tuples(saver.list(config("t"))),
        tuples(saver.list(config("t"), before=config("t", checkpoint_id=""))),
        tuples(saver.list(None, before=config("t", checkpoint_id=""))),
        tuples(saver.list(config("t", checkpoint_id="1ef1"), before=config("t", checkpoint_id=""))),
        tuples(saver.list(None, filter={"a": 2}, before=config("t", checkpoint_id=""))),
        tuples(saver.list(config("t"), before=config("t", checkpoint_id="1ef1"))),
        tuples(saver.list(None, filter={"a": 1}, before=config("t", checkpoint_id="1ef1"))),
    ]


@pytest.mark.parametrize("whole_latest", [True, False])
@pytest.mark.parametrize("backend", ["memory", "lmdb"])
def test_empty_checkpoint_id_as_sqlitesaver(
    tmp_path: Path, backend: str, whole_latest: bool
) -> None:
    """put_writes under checkpoint id "" is stored (it was refused as a
    missing id), and list(before=id "") returns nothing, as no id sorts
    below "" (it returned everything)."""
    want = _empty_id_story(sqlite_saver())
    assert want[3] == want[4] == want[5] == want[6] == [] and want[2][1]["pending_writes"]
    saver = open_kv(backend, tmp_path, whole_latest=whole_latest)
    try:
        assert _empty_id_story(saver) == want
    finally:
        saver.close()
