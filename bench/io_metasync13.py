"""Issue #13, 8 writer threads: would flushing the meta page outside LMDB's
writer lock let concurrent commits share flushes? Raw py-lmdb, no saver code.

    python bench/io_metasync13.py [--rounds 5] [--seconds 2]

A durable LMDB commit (durability "full": ``sync=True, metasync=True``)
flushes its data pages, then writes its meta page through a synchronous fd,
both while holding LMDB's writer lock: the next commit waits for two device
flushes. The alternative measured here ("split"): ``metasync=False`` (the
commit flushes the data pages and writes the meta page without a flush),
then ``env.sync(True)`` after the commit, outside the writer lock; a commit
counts only when its own sync has returned, so every counted commit is as
durable as a "full" one. Meanwhile the next thread's commit may run: its data
flush and our meta flush can overlap on the device.

N threads (1, 2, 4) commit back to back (3 values of 300 bytes each, a
put_writes' size), into a data file zeroed ahead as KVSaver keeps its own
(bench/_workloads.raw_lmdb: KVSaver's settings).
Each round runs every (mode, N) for ``--seconds``, in an order that rotates
every round; reported: median commits/s, and the median over rounds of the
per-round ratio split / full for each N.

Not a change of KVSaver: with "split", another process can read a commit
before its meta page is on disk (LMDB publishes it at the end of the
commit), so a reader could act on a commit that a power loss then undoes;
today a reader sees only durable commits, as with SQLite's synchronous FULL.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

import lmdb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _workloads import raw_lmdb

VALUES = [os.urandom(300) for _ in range(3)]


def make(path: str, metasync: bool) -> lmdb.Environment:
    shutil.rmtree(path, ignore_errors=True)
    return raw_lmdb(path, zeroed=True, metasync=metasync)


def commits_per_second(env: lmdb.Environment, split: bool, threads: int, seconds: float) -> float:
    stop = time.monotonic() + seconds
    counts = [0] * threads

    def worker(w: int) -> None:
        i = 0
        while time.monotonic() < stop:
            i += 1
            with env.begin(write=True) as txn:
                for j, v in enumerate(VALUES):
                    txn.put(b"%d-%d-%d" % (w, i, j), v)
            if split:
                env.sync(True)  # this commit's meta page, outside the writer lock
            counts[w] += 1

    ts = [threading.Thread(target=worker, args=(w,)) for w in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts) / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    cases = [(split, n) for n in (1, 2, 4) for split in (False, True)]
    got: dict[tuple[bool, int], list[float]] = {c: [] for c in cases}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            for split, n in cases[r % len(cases) :] + cases[: r % len(cases)]:
                env = make(os.path.join(d, "env"), metasync=not split)
                try:
                    got[(split, n)].append(commits_per_second(env, split, n, args.seconds))
                finally:
                    env.close()
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    print("| threads | full: commits/s | split: commits/s | split / full (per round) |")
    print("|---:|---:|---:|---:|")
    for n in (1, 2, 4):
        full, split = got[(False, n)], got[(True, n)]
        ratios = [s / f for s, f in zip(split, full)]
        print(
            f"| {n} | {statistics.median(full):,.0f} | {statistics.median(split):,.0f} | "
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |"
        )


if __name__ == "__main__":
    main()
