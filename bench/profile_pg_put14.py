"""Where a KVSaver put's client CPU goes on PostgreSQL (issue #14): the
thread CPU of the whole put, and of the part inside ``store.transact`` (the
saver's transaction function plus the store: arrays, speculation cache,
the prepared write, the pool), against the same on ``KVSaver(":memory:")``.
Starts a throwaway PostgreSQL server (tests/pg_helpers.PgServer).

    python bench/profile_pg_put14.py [--puts 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from _workloads import ThreadGen
from kvsaver import KVSaver


def measure(saver: KVSaver, name: str, puts: int, rounds: int) -> None:
    store: Any = saver.store
    inner = [0.0, 0.0]
    orig = store.transact

    def transact(fn: Any) -> Any:
        c, t = time.thread_time(), time.perf_counter()
        try:
            return orig(fn)
        finally:
            inner[0] += time.thread_time() - c
            inner[1] += time.perf_counter() - t

    store.transact = transact
    for r in range(rounds):
        gen = ThreadGen(saver, f"{name}-{r}")
        ops = [gen.next() for _ in range(puts)]
        inner[:] = [0.0, 0.0]
        c, t = time.thread_time(), time.perf_counter()
        for a in ops:
            saver.put(a.config, a.checkpoint, a.metadata, a.new_versions)
        cpu = (time.thread_time() - c) / puts * 1e6
        wall = (time.perf_counter() - t) / puts * 1e6
        print(
            f"{name}: put thread CPU {cpu:.0f} us, wall {wall:.0f} us; inside transact: "
            f"CPU {inner[0] / puts * 1e6:.0f} us, wall {inner[1] / puts * 1e6:.0f} us"
        )
    store.transact = orig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--puts", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from pg_helpers import PgServer

    print(f"load average {os.getloadavg()[0]:.2f}")
    memory = KVSaver(":memory:")
    measure(memory, "memory", args.puts, args.rounds)
    memory.close()
    server = PgServer()
    server.start(durable=True)
    try:
        saver = KVSaver(server.url)
        measure(saver, "postgresql", args.puts, args.rounds)
        saver.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
