"""Graph overhead per superstep at each KVSaver durability, against
SqliteSaver, in the same rounds (issue #13: the README's "Choosing durability").

group durability:graph_loop (one call = one round): the agent loop of
bench_graph (6 threads x one 30-turn loop, LangGraph's default "async"
durability) on a fresh store for each of

    kvsaver-full   KVSaver(dir)                     (the default)
    kvsaver-meta   KVSaver(dir, durability="meta")
    kvsaver-none   KVSaver(dir, durability="none")
    sqlite         SqliteSaver (WAL, synchronous FULL: its defaults)

and once with no checkpointer, in an order that rotates every round.
extra_info: per row, the median over rounds of (time with it - time without
it in the same round) / checkpoints written, and its ratio to SqliteSaver's
(median of per-round ratios).
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import time
from typing import Any

from _workloads import (
    KV_LMDB,
    SQLITE,
    build_agent,
    close_saver,
    count_checkpoints,
    label,
    make_saver,
    median,
    rotated,
    run_loop,
)

THREADS = 6
ROUNDS = 5
ROWS = ["kvsaver-full", "kvsaver-meta", "kvsaver-none", SQLITE]
NONE = "no checkpointer"


def _saver(row: str, workdir: str) -> Any:
    if row == SQLITE:
        return make_saver(SQLITE, workdir)
    return make_saver(KV_LMDB, workdir, durability=row.split("-")[1])


def test_durability_graph_loop(benchmark: Any) -> None:
    plain = build_agent(None)
    run_loop(plain, "warmup", False, threads=1)
    times: dict[str, list[float]] = {r: [] for r in [*ROWS, NONE]}
    steps: dict[str, int] = {}
    counter = itertools.count()

    def one_round(r: int) -> None:
        for row in rotated([*ROWS, NONE], r):
            if row == NONE:
                t0 = time.perf_counter()
                run_loop(plain, "none", False, threads=THREADS)
                times[row].append(time.perf_counter() - t0)
                continue
            workdir = tempfile.mkdtemp(prefix="kvs-dur-")
            saver = _saver(row, workdir)
            try:
                graph = build_agent(saver)
                t0 = time.perf_counter()
                run_loop(graph, f"d{r}", True, threads=THREADS)
                times[row].append(time.perf_counter() - t0)
                steps[row] = count_checkpoints(saver, f"d{r}")
            finally:
                close_saver(saver)
                shutil.rmtree(workdir, ignore_errors=True)

    label(benchmark, "durability:graph_loop", "all savers", 1)
    benchmark.pedantic(one_round, setup=lambda: ((next(counter),), {}), rounds=ROUNDS)
    over = {row: [(t - b) / steps[row] for t, b in zip(times[row], times[NONE])] for row in ROWS}
    benchmark.extra_info.update(
        threads=THREADS,
        rounds=ROUNDS,
        supersteps=steps,
        overhead_us_per_superstep={row: round(median(v) * 1e6, 1) for row, v in over.items()},
        x_sqlite={
            row: round(median([a / b for a, b in zip(v, over[SQLITE]) if b > 0]), 3)
            for row, v in over.items()
        },
    )
