"""Issue #13's graph rows: where a superstep's overhead goes, in user and
system CPU, for every saver in the same rounds.

    python bench/cpu_split13.py [--rounds 5] [--threads 6]

A measurement script, not a test. Each round runs bench/_workloads' agent
loop (``run_loop``: ``--threads`` conversations one after the other, each a
30-turn loop) with KVSaver on LMDB (durability "full"), SqliteSaver,
KVSaver(":memory:"), InMemorySaver and no checkpointer, in an order that
rotates every round, each saver on a fresh store. Per checkpoint written,
medians over rounds of (run - the same round's run without checkpointer):
wall clock, user and system CPU of the process (``getrusage``: every thread,
LangGraph's workers included), and the garbage collections of each
generation during the run (``gc.get_stats``: no ``gc.callbacks``, whose
own cost changes how often the collector runs).

It answers whether the graph rows wait for the disk or for the CPU: the
system CPU holds the flushes' system calls, the user CPU the Python and the
C libraries (LMDB's and SQLite's page work included).
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _workloads import (
    INMEM,
    KV_LMDB,
    KV_MEM,
    SQLITE,
    build_agent,
    close_saver,
    make_saver,
    rotated,
    run_loop,
)

NONE = "none"
FIELDS = ("wall", "user", "sys", "gen0", "gen1", "gen2")


def _one(name: str, workdir: str, tag: str, threads: int) -> tuple[dict[str, float], int]:
    """One run: the totals of FIELDS, and the checkpoints written (0: none)."""
    saver = None if name == NONE else make_saver(name, workdir)
    graph = build_agent(saver)
    gc.collect()
    g0 = [s["collections"] for s in gc.get_stats()]
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    run_loop(graph, tag, saver is not None, threads=threads)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    g1 = [s["collections"] for s in gc.get_stats()]
    steps = sum(1 for _ in saver.list(None)) if saver is not None else 0
    if saver is not None:
        close_saver(saver)
    out = {"wall": wall, "user": r1.ru_utime - r0.ru_utime, "sys": r1.ru_stime - r0.ru_stime}
    out.update({f"gen{i}": float(b - a) for i, (a, b) in enumerate(zip(g0, g1))})
    return out, steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=6)
    args = ap.parse_args(argv)
    names = [KV_LMDB, SQLITE, KV_MEM, INMEM, NONE]
    got: dict[str, list[tuple[dict[str, float], int]]] = {n: [] for n in names}
    top = tempfile.mkdtemp(prefix="cpu-split-")
    try:
        for r in range(args.rounds):
            for n in rotated(names, r):
                wd = os.path.join(top, f"{n}-{r}")
                os.makedirs(wd)
                got[n].append(_one(n, wd, f"{n}-{r}", args.threads))
                shutil.rmtree(wd, ignore_errors=True)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}; {args.rounds} rounds")
    print("| saver | wall / checkpoint | user CPU | system CPU | collections gen0/1/2 per run |")
    print("|---|---:|---:|---:|---:|")
    for n in names[:-1]:
        per: dict[str, list[float]] = {k: [] for k in FIELDS}
        for (run, steps), (base, _) in zip(got[n], got[NONE]):
            for k in ("wall", "user", "sys"):
                per[k].append((run[k] - base[k]) / steps * 1e6)
            for k in ("gen0", "gen1", "gen2"):
                per[k].append(run[k])
        med = {k: statistics.median(v) for k, v in per.items()}
        print(
            f"| {n} | {med['wall']:,.0f} µs | {med['user']:,.0f} µs | {med['sys']:,.0f} µs "
            f"| {med['gen0']:.0f} / {med['gen1']:.0f} / {med['gen2']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
