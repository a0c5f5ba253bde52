"""Paired A/B of issue #14's statements on a small store: this checkout's
PostgresStore against another revision's ``kv/postgres.py`` (the saver code
is this checkout's for both), on one throwaway server, one process.

    python bench/ab_pg14_small.py [--rev 87300ce] [--rounds 8]

Why a small store: PostgreSQL's generic plan (a prepared statement's, from
its sixth run) of ``key = ANY($1)`` assumes 10 keys and scans a table of up
to a few thousand rows instead of looking them up; bench_postgres's and
ab_pg14's tables grow past that within seconds, where both plans are index
scans. Here each store holds two threads of 40 checkpoints (~470 rows),
ANALYZEd (as autovacuum does), then:

* reads: get_tuple (latest) and list(limit=10) of those threads, from a
  fresh saver (no cache of this process's writes), 40 calls per round;
* puts two seconds apart (the saver's clock): each one touches its thread's
  activity and deletes the previous entry, 15 per round on fresh threads.

The two stores' calls alternate one by one (A B, then B A); per round the
median per call; reported: medians, and the median of the per-round ratios
new/old (their lowest and highest).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from _workloads import ThreadGen, task_id, writes_for
from ab_pg14 import old_store_class
from kvsaver import KVSaver
from kvsaver.kv import PostgresStore


def paired(calls: dict[str, list[Callable[[], Any]]], r: int) -> dict[str, float]:
    """The calls of each store alternately; the median seconds per call."""
    times: dict[str, list[float]] = {n: [] for n in calls}
    names = list(calls)
    for i in range(len(calls[names[0]])):
        for n in names if (i + r) % 2 == 0 else names[::-1]:
            t = time.perf_counter()
            calls[n][i]()
            times[n].append(time.perf_counter() - t)
    return {n: statistics.median(v) for n, v in times.items()}


def report(name: str, rounds: list[dict[str, float]]) -> None:
    ratios = [r["new"] / r["old"] for r in rounds]
    new = statistics.median(r["new"] for r in rounds) * 1e6
    old = statistics.median(r["old"] for r in rounds) * 1e6
    print(
        f"{name:<28} new {new:7.0f} us  old {old:7.0f} us  new/old "
        f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="87300ce", help="the old revision (git)")
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    import psycopg
    from pg_helpers import PgServer

    old_class = old_store_class(args.rev)
    server = PgServer()
    server.start(durable=True)
    try:
        now = [1_800_000_000.0]

        def clock() -> float:  # two seconds between puts
            now[0] += 2.0
            return now[0]

        stores = {
            "new": PostgresStore(server.url, table="kv_new"),
            "old": old_class(server.url, table="kv_old"),
        }
        savers = {n: KVSaver(s, clock=clock) for n, s in stores.items()}
        configs = []
        for t in range(2):
            for s in savers.values():
                gen = ThreadGen(s, f"h{t}", window=40)
                for _ in range(40):
                    a = gen.next()
                    s.put(a.config, a.checkpoint, a.metadata, a.new_versions)
                s.put_writes(gen.config(), writes_for(40), task_id(1))
            configs.append({"configurable": {"thread_id": f"h{t}", "checkpoint_ns": ""}})
        with psycopg.connect(server.url, autocommit=True) as conn:
            for table in ("kv_new", "kv_old"):
                conn.execute(f"ANALYZE {table}")
                rows = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
                print(f"{table}: {rows[0] if rows else 0} rows")
        readers = {n: KVSaver(s) for n, s in stores.items()}  # no cache of the writes

        def reads(saver: KVSaver, op: Callable[[KVSaver, Any], Any]) -> list[Callable[[], Any]]:
            return [lambda c=configs[i % 2]: op(saver, c) for i in range(40)]

        def get_tuple(saver: KVSaver, config: Any) -> Any:
            return saver.get_tuple(config)

        def list10(saver: KVSaver, config: Any) -> Any:
            return list(saver.list(config, limit=10))

        gets, lists, puts = [], [], []
        for r in range(args.rounds):
            gets.append(paired({n: reads(s, get_tuple) for n, s in readers.items()}, r))
            lists.append(paired({n: reads(s, list10) for n, s in readers.items()}, r))
            calls = {}
            for n, s in savers.items():
                gen = ThreadGen(s, f"put-{n}-{r}")
                ops = [gen.next() for _ in range(15)]
                calls[n] = [
                    lambda s=s, a=a: s.put(a.config, a.checkpoint, a.metadata, a.new_versions)
                    for a in ops
                ]
            puts.append(paired(calls, r))
        print(f"old = {args.rev}; load average {os.getloadavg()[0]:.2f} at the end")
        report("get_tuple (latest)", gets)
        report("list (limit 10)", lists)
        report("put, 2 s after the last", puts)
        for s in stores.values():
            s.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
