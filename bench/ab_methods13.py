"""Per saver method, the CPU of KVSaver(":memory:") inside a real graph against
InMemorySaver's, and against another version of the code (issue #13, the CPU
rows): bench/results/PROFILE13_CPU.md's "pm3" tables.

    python bench/ab_methods13.py --old DIR [--workload loop|invokes] [--rounds 7]

``--old DIR``: DIR holds a package ``kvsaver_old`` (another checkout's saver/,
with its kv/ as ``kvsaver_old.kv``, imports renamed), as for bench/ab_cpu13.py.

Every round runs the workload (bench/_workloads: the agent loop, or 2-turn
invokes that reload the thread; 6 threads) once with each saver and once with
no checkpointer, in an order that rotates every round. Per checkpoint written:
``time.thread_time`` inside each of put, put_writes, get_tuple and
get_next_version (LangGraph calls them from worker threads), their sum
("saver"), and the process's CPU minus the no-checkpointer run's ("overhead").
Reported: medians, and medians of the per-round ratios new/InMemorySaver,
old/InMemorySaver and new/old.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _workloads import build_agent, run_invokes, run_loop
from kvsaver import KVSaver
from langgraph.checkpoint.memory import InMemorySaver

METHODS = ("put", "put_writes", "get_tuple", "get_next_version")


def _run(
    make: Callable[[], Any], run: Any, tag: str, threads: int, methods: tuple[str, ...] = METHODS
) -> dict[str, float]:
    """One graph run on ``make()``: per method in ``methods``, its thread CPU
    per checkpoint (µs); "saver" their sum, "process" the run's process CPU
    (µs, whole run), "steps" the checkpoints written."""
    saver = make()
    spent: dict[str, float] = defaultdict(float)
    for name in methods:
        fn = getattr(saver, name)

        def timed(*a: Any, _fn: Any = fn, _name: str = name, **kw: Any) -> Any:
            t0 = time.thread_time()
            try:
                return _fn(*a, **kw)
            finally:
                spent[_name] += time.thread_time() - t0

        setattr(saver, name, timed)
    t0 = time.process_time()
    run(build_agent(saver), tag, True, threads=threads)
    process = time.process_time() - t0
    steps = sum(1 for _ in saver.list(None))
    out = {k: v / steps * 1e6 for k, v in spent.items()}
    out["saver"] = sum(out.values())
    out["process"] = process * 1e6
    out["steps"] = steps
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--old", required=True, help="directory holding kvsaver_old")
    parser.add_argument("--workload", choices=["loop", "invokes"], default="loop")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=6)
    args = parser.parse_args(argv)
    sys.path.insert(0, args.old)
    from kvsaver_old import KVSaver as OldKVSaver

    run = run_loop if args.workload == "loop" else run_invokes
    makers: dict[str, Callable[[], Any]] = {
        "inmem": InMemorySaver,
        "new": lambda: KVSaver(":memory:"),
        "old": lambda: OldKVSaver(":memory:"),
    }
    names = [*makers, "none"]
    plain = build_agent(None)
    got: dict[str, dict[str, list[float]]] = {n: defaultdict(list) for n in names}
    for r in range(args.rounds):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            if n == "none":
                t0 = time.process_time()
                run(plain, "none", False, threads=args.threads)
                got[n]["process"].append((time.process_time() - t0) * 1e6)
                continue
            for k, v in _run(makers[n], run, f"{n}{r}", args.threads).items():
                got[n][k].append(v)
    for n in makers:
        got[n]["overhead"] = [
            (p - b) / s
            for p, b, s in zip(got[n]["process"], got["none"]["process"], got[n]["steps"])
        ]
    med = statistics.median

    def ratio(a: list[float], b: list[float]) -> float:
        return med(x / y for x, y in zip(a, b) if y > 0)

    for k in ("overhead", "saver", *METHODS):
        row = " ".join(f"{n} {med(got[n][k]):,.1f}" for n in makers)
        row += f" | new/inmem {ratio(got['new'][k], got['inmem'][k]):.3f}"
        row += f" | old/inmem {ratio(got['old'][k], got['inmem'][k]):.3f}"
        row += f" | new/old {ratio(got['new'][k], got['old'][k]):.3f}"
        print(f"{k:16s} us/checkpoint: {row}")
    print(f"load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
