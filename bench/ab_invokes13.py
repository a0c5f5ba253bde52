"""A/B of the LMDB group commit on the graph rows and 8 writer threads (issue #13).

A measurement script, not a test. Each round runs, for each variant in an
order that rotates every round, on the variant's own fresh store (durability
"full"), and once for SqliteSaver and once with no checkpointer:

* invokes: bench_graph_paired's "10 invokes per thread" (``run_invokes``,
  THREADS conversations one after the other, each invoke reloading the thread);
* loop: its agent loop (``run_loop``, THREADS conversations of 30 turns);
* 8 threads: 8 writer threads x 25 put_writes (bench/_concurrency.py), ops/s.

Graph rows: overhead per checkpoint = (time - time without checkpointer, same
round) / checkpoints, wall clock, and x SqliteSaver (median of per-round
ratios). Every variant: the median of per-round ratios to the first variant.

* ``before``: the gatherer as it was: a leader waits for the batch size of
  the last batches whenever one of them was shared.
* ``after``: the code as it is.

    python bench/ab_invokes13.py --rounds 7 [--variants before,after] [--skip w8]
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
from concurrent.futures import ThreadPoolExecutor
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _concurrency import put_writes_ops, threaded_put_writes
from _workloads import (
    KV_LMDB,
    SQLITE,
    build_agent,
    close_saver,
    count_checkpoints,
    make_saver,
    run_invokes,
    run_loop,
)
from kvsaver.kv import lmdb_store as L

THREADS = 6
_AFTER = {"gather": L._Env.gather}


def _gather_before(self: Any) -> list[Any]:
    waker = None
    with self.queue_lock:
        expect = max(self.batch_sizes)
        if expect > 1 and len(self.queue) < expect:
            waker = threading.Lock()
            waker.acquire()
            self.gatherer = (waker, expect)
    if waker is not None:
        waker.acquire(timeout=min(L._GATHER_MAX_SECONDS, self.commit_seconds))
    with self.queue_lock:
        self.gatherer = None
        batch, self.queue = self.queue, []
        self.batch = batch
    self.batch_sizes = (self.batch_sizes[1], len(batch))
    return batch


VARIANTS: dict[str, dict[str, Any]] = {
    "before": {"gather": _gather_before},
    "after": _AFTER,
}


def _install(variant: str) -> None:
    for name, fn in VARIANTS.get(variant, _AFTER).items():
        setattr(L._Env, name, fn)


def _graph(run: Any, saver_name: str, variant: str | None, tag: str) -> tuple[float, int]:
    workdir = tempfile.mkdtemp(prefix="ab_inv-")
    try:
        saver = make_saver(saver_name, workdir)
        try:
            if variant is not None:
                _install(variant)
            graph = build_agent(saver)
            t0 = time.perf_counter()
            run(graph, tag, True, threads=THREADS)
            t = time.perf_counter() - t0
            return t, count_checkpoints(saver, tag)
        finally:
            close_saver(saver)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--skip", default="", help="comma list of: invokes, loop, w8")
    args = ap.parse_args()
    names = args.variants.split(",")
    skip = set(args.skip.split(",")) - {""}
    plain = build_agent(None)
    run_invokes(plain, "warm", False, threads=1)
    pool = ThreadPoolExecutor(8)
    res: dict[str, dict[str, list[float]]] = {v: {} for v in [*names, SQLITE]}
    graphs = {"invokes": run_invokes, "loop": run_loop}
    try:
        for r in range(args.rounds + 1):  # round 0: warm-up, discarded
            rows = [*names, SQLITE]
            order = rows[r % len(rows) :] + rows[: r % len(rows)]
            for g, run in graphs.items():
                if g in skip:
                    continue
                t0 = time.perf_counter()
                run(plain, f"none-{r}", False, threads=THREADS)
                none = time.perf_counter() - t0
                for v in order:
                    name = SQLITE if v == SQLITE else KV_LMDB
                    t, steps = _graph(run, name, None if v == SQLITE else v, f"{v}-{g}-{r}")
                    if r:
                        key = f"{g}: overhead/checkpoint us"
                        res[v].setdefault(key, []).append((t - none) / steps * 1e6)
            if "w8" not in skip:
                for v in order:
                    if v == SQLITE:
                        continue
                    root = tempfile.mkdtemp(prefix="ab_inv_w8-")
                    try:
                        _install(v)
                        saver = make_saver(KV_LMDB, root)
                        ops = put_writes_ops(8, 25, f"{v}-{r}")
                        c0, t0 = time.process_time(), time.perf_counter()
                        threaded_put_writes(saver, pool, ops)
                        t, c = time.perf_counter() - t0, time.process_time() - c0
                        close_saver(saver)
                    finally:
                        shutil.rmtree(root, ignore_errors=True)
                    if r:
                        res[v].setdefault("8 threads: ops/s", []).append(200 / t)
                        res[v].setdefault("8 threads: CPU/op us", []).append(c / 200 * 1e6)
    finally:
        _install("after")
        pool.shutdown()
    base = names[0]
    print(f"rounds {args.rounds}, load average at the end {os.getloadavg()}")
    cols = [*names, SQLITE]
    print(
        "| measure | "
        + " | ".join(cols)
        + " | "
        + " | ".join(f"{v} / {base}" for v in names[1:])
        + " | "
        + " | ".join(f"{v} x sqlite" for v in names)
        + " |"
    )
    print("|---|" + "---:|" * (len(cols) + 2 * len(names) - 1))
    for m in res[base]:
        meds = [statistics.median(res[v][m]) if m in res[v] else float("nan") for v in cols]
        ratios = [
            statistics.median([a / b for a, b in zip(res[v][m], res[base][m])]) for v in names[1:]
        ]
        xs = [
            statistics.median([a / b for a, b in zip(res[v][m], res[SQLITE][m])])
            if m in res[SQLITE]
            else float("nan")
            for v in names
        ]
        print(
            f"| {m} | "
            + " | ".join(f"{x:,.1f}" for x in meds)
            + " | "
            + " | ".join(f"{x:.3f}" for x in ratios)
            + " | "
            + " | ".join(f"{x:.3f}" for x in xs)
            + " |"
        )


if __name__ == "__main__":
    main()
