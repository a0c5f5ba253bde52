"""Where the time of "10 invokes per thread" goes on LMDB (issue #13), per
invoke and per checkpoint: store commits and their batch sizes, time a
leader waited in the gatherer, time in commits (the flushes), get_tuple at
invoke start, and the time LangGraph waits at the end of an invoke for its
background puts (``BackgroundExecutor.__exit__``). The same counts for
SqliteSaver (its commits). Run it under strace to count the flushes:

    strace -f -c -e trace=fsync,fdatasync,msync \
        .venv/bin/python bench/profile_invokes13.py --saver kvsaver-lmdb

    .venv/bin/python bench/profile_invokes13.py [--saver NAME] [--workload invokes|loop]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from _workloads import (
    KV_LMDB,
    SQLITE,
    build_agent,
    close_saver,
    make_saver,
    run_invokes,
    run_loop,
)
from kvsaver.kv import lmdb_store as L
from langgraph.pregel import _executor as EX

THREADS = 6


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.t: dict[str, list[float]] = collections.defaultdict(list)
        self.n: collections.Counter[str] = collections.Counter()

    def add(self, name: str, seconds: float) -> None:
        with self.lock:
            self.t[name].append(seconds)


S = Stats()
BATCH_AT: dict[int, float] = {}  # id(a request's fn): when its batch began
DONE_AT: dict[int, float] = {}  # ... and ended
EVENTS: list[tuple[float, str, str]] = []  # (time, thread name, event), with --trace


def ev(what: str) -> None:
    EVENTS.append((time.perf_counter(), threading.current_thread().name[-12:], what))


def timed_method(obj: Any, name: str, label: str) -> None:
    orig = getattr(obj, name)

    def wrapper(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        ev(f"{label} >")
        try:
            return orig(*a, **k)
        finally:
            S.add(label, time.perf_counter() - t0)
            ev(f"{label} <")

    setattr(obj, name, wrapper)


def instrument_lmdb() -> None:
    gather = L._Env.gather

    def g(self: Any) -> Any:
        t0 = time.perf_counter()
        ev("gather >")
        with self.queue_lock:
            queued = len(self.queue)
        batch = gather(self)
        ev(f"gather < {len(batch)}")
        w = time.perf_counter() - t0
        S.add("gather wait", w)
        if w > 50e-6:
            kind = self.leader.fn.__qualname__.split(".")[1] if self.leader else "?"
            S.add("gather wait, gained" if len(batch) > queued else "gather wait, none came", w)
            S.add(f"  led by {kind}: " + ("gained" if len(batch) > queued else "none"), w)
        S.n[f"batch of {len(batch)}"] += 1
        return batch

    L._Env.gather = g  # type: ignore[method-assign]
    transact = L.LMDBStore.transact

    def tr(self: Any, fn: Any) -> Any:
        kind = fn.__qualname__.split(".")[1]
        t0 = time.perf_counter()
        try:
            return transact(self, fn)
        finally:
            t3 = time.perf_counter()
            t1, t2 = BATCH_AT.pop(id(fn), t0), DONE_AT.pop(id(fn), t3)
            S.add(f"{kind}: transact to its batch", t1 - t0)
            S.add(f"{kind}: its batch (commit)", t2 - t1)
            S.add(f"{kind}: commit to return", t3 - t2)

    L.LMDBStore.transact = tr  # type: ignore[method-assign]
    run_batch = L.LMDBStore._run_batch

    def rb(self: Any, env: Any, batch: Any) -> None:
        t0 = time.perf_counter()
        for r in batch:
            BATCH_AT[id(r.fn)] = t0
        run_batch(self, env, batch)
        t1 = time.perf_counter()
        for r in batch:
            DONE_AT[id(r.fn)] = t1
        ev("committed")
        S.add("run_batch (txn+commit)", time.perf_counter() - t0)

    L.LMDBStore._run_batch = rb  # type: ignore[method-assign]
    run_one = L._run_one

    def ro(*a: Any, **k: Any) -> None:
        t0 = time.perf_counter()
        run_one(*a, **k)
        S.add("run_one (a request's fn)", time.perf_counter() - t0)

    L._run_one = ro


def instrument_exit() -> None:
    ex = EX.BackgroundExecutor.__exit__

    def e(self: Any, *a: Any) -> Any:
        t0 = time.perf_counter()
        ev("exit wait >")
        try:
            return ex(self, *a)
        finally:
            S.add("invoke end: wait for puts", time.perf_counter() - t0)

    EX.BackgroundExecutor.__exit__ = e  # type: ignore[method-assign]


class CountingConn:
    """A sqlite3 connection proxy counting commits (SqliteSaver's)."""

    def __init__(self, conn: Any) -> None:
        self._c = conn

    def commit(self) -> None:
        S.n["sqlite commits"] += 1
        t0 = time.perf_counter()
        self._c.commit()
        S.add("sqlite commit", time.perf_counter() - t0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._c, name)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--saver", default=KV_LMDB)
    ap.add_argument("--workload", default="invokes", choices=["invokes", "loop"])
    ap.add_argument("--threads", type=int, default=THREADS)
    ap.add_argument("--variant", default="", help="a variant of bench/ab_invokes13.py")
    ap.add_argument("--trace", type=int, default=0, help="print the events of invoke N")
    ap.add_argument("--switch", type=float, default=None, help="sys.setswitchinterval")
    args = ap.parse_args()
    if args.variant:
        from ab_invokes13 import _install

        _install(args.variant)
    if args.switch:
        sys.setswitchinterval(args.switch)
    run = run_invokes if args.workload == "invokes" else run_loop
    instrument_lmdb()
    instrument_exit()
    plain = build_agent(None)
    run(plain, "warm", False, threads=1)
    workdir = tempfile.mkdtemp(prefix="kvs-pi-")
    try:
        saver = make_saver(args.saver, workdir)
        if args.saver == SQLITE:
            saver.conn = CountingConn(saver.conn)  # type: ignore[attr-defined]
        for m in ("put", "put_writes", "get_tuple"):
            timed_method(saver, m, m)
        graph = build_agent(saver)
        timed_method(graph, "invoke", "invoke")
        S.t.clear()
        S.n.clear()
        w0, c0 = time.perf_counter(), time.process_time()
        run(graph, "p", True, threads=args.threads)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        close_saver(saver)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    invokes = len(S.t["invoke"])
    cps = len(S.t["put"])
    print(
        f"{args.saver} {args.workload}: {invokes} invokes, {cps} puts (checkpoints), "
        f"{len(S.t['put_writes'])} put_writes, wall {wall:.3f}s cpu {cpu:.3f}s"
    )
    print(
        f"per invoke: {cps / invokes:.1f} puts, {len(S.t['put_writes']) / invokes:.1f} "
        f"put_writes, wall {wall / invokes * 1e6:,.0f} us"
    )
    for name, v in sorted(S.t.items()):
        tot = sum(v)
        print(
            f"  {name:28s} n={len(v):5d} total {tot:7.3f}s  per invoke "
            f"{tot / invokes * 1e6:8,.0f} us  mean {tot / len(v) * 1e6:8,.0f} us"
        )
    for name, c in sorted(S.n.items()):
        print(f"  {name:28s} {c}")
    if args.trace:
        marks = [i for i, e in enumerate(EVENTS) if e[2] == "invoke >"]
        a, b = marks[args.trace], marks[args.trace + 1]
        t0 = EVENTS[a][0]
        for t, th, what in EVENTS[a:b]:
            print(f"  {(t - t0) * 1e6:9,.0f} us  {th:>12s}  {what}")


if __name__ == "__main__":
    main()
