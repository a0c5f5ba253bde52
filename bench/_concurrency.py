"""The process and thread workloads of test_concurrency.py.

readers_writer(): 1 writer process + N reader processes on one store, for a
fixed window. The writer keeps 100 threads going (round robin, one ``put`` of
1-2 changed channels per op); each reader calls ``get_tuple`` (latest) on a
random one of those threads. Throughput = operations / window, per role.
Processes are spawned (fresh interpreters), open the store themselves
(readers: ``KVSaver(path, readonly=True)``; SqliteSaver: their own
connection), and start together at a barrier; the first ``WARMUP`` seconds
after it are not counted (as every benchmark here discards warm-up rounds:
a KVSaver reader's first reads of the writer's threads find no head and
mark them wanted, saver/whole/hints.py, and the writer's puts of the next
third of a second write them; ``BENCH_WARMUP=0`` counts that too).

threaded_put_writes(): T Python threads sharing one saver object, each writing
``put_writes`` (3 writes) to its own thread id; the inputs are made ahead by
put_writes_ops(), so the timed call is only saver calls (as everywhere else).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _workloads import (
    KV_BLOBS,
    KV_LMDB,
    KV_WHOLE,
    SQLITE,
    ThreadGen,
    close_saver,
    make_saver,
    task_id,
    writes_for,
)

HOT_THREADS = 100
HOT_DEPTH = 3  # checkpoints per thread written before the window opens
# Seconds every process runs before its counted window (the environment's
# BENCH_WARMUP, read by the spawned processes too).
WARMUP = float(os.environ.get("BENCH_WARMUP", "1.0"))


def _run_window(step: Callable[[int], bool], window: float, limit: int) -> tuple[int, int, float]:
    """``step(i)`` (True: done, False: failed) for ``WARMUP`` seconds, not
    counted, then for ``window`` seconds, at most ``limit`` steps in all:
    (done, failed, seconds) of the counted ones."""
    i = 0
    warm_until = time.perf_counter() + WARMUP
    while time.perf_counter() < warm_until and i < limit:
        step(i)
        i += 1
    done = failed = 0
    t0 = time.perf_counter()
    deadline = t0 + window
    while time.perf_counter() < deadline and i < limit:
        if step(i):
            done += 1
        else:
            failed += 1
        i += 1
    return done, failed, time.perf_counter() - t0


def _open(name: str, workdir: str, readonly: bool) -> Any:
    if name in (KV_LMDB, KV_WHOLE, KV_BLOBS):  # the defaults, whole_latest=True / False
        return make_saver(name, workdir, readonly=readonly)
    if name == SQLITE:
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(os.path.join(workdir, "cp.sqlite"), check_same_thread=False)
        return SqliteSaver(conn)
    raise ValueError(name)


def _writer(name: str, workdir: str, ready: Any, barrier: Any, window: float, out: Any) -> None:
    saver = _open(name, workdir, readonly=False)
    gens = [ThreadGen(saver, f"hot-{i:03d}", msg_chars=300, window=20) for i in range(HOT_THREADS)]
    for _ in range(HOT_DEPTH):
        for g in gens:
            a = g.next()
            saver.put(a.config, a.checkpoint, a.metadata, a.new_versions)
    # Generate the window's put arguments ahead, so the window times the saver.
    pending = [g.next() for _ in range(45) for g in gens]  # more than a window takes

    def step(i: int) -> bool:
        a = pending[i]
        try:
            saver.put(a.config, a.checkpoint, a.metadata, a.new_versions)
        except Exception:  # e.g. "database is locked": counted, not fatal
            return False
        return True

    ready.set()
    barrier.wait()
    out.put(("writer", *_run_window(step, window, len(pending))))
    close_saver(saver)


def _reader(
    name: str, workdir: str, seed: int, ready: Any, barrier: Any, window: float, out: Any
) -> None:
    ready.wait()
    saver = _open(name, workdir, readonly=True)
    rnd = random.Random(seed)
    configs = [
        {"configurable": {"thread_id": f"hot-{i:03d}", "checkpoint_ns": ""}}
        for i in range(HOT_THREADS)
    ]
    saver.get_tuple(configs[0])  # first use (SqliteSaver runs its setup here)

    def step(i: int) -> bool:
        try:
            return saver.get_tuple(rnd.choice(configs)) is not None
        except Exception:
            return False

    barrier.wait()
    out.put(("reader", *_run_window(step, window, 1 << 62)))
    close_saver(saver)


def run_readers_writer(
    writer: Any, reader: Any, name: str, workdir: str, readers: int, window: float
) -> tuple[Any, list[Any]]:
    """Start ``writer`` and ``readers`` x ``reader`` processes (spawned; each
    posts one result tuple whose first element is "writer" or "reader"), wait
    for them: (the writer's result, the readers' results)."""
    ctx = mp.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    barrier = ctx.Barrier(readers + 1)
    procs = [ctx.Process(target=writer, args=(name, workdir, ready, barrier, window, out))]
    procs += [
        ctx.Process(target=reader, args=(name, workdir, i, ready, barrier, window, out))
        for i in range(readers)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    w = next(r for r in results if r[0] == "writer")
    return w, [r for r in results if r[0] == "reader"]


def readers_writer(name: str, workdir: str, readers: int = 3, window: float = 3.0) -> dict:
    """Throughput of ``readers`` reader processes and one writer process."""
    w, rs = run_readers_writer(_writer, _reader, name, workdir, readers, window)
    return {
        "readers": readers,
        "window_s": window,
        "warmup_s": WARMUP,
        "writes_per_s": w[1] / w[3],
        "writer_errors": w[2],
        "reads_per_s": sum(r[1] / r[3] for r in rs),
        "reader_errors": sum(r[2] for r in rs),
    }


WritesOps = list[list[tuple[dict[str, Any], list[tuple[str, Any]], str]]]


def put_writes_ops(threads: int, per_thread: int, prefix: str) -> WritesOps:
    """The inputs of threaded_put_writes, made ahead (untimed): per thread,
    ``per_thread`` (config, 3 writes, task id) on its own thread id."""
    ops = []
    for k in range(threads):
        thread = f"{prefix}-{k}"
        cfg = {"configurable": {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": thread}}
        ops.append([(cfg, writes_for(i), task_id(k * 100_000 + i)) for i in range(per_thread)])
    return ops


def threaded_put_writes(saver: Any, pool: ThreadPoolExecutor, ops: WritesOps) -> None:
    """One pool thread per list of ``ops``, all at once, each calling
    ``put_writes`` for its list in order; returns when all are done."""

    def one(mine: list[tuple[dict[str, Any], list[tuple[str, Any]], str]]) -> None:
        for cfg, writes, tid in mine:
            saver.put_writes(cfg, writes, tid)

    for f in [pool.submit(one, mine) for mine in ops]:
        f.result()
