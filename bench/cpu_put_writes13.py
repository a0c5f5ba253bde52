"""Issue #13: a lone put_writes on LMDB (durability "full") against one raw
py-lmdb commit of the very records it writes, wall clock and process CPU
(kernel included: the flushes' system calls are in both) per operation.

    python bench/cpu_put_writes13.py [--rounds 7] [--ops 300]

Each round: a fresh KVSaver directory and a fresh raw environment zeroed
ahead (bench/_workloads.raw_lmdb, KVSaver's settings), ``--ops``
put_writes of bench_saver_ops' workload (3 values) after 20 unmeasured; the
raw side commits the (key, value) pairs KVSaver wrote for the same calls
(bench/_workloads.Recorder). Order alternates every round; medians, and the
median of the per-round ratios. The difference in CPU is the saver's and
the store's Python (the system calls are the same: ``strace -c`` counts 789
and 787 pwrite64, 201 and 202 fdatasync for 200 operations).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _workloads import Recorder, raw_commit, raw_lmdb
from bench_saver_ops import _writes_ops
from kvsaver import KVSaver

WARM = 20


def _per_op(do: Callable[[Any], Any], items: list[Any]) -> tuple[float, float]:
    """(wall, process CPU) seconds per item of ``do`` over ``items``, the
    first ``WARM`` untimed."""
    for item in items[:WARM]:
        do(item)
    t0, c0 = time.perf_counter(), time.process_time()
    for item in items[WARM:]:
        do(item)
    n = len(items) - WARM
    return (time.perf_counter() - t0) / n, (time.process_time() - c0) / n


def run_kv(path: str, ops: list[Any]) -> tuple[float, float]:
    saver = KVSaver(path)
    out = _per_op(lambda op: saver.put_writes(*op), ops)
    saver.store.close()
    return out


def run_raw(path: str, ops: list[Any]) -> tuple[float, float]:
    rec = Recorder()
    pairs = [rec.put_writes(*op) for op in ops]
    env = raw_lmdb(path, zeroed=True)
    out = _per_op(lambda p: raw_commit(env, p), pairs)
    env.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--ops", type=int, default=300)
    args = ap.parse_args()
    got: dict[str, list[tuple[float, float]]] = {"kv": [], "raw": []}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            for name in ("kv", "raw") if r % 2 == 0 else ("raw", "kv"):
                fn = run_kv if name == "kv" else run_raw
                got[name].append(fn(os.path.join(d, f"{name}{r}"), _writes_ops(args.ops + WARM)))
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    print("| | wall µs / op | process CPU µs / op |")
    print("|---|---:|---:|")
    for name, label in (("kv", "KVSaver.put_writes"), ("raw", "raw commit of its records")):
        wall = statistics.median(w for w, _ in got[name]) * 1e6
        cpu = statistics.median(c for _, c in got[name]) * 1e6
        print(f"| {label} | {wall:,.1f} | {cpu:,.1f} |")
    rw = statistics.median(k[0] / r[0] for k, r in zip(got["kv"], got["raw"]))
    rc = statistics.median(k[1] / r[1] for k, r in zip(got["kv"], got["raw"]))
    print(f"| KVSaver / raw (per round) | {rw:.2f}x | {rc:.2f}x |")


if __name__ == "__main__":
    main()
