"""Paired A/B of head records (issue #13, saver/heads.py) on the graph rows:
this checkout's KVSaver with ``whole_latest=True`` ("new"; ``--default``:
without it) against another
checkout's KVSaver ("old", e.g. main before heads), SqliteSaver, and no
checkpointer, in the same rounds, in an order that rotates every round.

    python bench/ab_heads13.py --old /tmp/old [--rounds 7] [--durability full]
        [--workloads loop,invokes] [--default]
    # /tmp/old/kvsaver_old: the other checkout's saver/ (kv/ as .kv), imports renamed

Each round runs each workload of bench/_workloads.py (the agent loop;
10 two-turn invokes per thread, each reloading the thread) on a fresh store
per saver. Reported: the median over rounds of the overhead per checkpoint,
(time - time without checkpointer, same round) / checkpoints written, and
the medians of the per-round ratios new/old, new/SqliteSaver, old/SqliteSaver.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _workloads import build_agent, rotated, run_invokes, run_loop
from kvsaver import KVSaver
from langgraph.checkpoint.sqlite import SqliteSaver

THREADS = 6


def _x(per: dict[str, list[float]], a: str, b: str) -> float:
    return statistics.median([p / q for p, q in zip(per[a], per[b])])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="directory holding the kvsaver_old package")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--durability", default="full")
    ap.add_argument("--workloads", default="loop,invokes")
    ap.add_argument(
        "--default",
        action="store_true",
        help="new with its defaults (whole_latest=False): what heads cost a saver without them",
    )
    args = ap.parse_args()
    sys.path.insert(0, args.old)
    from kvsaver_old import KVSaver as OldKVSaver

    def make(name: str, d: str) -> Any:
        if name == "new":
            return KVSaver(
                os.path.join(d, "s"), durability=args.durability, whole_latest=not args.default
            )
        if name == "old":
            return OldKVSaver(os.path.join(d, "s"), durability=args.durability)
        if name == "sqlite":
            saver = SqliteSaver(sqlite3.connect(os.path.join(d, "s.db"), check_same_thread=False))
            saver.setup()
            return saver
        return None

    def checkpoints(saver: Any) -> int:
        if isinstance(saver, SqliteSaver):
            return int(saver.conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0])
        return sum(1 for _ in saver.list(None))

    workloads = {"loop": run_loop, "invokes": run_invokes}
    for wl in args.workloads.split(","):
        run = workloads[wl]
        per: dict[str, list[float]] = {"new": [], "old": [], "sqlite": []}
        for r in range(args.rounds):
            took: dict[str, float] = {}
            written: dict[str, int] = {}
            for name in rotated(["none", "new", "old", "sqlite"], r):
                d = tempfile.mkdtemp()
                saver = make(name, d)
                graph = build_agent(saver)
                gc.collect()
                t0 = time.perf_counter()
                run(graph, f"r{r}", saver is not None, threads=THREADS)
                took[name] = time.perf_counter() - t0
                if saver is not None:
                    written[name] = checkpoints(saver)
                    if isinstance(saver, SqliteSaver):
                        saver.conn.close()
                    else:
                        saver.close()
                shutil.rmtree(d, ignore_errors=True)
            for name in per:
                per[name].append((took[name] - took["none"]) / written[name] * 1e6)

        med = {k: statistics.median(v) for k, v in per.items()}
        print(
            f"{wl} (durability {args.durability}, {args.rounds} rounds): overhead/checkpoint "
            f"new {med['new']:,.0f} µs, old {med['old']:,.0f} µs, sqlite {med['sqlite']:,.0f} µs; "
            f"new/old {_x(per, 'new', 'old'):.3f}, new/sqlite {_x(per, 'new', 'sqlite'):.3f}, "
            f"old/sqlite {_x(per, 'old', 'sqlite'):.3f}"
        )


if __name__ == "__main__":
    main()
