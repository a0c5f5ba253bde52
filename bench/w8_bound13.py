"""How far 8 writer threads can go on this machine (issue #13's "8 writer
threads, ops/s >= 3x SqliteSaver"), measured in the same rounds as the row.

A measurement script, not a test. Each of 8 threads calls ``put_writes``
(3 writes, its own thread id) and waits for it to be durable before its next
one, so at most 8 operations are ever in flight, and the work of preparing
an operation (serializing, running its function in the batch's transaction)
holds the GIL: one core's worth at most. Then a batch of 8 costs at least

    8 x c  (the GIL-held work of one put_writes)  +  F  (one durable commit)

when the threads prepare while no commit is flushing (the group commit as it
is), and a pipelined schedule that overlaps them cannot beat 8 / max(F, 8c)
either. Each round measures, in an order that rotates:

* ``kvsaver``, ``sqlite``: the ``concurrency:8_writers`` workload (8 threads x
  25 put_writes, durability full / SqliteSaver's defaults), ops/s;
* ``c``: the same 200 put_writes from one thread on ``KVSaver(dir,
  durability="none")`` (no flush: the CPU of the call and of its
  transaction and commit), thread CPU per operation;
* ``F``: one raw py-lmdb durable commit (KVSaver's settings, its data file
  zeroed ahead as KVSaver keeps its own) of the exact (key, value) pairs 8 of
  these put_writes write (under new keys each time), median of 25. Its
  environment grows by 25 such commits a round as KVSaver's store grows by
  the round's 400 put_writes: how many pages a commit writes depends on the
  tree's size. This VM's flushes drift by 2x within minutes; only figures of
  the same run compare.

Reported: medians; the bounds 8 / (8c + F) and 8 / max(F, 8c), and each as a
multiple of SqliteSaver's ops/s of the same rounds.

    python bench/w8_bound13.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _concurrency import batch_commit_seconds, batch_pairs, put_writes_ops, threaded_put_writes
from _workloads import KV_LMDB, SQLITE, close_saver, make_saver, raw_lmdb, rotated

THREADS, PER_THREAD = 8, 25


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    top = tempfile.mkdtemp(prefix="w8-bound-")
    pool = ThreadPoolExecutor(THREADS)
    kv = make_saver(KV_LMDB, os.path.join(top, "kv"))
    cpu_saver = make_saver(KV_LMDB, os.path.join(top, "kv-none"), durability="none")
    sq = make_saver(SQLITE, top)
    raw = raw_lmdb(os.path.join(top, "raw"), zeroed=True)  # as KVSaver keeps its file
    batch = batch_pairs(THREADS)
    got: dict[str, list[float]] = {"kvsaver": [], "sqlite": [], "c": [], "F": []}
    n = THREADS * PER_THREAD

    def run(name: str, r: int) -> None:
        if name in ("kvsaver", "sqlite"):
            saver: Any = kv if name == "kvsaver" else sq
            ops = put_writes_ops(THREADS, PER_THREAD, f"{name}-{r}")
            t0 = time.perf_counter()
            threaded_put_writes(saver, pool, ops)
            got[name].append(n / (time.perf_counter() - t0))
        elif name == "c":
            ops = put_writes_ops(1, n, f"c-{r}")[0]
            c0 = time.thread_time()
            for cfg, writes, tid in ops:
                cpu_saver.put_writes(cfg, writes, tid)
            got["c"].append((time.thread_time() - c0) / n)
        else:
            times = [batch_commit_seconds(raw, batch, f"-{r}-{i}") for i in range(25)]
            got["F"].append(statistics.median(times))

    try:
        for r in range(args.rounds + 1):  # round 0: warm-up, not counted
            for name in rotated(list(got), r):
                run(name, r)
            if r == 0:
                for v in got.values():
                    v.clear()
    finally:
        for saver in (kv, cpu_saver, sq):
            close_saver(saver)
        raw.close()
        pool.shutdown()
        shutil.rmtree(top, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in got.items()}
    c, f, sql = med["c"], med["F"], med["sqlite"]
    serial = THREADS / (THREADS * c + f)
    overlap = THREADS / max(f, THREADS * c)
    print(f"rounds {args.rounds}, load average {os.getloadavg()[0]:.2f}")
    kvs = med["kvsaver"]
    print(f"kvsaver 8 threads: {kvs:,.0f} ops/s ({kvs / sql:.2f}x SqliteSaver)")
    print(f"SqliteSaver 8 threads: {sql:,.0f} ops/s (3x: {3 * sql:,.0f})")
    print(f"c, GIL-held work of one put_writes (durability none, thread CPU): {c * 1e6:.0f} µs")
    print(f"F, one durable raw commit of 8 put_writes' pairs ({len(batch)}): {f * 1e6:.0f} µs")
    print(f"bound, prepare then flush, 8 / (8c + F): {serial:,.0f} ops/s ({serial / sql:.2f}x)")
    print(f"bound, fully overlapped, 8 / max(F, 8c): {overlap:,.0f} ops/s ({overlap / sql:.2f}x)")
    cycle = THREADS / (3 * sql)
    print(
        f"3x SqliteSaver: a batch of 8 every {cycle * 1e6:.0f} µs; prepare then flush needs "
        f"8c + F <= that ({(THREADS * c + f) * 1e6:.0f} µs now), overlapped F and 8c each "
        f"<= that"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
