"""What a head record (``whole_latest=True``, saver/heads.py) costs a durable
commit at the LMDB level, with no saver code: the floor under the option's
graph cost (issue #13, the ``whole_latest`` default).

    python bench/io_heads13.py [--rounds 300] [--head-bytes 13000]

Each round makes three raw py-lmdb write transactions, in an order that
rotates every round, on a store opened as ``KVSaver(dir)`` opens it for
durability "full" (sync and metasync on):

* alone: a put's records (an 800-byte checkpoint record, a 1,500-byte blob,
  an index entry);
* head in commit: the same and a head of ``--head-bytes`` rewritten in the
  same transaction (what ``whole_latest=True`` does);
* head in side env: the same as "alone", then the head in a second
  environment with sync off and a write map (a head is a cache a read
  verifies byte for byte, so it could live without flushes: the layout left
  open in the closing note).

Reported: medians of wall clock and of the thread's CPU time per commit, and
the wall clock as x "alone".
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import lmdb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--head-bytes", type=int, default=13000)
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="io_heads13-")
    try:
        env = lmdb.open(os.path.join(base, "main"), map_size=1 << 30, sync=True, metasync=True)
        side = lmdb.open(
            os.path.join(base, "side"),
            map_size=1 << 30,
            sync=False,
            metasync=False,
            writemap=True,
            map_async=True,
        )
        head = os.urandom(args.head_bytes)
        record, blob = os.urandom(800), os.urandom(1500)

        def commit(i: int, mode: int) -> None:
            with env.begin(write=True) as t:
                t.put(b"c%08d" % i, record)
                t.put(b"b%08d" % i, blob)
                t.put(b"i%08d" % i, b"")
                if mode == 1:
                    t.put(b"~h", head + b"%08d" % i)
            if mode == 2:
                with side.begin(write=True) as t:
                    t.put(b"~h", head + b"%08d" % i)

        names = ["alone", "head in commit", "head in side env (no sync)"]
        wall: list[list[float]] = [[], [], []]
        cpu: list[list[float]] = [[], [], []]
        i = 0
        for r in range(args.rounds):
            for m in [(r + k) % 3 for k in range(3)]:
                i += 1
                c0, t0 = time.thread_time(), time.perf_counter()
                commit(i, m)
                wall[m].append(time.perf_counter() - t0)
                cpu[m].append(time.thread_time() - c0)
        env.close()
        side.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    alone = statistics.median(wall[0])
    print(f"{args.rounds} rounds, head {args.head_bytes:,} bytes")
    for m, name in enumerate(names):
        w = statistics.median(wall[m])
        c = statistics.median(cpu[m])
        print(f"{name:28s} wall {w * 1e6:6.0f} µs ({w / alone:.3f}x)  CPU {c * 1e6:5.0f} µs")


if __name__ == "__main__":
    main()
