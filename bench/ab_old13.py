"""Paired A/B of this checkout's KVSaver against another version of the code,
on the two rows that moved between runs with no change to their code path:
bench_async's 32 conversations (issue #13) and the put on PostgreSQL (issue
#14). Tells a regression apart from this machine's drift.

    python bench/ab_old13.py --old /tmp/old --workload async [--rounds 13]
    python bench/ab_old13.py --old /tmp/old --workload pg-put [--rounds 11]
    ... --aa   # both sides the old code: the harness's own bias (an A/A run)

``/tmp/old/kvsaver_old``: the other version's saver/ (and kv/ as .kv), its
imports renamed, as bench/ab_cpu13.py describes.

* async: bench_async's workload through bench/ab_async13.compare (KVSaver new
  and old, AsyncSqliteSaver, no checkpointer; rotated rounds, round 0 a
  warm-up): overhead per superstep, new/old as the median of per-round ratios.
* pg-put: one throwaway PostgreSQL server (tests/pg_helpers), KVSaver new and
  old each on its own table of its own PostgresStore, and PostgresSaver, in
  bench/ab_pg14.py's paired rounds (``--puts-only``): per round 50 puts each
  on a fresh thread, the savers' calls alternating one by one in an order
  rotated every call; wall time and ``thread_time`` per put, medians; ratios
  are medians of the per-round ratios (lowest-highest).

Measured 2026-12-01 (load ~0.3-1.4), against 0a1d451 (before head records):
async new/old 1.178 (9 rounds), 1.050 (13), 1.255 (3), 0.997 (15), A/A
1.046 (9); pg-put CPU new/old 1.055 and 1.021 (5 rounds), A/A 1.051; wall
1.027 and 1.008, A/A 1.008. The async overhead is a difference of two
timings of ~0.3 s, and its per-round ratio moves by 10-25% between runs:
read new/old against the A/A run, and over 13 rounds or more.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def _async(new: Any, old: Any, rounds: int) -> None:
    import bench_async as B
    from ab_async13 import compare

    def use(cls: Any) -> None:
        B.KVSaver = cls  # bench_async makes (and closes) its saver through this name

    restore = functools.partial(use, B.KVSaver)
    compare(
        {"new": functools.partial(use, new), "old": functools.partial(use, old)}, rounds, restore
    )


def _pg_put(new: Any, old: Any, rounds: int) -> None:
    from ab_pg14 import paired_rounds
    from langgraph.checkpoint.postgres import PostgresSaver
    from pg_helpers import PgServer, Unavailable

    try:
        server = PgServer()
    except Unavailable as e:
        print(f"skipped: {e}")
        return
    server.start(durable=True)
    try:
        with PostgresSaver.from_conn_string(server.url) as pg:
            pg.setup()
            savers = {"new": new(server.url, "kv_new"), "old": old(server.url, "kv_old")}
            paired_rounds({**savers, "PostgresSaver": pg}, rounds, 50, puts_only=True)
            for saver in savers.values():
                saver.close()
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="directory holding the kvsaver_old package")
    ap.add_argument("--workload", choices=("async", "pg-put"), required=True)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--aa", action="store_true", help="both sides the old code (A/A)")
    args = ap.parse_args(argv)
    sys.path.insert(0, args.old)
    from kvsaver import KVSaver
    from kvsaver.kv import PostgresStore
    from kvsaver_old import KVSaver as OldKVSaver
    from kvsaver_old.kv import PostgresStore as OldPostgresStore

    new_cls, new_store = (OldKVSaver, OldPostgresStore) if args.aa else (KVSaver, PostgresStore)
    new_name = "old (A/A)" if args.aa else "this checkout"
    print(f"load average {os.getloadavg()[0]:.2f}; new = {new_name}")
    if args.workload == "async":
        _async(new_cls, OldKVSaver, args.rounds)
    else:
        _pg_put(
            lambda url, table: new_cls(new_store(url, table=table)),
            lambda url, table: OldKVSaver(OldPostgresStore(url, table=table)),
            args.rounds,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
