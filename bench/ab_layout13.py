"""Paired A/B of issue #13's read rows for two versions of the code, each on a
store it wrote itself (a layout change: the old code reading the new code's
records would not measure the old layout), with SqliteSaver in the same rounds.

    python bench/ab_layout13.py --old /tmp/old [--threads 300] [--rounds 15]
    # /tmp/old/kvsaver_old: another checkout's saver/ (kv/ as .kv), imports renamed

Three stores of bench/bench_reads13.py's workload (``populate13``: the same
threads, the same text), written by the new code, the old code and SqliteSaver;
every page of the LMDB ones is read once first. Every round times each saver on
the next ``--ops`` threads, in an order that rotates every round, by
``thread_time`` (CPU of this thread) after a full collection. Reported: medians
per operation, medians of per-round ratios to SqliteSaver, and new/old.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _workloads import KV_LMDB, SQLITE, build_store13, close_saver, populate13
from ab_reads13 import ROWS, paired_cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--old", required=True, help="directory holding the kvsaver_old package")
    ap.add_argument("--threads", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--ops", type=int, default=40, help="operations per saver per round")
    ap.add_argument("--rows", default=",".join(ROWS))
    args = ap.parse_args(argv)
    sys.path.insert(0, args.old)
    from kvsaver_old import KVSaver as OldKVSaver

    workdir = tempfile.mkdtemp(prefix="ab-layout13-")
    try:
        st = build_store13(KV_LMDB, os.path.join(workdir, "new"), args.threads)
        os.makedirs(os.path.join(workdir, "sqlite"))
        sq = build_store13(SQLITE, os.path.join(workdir, "sqlite"), args.threads)
        old_dir = os.path.join(workdir, "old")
        builder = OldKVSaver(old_dir, durability="none")
        old_st = populate13(builder, args.threads)
        builder.close()
        # Each store's own checkpoint ids (get_tuple by id names them).
        stores = {"new": st, "old": old_st, "sqlite": sq}
        savers: dict[str, Any] = {"new": st.saver, "old": OldKVSaver(old_dir), "sqlite": sq.saver}
        for name in ("new", "old"):  # map every page first: no saver pays the page faults
            with savers[name].store._env.env.begin() as txn:
                sum(len(v) for v in txn.cursor().iternext(keys=False))
        print(f"load average {os.getloadavg()[0]:.2f}, {args.threads} threads", flush=True)
        names = list(savers)
        for row in args.rows.split(","):
            op, which = ROWS[row]
            cfgs = {n: getattr(stores[n], which) for n in names}

            def call(name: str, i: int, op: Any = op, cfgs: Any = cfgs) -> None:
                op(savers[name], cfgs[name][i % len(cfgs[name])])

            cpu = paired_cpu(names, args.rounds, args.ops, call)
            med = {n: statistics.median(v) * 1e6 for n, v in cpu.items()}
            ratio = {
                pair: statistics.median(x / y for x, y in zip(cpu[pair[0]], cpu[pair[1]]))
                for pair in (("new", "sqlite"), ("old", "sqlite"), ("new", "old"))
            }
            print(
                f"{row:18s} "
                + "  ".join(f"{n} {med[n]:7.1f} us" for n in names)
                + "".join(f"  {a}/{b} {x:.3f}" for (a, b), x in ratio.items()),
                flush=True,
            )
        print(f"load average {os.getloadavg()[0]:.2f}")
        savers["old"].close()
        close_saver(st.saver)
        close_saver(sq.saver)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
