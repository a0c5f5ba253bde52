"""How much of KVSaver(":memory:")'s put and put_writes CPU is zstd (issue
#13's CPU rows against issue #15's bytes): the calls a real graph made
(bench/_workloads' agent loop, 6 threads, recorded through InMemorySaver:
``ab_cpu13.record``) replayed into fresh savers, thread CPU per call, median
of rounds in an order that rotates every round.

    python bench/ablate_zstd13.py [--rounds 7]

Variants: InMemorySaver; KVSaver(":memory:") as it is; the same with the
small-value zstd calls (checkpoint record, delta piece, pending write) made
no-ops; the same with every zstd call a no-op (nothing compressed: what
issue #15's bytes forbid, measured only to bound what compression costs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _workloads import run_loop
from ab_cpu13 import record, replay
from kvsaver import KVSaver
from kvsaver import delta as D
from langgraph.checkpoint.memory import InMemorySaver

NAMES = ["InMemorySaver", "KVSaver", "no small-value zstd", "no zstd at all"]


def make(name: str) -> Any:
    if name == "InMemorySaver":
        return InMemorySaver()
    saver = KVSaver(":memory:")
    comp = D.codec(saver.serde).comp
    assert comp is not None
    if name != "KVSaver":
        comp.compress_small = lambda typ, data, remember=True: (typ, data)  # type: ignore[method-assign]
    if name == "no zstd at all":
        comp.compress_typed = lambda typ, data, threshold=None: (typ, data)  # type: ignore[method-assign]
    return saver


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    calls = record(run_loop, 6)
    per: dict[str, dict[str, list[float]]] = {n: {"put": [], "put_writes": []} for n in NAMES}
    for r in range(args.rounds):
        for name in NAMES[r % len(NAMES) :] + NAMES[: r % len(NAMES)]:
            for kind in ("put", "put_writes"):
                per[name][kind].append(replay(make(name), calls, kind))
    print(f"{len(calls)} calls recorded, {args.rounds} rounds; thread CPU per call")
    for kind in ("put", "put_writes"):
        base = statistics.median(per["InMemorySaver"][kind])
        cells = [
            f"{n} {statistics.median(per[n][kind]) * 1e6:,.1f} µs "
            f"({statistics.median(per[n][kind]) / base:.2f}x)"
            for n in NAMES
        ]
        print(f"{kind}: " + ", ".join(cells))


if __name__ == "__main__":
    main()
