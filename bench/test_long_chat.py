"""Long chats: bytes per turn and get_tuple latest against SqliteSaver.

Workload: a graph with ``messages`` (``add_messages``) and ``summary`` (a
string); each turn invokes it with one human message and the "assistant" node
answers with one message; every 10th turn it also rewrites the summary (~100
words). Messages are ~45 words (290-340 characters) of Zipf-distributed
generated words (``_workloads.zipf_text``), seeded per (thread, turn), so every
saver stores the same conversation. Three checkpoints per turn.

Chats (groups of bench/results/long_chat.json): ``long_chat:3x120`` (3 threads
x 120 turns) and ``long_chat:1x500`` (1 thread x 500 turns, measured at 120
and at 500). Savers, in one run, each in its own directory: sqlite
(SqliteSaver on one file, WAL, as LangGraph ships it) and kv (KVSaver(dir), its
defaults).

Method: turn by turn, every thread, every saver (the order rotates every
invoke). At each mark: bytes on disk of every file of each saver (SqliteSaver's
WAL checkpointed first), per turn; then get_tuple of the latest checkpoint of
every thread in ROUNDS paired rounds (each round times every saver once, order
rotated, each read after a full garbage collection: a read of hundreds of
messages triggers collections, and one landing on a full collection pays for
the whole process's heap), medians, ratios to SqliteSaver; wall and process
CPU. "kv cold" is the same read through a fresh KVSaver over the same store (a
serializer and caches of its own, nothing cached: as another process reads).
"""

from __future__ import annotations

import gc
import os
import sqlite3
import statistics
import time
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest
from _workloads import disk_bytes, label, pick, record, rotated, target
from _workloads import zipf_text as text
from kvsaver import KVSaver
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

ROUNDS = pick(15, 2)
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


def _open(name: str, path: str) -> Any:
    if name == "sqlite":
        os.makedirs(path)
        conn = sqlite3.connect(os.path.join(path, "cp.sqlite"), check_same_thread=False)
        return SqliteSaver(conn)
    return KVSaver(path)


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
    starts after a full garbage collection."""
    names = [*savers, *(["kv cold"] if "kv" in savers else [])]
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for th in threads:
            cfg: RunnableConfig = {"configurable": {"thread_id": th}}
            order = names[r % len(names) :] + names[: r % len(names)]
            for n in order:
                saver = savers.get(n)
                if n == "kv cold":  # a saver of its own over the same store
                    saver = KVSaver(savers["kv"].store)
                gc.collect()
                c0 = time.process_time()
                t0 = time.perf_counter()
                tup = saver.get_tuple(cfg)
                times[n].append(time.perf_counter() - t0)
                cpu[n].append(time.process_time() - c0)
                if n == "kv cold":
                    saver.close()  # not the store: the saver was given it
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
    savers = {n: _open(n, paths[n]) for n in names}
    builder = build()
    graphs = {n: builder.compile(checkpointer=s) for n, s in savers.items()}
    result: dict[str, Any] = {
        "threads": threads,
        "turns": turns,
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
            for n in rotated(names, rotation):
                graphs[n].invoke(inp, cfg, durability="sync")
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


# chat: (threads, turns, marks, the bytes goal at each mark)
CHATS: dict[str, tuple[int, int, dict[int, float | None]]] = {
    "3x120": pick((3, 120, {120: 0.05}), (2, 12, {12: 0.05})),
    "1x500": pick((1, 500, {120: None, 500: 0.03}), (1, 20, {10: None, 20: 0.03})),
}


@pytest.mark.parametrize("chat", list(CHATS))
def test_long_chat(benchmark: Any, tmp_path: Any, chat: str) -> None:
    threads, turns, marks = CHATS[chat]
    label(benchmark, f"long_chat:{chat}", "all savers", 1)
    result = benchmark.pedantic(
        run, args=(threads, turns, list(marks), str(tmp_path), ["sqlite", "kv"]), rounds=1
    )
    for at, goal in marks.items():
        mark = result["marks"][str(at)]
        reads = mark["get_tuple_latest"]
        rows: dict[str, dict[str, Any]] = {}
        for n in ("sqlite", "kv", "kv cold"):
            row = rows[n] = {}
            if n in mark["disk_bytes"]:
                row["disk_bytes"] = mark["disk_bytes"][n]
                row["bytes_per_turn"] = mark["bytes_per_turn"][n]
                row["x_sqlite_bytes"] = mark["bytes_ratio_vs_sqlite"].get(n, 1.0)
            row["get_tuple_ms"] = reads["median_ms"][n]
            row["x_sqlite_get_tuple"] = reads["ratio_vs_sqlite"][n]
            row["get_tuple_cpu_ms"] = reads["cpu_median_ms"][n]
            row["x_sqlite_get_tuple_cpu"] = reads["cpu_ratio_vs_sqlite"][n]
        what = f"{threads} x {at} turns" + ("" if at == turns else f" (of {turns})")
        targets = []
        if goal is not None:
            targets = [
                target(f"bytes on disk vs SqliteSaver, {what}", rows["kv"]["x_sqlite_bytes"], goal),
                target(f"get_tuple latest, warm, {what}", rows["kv"]["x_sqlite_get_tuple"], 0.8),
                target(
                    f"get_tuple latest, cold (a fresh saver), {what}",
                    rows["kv cold"]["x_sqlite_get_tuple"],
                    0.8,
                ),
            ]
        record(
            "long_chat",
            f"long_chat:{threads}x{at}" + ("" if at == turns else f"of{turns}"),
            f"a long chat, {what}: bytes and get_tuple latest vs SqliteSaver",
            rows,
            info={
                "threads": threads,
                "turns": turns,
                "at_turn": at,
                "rounds": ROUNDS,
                "mean_words_per_message": result["mean_words_per_message"],
            },
            targets=targets,
        )
