"""A/B of the multi-process read path (issue #13): 3 readers + 1 writer.

A measurement script, not a test. Each round runs the workload of
bench/_concurrency.py (``readers_writer``: 1 writer process putting round
robin over 100 threads, 3 reader processes calling ``get_tuple`` latest on
them, a fixed window) once per variant, in an order that rotates every round,
each on a fresh store. A variant is installed in every process (writer and
readers) before it opens the store:

* ``before``: the read begin as it was: ``env.info()`` for the newest meta
  page's id (it releases the GIL and builds a dict), and a read that finds a
  meta page newer than its id begins again, up to 32 times, until no newer
  one exists (at durability "full" a writer keeps its meta page written but
  unpublished for a whole device flush).
* ``after``: the code as it is (``_Env.last_txnid`` and the probe begin of
  ``_Env._settled``).

Besides reads/s (all readers) and the writer's puts/s it reports each
reader's CPU time per read (``time.process_time``), which a busy machine
disturbs far less than throughput, and the read begins per read.

    python bench/ab_concurrency.py --rounds 6 --window 3
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _concurrency as C

VARIANTS = ["before", "after"]


def _settled_before(self: Any, txn: Any) -> Any:
    attempt = 0
    while int(self.env.info()["last_txnid"]) > txn.id() + (attempt >= 32):
        txn.abort()
        txn = self.env.begin(write=False, buffers=False)
        attempt += 1
    return txn


def _install(variant: str) -> None:
    from kvsaver.kv import lmdb_store as L

    if variant == "before":
        L._Env._settled = _settled_before  # type: ignore[method-assign]
        L._Env.last_txnid = lambda self: int(self.env.info()["last_txnid"])  # type: ignore


def _writer(variant: str, *args: Any) -> None:
    _install(variant)
    C._writer(C.KV_LMDB, *args)


def _reader(
    variant: str, workdir: str, seed: int, ready: Any, barrier: Any, window: float, out: Any
) -> None:
    _install(variant)
    ready.wait()
    saver = C._open(C.KV_LMDB, workdir, readonly=True)
    env = saver.store._env
    begins = [0]
    real_begin = env.env.begin

    class Counting:  # counts the read begins (a Python call: kept out of the CPU figure)
        def begin(self, **kw: Any) -> Any:
            begins[0] += 1
            return real_begin(**kw)

        def __getattr__(self, name: str) -> Any:
            return getattr(real_env, name)

    real_env = env.env
    rnd = random.Random(seed)
    configs = [
        {"configurable": {"thread_id": f"hot-{i:03d}", "checkpoint_ns": ""}}
        for i in range(C.HOT_THREADS)
    ]
    saver.get_tuple(configs[0])
    barrier.wait()
    n = 0
    c0, t0 = time.process_time(), time.perf_counter()
    deadline = t0 + window / 2
    while time.perf_counter() < deadline:  # first half: CPU time, no counting
        saver.get_tuple(rnd.choice(configs))
        n += 1
    cpu = (time.process_time() - c0) / max(n, 1)
    env.env = Counting()
    m = 0
    deadline = t0 + window
    while time.perf_counter() < deadline:  # second half: begins per read
        saver.get_tuple(rnd.choice(configs))
        m += 1
    env.env = real_env
    out.put(("reader", n + m, time.perf_counter() - t0, cpu, begins[0] / max(m, 1)))
    C.close_saver(saver)


def one_run(variant: str, window: float, readers: int = 3) -> dict[str, float]:
    workdir = tempfile.mkdtemp(prefix=f"ab-{variant}-")
    try:
        w, rs = C.run_readers_writer(_writer, _reader, variant, workdir, readers, window)
        return {
            "reads/s": sum(r[1] / r[2] for r in rs),
            "cpu_us/read": statistics.mean(r[3] for r in rs) * 1e6,
            "begins/read": statistics.mean(r[4] for r in rs),
            "puts/s": w[1] / w[3],
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--window", type=float, default=3.0)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    ratios: list[dict[str, float]] = []
    for r in range(args.rounds):
        got = {}
        for v in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
            got[v] = one_run(v, args.window)
            runs[v].append(got[v])
            cells = ", ".join(f"{k} {x:,.1f}" for k, x in got[v].items())
            print(f"round {r} {v}: {cells} (load {os.getloadavg()[0]:.1f})", flush=True)
        ratios.append({k: got["after"][k] / got["before"][k] for k in got["after"]})
    print()
    print("| measure | before (median) | after (median) | after / before (median of rounds) |")
    print("|---|---:|---:|---:|")
    for k in ratios[0]:
        b = statistics.median(x[k] for x in runs["before"])
        a = statistics.median(x[k] for x in runs["after"])
        ratio = statistics.median(x[k] for x in ratios)
        print(f"| {k} | {b:,.1f} | {a:,.1f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
