"""Real graphs with every saver timed in the same rounds, in rotating order
(issue #13): the graph rows of its table, and the README's "Choosing
durability". bench_graph times each saver in a test of its own, and this
machine drifts between tests by more than the gaps measured.

groups (one call = one round; every row and a run with no checkpointer in
each round, a fresh store per row and round):

  graph_paired:loop      the agent loop of bench_graph (THREADS threads x one
  graph_paired:invokes   30-turn loop) / 10 invokes per thread, each reloading
                         the thread; rows kvsaver-lmdb (durability full),
                         kvsaver-memory, sqlite, inmemory
  durability:graph_loop  the loop at each KVSaver durability: kvsaver-full,
                         kvsaver-meta, kvsaver-none, and sqlite

extra_info per row: the median over rounds of (time with it - time without
it, same round) / checkpoints written, on wall-clock time and on the process's
CPU time (LangGraph writes checkpoints from worker threads); x_sqlite and
x_inmemory, the medians of per-round ratios of those overheads; for the LMDB
rows, commits_per_superstep: LMDB write transactions committed (its txnid
advances by one per commit, and each durable commit is two device flushes)
per checkpoint written, median over rounds. SqliteSaver commits once per put
and once per put_writes (10 invokes per thread: 1.8 per checkpoint). For the
memory rows, saver_cpu_us_per_superstep and x_inmemory_saver_cpu: the thread
CPU inside the saver's calls alone (_workloads.SaverClock).
"""

from __future__ import annotations

import itertools
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
    label,
    make_saver,
    median,
    rotated,
    run_invokes,
    run_loop,
)
from kvsaver import KVSaver
from kvsaver.kv import LMDBStore

THREADS = 6
ROUNDS = 5
NONE = "no checkpointer"
RUNS = {"loop": run_loop, "invokes": run_invokes}


def _paired(benchmark: Any, group: str, run: Callable[..., None], rows: list[str]) -> None:
    plain = build_agent(None)
    run(plain, "warmup", False, threads=1)
    wall: dict[str, list[float]] = {r: [] for r in [*rows, NONE]}
    cpu: dict[str, list[float]] = {r: [] for r in [*rows, NONE]}
    steps: dict[str, int] = {}
    commits: dict[str, list[float]] = {}
    inside: dict[str, list[float]] = {}  # CPU inside the saver's calls (memory rows)
    counter = itertools.count()

    def one_round(r: int) -> None:
        for row in rotated([*rows, NONE], r):
            workdir = tempfile.mkdtemp(prefix="kvs-gp-")
            saver = None if row == NONE else _saver(row, workdir)
            try:
                clock = None
                if row in (KV_MEM, INMEM):  # the CPU inside the saver's calls alone
                    clock = SaverClock(saver, time.thread_time, SaverClock.GRAPH_METHODS)
                graph = plain if saver is None else build_agent(saver)
                txnid = _txnid(saver)
                w0, c0 = time.perf_counter(), time.process_time()
                run(graph, f"p{r}", saver is not None, threads=THREADS)
                wall[row].append(time.perf_counter() - w0)
                cpu[row].append(time.process_time() - c0)
                if saver is not None:
                    steps[row] = count_checkpoints(saver, f"p{r}")
                if clock is not None:
                    inside.setdefault(row, []).append(clock.total / steps[row])
                if txnid is not None:
                    done = _txnid(saver)
                    assert done is not None
                    commits.setdefault(row, []).append((done - txnid) / steps[row])
            finally:
                if saver is not None:
                    close_saver(saver)
                shutil.rmtree(workdir, ignore_errors=True)

    label(benchmark, group, "all savers", 1)
    benchmark.pedantic(one_round, setup=lambda: ((next(counter),), {}), rounds=ROUNDS)

    def over(times: dict[str, list[float]]) -> dict[str, list[float]]:
        return {r: [(t - b) / steps[r] for t, b in zip(times[r], times[NONE])] for r in rows}

    def x(o: dict[str, list[float]], ref: str) -> dict[str, float]:
        if ref not in o:
            return {}
        ratios = {r: [a / b for a, b in zip(v, o[ref]) if b > 0] for r, v in o.items()}
        return {r: round(median(v), 3) for r, v in ratios.items()}

    ow, oc = over(wall), over(cpu)
    benchmark.extra_info.update(
        threads=THREADS,
        rounds=ROUNDS,
        supersteps=steps,
        overhead_us_per_superstep={r: round(median(v) * 1e6, 1) for r, v in ow.items()},
        cpu_overhead_us_per_superstep={r: round(median(v) * 1e6, 1) for r, v in oc.items()},
        x_sqlite=x(ow, SQLITE),
        x_sqlite_cpu=x(oc, SQLITE),
        x_inmemory_cpu=x(oc, INMEM),
        commits_per_superstep={r: round(median(v), 2) for r, v in commits.items()},
        saver_cpu_us_per_superstep={r: round(median(v) * 1e6, 1) for r, v in inside.items()},
        x_inmemory_saver_cpu=x(inside, INMEM),
    )


def _txnid(saver: Any) -> int | None:
    """The last committed LMDB transaction id of a KVSaver on LMDB, else None."""
    if isinstance(saver, KVSaver) and isinstance(saver.store, LMDBStore):
        return saver.store._env.last_txnid()
    return None


def _saver(row: str, workdir: str) -> Any:
    if row.startswith("kvsaver-") and row.split("-")[1] in ("full", "meta", "none"):
        return make_saver(KV_LMDB, workdir, durability=row.split("-")[1])
    return make_saver(row, workdir)


@pytest.mark.parametrize("workload", list(RUNS))
def test_graph_paired(benchmark: Any, workload: str) -> None:
    _paired(benchmark, f"graph_paired:{workload}", RUNS[workload], [KV_LMDB, KV_MEM, SQLITE, INMEM])


def test_durability_graph_loop(benchmark: Any) -> None:
    rows = ["kvsaver-full", "kvsaver-meta", "kvsaver-none", SQLITE]
    _paired(benchmark, "durability:graph_loop", run_loop, rows)
