"""A/B of the LMDB write path under 8 writer threads and for a lone writer (issue #13).

A measurement script, not a test. Each round runs, for each variant in an
order that rotates every round, on the variant's own store (durability
"full"): the ``concurrency:8_writers`` workload (8 threads x 25 put_writes of
3 writes to their own thread, bench/_concurrency.py), and the same 200
put_writes from one thread. Reported: medians over rounds of ops/s and of
process CPU per operation (``time.process_time``: both cores, kernel
included), and the median of the per-round ratios to ``before``.

* ``before``: the write path as it was: a leader waiting for its batch to
  fill polls (``time.sleep(50 us)`` and a look at the queue) for at most half
  of the last commit's time, and every write transaction asks ``env.info()``
  for the pages in use (zero_ahead); the sleeps and info() release the GIL.
* ``after``: the code as it is.

With ``--graph N``, each round also runs bench_graph's agent loop
(``run_loop``: N conversations, one after the other, of a 30-turn loop;
LangGraph writes put_writes and put from its worker threads) for each
variant and once with no checkpointer; reported per superstep: the overhead
over the run without a checkpointer in the same round.

    python bench/ab_w8.py --rounds 10 [--graph 3]
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

from _concurrency import put_writes_ops, threaded_put_writes
from _workloads import LOOP_TURNS, build_agent, run_loop
from kvsaver import KVSaver
from kvsaver.kv import lmdb_store as L

_AFTER = {"gather": L._Env.gather, "zero_ahead": L._Env.zero_ahead}


def _gather_before(self: Any) -> list[Any]:
    with self.queue_lock:
        expect = max(self.batch_sizes)
        short = expect > 1 and len(self.queue) < expect
    if short:
        deadline = time.monotonic() + min(L._GATHER_MAX_SECONDS, self.commit_seconds / 2)
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.00005))
            with self.queue_lock:
                if len(self.queue) >= expect:
                    break
    with self.queue_lock:
        batch, self.queue = self.queue, []
        self.batch = batch
    self.batch_sizes = (self.batch_sizes[1], len(batch))
    return batch


def _zero_ahead_before(self: Any) -> None:
    self.env.info()  # what the fast path asked at every write transaction
    _AFTER["zero_ahead"](self)


VARIANTS = {
    "before": {"gather": _gather_before, "zero_ahead": _zero_ahead_before},
    "after": _AFTER,
}


def _install(variant: str) -> None:
    for name, fn in VARIANTS[variant].items():
        setattr(L._Env, name, fn)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--graph", type=int, default=0, help="conversations of the agent loop")
    args = ap.parse_args()
    names = args.variants.split(",")
    root = tempfile.mkdtemp(prefix="ab_w8-")
    savers = {v: KVSaver(os.path.join(root, v)) for v in names}
    pool = ThreadPoolExecutor(8)
    res: dict[str, dict[str, list[float]]] = {
        v: {
            "8 threads: ops/s": [],
            "8 threads: CPU/op us": [],
            "1 thread: ops/s": [],
            "1 thread: CPU/op us": [],
        }
        for v in names
    }
    plain = build_agent(None)
    graphs = {v: build_agent(savers[v]) for v in names}
    if args.graph:
        for v in names:
            res[v]["graph loop: overhead/superstep us"] = []
        run_loop(plain, "warm", False, threads=1)
    # a 30-turn loop: an agent and a tools step per turn, plus input and end
    supersteps = args.graph * (2 * LOOP_TURNS + 1)
    try:
        for r in range(args.rounds + 1):  # round 0: warm-up, discarded
            order = names[r % len(names) :] + names[: r % len(names)]
            for v in order:
                _install(v)
                for label, threads, per in (("8 threads", 8, 25), ("1 thread", 1, 200)):
                    ops = put_writes_ops(threads, per, f"{v}-{label[0]}-{r}")
                    c0, t0 = time.process_time(), time.perf_counter()
                    threaded_put_writes(savers[v], pool, ops)
                    t, c = time.perf_counter() - t0, time.process_time() - c0
                    if r:
                        res[v][f"{label}: ops/s"].append(200 / t)
                        res[v][f"{label}: CPU/op us"].append(c / 200 * 1e6)
            if args.graph:
                t0 = time.perf_counter()
                run_loop(plain, f"none-{r}", False, threads=args.graph)
                none = time.perf_counter() - t0
                for v in order:
                    _install(v)
                    t0 = time.perf_counter()
                    run_loop(graphs[v], f"{v}-g-{r}", True, threads=args.graph)
                    t = time.perf_counter() - t0
                    if r:
                        over = (t - none) / supersteps * 1e6
                        res[v]["graph loop: overhead/superstep us"].append(over)
    finally:
        _install("after")
        pool.shutdown()
        for s in savers.values():
            s.close()
        shutil.rmtree(root, ignore_errors=True)
    base = names[0]
    print(f"rounds {args.rounds}, load average at the end {os.getloadavg()}")
    print(
        "| measure | "
        + " | ".join(names)
        + " | "
        + " | ".join(f"{v} / {base}" for v in names[1:])
        + " |"
    )
    print("|---|" + "---:|" * (2 * len(names) - 1))
    for m in res[base]:
        meds = [statistics.median(res[v][m]) for v in names]
        ratios = [
            statistics.median([a / b for a, b in zip(res[v][m], res[base][m])]) for v in names[1:]
        ]
        print(
            f"| {m} | "
            + " | ".join(f"{x:,.1f}" for x in meds)
            + " | "
            + " | ".join(f"{x:.3f}" for x in ratios)
            + " |"
        )


if __name__ == "__main__":
    main()
