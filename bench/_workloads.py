"""Shared pieces of the benchmark suites: the savers under test, the fixed
synthetic workload (checkpoint sequences, pending writes), the real StateGraph
agent, store builders, the floor helpers, paired rounds and the results files.

Everything here is deterministic except checkpoint ids (uuid6, as LangGraph
makes them) and channel versions (each saver's own ``get_next_version``).

Only the public API of ``kvsaver`` and ``kvsaver.kv`` is used (KVSaver and its
options, the Store protocol, LMDBStore, Retention, compact_lmdb), so the same
suite runs against an older checkout of the code for an A/B.

``KVSAVER_BENCH_QUICK=1`` (or ``pytest bench --quick``) is the smoke mode:
fewer rounds and smaller stores everywhere; its figures are not results.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import platform
import random
import shutil
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from typing import Annotated, Any, TypedDict

import lmdb
from kvsaver import KVSaver
from kvsaver.kv import MemoryStore
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph.message import add_messages

# -- the savers under test ----------------------------------------------------------

KV_LMDB = "kvsaver-lmdb"
KV_MEM = "kvsaver-memory"
KV_WHOLE = "kvsaver-lmdb-whole"  # KVSaver(dir, whole_latest=True): the wide-store read rows
KV_BLOBS = "kvsaver-lmdb-blobs"  # KVSaver(dir, whole_latest=False): the wide-store read rows
SQLITE = "sqlite"
INMEM = "inmemory"
SAVERS = [KV_LMDB, KV_MEM, SQLITE, INMEM]
DISK_SAVERS = [KV_LMDB, SQLITE]
REFERENCE = SQLITE  # ratios in the report are "x SqliteSaver"


def make_saver(name: str, workdir: str, **kv_options: Any) -> BaseCheckpointSaver:
    """A fresh saver with the defaults a user gets. ``workdir`` must be a new,
    empty directory for the on-disk savers."""
    if name == KV_LMDB:
        return KVSaver(os.path.join(workdir, "kv"), **kv_options)
    if name == KV_WHOLE:  # every put rewrites the thread's head
        return KVSaver(os.path.join(workdir, "kv"), whole_latest=True, **kv_options)
    if name == KV_BLOBS:  # no heads: a thread read before it went idle
        return KVSaver(os.path.join(workdir, "kv"), whole_latest=False, **kv_options)
    if name == KV_MEM:
        return KVSaver(":memory:")
    if name == SQLITE:
        conn = sqlite3.connect(os.path.join(workdir, "cp.sqlite"), check_same_thread=False)
        return SqliteSaver(conn)
    if name == INMEM:
        return InMemorySaver()
    raise ValueError(f"unknown saver {name!r}")


def close_saver(saver: Any) -> None:
    if isinstance(saver, KVSaver):
        saver.close()
    elif isinstance(saver, SqliteSaver):
        saver.conn.close()


def stores_per_saver(
    tmp_path_factory: Any, prefix: str, names: Any, build: Callable[[str, str], Any]
) -> Iterator[dict[str, Any]]:
    """A module fixture's body: ``build(name, directory)`` for each saver
    name, each in a fresh directory; afterwards each store's saver closed
    and its directory removed."""
    dirs = {name: str(tmp_path_factory.mktemp(f"{prefix}-{name}")) for name in names}
    built = {name: build(name, d) for name, d in dirs.items()}
    yield built
    for name, st in built.items():
        close_saver(st.saver)
        shutil.rmtree(dirs[name], ignore_errors=True)


def disk_bytes(path: str) -> int:
    """Bytes of every file under ``path`` (a store directory or one file's directory)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


# -- deterministic content ------------------------------------------------------------

_WORDS = (
    "state graph node edge channel version checkpoint thread message tool call result "
    "search answer question user assistant context memory plan step retry value reduce "
    "append update merge branch route stream token model prompt reply summary"
).split()


def text(chars: int, seed: int) -> str:
    """About ``chars`` characters of words, the same for the same seed."""
    return words_text(random.Random(seed), chars)


def words_text(rnd: random.Random, chars: int, words: Sequence[str] = _WORDS) -> str:
    """``chars`` characters of words drawn from ``words`` by ``rnd``."""
    out: list[str] = []
    n = 0
    while n < chars:
        w = rnd.choice(words)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:chars]


