"""Storage: bytes on disk against SqliteSaver, and what compression costs a
graph per superstep.

Workload: a chat graph (``MessagesState``, one "assistant" node); each turn
invokes it with one human message of 100-400 characters and the node answers
with 200-600 characters of Zipf-distributed generated words
(``_workloads.zipf_text``), seeded per (thread, turn), so every saver stores
exactly the same conversation; the result records zstd's ratio on the raw
text. All text is generated before timing starts. Three checkpoints per turn
(input, ``__start__``, assistant): three supersteps.

Savers, in one run, each in its own directory:
  sqlite                SqliteSaver on one file (WAL), as LangGraph ships it
  kv                    KVSaver(dir): the defaults (LMDB, durability "full", compression on)
  kv-nocompress         KVSaver(dir, compress=False)
  kv-nosync             KVSaver(dir, durability="none"): no fsync, so the CPU cost
  kv-nosync-nocompress  of compression is not hidden behind disk syncs

Method: turn by turn, every thread, every saver (the order rotates every
invoke). Graphs run with ``durability="sync"``: each checkpoint write finishes
inside the timed invoke. Two times per invoke: wall time, and time inside the
saver (``put``, ``put_writes``, ``get_tuple``). Per superstep = per invoke / 3.
Medians over the invokes of the last LAST turns (the largest state) and over
all turns; the first turn of each thread is warm-up. The compression ratios are
medians of per-invoke ratios on/off of the same (thread, turn). Bytes on disk:
every file each saver left (SqliteSaver's connection closed first, so its WAL
is folded into the database file). Afterwards the default KVSaver store is
swept (``Retention(keep_last=10)``) and compacted, for the lifecycle figures.
Results: bench/results/storage.json.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from typing import Any

import zstandard
from _workloads import (
    SaverClock,
    disk_bytes,
    label,
    metric_rows,
    pick,
    record,
    rotated,
    target,
    zipf_text,
)
from kvsaver import KVSaver, Retention
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph

SUPERSTEPS_PER_TURN = 3
THREADS = pick(20, 2)
TURNS = pick(200, 12)
LAST = min(50, TURNS // 2)  # turns in the "largest state" window
text = zipf_text

# -- the graph ---------------------------------------------------------------------------

REPLIES: dict[tuple[str, int], str] = {}


def assistant(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
    thread = config["configurable"]["thread_id"]
    turn = len(state["messages"]) // 2
    return {"messages": [AIMessage(REPLIES[thread, turn], id=f"a-{turn}")]}


def build() -> StateGraph:
    builder = StateGraph(MessagesState)
    builder.add_node("assistant", assistant)
    builder.add_edge(START, "assistant")
    return builder


# -- measuring ---------------------------------------------------------------------------


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1e3 / SUPERSTEPS_PER_TURN, 3)


def run(threads: int, turns: int, workdir: str) -> dict[str, Any]:
    thread_ids = [f"thread-{t:02d}" for t in range(threads)]
    humans = {
        (th, turn): text(f"h/{th}/{turn}", 100, 400) for th in thread_ids for turn in range(turns)
    }
    REPLIES.clear()
    REPLIES.update(
        {(th, turn): text(f"a/{th}/{turn}", 200, 600) for th in thread_ids for turn in range(turns)}
    )
    raw = "".join(humans.values()).encode() + "".join(REPLIES.values()).encode()

    kv_options: dict[str, dict[str, Any]] = {
        "kv": {},
        "kv-nocompress": {"compress": False},
        "kv-nosync": {"durability": "none"},
        "kv-nosync-nocompress": {"durability": "none", "compress": False},
    }
    paths = {name: os.path.join(workdir, name) for name in ["sqlite", *kv_options]}
    os.makedirs(paths["sqlite"])
    conn = sqlite3.connect(os.path.join(paths["sqlite"], "cp.sqlite"), check_same_thread=False)
    savers: dict[str, Any] = {"sqlite": SqliteSaver(conn)}
    for name, options in kv_options.items():
        savers[name] = KVSaver(paths[name], **options)
    clocks = {name: SaverClock(s) for name, s in savers.items()}
    builder = build()
    graphs = {name: builder.compile(checkpointer=s) for name, s in savers.items()}
    names = list(graphs)
    # per saver: (turn, thread) -> (wall seconds, seconds inside the saver)
    times: dict[str, dict[tuple[int, str], tuple[float, float]]] = {n: {} for n in names}
    started = time.monotonic()
    rotation = 0
    for turn in range(turns):
        for th in thread_ids:
            cfg: RunnableConfig = {"configurable": {"thread_id": th}}
            inp = {"messages": [HumanMessage(humans[th, turn], id=f"h-{turn}")]}
            rotation += 1
            for name in rotated(names, rotation):
                in_saver = clocks[name].total
                t0 = time.perf_counter()
                graphs[name].invoke(inp, cfg, durability="sync")
                wall = time.perf_counter() - t0
                times[name][turn, th] = (wall, clocks[name].total - in_saver)
        if turn % 10 == 9 or turn == turns - 1:
            elapsed = time.monotonic() - started
            print(f"  turn {turn + 1}/{turns}  {elapsed:,.0f} s", file=sys.stderr)
    # The savers agree on the conversation (a cheap check of the run itself).
    for th in (thread_ids[0], thread_ids[-1]):
        cfg = {"configurable": {"thread_id": th}}
        contents = {
            name: [m.content for m in graphs[name].get_state(cfg).values["messages"]]
            for name in names
        }
        assert len(contents["sqlite"]) == 2 * turns
        assert all(c == contents["sqlite"] for c in contents.values())
    live = {name: s.stats().live_bytes for name, s in savers.items() if isinstance(s, KVSaver)}
    for s in savers.values():
        if isinstance(s, KVSaver):
            s.close()
    conn.close()
    disk = {name: disk_bytes(p) for name, p in paths.items()}

    def window(name: str, last: bool, which: int) -> list[float]:
        lo = turns - LAST if last else 1
        return [v[which] for (turn, _), v in times[name].items() if turn >= max(lo, 1)]

    def paired(on: str, off: str, last: bool, which: int) -> float:
        lo = turns - LAST if last else 1
        ratios = [
            times[on][key][which] / times[off][key][which]
            for key in times[on]
            if key[0] >= max(lo, 1)
        ]
        return round(statistics.median(ratios), 3)

    pairs = [("kv", "kv-nocompress"), ("kv-nosync", "kv-nosync-nocompress")]
    return {
        "threads": threads,
        "turns": turns,
        "supersteps_per_saver": threads * turns * SUPERSTEPS_PER_TURN,
        "raw_text_bytes": len(raw),
        "raw_text_zstd_ratio": round(
            len(zstandard.ZstdCompressor(level=3).compress(raw)) / len(raw), 3
        ),
        "disk_bytes": disk,
        "kv_live_bytes": live,
        "bytes_ratio_vs_sqlite": {n: round(disk[n] / disk["sqlite"], 3) for n in kv_options},
        "ms_per_superstep": {
            n: {
                "wall_median_last50": median_ms(window(n, True, 0)),
                "wall_median_all": median_ms(window(n, False, 0)),
                "in_saver_median_last50": median_ms(window(n, True, 1)),
                "in_saver_median_all": median_ms(window(n, False, 1)),
            }
            for n in names
        },
        "compression_on_vs_off": {
            f"{on} / {off}": {
                "in_saver_last50": paired(on, off, True, 1),
                "in_saver_all": paired(on, off, False, 1),
                "wall_last50": paired(on, off, True, 0),
                "wall_all": paired(on, off, False, 0),
            }
            for on, off in pairs
        },
        "lifecycle_kv": lifecycle(paths["kv"]),
    }


def lifecycle(path: str) -> dict[str, Any]:
    """Keep the last 10 checkpoints per thread, then compact."""
    try:
        from kvsaver.kv.lmdb import compact_lmdb
    except ImportError:  # a checkout from before kv/lmdb/ (an A/B against older code)
        from kvsaver.kv.lmdb_store import compact_lmdb  # type: ignore[no-redef]
    with KVSaver(path) as s:
        t0 = time.perf_counter()
        report = s.sweep(Retention(keep_last=10, sweep_interval_minutes=None))
        sweep_s = time.perf_counter() - t0
        live_after = s.stats().live_bytes
    t0 = time.perf_counter()
    compacted = compact_lmdb(path)
    return {
        "sweep_keep_last": 10,
        "sweep_seconds": round(sweep_s, 2),
        "checkpoints_deleted": report.checkpoints_deleted,
        "live_bytes_after_sweep": live_after,
        "file_bytes_before_compact": compacted.before,
        "file_bytes_after_compact": compacted.after,
        "compact_seconds": round(time.perf_counter() - t0, 2),
        "after_compact_vs_live": round(compacted.after / live_after, 3),
    }


def test_storage(benchmark: Any) -> None:
    workdir = tempfile.mkdtemp(prefix="kvsaver-bench-storage-")
    label(benchmark, "storage", "all savers", 1)
    try:
        result = benchmark.pedantic(run, args=(THREADS, TURNS, workdir), rounds=1)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    ms = result.pop("ms_per_superstep")
    disk = result.pop("disk_bytes")
    ratios = result.pop("bytes_ratio_vs_sqlite")
    rows = metric_rows(
        disk_bytes=disk,
        x_sqlite_bytes={"sqlite": 1.0, **ratios},
        live_bytes=result.pop("kv_live_bytes"),
        **{k: {n: v[k] for n, v in ms.items()} for k in next(iter(ms.values()))},
    )
    record(
        "storage",
        "storage",
        f"a chat graph, {THREADS} threads x {TURNS} turns; bytes and ms per superstep",
        rows,
        info=result,
        targets=[target("bytes on disk vs SqliteSaver", ratios["kv"], 0.3)],
    )
