"""A real StateGraph agent with each saver as its checkpointer, every saver in
the same rounds.

Groups (bench/results/graph.json; one timed call = one round: every row and a
run with no checkpointer, in an order that rotates every round, a fresh store
per row and round; LangGraph's default durability, "async"):

  graph:loop             THREADS threads x one invoke of a 30-turn agent <-> tools
                         loop (~61 supersteps per thread, 300-character messages)
  graph:invokes          THREADS threads x 10 invokes of a 2-turn exchange, each
                         reloading the thread's latest checkpoint
                         (rows: kvsaver-lmdb, durability "full"; kvsaver-memory;
                         sqlite; inmemory)
  durability:graph_loop  the loop at each KVSaver durability (kvsaver-full,
                         kvsaver-meta, kvsaver-none) and sqlite

Per row: overhead per superstep = median over rounds of (time with it - time
without it, same round) / checkpoints written, on wall-clock time and on the
process's CPU time (LangGraph writes checkpoints from worker threads);
``x_sqlite`` / ``x_inmemory_cpu``, the medians of per-round ratios of those
overheads; for the memory rows the thread CPU inside the saver's calls alone
(``saver_cpu_us``, ``x_inmemory_saver_cpu``: a graph's process CPU minus a run
without checkpointer is a small difference of large numbers); for the LMDB rows
``commits_per_superstep``: LMDB transactions committed (read from the data
file's meta pages) per checkpoint written (each durable commit is two device
flushes); for the on-disk rows the bytes left after the last round.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import pytest
from _workloads import (
    INMEM,
    KV_LMDB,
    KV_MEM,
    SQLITE,
    SaverClock,
    build_agent,
    close_saver,
    count_checkpoints,
    disk_bytes,
    label,
    lmdb_txnid,
    make_saver,
    median,
    metric_rows,
    pick,
    record,
    rotated,
    run_invokes,
    run_loop,
    target,
)

AREA = "graph"
THREADS = pick(6, 2)
ROUNDS = pick(5, 2)
NONE = "no checkpointer"
RUNS = {"loop": run_loop, "invokes": run_invokes}
DURABILITY = {"kvsaver-full": "full", "kvsaver-meta": "meta", "kvsaver-none": "none"}


def _saver(row: str, workdir: str) -> Any:
    if row in DURABILITY:
        return make_saver(KV_LMDB, workdir, durability=DURABILITY[row])
    return make_saver(row, workdir)


def _paired(run: Callable[..., None], rows: list[str]) -> dict[str, Any]:
    plain = build_agent(None)
    run(plain, "warmup", False, threads=1)
    wall: dict[str, list[float]] = {r: [] for r in [*rows, NONE]}
    cpu: dict[str, list[float]] = {r: [] for r in [*rows, NONE]}
    steps: dict[str, int] = {}
    commits: dict[str, list[float]] = {}
    inside: dict[str, list[float]] = {}
    on_disk: dict[str, int] = {}

    def one_round(r: int) -> None:
        for row in rotated([*rows, NONE], r):
            workdir = tempfile.mkdtemp(prefix="kvs-graph-")
            saver = None if row == NONE else _saver(row, workdir)
            lmdb_dir = os.path.join(workdir, "kv")
            lmdb = os.path.exists(os.path.join(lmdb_dir, "data.mdb"))
            try:
                clock = None
                if row in (KV_MEM, INMEM):
                    clock = SaverClock(saver, time.thread_time, SaverClock.GRAPH_METHODS)
                graph = plain if saver is None else build_agent(saver)
                txnid = lmdb_txnid(lmdb_dir) if lmdb else None
                w0, c0 = time.perf_counter(), time.process_time()
                run(graph, f"p{r}", saver is not None, threads=THREADS)
                wall[row].append(time.perf_counter() - w0)
                cpu[row].append(time.process_time() - c0)
                if saver is not None:
                    steps[row] = count_checkpoints(saver, f"p{r}", THREADS)
                if clock is not None:
                    inside.setdefault(row, []).append(clock.total / steps[row])
                if txnid is not None:
                    done = lmdb_txnid(lmdb_dir) - txnid
                    commits.setdefault(row, []).append(done / steps[row])
            finally:
                if saver is not None:
                    close_saver(saver)  # SqliteSaver: the last close folds the WAL in
                    if row not in (KV_MEM, INMEM):
                        on_disk[row] = disk_bytes(workdir)
                shutil.rmtree(workdir, ignore_errors=True)

    return {
        "one_round": one_round,
        "wall": wall,
        "cpu": cpu,
        "steps": steps,
        "commits": commits,
        "inside": inside,
        "disk": on_disk,
    }


def _over(p: dict[str, Any], times: dict[str, list[float]], rows: list[str]) -> dict:
    return {
        r: [(t - b) / p["steps"][r] for t, b in zip(times[r], times[NONE])]
        for r in rows
        if times[r]
    }


def _x(o: dict[str, list[float]], ref: str) -> dict[str, float]:
    if ref not in o:
        return {}
    ratios = {r: [a / b for a, b in zip(v, o[ref]) if b > 0] for r, v in o.items()}
    return {r: round(median(v), 3) for r, v in ratios.items() if v}


def _run(benchmark: Any, group: str, run: Callable[..., None], rows: list[str]) -> dict:
    p = _paired(run, rows)
    counter = iter(range(ROUNDS))
    label(benchmark, group, "all savers", 1)
    benchmark.pedantic(p["one_round"], setup=lambda: ((next(counter),), {}), rounds=ROUNDS)
    ow, oc = _over(p, p["wall"], rows), _over(p, p["cpu"], rows)

    def us(o: dict[str, list[float]]) -> dict[str, float]:
        return {r: round(median(v) * 1e6, 1) for r, v in o.items()}

    out = {
        "overhead_us": us(ow),
        "x_sqlite": _x(ow, SQLITE),
        "cpu_overhead_us": us(oc),
        "x_sqlite_cpu": _x(oc, SQLITE),
        "x_inmemory_cpu": _x(oc, INMEM),
        "commits_per_superstep": {r: round(median(v), 2) for r, v in p["commits"].items()},
        "saver_cpu_us": us(p["inside"]),
        "x_inmemory_saver_cpu": _x(p["inside"], INMEM),
        "supersteps": p["steps"],
        "disk_bytes": p["disk"],
    }
    return out


@pytest.mark.parametrize("workload", list(RUNS))
def test_graph(benchmark: Any, workload: str) -> None:
    group = f"graph:{workload}"
    m = _run(benchmark, group, RUNS[workload], [KV_LMDB, KV_MEM, SQLITE, INMEM])
    what = (
        f"{THREADS} threads x one 30-turn agent loop"
        if workload == "loop"
        else f"{THREADS} threads x 10 invokes of 2 turns, each reloading the thread"
    )
    record(
        AREA,
        group,
        what + "; overhead per superstep vs no checkpointer, same round",
        metric_rows(**m),
        info={"threads": THREADS, "rounds": ROUNDS},
        targets=[
            target(
                f"{group}: overhead/superstep, durability full, vs SqliteSaver",
                m["x_sqlite"].get(KV_LMDB),
                1.0,
            ),
            target(f"{group}: same, the earlier goal", m["x_sqlite"].get(KV_LMDB), 0.5),
            target(
                f"{group}: KVSaver(':memory:') CPU overhead vs InMemorySaver's",
                m["x_inmemory_cpu"].get(KV_MEM),
                1.3,
            ),
        ],
    )


def test_durability_graph_loop(benchmark: Any) -> None:
    rows = [*DURABILITY, SQLITE]
    m = _run(benchmark, "durability:graph_loop", run_loop, rows)
    record(
        AREA,
        "durability:graph_loop",
        f"the agent loop ({THREADS} threads) at each KVSaver durability, and SqliteSaver",
        metric_rows(**m),
        info={"threads": THREADS, "rounds": ROUNDS},
    )
