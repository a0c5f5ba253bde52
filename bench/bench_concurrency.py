"""Concurrency: KVSaver (LMDB, durability "full") against SqliteSaver (issue #6).

concurrency:8_writers      8 Python threads sharing one saver, each doing 25
                           put_writes (3 writes) to its own thread id: 200 ops
                           per round; throughput = 200 / median round time.
                           Each round's setup also times the same 200 ops from
                           one thread (extra_info: single_thread_ops_per_s).
concurrency:3r1w           3 reader processes (get_tuple latest) + 1 writer
                           process (put) on one store for a 3 s window, 3 runs
                           (medians), then the writer alone (3 runs, median);
                           extra_info holds the throughputs.

As a script, ``python bench/bench_concurrency.py`` prints both as a table.
"""

from __future__ import annotations

import itertools
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _concurrency import put_writes_ops, readers_writer, threaded_put_writes
from _workloads import DISK_SAVERS, close_saver, label, make_saver, median

WRITER_THREADS = 8
PER_THREAD = 25
WINDOW = 3.0


@pytest.mark.parametrize("name", DISK_SAVERS)
def test_8_writers(benchmark: Any, name: str, tmp_path: Any) -> None:
    saver = make_saver(name, str(tmp_path))
    pool = ThreadPoolExecutor(WRITER_THREADS)
    single: list[float] = []
    counter = itertools.count()

    def setup() -> tuple[tuple[Any, ...], dict]:
        r = next(counter)
        alone = put_writes_ops(1, WRITER_THREADS * PER_THREAD, f"one-{r}")
        t0 = time.perf_counter()
        threaded_put_writes(saver, pool, alone)
        single.append(time.perf_counter() - t0)
        return (saver, pool, put_writes_ops(WRITER_THREADS, PER_THREAD, f"eight-{r}")), {}

    label(benchmark, "concurrency:8_writers", name, WRITER_THREADS * PER_THREAD)
    benchmark.pedantic(threaded_put_writes, setup=setup, rounds=5, warmup_rounds=1)
    ops = WRITER_THREADS * PER_THREAD
    if benchmark.stats is not None:  # None under --benchmark-disable (a smoke run)
        benchmark.extra_info.update(
            threads=WRITER_THREADS,
            ops_per_s=round(ops / benchmark.stats.stats.median, 1),
            single_thread_ops_per_s=round(ops / median(single[1:]), 1),
        )
    pool.shutdown()
    close_saver(saver)


MIXED_RUNS = 3


@pytest.mark.parametrize("name", DISK_SAVERS)
def test_readers_writer(benchmark: Any, name: str, tmp_path: Any) -> None:
    """One round: the timed call is MIXED_RUNS whole 3-readers+1-writer runs
    (spawn included), each on a fresh store; the numbers that matter are the
    throughputs in extra_info, medians of the runs (one 3 s window on this
    shared machine swings by up to 2x)."""

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
    benchmark.extra_info.update(
        reads_per_s=round(median(reads), 1),
        reads_per_s_runs=[round(r, 1) for r in reads],
        writes_per_s=round(median(writes), 1),
        writes_per_s_alone=round(median(alone), 1),
        writes_per_s_alone_runs=[round(w, 1) for w in alone],
        writer_kept=round(median(writes) / median(alone), 3),
        reader_errors=sum(m["reader_errors"] for m in mixed),
        writer_errors=sum(m["writer_errors"] for m in mixed),
        window_s=WINDOW,
        runs=MIXED_RUNS,
    )


def main() -> None:
    rows = []
    for name in DISK_SAVERS:
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "mixed"))
            os.makedirs(os.path.join(d, "alone"))
            mixed = readers_writer(name, os.path.join(d, "mixed"), 3, WINDOW)
            alone = readers_writer(name, os.path.join(d, "alone"), 0, WINDOW)
            saver = make_saver(name, d)
            pool = ThreadPoolExecutor(WRITER_THREADS)
            times = []
            for r in range(4):
                ops = put_writes_ops(WRITER_THREADS, PER_THREAD, f"eight-{r}")
                t0 = time.perf_counter()
                threaded_put_writes(saver, pool, ops)
                times.append(time.perf_counter() - t0)
            pool.shutdown()
            close_saver(saver)
        rows.append(
            (
                name,
                mixed["reads_per_s"],
                mixed["writes_per_s"],
                alone["writes_per_s"],
                WRITER_THREADS * PER_THREAD / median(times[1:]),
                mixed["reader_errors"] + mixed["writer_errors"],
            )
        )
    print(
        "| saver | 3 readers: reads/s | 1 writer beside them: puts/s | writer alone: puts/s "
        "| 8 writer threads: put_writes/s | errors |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, reads, writes, alone_w, eight, errs in rows:
        print(f"| {name} | {reads:,.0f} | {writes:,.0f} | {alone_w:,.0f} | {eight:,.0f} | {errs} |")


if __name__ == "__main__":
    main()
