"""Long-chat storage (issue #15): bytes per turn and get_tuple latest against
SqliteSaver, with delta storage of the message list.

    python bench/bench_long_chat.py                         # 3 threads x 120 turns (~3 min)
    python bench/bench_long_chat.py --threads 1 --turns 500 --marks 120,500 --savers sqlite,kv \
        --out bench/results/long_chat_500.json                # 500 turns (~5 min)
    python bench/bench_long_chat.py --turns 120 --sweep-k 1,8,16,32,64,128,256

Workload (the chat of issue #15): a graph with ``messages`` (``add_messages``)
and ``summary`` (a string); each turn invokes it with one human message and
the "assistant" node answers with one message; every 10th turn it also
rewrites the summary (~100 words). Messages are ~45 words (290-340
characters) of Zipf-distributed generated words (``bench_storage.text``),
seeded per (thread, turn), so every saver stores the same conversation.
Three checkpoints per turn (input, loop step 0... as LangGraph makes them).

Savers, in one run, each in its own directory:
  sqlite    SqliteSaver on one file (WAL), as LangGraph ships it
  kv        KVSaver(dir): the defaults (delta storage, compression, LMDB)
  kv-whole  KVSaver(dir) with delta storage off (every version whole, as before #15)

Method: turn by turn, every thread, every saver (the order rotates every
invoke). At each mark (e.g. turn 120): bytes on disk of every file of each
saver (SqliteSaver's WAL checkpointed first), per turn; then get_tuple of the
latest checkpoint of every thread in ``ROUNDS`` paired rounds (each round times
every saver once, order rotated), medians, ratios to SqliteSaver. "kv cold" is
the same read through a fresh serializer (so neither the decompression cache
nor the delta cache holds anything: a read in another process). Put CPU:
``time.thread_time`` inside every ``put`` of kv and kv-whole, paired per
(thread, turn) invoke, median of the ratios. ``--sweep-k`` runs the kv saver
with several ``delta.MAX_CHAIN`` values instead (bytes vs read cost; see
``sweep_k``).
Results go to bench/results/long_chat.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest
from _workloads import disk_bytes
from bench_storage import text
from kvsaver import KVSaver
from kvsaver import compression as C
from kvsaver import delta as D
from kvsaver import schema as S
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

ROUNDS = 15
SUMMARY_EVERY = 10


class Chat(TypedDict, total=False):
    messages: Annotated[list, add_messages]
    summary: str


REPLIES: dict[tuple[str, int], str] = {}


def assistant(state: Chat, config: RunnableConfig) -> dict[str, Any]:
    thread = config["configurable"]["thread_id"]
    turn = len(state["messages"]) // 2
    out: dict[str, Any] = {"messages": [AIMessage(REPLIES[thread, turn], id=f"a-{turn}")]}
    if turn % SUMMARY_EVERY == SUMMARY_EVERY - 1:
        out["summary"] = text(f"s/{thread}/{turn}", 550, 650)
    return out


def build() -> StateGraph:
    builder = StateGraph(Chat)
    builder.add_node("assistant", assistant)
    builder.add_edge(START, "assistant")
    return builder


class PutClock:
    """CPU seconds (this thread's) inside a saver's ``put``, per call."""

    def __init__(self, saver: Any) -> None:
        self.total = 0.0
        put = saver.put

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return put(*args, **kwargs)
            finally:
                self.total += time.thread_time() - t0

        saver.put = timed


def _open(name: str, path: str, k: int | None) -> Any:
    if name == "sqlite":
        os.makedirs(path)
        conn = sqlite3.connect(os.path.join(path, "cp.sqlite"), check_same_thread=False)
        return SqliteSaver(conn)
    saver = KVSaver(path)
    codec = D.codec(saver.serde)
    if name == "kv-whole":
        codec.enabled = False
    elif k is not None:
        codec.max_chain = k
    return saver


def _disk(name: str, saver: Any, path: str) -> int:
    if name == "sqlite":
        saver.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return disk_bytes(path)


def _reads(savers: dict[str, Any], threads: list[str], rounds: int) -> dict[str, Any]:
    """Paired rounds of get_tuple(latest) over every thread; per saver the
    median seconds, and "kv cold" through a fresh serializer each time. Also
    process CPU time (``cpu_*``): the median of each saver's per-read ratio
    to SqliteSaver's read in the same round, which a loaded machine (other
    processes taking the cores) moves much less than wall time. Each read
    starts after a full garbage collection: a read of hundreds of messages
    triggers collections, and one that lands on a full collection pays for
    the whole process's heap (the 500-turn chat's warm reads measured slower
    than its cold ones for that)."""
    names = [*savers, *(["kv cold"] if "kv" in savers else [])]
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for th in threads:
            cfg: RunnableConfig = {"configurable": {"thread_id": th}}
            order = names[r % len(names) :] + names[: r % len(names)]
            for n in order:
                saver = savers["kv" if n == "kv cold" else n]
                serde = saver.serde
                if n == "kv cold":
                    saver.serde = C.wrap(JsonPlusSerializer())
                gc.collect()
                c0 = time.process_time()
                t0 = time.perf_counter()
                tup = saver.get_tuple(cfg)
                times[n].append(time.perf_counter() - t0)
                cpu[n].append(time.process_time() - c0)
                saver.serde = serde
                assert tup is not None
    med = {n: statistics.median(v) for n, v in times.items()}
    cpu_ratios = {
        n: statistics.median(a / b for a, b in zip(v, cpu["sqlite"]) if b > 0)
        for n, v in cpu.items()
    }
    return {
        "median_ms": {n: round(v * 1e3, 3) for n, v in med.items()},
        "ratio_vs_sqlite": {n: round(v / med["sqlite"], 3) for n, v in med.items()},
        "cpu_median_ms": {n: round(statistics.median(v) * 1e3, 3) for n, v in cpu.items()},
        "cpu_ratio_vs_sqlite": {n: round(v, 3) for n, v in cpu_ratios.items()},
    }


def run(
    threads: int,
    turns: int,
    marks: list[int],
    workdir: str,
    names: list[str],
    k: int | None = None,
    rounds: int = ROUNDS,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    thread_ids = [f"chat-{t:02d}" for t in range(threads)]
    humans = {(th, t): text(f"h/{th}/{t}", 290, 340) for th in thread_ids for t in range(turns)}
    REPLIES.clear()
    REPLIES.update(
        {(th, t): text(f"a/{th}/{t}", 290, 340) for th in thread_ids for t in range(turns)}
    )
    words = statistics.mean(len(m.split()) for m in humans.values())
    paths = {n: os.path.join(workdir, n) for n in names}
    savers = {n: _open(n, paths[n], k) for n in names}
    clocks = {n: PutClock(s) for n, s in savers.items() if n != "sqlite"}
    put_cpu: dict[str, dict[tuple[int, str], float]] = {n: {} for n in clocks}
    builder = build()
    graphs = {n: builder.compile(checkpointer=s) for n, s in savers.items()}
    result: dict[str, Any] = {
        "threads": threads,
        "turns": turns,
        "K": k if k is not None else D.MAX_CHAIN,
        "mean_words_per_message": round(words, 1),
        "marks": {},
    }
    started = time.monotonic()
    rotation = 0
    for turn in range(turns):
        for th in thread_ids:
            cfg: RunnableConfig = {"configurable": {"thread_id": th}}
            inp = {"messages": [HumanMessage(humans[th, turn], id=f"h-{turn}")]}
            rotation += 1
            for i in range(len(names)):
                n = names[(rotation + i) % len(names)]
                before = clocks[n].total if n in clocks else 0.0
                graphs[n].invoke(inp, cfg, durability="sync")
                if n in clocks:
                    put_cpu[n][turn, th] = clocks[n].total - before
        done = turn + 1
        if progress is not None and (done % 20 == 0 or done == turns):
            progress(f"turn {done}/{turns}  {time.monotonic() - started:,.0f} s")
        if done in marks:
            disk = {n: _disk(n, s, paths[n]) for n, s in savers.items()}
            mark: dict[str, Any] = {
                "disk_bytes": disk,
                "bytes_per_turn": {n: round(b / (threads * done)) for n, b in disk.items()},
                "bytes_ratio_vs_sqlite": {
                    n: round(b / disk["sqlite"], 4) for n, b in disk.items() if n != "sqlite"
                },
                "get_tuple_latest": _reads(savers, thread_ids, rounds),
            }
            if "kv" in put_cpu and "kv-whole" in put_cpu:
                ratios = [
                    put_cpu["kv"][key] / put_cpu["kv-whole"][key]
                    for key in put_cpu["kv"]
                    if put_cpu["kv-whole"].get(key)
                ]
                mark["put_cpu_kv_over_kv_whole_median"] = round(statistics.median(ratios), 3)
                mark["put_cpu_seconds_total"] = {
                    n: round(sum(v.values()), 3) for n, v in put_cpu.items()
                }
            result["marks"][str(done)] = mark
    # Every saver holds the same conversation (a cheap check of the run itself).
    for th in thread_ids:
        cfg = {"configurable": {"thread_id": th}}
        states = {n: graphs[n].get_state(cfg).values for n in names}
        first = states[names[0]]
        assert len(first["messages"]) == 2 * turns
        assert all(s == first for s in states.values())
    for n, s in savers.items():
        if n == "sqlite":
            s.conn.close()
        else:
            s.close()
    return result


def sweep_k(turns: int, ks: list[int], rounds: int) -> dict[str, Any]:
    """The choice of K, without a graph: one thread of ``turns`` turns (two
    appended messages a turn, as the chat's puts store them) put into an
    in-memory KVSaver per K. Per K: bytes of the message list's records, and
    the cold rebuild of the latest value's msgpack bytes (a fresh serializer
    each time, so every piece is read and decompressed, and a whole value is
    decompressed; the decode that follows is the same for every K and is
    timed apart)."""
    msgs: list[Any] = []
    for t in range(turns):
        msgs.append(HumanMessage(text(f"h/k/{t}", 290, 340), id=f"h-{t}"))
        msgs.append(AIMessage(text(f"a/k/{t}", 290, 340), id=f"a-{t}"))
    out: dict[str, Any] = {}
    for k in ks:
        saver = KVSaver(":memory:")
        D.codec(saver.serde).max_chain = k
        parent = None
        version = None
        for i in range(1, len(msgs) + 1):
            cp = empty_checkpoint()
            cp["id"] = f"{i:08d}"
            version = saver.get_next_version(version, None)
            cp["channel_versions"] = {"messages": version}
            cp["channel_values"] = {"messages": msgs[:i]}
            conf: dict[str, Any] = {"thread_id": "k", "checkpoint_ns": ""}
            if parent:
                conf["checkpoint_id"] = parent
            saver.put({"configurable": conf}, cp, {}, {"messages": version})
            parent = cp["id"]
        with saver.store.read() as txn:
            size = sum(len(a) + len(b) for a, b in txn.scan(*S.blobs_range("k")))
            key = S.blob_key("k", "", "messages", version)
            raw = txn.get(key)
            rebuild, decode = [], []
            for _ in range(rounds):
                serde = C.wrap(JsonPlusSerializer())
                codec = D.codec(serde)
                assert codec.comp is not None
                codec.comp._decompressor()  # made once per thread, not per read
                t0 = time.perf_counter()
                typed = codec.typed(txn, key, raw)
                assert typed is not None
                typed = codec.unwrap(*typed)  # a whole value: its decompression
                t1 = time.perf_counter()
                serde.loads_typed(typed)
                t2 = time.perf_counter()
                rebuild.append(t1 - t0)
                decode.append(t2 - t1)
        out[str(k)] = {
            "message_list_bytes": size,
            "cold_rebuild_us": round(statistics.median(rebuild) * 1e6, 1),
            "decode_us": round(statistics.median(decode) * 1e6, 1),
            "depth_of_latest": D.decode(raw).depth if D.is_delta(raw) else 0,
        }
        print(f"K={k}: {json.dumps(out[str(k)])}", file=sys.stderr)
    return out


# -- in the bench suite -------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory: Any) -> dict[str, Any]:
    workdir = str(tmp_path_factory.mktemp("long-chat"))
    try:
        return run(3, 120, [120], workdir, ["sqlite", "kv", "kv-whole"])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_long_chat_storage(benchmark: Any, chat_run: dict[str, Any]) -> None:
    """3 threads x 120 turns: bytes and reads vs SqliteSaver (issue #15)."""
    mark = chat_run["marks"]["120"]
    benchmark.group = "long_chat:storage"
    # bench/report.py's issue #15 section reads these.
    benchmark.extra_info.update(
        {
            "threads": chat_run["threads"],
            "turns": chat_run["turns"],
            "disk_bytes": mark["disk_bytes"],
            "bytes_ratio_vs_sqlite": mark["bytes_ratio_vs_sqlite"],
            "bytes_per_turn": mark["bytes_per_turn"],
            "get_tuple_latest": mark["get_tuple_latest"],
            "put_cpu_kv_over_kv_whole_median": mark.get("put_cpu_kv_over_kv_whole_median"),
            "K": chat_run["K"],
        }
    )
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    # Issue #15's targets are shown (met / not met) by bench/report.py; what
    # deltas alone must give, whatever the machine: under a third of the
    # store with every version whole.
    ratios = mark["bytes_ratio_vs_sqlite"]
    assert ratios["kv"] <= 0.3 * ratios["kv-whole"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=3)
    parser.add_argument("--turns", type=int, default=120)
    parser.add_argument("--marks", default="120", help="turns at which to measure")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--savers", default="sqlite,kv,kv-whole")
    parser.add_argument("--sweep-k", default="", help="e.g. 1,4,8,16,32,64")
    parser.add_argument(
        "--out",
        default=os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "results", "long_chat.json"
        ),
        help="where to write the JSON results ('-' for nowhere)",
    )
    args = parser.parse_args(argv)
    load = os.getloadavg()
    if args.sweep_k:
        ks = [int(x) for x in args.sweep_k.split(",")]
        result: dict[str, Any] = {
            "threads": 1,
            "turns": args.turns,
            "sweep_k": sweep_k(args.turns, ks, args.rounds),
        }
    else:
        marks = [int(x) for x in args.marks.split(",") if int(x) <= args.turns]
        workdir = tempfile.mkdtemp(prefix="kvsaver-bench-chat-")
        try:
            result = run(
                args.threads,
                args.turns,
                marks,
                workdir,
                args.savers.split(","),
                rounds=args.rounds,
                progress=lambda s: print(f"  {s}", file=sys.stderr),
            )
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    result["loadavg"] = [round(x, 2) for x in (*load, *os.getloadavg())]
    print(json.dumps(result, indent=2))
    if args.out != "-":
        name = args.out
        if args.sweep_k and name.endswith("long_chat.json"):
            name = name[: -len(".json")] + "_k.json"
        os.makedirs(os.path.dirname(name), exist_ok=True)
        with open(name, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
