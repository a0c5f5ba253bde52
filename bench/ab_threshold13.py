"""What ``compress_threshold`` trades on issue #13's read store: cold reads
against bytes. Two stores of the same threads (bench/_workloads.populate13:
~13 KB, 10-channel checkpoints whose message window serializes to ~6.7 KB),
one written with the default threshold (2 KiB: the window is zstd-compressed)
and one with a higher one (the window stored as serialized); get_tuple of a
thread's latest and list(limit=10), each thread read once per round (no
cache helps), both stores in the same rounds, order rotated; thread CPU per
read, median of per-round ratios; the stores' live bytes (``stats()``).

    python bench/ab_threshold13.py [--threads 300] [--high 8192] [--rounds 16]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _workloads as W
from kvsaver import KVSaver
from kvsaver import compression as C


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=300)
    ap.add_argument("--high", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=16)
    args = ap.parse_args()
    n = args.threads
    stores = {}
    dirs = []
    for thr in (C.DEFAULT_THRESHOLD, args.high):
        d = tempfile.mkdtemp(prefix=f"kvsaver-thr{thr}-")
        dirs.append(d)
        builder = KVSaver(d, durability="none", compress_threshold=thr)
        st = W.populate13(builder, n)
        builder.close()
        saver = KVSaver(d, compress_threshold=thr)
        stores[thr] = (saver, st.latest)
    print(f"load average {os.getloadavg()[0]:.2f}; {n} threads of 10 checkpoints")
    for thr, (saver, _) in stores.items():
        print(f"compress_threshold={thr}: live bytes {saver.stats().live_bytes:,}")
    for what, per_round, reads in (("get_tuple latest", 40, 1), ("list(limit=10)", 10, 10)):
        res: dict[int, list[float]] = {t: [] for t in stores}
        for r in range(args.rounds):
            for t in list(stores) if r % 2 == 0 else list(stores)[::-1]:
                saver, latest = stores[t]
                start = (r * per_round) % n
                some = latest[start : start + per_round]
                c = time.thread_time()
                for cfg in some:
                    if reads == 1:
                        saver.get_tuple(cfg)
                    else:
                        list(saver.list(cfg, limit=10))
                res[t].append((time.thread_time() - c) / len(some) * 1e6)
        lo, hi = list(stores)
        ratio = statistics.median(a / b for a, b in zip(res[hi], res[lo]))
        print(
            f"{what}: {statistics.median(res[lo]):,.1f} us at {lo}, "
            f"{statistics.median(res[hi]):,.1f} us at {hi}: {ratio:.3f}x"
        )
    for saver, _ in stores.values():
        saver.close()
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
