"""Paired A/B of issue #13's three read rows on LMDB (get_tuple latest, get_tuple
by id, list limit 10) for two versions of the code, with the floor, in one process.

    python bench/ab_reads13.py --old /tmp/old [--threads 300] [--rounds 15]
    # /tmp/old/kvsaver_old: another checkout's saver/ (kv/ as .kv), imports renamed

The store of bench/bench_reads13.py is built once by this checkout, copied, and
the copy opened by the old code (two LMDB environments on one path in one
process are not allowed); every page of both is read once first (the floor
reads the new one's: whichever variant read a page first paid its page
fault). Every round times each variant (new, old, and
bench_reads13's floor: raw py-lmdb + serializer, no saver code) on the next
``--ops`` threads, in an order that rotates every round, by ``thread_time``
(CPU of this thread); a full collection before each variant's calls. Reported:
medians per operation, and medians of per-round ratios new/old and x/floor.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _workloads import KV_LMDB, build_store13, close_saver, rotated
from bench_reads13 import floor_reader

ROWS: dict[str, tuple[Callable[[Any, dict[str, Any]], Any], str]] = {
    "get_tuple:latest": (lambda s, c: s.get_tuple(c), "latest"),
    "get_tuple:by_id": (lambda s, c: s.get_tuple(c), "by_id"),
    "list:limit10": (lambda s, c: list(s.list(c, limit=10)), "latest"),
}


def paired_cpu(
    names: list[str], rounds: int, ops: int, call: Callable[[str, int], Any]
) -> dict[str, list[float]]:
    """Per name, the thread CPU seconds per operation of each round: every
    round runs ``call(name, i)`` for the next ``ops`` values of ``i`` of
    each name, in an order that rotates every round, each name's calls after
    a full collection; round 0 is a warm-up, not kept."""
    cpu: dict[str, list[float]] = {n: [] for n in names}
    at = dict.fromkeys(names, 0)
    for r in range(rounds + 1):
        for name in rotated(names, r):
            first = at[name]
            at[name] += ops
            gc.collect()
            c0 = time.thread_time()
            for i in range(first, first + ops):
                call(name, i)
            c = time.thread_time() - c0
            if r > 0:
                cpu[name].append(c / ops)
    return cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--old", help="directory holding the kvsaver_old package")
    ap.add_argument("--threads", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--ops", type=int, default=40, help="operations per variant per round")
    ap.add_argument("--rows", default=",".join(ROWS))
    args = ap.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="ab-reads13-")
    try:
        st = build_store13(KV_LMDB, os.path.join(workdir, "new"), args.threads)
        savers: dict[str, Any] = {"new": st.saver}
        if args.old:
            sys.path.insert(0, args.old)
            from kvsaver_old import KVSaver as OldKVSaver

            shutil.copytree(os.path.join(workdir, "new", "kv"), os.path.join(workdir, "old"))
            savers["old"] = OldKVSaver(os.path.join(workdir, "old"))
        for s in savers.values():  # map every page first: no variant pays the page faults
            with s.store._env.env.begin() as txn:
                sum(len(v) for v in txn.cursor().iternext(keys=False))
        print(f"load average {os.getloadavg()[0]:.2f}, {args.threads} threads", flush=True)
        for row in args.rows.split(","):
            op, which = ROWS[row]
            cfgs = getattr(st, which)
            floor = floor_reader(st, row)
            names = [*savers, "floor"]

            def call(name: str, i: int, op: Any = op, cfgs: Any = cfgs, floor: Any = floor) -> None:
                if name == "floor":
                    floor(i)
                else:
                    op(savers[name], cfgs[i % len(cfgs)])

            cpu = paired_cpu(names, args.rounds, args.ops, call)
            med = {n: statistics.median(v) * 1e6 for n, v in cpu.items()}
            ratio = {
                n: statistics.median(a / b for a, b in zip(cpu[n], cpu["floor"])) for n in savers
            }
            line = f"{row:18s} " + "  ".join(
                f"{n} {med[n]:7.1f} us" + (f" ({ratio[n]:.2f}x floor)" if n in ratio else "")
                for n in names
            )
            if "old" in savers:
                nvo = statistics.median(a / b for a, b in zip(cpu["new"], cpu["old"]))
                line += f"  new/old {nvo:.3f}"
            print(line, flush=True)
        print(f"load average {os.getloadavg()[0]:.2f}")
        for s in savers.values():
            close_saver(s) if s is st.saver else s.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
