"""What LMDBStore costs on top of raw py-lmdb, per operation.

Run: ``python bench/bench_kv_overhead.py [--quick] [--dir DIR]``

Method (one run, both sides in the same process and on the same disk):

* Two environments per durability, created alike: raw ``lmdb.open`` with the
  flags LMDBStore uses (64 MiB map, ``max_spare_txns=0``, ``readahead=False``,
  the same ``sync``/``metasync``), and an ``LMDBStore``. Both get the same
  10,000 records: 100 threads x 100 checkpoint keys ``("c", thread, "", id)``
  of 200-byte values, packed with ``kv.keys.pack`` (key building is not timed).
* Operations, each one complete transaction, timed one by one with
  ``time.perf_counter_ns``:
    - put: one new key (100-byte value) per write transaction; with durability
      "full" (fsync per commit, the default) and "none" (no fsync: exposes the
      wrapper's CPU cost); also through ``LMDBStore.transact``.
    - get: one existing key in a read transaction.
    - last in prefix: the first key of a reverse scan over one thread's prefix
      (the saver's "latest checkpoint"). Raw: ``cursor.set_range(stop)`` then
      ``prev()``, else ``last()``; wrapper: ``next(txn.scan(start, stop,
      reverse=True))``.
* Raw and wrapper alternate in blocks (so drift hits both alike); the first
  block of each side is warm-up and discarded. Reported: medians in µs and the
  ratio wrapper / raw (1.00 = no overhead).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import lmdb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from kvsaver.kv import LMDBStore, pack, prefix_range

SYNC_FLAGS = {"full": {"sync": True, "metasync": True}, "none": {"sync": False, "metasync": False}}
THREADS, PER_THREAD, VALUE = 100, 100, b"v" * 200


def open_raw(path: str, durability: str) -> lmdb.Environment:
    return lmdb.open(
        path,
        map_size=64 << 20,
        subdir=True,
        max_dbs=0,
        max_spare_txns=0,
        readahead=False,
        lock=True,
        **SYNC_FLAGS[durability],
    )


def fill(raw: lmdb.Environment, store: LMDBStore) -> list[bytes]:
    keys = [
        pack(("c", f"thread-{t:03d}", "", f"{j:08d}"))
        for t in range(THREADS)
        for j in range(PER_THREAD)
    ]
    with raw.begin(write=True) as txn:
        for k in keys:
            txn.put(k, VALUE)
    with store.write() as wtxn:
        for k in keys:
            wtxn.put(k, VALUE)
    return keys


def timed(op: Callable[[int], object], start: int, n: int) -> list[int]:
    out = []
    clock = time.perf_counter_ns
    for i in range(start, start + n):
        t0 = clock()
        op(i)
        out.append(clock() - t0)
    return out


def compare(
    raw_op: Callable[[int], object], wrap_op: Callable[[int], object], blocks: int, per_block: int
) -> tuple[float, float]:
    """Alternate blocks of raw and wrapper ops; drop each side's first block."""
    raw: list[int] = []
    wrap: list[int] = []
    for b in range(blocks + 1):
        r = timed(raw_op, b * per_block, per_block)
        w = timed(wrap_op, b * per_block, per_block)
        if b:  # block 0 is warm-up
            raw += r
            wrap += w
    return statistics.median(raw) / 1000, statistics.median(wrap) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", help="where to create the stores (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    scale = 5 if args.quick else 1
    base = tempfile.mkdtemp(prefix="kv-overhead-", dir=args.dir)
    try:
        run(base, scale)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run(base: str, scale: int) -> None:
    rng = random.Random(42)
    rows: list[tuple[str, str, int, float, float]] = []
    envs: dict[str, tuple[lmdb.Environment, LMDBStore]] = {}
    for durability in ("full", "none"):
        raw = open_raw(os.path.join(base, f"raw-{durability}"), durability)
        store = LMDBStore(os.path.join(base, f"wrap-{durability}"), durability=durability)
        envs[durability] = (raw, store)
    keys = fill(*envs["full"])
    fill(*envs["none"])

    value = b"w" * 100
    for durability, blocks, per_block in (("full", 6, 50 // scale), ("none", 10, 1000 // scale)):
        raw, store = envs[durability]

        def raw_put(i: int, raw: lmdb.Environment = raw, space: str = "w") -> None:
            with raw.begin(write=True) as txn:
                txn.put(pack((space, i)), value)

        def wrap_put(i: int, store: LMDBStore = store) -> None:
            with store.write() as txn:
                txn.put(pack(("w", i)), value)

        def wrap_transact(i: int, store: LMDBStore = store) -> None:
            store.transact(lambda txn: txn.put(pack(("t", i)), value))

        def raw_put_t(i: int, raw: lmdb.Environment = raw) -> None:
            raw_put(i, raw, "t")

        r, w = compare(raw_put, wrap_put, blocks, per_block)
        rows.append(("put, 1 key per write txn", durability, blocks * per_block, r, w))
        r, w = compare(raw_put_t, wrap_transact, blocks, per_block)
        rows.append(("put, 1 key per transact()", durability, blocks * per_block, r, w))

    raw, store = envs["full"]
    n_reads = 20 * (1000 // scale)
    probe = [rng.choice(keys) for _ in range(n_reads * 2)]

    def raw_get(i: int) -> bytes | None:
        with raw.begin() as txn:
            return txn.get(probe[i % len(probe)])

    def wrap_get(i: int) -> bytes | None:
        with store.read() as txn:
            return txn.get(probe[i % len(probe)])

    r, w = compare(raw_get, wrap_get, 20, n_reads // 20)
    rows.append(("get 1 key (read txn)", "-", n_reads, r, w))

    ranges = [prefix_range(("c", f"thread-{rng.randrange(THREADS):03d}", "")) for _ in range(999)]

    def raw_last(i: int) -> bytes | None:
        start, stop = ranges[i % len(ranges)]
        with raw.begin() as txn:
            cur = txn.cursor()
            ok = cur.prev() if cur.set_range(stop) else cur.last()
            if ok and cur.key() >= start:
                return cur.key()
            return None

    def wrap_last(i: int) -> bytes | None:
        start, stop = ranges[i % len(ranges)]
        with store.read() as txn:
            item = next(txn.scan(start, stop, reverse=True), None)
            return item[0] if item else None

    for i in range(len(ranges)):  # both sides find the same key: the newest of the thread
        assert raw_last(i) == wrap_last(i) is not None
    r, w = compare(raw_last, wrap_last, 20, n_reads // 20)
    rows.append(("last key in a prefix (reverse scan)", "-", n_reads, r, w))

    for raw, store in envs.values():
        raw.close()
        store.close()

    print(
        f"Python {platform.python_version()}, py-lmdb {lmdb.__version__} "
        f"(LMDB {'.'.join(map(str, lmdb.version()))}), {platform.system()} "
        f"{platform.machine()}, {os.cpu_count()} CPUs; stores in {base}"
    )
    print()
    print("| operation | durability | timed ops | raw py-lmdb (µs) | LMDBStore (µs) | ratio |")
    print("|---|---|---:|---:|---:|---:|")
    for name, durability, n, r, w in rows:
        print(f"| {name} | {durability} | {n} | {r:.1f} | {w:.1f} | {w / r:.2f} |")


if __name__ == "__main__":
    main()
