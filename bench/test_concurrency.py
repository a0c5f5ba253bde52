"""Concurrency: KVSaver (LMDB, durability "full") against SqliteSaver.

Groups (bench/results/concurrency.json):

  concurrency:8_writers  8 Python threads sharing one saver, each doing 25
                         put_writes (3 writes) to its own thread id: 200 ops per
                         round; ops/s = 200 / median round time. Each round's
                         setup also times the same 200 ops from one thread
                         (``single_thread_ops_per_s``).
  concurrency:3r1w       3 reader processes (get_tuple latest of a random one of
                         100 threads) + 1 writer process (put, round robin over
                         them) on one store for a WINDOW-second window after a
                         warm-up, MIXED_RUNS runs on fresh stores (medians),
                         then the writer alone as many times: reads/s, puts/s,
                         ``writer_kept`` = puts/s beside the readers / alone,
                         errors counted (SQLite's "database is locked" among them).
"""

from __future__ import annotations

import itertools
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from _concurrency import put_writes_ops, readers_writer, threaded_put_writes
from _workloads import (
    DISK_SAVERS,
    KV_LMDB,
    SQLITE,
    close_saver,
    label,
    make_saver,
    median,
    pick,
    record,
    target,
)

AREA = "concurrency"
WRITER_THREADS = 8
PER_THREAD = 25
WINDOW = pick(3.0, 1.0)
MIXED_RUNS = pick(3, 1)
ROUNDS = pick(5, 2)
_results: dict[str, dict[str, dict[str, Any]]] = {"8_writers": {}, "3r1w": {}}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


@pytest.mark.parametrize("name", DISK_SAVERS)
def test_8_writers(benchmark: Any, name: str, tmp_path: Any) -> None:
    saver = make_saver(name, str(tmp_path))
    pool = ThreadPoolExecutor(WRITER_THREADS)
    single: list[float] = []
    eight: list[float] = []
    counter = itertools.count()
    ops = WRITER_THREADS * PER_THREAD

    def setup() -> tuple[tuple[Any, ...], dict]:
        r = next(counter)
        alone = put_writes_ops(1, ops, f"one-{r}")
        t0 = time.perf_counter()
        threaded_put_writes(saver, pool, alone)
        single.append(time.perf_counter() - t0)
        return (r, put_writes_ops(WRITER_THREADS, PER_THREAD, f"eight-{r}")), {}

    def run(r: int, work: Any) -> None:
        t0 = time.perf_counter()
        threaded_put_writes(saver, pool, work)
        if r > 0:  # round 0 is the warm-up
            eight.append(time.perf_counter() - t0)

    label(benchmark, "concurrency:8_writers", name, ops)
    benchmark.pedantic(run, setup=setup, rounds=ROUNDS + 1)
    pool.shutdown()
    close_saver(saver)
    _results["8_writers"][name] = {
        "ops_per_s": round(ops / median(eight), 1),
        "single_thread_ops_per_s": round(ops / median(single[1:]), 1),
    }
    rows = _results["8_writers"]
    x = _ratio(rows.get(KV_LMDB, {}).get("ops_per_s"), rows.get(SQLITE, {}).get("ops_per_s"))
    record(
        AREA,
        "concurrency:8_writers",
        f"{WRITER_THREADS} threads x {PER_THREAD} put_writes to their own thread ids",
        rows,
        info={"rounds": ROUNDS, "threads": WRITER_THREADS, "x_sqlite_ops_per_s": x},
        targets=[target("8 writer threads, ops/s vs SqliteSaver", x, 3.0, at_most=False)],
    )


@pytest.mark.parametrize("name", DISK_SAVERS)
def test_readers_writer(benchmark: Any, name: str, tmp_path: Any) -> None:
    def runs() -> list[dict[str, Any]]:
        out = []
        for i in range(MIXED_RUNS):
            os.makedirs(tmp_path / f"mixed{i}")
            out.append(readers_writer(name, str(tmp_path / f"mixed{i}"), 3, WINDOW))
        return out

    label(benchmark, "concurrency:3r1w", name, 1)
    mixed = benchmark.pedantic(runs, rounds=1)
    alone = []
    for i in range(MIXED_RUNS):  # the writer alone, as many times, on fresh stores
        os.makedirs(tmp_path / f"alone{i}")
        alone.append(readers_writer(name, str(tmp_path / f"alone{i}"), 0, WINDOW)["writes_per_s"])
    reads = [m["reads_per_s"] for m in mixed]
    writes = [m["writes_per_s"] for m in mixed]
    _results["3r1w"][name] = {
        "reads_per_s": round(median(reads), 1),
        "writes_per_s": round(median(writes), 1),
        "writes_per_s_alone": round(median(alone), 1),
        "writer_kept": round(median(writes) / median(alone), 3),
        "reader_errors": sum(m["reader_errors"] for m in mixed),
        "writer_errors": sum(m["writer_errors"] for m in mixed),
        "reads_per_s_runs": [round(r, 1) for r in reads],
    }
    rows = _results["3r1w"]
    kv, sql = rows.get(KV_LMDB, {}), rows.get(SQLITE, {})
    x = _ratio(kv.get("reads_per_s"), sql.get("reads_per_s"))
    record(
        AREA,
        "concurrency:3r1w",
        f"3 reader processes + 1 writer process, {MIXED_RUNS} runs of a {WINDOW:g} s window",
        rows,
        info={"window_s": WINDOW, "runs": MIXED_RUNS, "x_sqlite_reads_per_s": x},
        targets=[
            target("3 readers + 1 writer: reads/s vs SqliteSaver", x, 2.5, at_most=False),
            target("3 readers + 1 writer: reads/s vs SqliteSaver, the later goal", x, 1.5, False),
            target(
                "3 readers + 1 writer: KVSaver's puts/s beside readers / alone",
                kv.get("writer_kept"),
                0.5,
                at_most=False,
            ),
        ],
    )
