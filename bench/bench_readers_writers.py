"""Reader/writer throughput across processes: KVSaver vs SqliteSaver (issue #4).

A measurement script, not a test (it defines no test functions, so the bench
suite's collector finds nothing to run in it). Run it directly::

    python bench/bench_readers_writers.py                 # 3 readers + 1 writer, 5 s, 3 runs
    python bench/bench_readers_writers.py --duration 10 --runs 5 --readers 3

Method. For each saver, in the same run and with the same workload:

* a fresh store is filled by the parent with ``--threads`` threads of
  ``--depth`` checkpoints each (one ~1 KiB payload channel, a counter, a
  message list), then closed;
* ``--readers`` reader processes and one writer process are started with the
  "spawn" method; each opens the store itself (KVSaver(path) /
  SqliteSaver(sqlite3.connect(path, check_same_thread=False)), which puts
  SQLite in WAL mode), waits at a barrier, runs a warm-up second that is not
  counted, then counts for ``--duration`` seconds;
* a reader calls ``get_tuple`` on the latest checkpoint of a random thread
  (the writer's threads included); the writer calls ``put`` (one changed
  channel, as a graph step does) then ``put_writes`` (two writes), round-robin
  over the same threads;
* every exception is counted, not raised: for SQLite, "database is locked"
  separately. Durability is each saver's default: KVSaver fsyncs each commit
  (``durability="full"``); SqliteSaver runs WAL with SQLite's default
  ``synchronous=FULL``.

The table shows the median of ``--runs`` runs (and the range) of gets/s
(all readers together), puts/s (put + put_writes pairs) and the error counts.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter
from typing import Any

from kvsaver import KVSaver
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.sqlite import SqliteSaver

SAVERS = ["kvsaver", "sqlite"]
WARMUP = 1.0


def open_saver(kind: str, workdir: str) -> Any:
    if kind == "kvsaver":
        return KVSaver(os.path.join(workdir, "kv"))
    conn = sqlite3.connect(os.path.join(workdir, "cp.sqlite"), check_same_thread=False)
    return SqliteSaver(conn)


def close_saver(saver: Any) -> None:
    if isinstance(saver, KVSaver):
        saver.close()
    else:
        saver.conn.close()


def config(thread: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


class Thread:
    """The state of one thread id as its writer advances it."""

    def __init__(self, saver: Any, name: str, rng: random.Random) -> None:
        self.saver, self.name, self.rng = saver, name, rng
        latest = saver.get_tuple(config(name))
        if latest is None:
            self.step, self.versions, self.parent = 0, {}, config(name)
        else:
            self.step = int(latest.metadata["step"]) + 1
            self.versions = dict(latest.checkpoint["channel_versions"])
            self.parent = latest.config

    def advance(self) -> None:
        s = self.saver
        changed = ["payload", "count"] if self.step else ["payload", "count", "messages"]
        new_versions = {ch: s.get_next_version(self.versions.get(ch), None) for ch in changed}
        cp = empty_checkpoint()
        cp["channel_values"] = {
            "payload": self.rng.randbytes(1024),
            "count": self.step,
            "messages": [{"role": "user", "content": f"hello from {self.name}"}] * 4,
        }
        cp["channel_versions"] = {**self.versions, **new_versions}
        metadata = {"source": "loop", "step": self.step, "writes": None, "parents": {}}
        cfg = s.put(self.parent, cp, metadata, new_versions)
        s.put_writes(cfg, [("count", self.step), ("payload", b"x" * 64)], f"task-{self.step}")
        self.versions, self.parent = dict(cp["channel_versions"]), cfg
        self.step += 1


def _classify(e: BaseException) -> str:
    text = str(e)
    if "database is locked" in text:
        return "database is locked"
    return f"{type(e).__name__}: {text[:80]}"


def writer(kind: str, workdir: str, names: list[str], barrier: Any, duration: float, out: Any):
    try:
        saver = open_saver(kind, workdir)
        rng = random.Random(1)
        threads = [Thread(saver, n, rng) for n in names]
        errors: Counter[str] = Counter()
        barrier.wait(120)
        start = time.perf_counter() + WARMUP
        end = start + duration
        puts, i = 0, 0
        while (now := time.perf_counter()) < end:
            try:
                threads[i % len(threads)].advance()
                if now >= start:
                    puts += 1
            except Exception as e:
                if now >= start:
                    errors[_classify(e)] += 1
            i += 1
        close_saver(saver)
        out.put(("writer", puts, dict(errors)))
    except BaseException:
        out.put(("writer-crash", 0, {traceback.format_exc(): 1}))


def reader(kind: str, workdir: str, names: list[str], barrier: Any, duration: float, out: Any):
    try:
        saver = open_saver(kind, workdir)
        rng = random.Random()
        errors: Counter[str] = Counter()
        barrier.wait(120)
        start = time.perf_counter() + WARMUP
        end = start + duration
        gets = 0
        while (now := time.perf_counter()) < end:
            try:
                tup = saver.get_tuple(config(rng.choice(names)))
                if tup is None:
                    raise LookupError("a prepopulated thread has no checkpoint")
                if now >= start:
                    gets += 1
            except Exception as e:
                if now >= start:
                    errors[_classify(e)] += 1
        close_saver(saver)
        out.put(("reader", gets, dict(errors)))
    except BaseException:
        out.put(("reader-crash", 0, {traceback.format_exc(): 1}))


def one_run(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    workdir = tempfile.mkdtemp(prefix=f"rw-{kind}-", dir=args.dir)
    try:
        names = [f"thread-{i}" for i in range(args.threads)]
        saver = open_saver(kind, workdir)
        rng = random.Random(0)
        for n in names:
            t = Thread(saver, n, rng)
            for _ in range(args.depth):
                t.advance()
        close_saver(saver)

        ctx = mp.get_context("spawn")
        barrier = ctx.Barrier(args.readers + 1)
        out = ctx.Queue()
        procs = [
            ctx.Process(target=writer, args=(kind, workdir, names, barrier, args.duration, out))
        ]
        procs += [
            ctx.Process(target=reader, args=(kind, workdir, names, barrier, args.duration, out))
            for _ in range(args.readers)
        ]
        try:
            for p in procs:
                p.start()
            results = [out.get(timeout=args.duration + 180) for _ in procs]
            for p in procs:
                p.join(60)
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
        crashes = [r for r in results if r[0].endswith("crash")]
        if crashes:
            raise RuntimeError(f"{kind}: a worker crashed:\n{next(iter(crashes[0][2]))}")
        reader_errors: Counter[str] = Counter()
        writer_errors: Counter[str] = Counter()
        gets = puts = 0
        for role, n, errs in results:
            if role == "writer":
                puts += n
                writer_errors.update(errs)
            else:
                gets += n
                reader_errors.update(errs)
        return {
            "gets/s": gets / args.duration,
            "puts/s": puts / args.duration,
            "reader errors": sum(reader_errors.values()),
            "writer errors": sum(writer_errors.values()),
            "locked": reader_errors["database is locked"] + writer_errors["database is locked"],
            "kinds": dict(reader_errors + writer_errors),
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds counted per run")
    parser.add_argument("--runs", type=int, default=3, help="runs per saver (median shown)")
    parser.add_argument("--readers", type=int, default=3, help="reader processes")
    parser.add_argument("--threads", type=int, default=50, help="thread ids in the store")
    parser.add_argument("--depth", type=int, default=20, help="checkpoints per thread at start")
    parser.add_argument("--saver", choices=SAVERS, action="append", help="default: both")
    parser.add_argument("--dir", default=None, help="where the stores go (default: $TMPDIR)")
    args = parser.parse_args(argv)
    kinds = args.saver or SAVERS

    print(
        f"{args.readers} reader processes + 1 writer process, {args.duration:g} s counted "
        f"(+{WARMUP:g} s warm-up) x {args.runs} runs; {args.threads} threads x "
        f"{args.depth} checkpoints to start; python {platform.python_version()}, "
        f"sqlite {sqlite3.sqlite_version}, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for r in range(args.runs):
        for kind in kinds if r % 2 == 0 else list(reversed(kinds)):  # alternate the order
            runs[kind].append(one_run(kind, args))
            print(
                f"  run {r + 1} {kind}: "
                + ", ".join(
                    f"{k} {v:.0f}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in runs[kind][-1].items()
                    if k != "kinds"
                ),
                flush=True,
            )

    header = f"{'saver':<10} {'gets/s (median, range)':>26} {'puts/s (median, range)':>24}"
    header += f" {'reader err':>10} {'writer err':>10} {'locked':>7}"
    print()
    print(header)
    print("-" * len(header))
    for kind in kinds:
        rs = runs[kind]

        def cell(key: str, rs: list[dict[str, Any]] = rs) -> str:
            values = [x[key] for x in rs]
            return f"{statistics.median(values):8.0f} ({min(values):.0f}-{max(values):.0f})"

        print(
            f"{kind:<10} {cell('gets/s'):>26} {cell('puts/s'):>24} "
            f"{sum(x['reader errors'] for x in rs):>10} {sum(x['writer errors'] for x in rs):>10} "
            f"{sum(x['locked'] for x in rs):>7}"
        )
    kinds_seen = Counter()
    for kind in kinds:
        for x in runs[kind]:
            kinds_seen.update({f"{kind}: {k}": v for k, v in x["kinds"].items()})
    for k, v in kinds_seen.items():
        print(f"  error {k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