def ts() -> str:
    return datetime.now(timezone.utc).isoformat()


# -- the synthetic thread: 10 channels, 1-2 changed per put, one a growing list ------

CHANNELS = ["messages"] + [f"field{i}" for i in range(1, 10)]
NODES = ["agent", "tools", "router"]


def message(i: int, chars: int, seed: int = 0) -> dict[str, Any]:
    return {
        "role": "assistant" if i % 2 else "user",
        "id": f"msg-{i:06d}",
        "content": text(chars, i + seed),
    }


@dataclass
class PutArgs:
    config: dict[str, Any]
    checkpoint: dict[str, Any]
    metadata: dict[str, Any]
    new_versions: dict[str, Any]


@dataclass
class ThreadGen:
    """Generates ``put`` arguments for one thread, as a graph would produce them.

    The first checkpoint (source "input") sets all 10 channels; each later one
    appends a message to ``messages`` (the growing list) and, every other step,
    also changes one of the nine other channels: 1-2 changed channels per put,
    and ``new_versions`` names exactly those. ``window`` caps the list (a
    trimming agent) so long threads stay a realistic size.
    """

    saver: BaseCheckpointSaver
    thread_id: str
    msg_chars: int = 300
    field_chars: int = 200
    window: int | None = None
    tag: str | None = None
    first_messages: int = 1  # messages of the first ("input") checkpoint
    seed: int = 0  # offsets the text seeds: threads with different content
    step: int = -1
    parent_id: str | None = None
    values: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    n_msgs: int = 0

    def _bump(self, ch: str) -> Any:
        v = self.saver.get_next_version(self.versions.get(ch), None)
        self.versions[ch] = v
        return v

    def next(self) -> PutArgs:
        if self.step == -1:
            changed = list(CHANNELS)
            self.values["messages"] = [
                message(i, self.msg_chars, self.seed) for i in range(self.first_messages)
            ]
            self.n_msgs = self.first_messages
            for i, ch in enumerate(CHANNELS[1:], 1):
                self.values[ch] = {
                    "name": ch,
                    "text": text(self.field_chars, 1000 + i + self.seed),
                    "n": 0,
                }
            source = "input"
        else:
            changed = ["messages"]
            msgs = [*self.values["messages"], message(self.n_msgs, self.msg_chars, self.seed)]
            self.n_msgs += 1
            if self.window is not None and len(msgs) > self.window:
                msgs = msgs[-self.window :]
            self.values["messages"] = msgs
            if self.step % 2 == 0:
                ch = CHANNELS[1 + (self.step // 2) % 9]
                old = self.values[ch]
                self.values[ch] = {
                    "name": ch,
                    "text": text(self.field_chars, 2000 + self.step + self.seed),
                    "n": old["n"] + 1,
                }
                changed.append(ch)
            source = "loop"
        new_versions = {ch: self._bump(ch) for ch in changed}
        node = NODES[(self.step + 1) % len(NODES)]
        self.seen[node] = {ch: self.versions[ch] for ch in CHANNELS[:4]}
        checkpoint = {
            "v": 2,
            "id": str(uuid6(clock_seq=self.step)),
            "ts": ts(),
            "channel_values": dict(self.values),
            "channel_versions": dict(self.versions),
            "versions_seen": {k: dict(v) for k, v in self.seen.items()},
            "pending_sends": [],
            "updated_channels": changed,
        }
        metadata: dict[str, Any] = {"source": source, "step": self.step, "parents": {}}
        if self.tag is not None:
            metadata["tag"] = self.tag
        conf: dict[str, Any] = {"thread_id": self.thread_id, "checkpoint_ns": ""}
        if self.parent_id is not None:
            conf["checkpoint_id"] = self.parent_id
        args = PutArgs({"configurable": conf}, checkpoint, metadata, new_versions)
        self.parent_id = checkpoint["id"]
        self.step += 1
        return args

    def config(self, checkpoint_id: str | None = None) -> dict[str, Any]:
        """The config naming checkpoint_id (default: the last one generated)."""
        return {
            "configurable": {
                "thread_id": self.thread_id,
                "checkpoint_ns": "",
                "checkpoint_id": checkpoint_id or self.parent_id,
            }
        }


def writes_for(step: int, chars: int = 300) -> list[tuple[str, Any]]:
    """The 3 pending writes of one task: a message, a field update, a branch trigger."""
    return [
        ("messages", [message(10_000 + step, chars)]),
        ("field3", {"name": "field3", "text": text(chars // 2, 3000 + step), "n": step}),
        ("branch:to:agent", None),
    ]


def task_id(i: int) -> str:
    return f"00000000-0000-4000-8000-{i:012d}"


def run_puts(saver: BaseCheckpointSaver, ops: list[PutArgs]) -> None:
    for a in ops:
        saver.put(a.config, a.checkpoint, a.metadata, a.new_versions)


# -- the read store: 1,000 threads, one of them with 1,000 checkpoints ---------------

BIG_THREAD = "thread-big"
N_THREADS = 1_000
SMALL_CHECKPOINTS = 3
BIG_CHECKPOINTS = 1_000
N_TAGS = 200  # tag of thread i is "tag-{i % 200}"; a tag + source=input matches 5


@dataclass
class ReadStore:
    name: str
    saver: BaseCheckpointSaver
    big_latest: dict[str, Any]  # config of the big thread, no checkpoint_id
    big_by_id: dict[str, Any]  # config naming its 500th checkpoint
    filter_tag: str
    filter_matches: int
    build_seconds: float
    checkpoints: int


def populate(
    saver: BaseCheckpointSaver, *, tag_threads: bool = True, threads: int = N_THREADS
) -> tuple[dict, dict, int]:
    """Write the read store through the saver's own ``put``/``put_writes``
    (``threads`` - 1 small threads and the big one)."""
    n = 0
    for i in range(threads - 1):
        gen = ThreadGen(
            saver,
            f"thread-{i:04d}",
            msg_chars=200,
            field_chars=100,
            window=20,
            tag=f"tag-{i % N_TAGS}" if tag_threads else None,
        )
        for _ in range(SMALL_CHECKPOINTS):
            a = gen.next()
            saver.put(a.config, a.checkpoint, a.metadata, a.new_versions)
            n += 1
    gen = ThreadGen(saver, BIG_THREAD, window=20, tag="tag-big")
    by_id = None
    for j in range(BIG_CHECKPOINTS):
        a = gen.next()
        saver.put(a.config, a.checkpoint, a.metadata, a.new_versions)
        n += 1
        if j < BIG_CHECKPOINTS - 1:  # pending writes on every checkpoint but the last
            saver.put_writes(gen.config(), writes_for(j), task_id(j))
        if j == BIG_CHECKPOINTS // 2:
            by_id = gen.config()
    latest = {"configurable": {"thread_id": BIG_THREAD, "checkpoint_ns": ""}}
    assert by_id is not None
    return latest, by_id, n


def build_read_store(name: str, workdir: str, threads: int = N_THREADS) -> ReadStore:
    """Build fast (no fsync while building), then reopen with the defaults."""
    t0 = time.perf_counter()
    if name in (KV_LMDB, KV_WHOLE):
        builder = make_saver(name, workdir, durability="none")
        latest, by_id, n = populate(builder, threads=threads)
        builder.store.sync()  # type: ignore[attr-defined]
        close_saver(builder)
        saver = make_saver(name, workdir)
    elif name == SQLITE:
        builder = make_saver(name, workdir)
        builder.setup()  # type: ignore[attr-defined]
        builder.conn.execute("PRAGMA synchronous=OFF")  # type: ignore[attr-defined]
        latest, by_id, n = populate(builder, threads=threads)
        close_saver(builder)
        saver = make_saver(name, workdir)
    else:
        saver = make_saver(name, workdir)
        latest, by_id, n = populate(saver, threads=threads)
    tag = "tag-7"
    matches = len(list(saver.list(None, filter={"source": "input", "tag": tag})))
    assert matches == sum(1 for i in range(threads - 1) if i % N_TAGS == 7), matches
    return ReadStore(name, saver, latest, by_id, tag, matches, time.perf_counter() - t0, n)


# -- the wide read store: 1,000 threads of ~13 KB checkpoints, 10 channels ----------

WIDE_THREADS = 1_000
WIDE_CHECKPOINTS = 10  # per thread: list(limit=10) returns a whole thread
WIDE_BY_ID = 5  # get_tuple by id names each thread's 6th checkpoint (with pending writes)
WIDE_FILTER = {"source": "input"}  # one per thread: ~1,000 matches


@dataclass
class WideStore:
    name: str
    saver: BaseCheckpointSaver
    latest: list[dict[str, Any]]  # per thread: config without checkpoint_id
    by_id: list[dict[str, Any]]  # per thread: config naming its WIDE_BY_ID-th checkpoint
    build_seconds: float
    checkpoint_bytes: int  # serialized size of one full checkpoint (values + the rest)


def populate_wide(saver: BaseCheckpointSaver, threads: int = WIDE_THREADS) -> WideStore:
    """The wide store: ``threads`` threads of WIDE_CHECKPOINTS checkpoints,
    10 channels of ~13 KB in all (20 messages of 300 characters, a window of
    20, nine 500-character fields); 3 pending writes on the checkpoint that
    ``by_id`` names. Written through the saver's own put/put_writes."""
    latest, by_id = [], []
    size = 0
    for i in range(threads):
        gen = ThreadGen(
            saver,
            f"wide-{i:04d}",
            msg_chars=300,
            field_chars=500,
            window=20,
            first_messages=20,
            seed=1_000_000 * (i + 1),
        )
        for j in range(WIDE_CHECKPOINTS):
            a = gen.next()
            saver.put(a.config, a.checkpoint, a.metadata, a.new_versions)
            if j == WIDE_BY_ID:
                by_id.append(gen.config())
                saver.put_writes(gen.config(), writes_for(j), task_id(i))
        if i == 0:
            plain = JsonPlusSerializer()
            values = a.checkpoint["channel_values"]
            rest = {k: v for k, v in a.checkpoint.items() if k != "channel_values"}
            size = sum(len(plain.dumps_typed(v)[1]) for v in [*values.values(), rest])
        latest.append({"configurable": {"thread_id": gen.thread_id, "checkpoint_ns": ""}})
    return WideStore(saver.__class__.__name__, saver, latest, by_id, 0.0, size)


def build_wide_store(name: str, workdir: str, threads: int = WIDE_THREADS) -> WideStore:
    """Build fast (no fsync while building), then reopen with the defaults."""
    t0 = time.perf_counter()
    if name in (KV_LMDB, KV_BLOBS):
        # KV_LMDB: the heads of idle threads, written during the build and by close()
        builder = make_saver(name, workdir, durability="none")
        st = populate_wide(builder, threads)
        builder.store.sync()  # type: ignore[attr-defined]
        close_saver(builder)
        saver = make_saver(name, workdir)
    elif name == SQLITE:
        builder = make_saver(name, workdir)
        builder.setup()  # type: ignore[attr-defined]
        builder.conn.execute("PRAGMA synchronous=OFF")  # type: ignore[attr-defined]
        st = populate_wide(builder, threads)
        close_saver(builder)
        saver = make_saver(name, workdir)
    else:
        saver = make_saver(name, workdir)
        st = populate_wide(saver, threads)
    st.name, st.saver, st.build_seconds = name, saver, time.perf_counter() - t0
    return st


# -- floors: serialization alone, and a raw py-lmdb commit of the same bytes ---------


class RecordingStore:
    """A ``kv.Store`` (a MemoryStore underneath) that remembers every key/value
    its write transactions put. A KVSaver over it yields the exact bytes
    ``put``/``put_writes`` write, whatever layout the code under test has.
    Whatever else the Store protocol grows is forwarded to the MemoryStore."""

    readonly = False

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.puts: list[tuple[bytes, bytes]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def read(self) -> Any:
        return self.inner.read()

    @contextmanager
    def write(self) -> Iterator[Any]:
        with self.inner.write() as txn:
            yield _RecordingTxn(txn, self.puts)

    def transact(self, fn: Callable[[Any], Any]) -> Any:
        done: list[tuple[bytes, bytes]] = []

        def run(txn: Any) -> Any:
            done.clear()  # fn may be rerun: keep the last run's puts
            return fn(_RecordingTxn(txn, done))

        result = self.inner.transact(run)
        self.puts.extend(done)
        return result

    def close(self) -> None:
        self.inner.close()

    def __enter__(self) -> RecordingStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def take(self) -> list[tuple[bytes, bytes]]:
        out, self.puts = self.puts, []
        return out


class _RecordingTxn:
    def __init__(self, txn: Any, puts: list[tuple[bytes, bytes]]) -> None:
        self._txn = txn
        self._puts = puts

    def put(self, key: bytes, value: bytes) -> None:
        self._puts.append((bytes(key), bytes(value)))
        self._txn.put(key, value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)


class Recorder:
    """The (key, value) pairs KVSaver writes for a put / put_writes call."""

    def __init__(self) -> None:
        self.store = RecordingStore()
        self.saver = KVSaver(self.store)  # type: ignore[arg-type]
        self.store.take()  # the schema record

    def put(self, a: PutArgs) -> list[tuple[bytes, bytes]]:
        self.saver.put(a.config, a.checkpoint, a.metadata, a.new_versions)
        return self.store.take()

    def put_writes(self, cfg: dict, writes: list, tid: str) -> list[tuple[bytes, bytes]]:
        self.saver.put_writes(cfg, writes, tid)
        return self.store.take()


def serialize_put(serde: Any, a: PutArgs) -> None:
    """What any put must do at least: dumps_typed of the changed channel values,
    of the checkpoint without values, and of the metadata."""
    values = a.checkpoint["channel_values"]
    for ch in a.new_versions:
        serde.dumps_typed(values[ch])
    cp = {k: v for k, v in a.checkpoint.items() if k != "channel_values"}
    serde.dumps_typed(cp)
    serde.dumps_typed(a.metadata)


class SaverClock:
    """Accumulates the time spent inside a saver's ``methods`` (any thread),
    by ``clock``: ``time.perf_counter`` for wall-clock time, or
    ``time.thread_time`` for the CPU of the calling threads alone (what
    the CPU rows need: a graph's process CPU minus a run with no
    checkpointer is a small difference of large numbers)."""

    METHODS = ("put", "put_writes", "get_tuple")
    # What a graph calls of a saver (the CPU rows).
    GRAPH_METHODS = (*METHODS, "get_next_version")

    def __init__(
        self,
        saver: Any,
        clock: Callable[[], float] = time.perf_counter,
        methods: Sequence[str] = METHODS,
    ) -> None:
        self.total = 0.0
        self._clock = clock
        self._lock = threading.Lock()
        for name in methods:
            setattr(saver, name, self._timed(getattr(saver, name)))

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        clock = self._clock

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = clock() - t0
                with self._lock:  # += reads, then writes: threads would lose additions
                    self.total += dt

        return timed


def raw_lmdb(path: str, zeroed: bool = False, metasync: bool = True) -> lmdb.Environment:
    """A py-lmdb environment with exactly KVSaver's settings (durability "full";
    ``metasync=False``: its "meta").

    ``zeroed``: the data file is first written with 16 MiB of zeros past
    LMDB's pages and synced, as LMDBStore keeps its file zeroed ahead, so
    commits overwrite blocks instead of extending the file: the floor of
    what a store doing that can reach."""
    os.makedirs(path, exist_ok=True)
    env = lmdb.open(
        path,
        map_size=64 << 20,
        subdir=True,
        max_readers=256,
        max_dbs=0,
        max_spare_txns=0,
        readahead=False,
        lock=True,
        sync=True,
        metasync=metasync,
    )
    if zeroed:
        raw_commit(env, [(b"\x00", b"")])  # the file exists, with its meta pages
        with open(os.path.join(path, "data.mdb"), "r+b") as f:
            f.seek(0, os.SEEK_END)
            f.write(bytes(16 << 20))
            f.flush()
            os.fdatasync(f.fileno())
    return env


def raw_commit(env: lmdb.Environment, pairs: list[tuple[bytes, bytes]]) -> None:
    with env.begin(write=True) as txn:
        for k, v in pairs:
            txn.put(k, v)


# -- the real StateGraph agent ----------------------------------------------------------


class AgentState(TypedDict):
    messages: Annotated[list, add_messages]
    turns: int
    max_turns: int


def build_agent(checkpointer: BaseCheckpointSaver | None, chars: int = 300) -> Any:
    """agent -> tools -> agent ... until ``max_turns`` agent turns, then END.
    Each node appends one message of ``chars`` characters (no model, no I/O)."""
    from langchain_core.messages import AIMessage, ToolMessage
    from langgraph.graph import END, START, StateGraph

    def agent(state: AgentState) -> dict[str, Any]:
        n = len(state["messages"])
        turns = state.get("turns", 0) + 1
        done = turns >= state["max_turns"]
        calls = [] if done else [{"name": "search", "args": {"q": text(40, n)}, "id": f"call-{n}"}]
        return {
            "messages": [AIMessage(content=text(chars, n), tool_calls=calls)],
            "turns": turns,
        }

    def tools(state: AgentState) -> dict[str, Any]:
        n = len(state["messages"])
        call_id = state["messages"][-1].tool_calls[0]["id"]
        return {"messages": [ToolMessage(content=text(chars, 7 * n), tool_call_id=call_id)]}

    def route(state: AgentState) -> str:
        return END if state["turns"] >= state["max_turns"] else "tools"

    g = StateGraph(AgentState)
    g.add_node("agent", agent)
    g.add_node("tools", tools)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", route, ["tools", END])
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=checkpointer)


def human(i: int, chars: int = 300) -> Any:
    from langchain_core.messages import HumanMessage

    return HumanMessage(content=text(chars, 50_000 + i))


GRAPH_THREADS = 20
LOOP_TURNS = 30  # graph A: one invoke per thread, 30 agent turns (~60 supersteps)
INVOKES = 10  # graph B: 10 invokes per thread, 2 agent turns each, state reloaded
INVOKE_TURNS = 2


def run_loop(
    graph: Any, prefix: str, with_checkpointer: bool, threads: int = GRAPH_THREADS
) -> None:
    """Graph A: 20 threads x one invoke of a 30-turn agent loop."""
    for t in range(threads):
        cfg: dict[str, Any] = {"recursion_limit": 4 * LOOP_TURNS + 10}
        if with_checkpointer:
            cfg["configurable"] = {"thread_id": f"{prefix}-{t}"}
        graph.invoke({"messages": [human(t)], "turns": 0, "max_turns": LOOP_TURNS}, cfg)


def run_invokes(
    graph: Any, prefix: str, with_checkpointer: bool, threads: int = GRAPH_THREADS
) -> None:
    """Graph B: 20 threads x 10 invokes; with a checkpointer each invoke reloads
    the thread's latest checkpoint. Without one the caller carries the
    messages itself, so the graph does the same channel work."""
    for t in range(threads):
        carried: list[Any] = []
        for i in range(INVOKES):
            msg = human(100 * t + i)
            if with_checkpointer:
                cfg = {"configurable": {"thread_id": f"{prefix}-{t}"}}
                graph.invoke({"messages": [msg], "turns": 0, "max_turns": INVOKE_TURNS}, cfg)
            else:
                out = graph.invoke(
                    {"messages": [*carried, msg], "turns": 0, "max_turns": INVOKE_TURNS}
                )
                carried = out["messages"]


def count_checkpoints(saver: BaseCheckpointSaver, prefix: str, threads: int = GRAPH_THREADS) -> int:
    return sum(
        len(list(saver.list({"configurable": {"thread_id": f"{prefix}-{t}"}})))
        for t in range(threads)
    )


def label(benchmark: Any, group: str, row: str, ops_per_call: int) -> None:
    """Name a pytest-benchmark result: its workload (group), its row (the
    saver, or a floor, or "all savers" for a paired round), and how many
    operations one timed call performs."""
    benchmark.group = group
    benchmark.extra_info.update(row=row, ops_per_call=ops_per_call)


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def rotated(seq: list[Any], r: int) -> list[Any]:
    """``seq`` starting at its element ``r`` (mod its length): paired rounds
    take their rows in this order, so that no row always runs first."""
    k = r % len(seq)
    return seq[k:] + seq[:k]


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def chunks(seq: list[Any], n: int) -> Iterator[list[Any]]:
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


# -- smoke mode ------------------------------------------------------------------------


def quick() -> bool:
    """The smoke mode (``KVSAVER_BENCH_QUICK=1``, or ``pytest bench --quick``,
    which sets it): fewer rounds, smaller stores; proves a suite runs."""
    return os.environ.get("KVSAVER_BENCH_QUICK", "") not in ("", "0")


def pick(full: Any, smoke: Any) -> Any:
    """``full``, or ``smoke`` in the smoke mode."""
    return smoke if quick() else full


# -- Zipf-distributed text (the chat workloads of storage and long_chat) -------------

_SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["th", "st", "er", "an"]


def _vocabulary(n: int = 5000) -> tuple[list[str], list[float]]:
    rnd = random.Random(7)
    words = sorted({"".join(rnd.choices(_SYLLABLES, k=rnd.randint(1, 4))) for _ in range(n * 2)})
    rnd.shuffle(words)
    words = words[:n]
    cum = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(words))))  # Zipf
    return words, cum


ZIPF_WORDS, _CUM_WEIGHTS = _vocabulary()


def zipf_text(seed: str, low: int, high: int) -> str:
    """A sentence of ``low``-``high`` characters of 5,000 generated words with
    a Zipf-like frequency (zstd takes such text to about a third, as it does
    English prose), the same for the same seed."""
    rnd = random.Random(seed)
    n = rnd.randint(low, high)
    out: list[str] = []
    size = 0
    top = _CUM_WEIGHTS[-1]
    while size < n:
        w = ZIPF_WORDS[bisect.bisect(_CUM_WEIGHTS, rnd.random() * top)]
        out.append(w)
        size += len(w) + 1
    sentence = " ".join(out)[:n]
    return sentence[:1].upper() + sentence[1:] + "."


# -- LMDB commits, read from the data file -----------------------------------------------

_TXNID_AT = 144  # in a meta page: its 16-byte header, then MDB_meta's fields up to mm_txnid


def lmdb_txnid(path: str) -> int:
    """The last committed transaction id of the LMDB environment in directory
    ``path`` (KVSaver(path)'s data.mdb), read from the file's two meta pages
    as LMDB itself picks the newest: one per commit. Read with plain file I/O,
    so it needs no handle of the store."""
    psize = os.sysconf("SC_PAGE_SIZE")
    with open(os.path.join(path, "data.mdb"), "rb") as f:
        head = f.read(2 * psize)
    (a,) = struct.unpack_from("<Q", head, _TXNID_AT)
    (b,) = struct.unpack_from("<Q", head, psize + _TXNID_AT)
    return max(a, b)


# -- paired rounds ------------------------------------------------------------------------

Times = dict[str, list[float]]


def paired_rounds(
    benchmark: Any,
    group: str,
    steps: Callable[[int], dict[str, Callable[[], Any]]],
    rounds: int,
    per: int = 1,
    cpu: Callable[[], float] = time.thread_time,
    before_each: Callable[[], Any] | None = None,
) -> tuple[Times, Times]:
    """Every row of ``steps(r)`` (made untimed, in the round's setup) timed in
    the same round, one after the other, in an order that rotates every round,
    so that a drift of this machine hits every row alike. Round 0 is the
    warm-up and is discarded. ``before_each`` runs untimed before each row's
    step (``gc.collect``: no row pays for the collector's debt of the one
    before). Returns (wall, CPU) seconds per operation (``per`` operations per
    step), one figure per round and row; ``cpu`` is the calling thread's by
    default (``time.process_time`` for work done in other threads)."""
    wall: Times = {}
    used: Times = {}
    counter = itertools.count()

    def setup() -> tuple[tuple[Any, ...], dict]:
        r = next(counter)
        return (r, steps(r)), {}

    def one_round(r: int, todo: dict[str, Callable[[], Any]]) -> None:
        for name in rotated(list(todo), r):
            if before_each is not None:
                before_each()
            w0, c0 = time.perf_counter(), cpu()
            todo[name]()
            w, c = time.perf_counter() - w0, cpu() - c0
            if r > 0:
                wall.setdefault(name, []).append(w / per)
                used.setdefault(name, []).append(c / per)

    label(benchmark, group, "all savers", 1)
    benchmark.pedantic(one_round, setup=setup, rounds=rounds + 1)
    return wall, used


def us(times: Times) -> dict[str, float]:
    """Median per row, in microseconds."""
    return {k: round(median(v) * 1e6, 1) for k, v in times.items() if v}


def x_of(times: Times, ref: str) -> dict[str, float]:
    """Per row, the median over rounds of its time / ``ref``'s in the same round."""
    if ref not in times:
        return {}
    out = {}
    for k, v in times.items():
        ratios = [a / b for a, b in zip(v, times[ref]) if b > 0]
        if ratios:
            out[k] = round(median(ratios), 3)
    return out


# -- results files: bench/results/<area>.json ---------------------------------------------

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
PACKAGES = [
    "kvsaver",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-postgres",
    "langchain-core",
    "lmdb",
    "ormsgpack",
    "zstandard",
    "pytest-benchmark",
]
_SESSION: dict[str, dict[str, Any]] = {}  # area -> what this session wrote


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _code_under_test() -> dict[str, Any]:
    """Where the imported kvsaver lives, and its checkout's commit and
    uncommitted changes: the figures belong to that code (an A/B runs this
    suite against another checkout)."""
    import kvsaver

    here = os.path.dirname(os.path.abspath(kvsaver.__file__))
    out: dict[str, Any] = {"kvsaver_path": here}
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=here, timeout=10
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "kv", "saver"],
            capture_output=True,
            text=True,
            cwd=os.path.dirname(here),
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return out
    out["commit"] = rev.stdout.strip()
    out["changes_kv_saver"] = dirty.stdout.splitlines()
    return out


def machine() -> dict[str, Any]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    versions["sqlite (library)"] = sqlite3.sqlite_version
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = []
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": versions,
        "loadavg": load,
    }


