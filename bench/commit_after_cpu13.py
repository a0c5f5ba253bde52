"""Issue #13: does a durable LMDB commit take longer when CPU work comes
before it? The floors of put and put_writes (bench_saver_ops.py,
``test_floor_paired``) add separately timed parts: serializing the
operations, and raw commits made back to back. A saver must serialize an
operation and then commit it, so its commits follow CPU work.

    python bench/commit_after_cpu13.py [--rounds 10] [--spin 300]

Each round: the (key, value) pairs KVSaver writes for 130 puts of
bench_saver_ops' workload (bench/_workloads.Recorder), committed by raw
py-lmdb transactions with KVSaver's settings into a file zeroed ahead,
once back to back and once with ``--spin`` µs of CPU work (a busy loop)
before each commit, in an order that alternates every round; the time of
the commit calls alone. Reported: medians over rounds, and the median of
the per-round ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _workloads import Recorder, raw_commit, raw_lmdb
from bench_saver_ops import _ops

WARM = 20


def spin(us: float) -> None:
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


def commits(path: str, pairs: list[list[tuple[bytes, bytes]]], spin_us: float) -> float:
    """Mean seconds per raw commit, ``spin_us`` of CPU work before each."""
    env = raw_lmdb(path, zeroed=True)
    for p in pairs[:WARM]:
        raw_commit(env, p)
    took = 0.0
    for p in pairs[WARM:]:
        if spin_us:
            spin(spin_us)
        t = time.perf_counter()
        raw_commit(env, p)
        took += time.perf_counter() - t
    env.close()
    return took / (len(pairs) - WARM)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--spin", type=float, default=300.0)
    args = ap.parse_args()
    rec = Recorder()
    pairs = [rec.put(a) for a in _ops(rec.saver, 130 + WARM)]
    got: dict[str, list[float]] = {"back to back": [], "after CPU work": []}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            names = list(got) if r % 2 == 0 else list(reversed(got))
            for name in names:
                us = args.spin if name == "after CPU work" else 0.0
                got[name].append(commits(os.path.join(d, f"{r}-{us:g}"), pairs, us))
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    print("| raw durable commit of a put's records | µs / commit (median of rounds) |")
    print("|---|---:|")
    for name, ts in got.items():
        label = name if name == "back to back" else f"after {args.spin:g} µs of CPU work"
        print(f"| {label} | {statistics.median(ts) * 1e6:,.1f} |")
    x = statistics.median(a / b for a, b in zip(got["after CPU work"], got["back to back"]))
    print(f"| ratio (median of per-round ratios) | {x:.2f}x |")


if __name__ == "__main__":
    main()
