"""3 reader processes + 1 writer process (issue #13's concurrency row), with
the three head settings of KVSaver and SqliteSaver in the same rounds.

A measurement script, not a test. Each round runs bench/_concurrency.py's
``readers_writer`` (the writer puts round robin over 100 threads, coming
back to each within about a third of a second; 3 readers get_tuple the
latest of a random one) on a fresh store for each row, in an order that
rotates every round:

* ``kvsaver-lmdb``: KVSaver's defaults (``whole_latest="idle"``): heads of
  threads left alone for a second, which this writer's threads never are;
* ``kvsaver-lmdb-whole``: ``whole_latest=True``, every put rewrites the head;
* ``kvsaver-lmdb-blobs``: ``whole_latest=False``, no heads;
* ``sqlite``: SqliteSaver with its defaults.

Reported: medians over rounds of reads/s and the writer's puts/s, and the
median of the per-round ratios of reads/s to SqliteSaver's.

    python bench/rw_heads13.py [--rounds 3] [--window 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _concurrency as K
from _workloads import KV_BLOBS, KV_LMDB, KV_WHOLE, SQLITE, rotated

ROWS = [KV_LMDB, KV_WHOLE, KV_BLOBS, SQLITE]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=float, default=3.0)
    args = ap.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in ROWS}
    for r in range(args.rounds):
        for name in rotated(ROWS, r):
            d = tempfile.mkdtemp(prefix="rw13-")
            try:
                runs[name].append(K.readers_writer(name, d, window=args.window))
            finally:
                shutil.rmtree(d, ignore_errors=True)
            last = runs[name][-1]
            print(
                f"round {r} {name}: {last['reads_per_s']:,.0f} reads/s, "
                f"{last['writes_per_s']:,.0f} puts/s",
                flush=True,
            )
    print()
    print("| row | reads/s | x SqliteSaver (median of rounds) | writer puts/s | errors |")
    print("|---|---:|---:|---:|---:|")
    for name in ROWS:
        rs = runs[name]
        ratio = statistics.median(
            a["reads_per_s"] / b["reads_per_s"] for a, b in zip(rs, runs[SQLITE])
        )
        errors = sum(x["reader_errors"] + x["writer_errors"] for x in rs)
        print(
            f"| {name} | {statistics.median(x['reads_per_s'] for x in rs):,.0f} | "
            f"{ratio:.2f}x | {statistics.median(x['writes_per_s'] for x in rs):,.0f} | {errors} |"
        )


if __name__ == "__main__":
    main()
