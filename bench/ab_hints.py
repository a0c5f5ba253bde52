"""A/B of the cross-process "wanted" marks (saver/whole/hints.py): the same
KVSaver code with the marks on (the default) and off (the saver's
``_heads.hints`` set to None in every process: no mark made, none looked
up), in the same run, in an order that rotates every pair of runs.

Workloads (1 writer process, durability "full", and reader processes doing
get_tuple(latest) of a random thread, as bench/_concurrency.py does):

  hot100    3 readers, the writer round robin over 100 threads
            (concurrency:3r1w's workload);
  wide2000  1 reader, the writer on a random one of 2,000 threads.

Per run: reads/s, puts/s, and the share of the readers' reads served by a
head record. Run: ``.venv/bin/python bench/ab_hints.py [pairs]``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
import time
from typing import Any

from _concurrency import _run_window, run_readers_writer
from _workloads import KV_LMDB, ThreadGen, close_saver, make_saver, median

WINDOW = 3.0
THREADS = {"hot100": 100, "wide2000": 2000}
READERS = {"hot100": 3, "wide2000": 1}


def _variant(saver: Any, mode: str) -> None:
    if mode == "off":
        saver._heads.hints = None


def _writer(name: str, workdir: str, ready: Any, barrier: Any, window: float, out: Any) -> None:
    mode, workload = name.split(":")
    saver = make_saver(KV_LMDB, workdir)
    _variant(saver, mode)
    n = THREADS[workload]
    gens = [ThreadGen(saver, f"t-{i:05d}", msg_chars=300, window=20) for i in range(n)]
    for _ in range(3 if n <= 100 else 1):
        for g in gens:
            a = g.next()
            saver.put(a.config, a.checkpoint, a.metadata, a.new_versions)
    rnd = random.Random(7)
    if n <= 100:
        pending = [g.next() for _ in range(45) for g in gens]
    else:
        pending = [gens[rnd.randrange(n)].next() for _ in range(4500)]

    def step(i: int) -> bool:
        a = pending[i]
        saver.put(a.config, a.checkpoint, a.metadata, a.new_versions)
        return True

    ready.set()
    barrier.wait()
    out.put(("writer", *_run_window(step, window, len(pending))))
    close_saver(saver)


def _reader(
    name: str, workdir: str, seed: int, ready: Any, barrier: Any, window: float, out: Any
) -> None:
    mode, workload = name.split(":")
    ready.wait()
    saver = make_saver(KV_LMDB, workdir, readonly=True)
    _variant(saver, mode)
    heads = saver._heads
    read = heads.read
    hits = [0, 0]

    def counted(*args: Any) -> Any:
        found = read(*args)
        hits[found is not None] += 1
        return found

    heads.read = counted
    rnd = random.Random(seed)
    configs = [
        {"configurable": {"thread_id": f"t-{i:05d}", "checkpoint_ns": ""}}
        for i in range(THREADS[workload])
    ]
    saver.get_tuple(configs[0])

    def step(i: int) -> bool:
        return saver.get_tuple(rnd.choice(configs)) is not None

    barrier.wait()
    done, failed, secs = _run_window(step, window, 1 << 62)
    out.put(("reader", done, failed, secs, hits[1] / max(1, sum(hits))))
    close_saver(saver)


def one(mode: str, workload: str) -> dict[str, float]:
    workdir = tempfile.mkdtemp(prefix="abhints")
    try:
        w, rs = run_readers_writer(
            _writer, _reader, f"{mode}:{workload}", workdir, READERS[workload], WINDOW
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "reads_per_s": sum(r[1] / r[3] for r in rs),
        "puts_per_s": w[1] / w[3],
        "head_share": sum(r[4] for r in rs) / len(rs),
    }


def main() -> None:
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    for workload in THREADS:
        results[workload] = {"on": [], "off": []}
        for r in range(pairs):
            for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
                res = one(mode, workload)
                results[workload][mode].append(res)
                print(workload, r, mode, {k: round(v, 3) for k, v in res.items()}, flush=True)
    for workload, by in results.items():
        ratios = {
            key: median([a[key] / b[key] for a, b in zip(by["on"], by["off"]) if b[key]])
            for key in ("reads_per_s", "puts_per_s")
        }
        summary = {
            mode: {key: round(median([x[key] for x in runs]), 3) for key in runs[0]}
            for mode, runs in by.items()
        }
        print(workload, json.dumps(summary), "on/off", {k: round(v, 3) for k, v in ratios.items()})
    print("load", os.getloadavg(), time.strftime("%H:%M:%S"))


if __name__ == "__main__":
    main()