Rows = dict[str, dict[str, Any]]


def metric_rows(**metrics: dict[str, Any]) -> Rows:
    """{row: {metric: value}} from {metric: {row: value}}."""
    rows: Rows = {}
    for m, per_row in metrics.items():
        for row, v in per_row.items():
            rows.setdefault(row, {})[m] = v
    return rows


def target(what: str, value: float | None, goal: float, at_most: bool = True) -> dict[str, Any]:
    """A goal for bench/report.py to show met / not met."""
    return {"target": what, "value": value, "goal": goal, "at_most": at_most}


def record(
    area: str,
    group: str,
    what: str,
    rows: Rows,
    info: dict[str, Any] | None = None,
    targets: Sequence[dict[str, Any]] = (),
) -> None:
    """Add one workload (``group``) to bench/results/<area>.json: a line saying
    what it measures, a table (``rows``: row -> metric -> value), scalar
    ``info`` and ``targets``. The file holds this session's groups only (the
    first record of a session replaces an older file), with the machine, the
    code under test, and whether it was a smoke run."""
    if area not in _SESSION:
        _SESSION[area] = {
            "area": area,
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "smoke": quick(),
            "machine": machine(),
            "code": _code_under_test(),
            "groups": {},
        }
    doc = _SESSION[area]
    doc["groups"][group] = {
        "what": what,
        "rows": rows,
        "info": info or {},
        "targets": list(targets),
    }
    try:
        doc["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    path = os.path.join(os.environ.get("KVSAVER_BENCH_RESULTS", RESULTS), f"{area}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


def fresh_database(url: str, name: str) -> str:
    """A fresh database on the server (one of that name dropped first); its URL."""
    from pg_helpers import create_database, drop_database

    drop_database(url, name)
    return create_database(url, name)
