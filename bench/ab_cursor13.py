"""A/B of the LMDB store's point reads and writes: ``Transaction.get`` /
``put`` (before) against one cursor per transaction, ``Cursor.set_key`` +
``value`` / ``Cursor.put`` (after, kv/lmdb_store.py ``_LMDBTxn._point``).

A measurement script, not a test. Two parts:

* raw py-lmdb: a read transaction getting 12 adjacent keys (a checkpoint's
  blobs) of a 200,000-key store, either way; the minimum of 5 repeats.
  A positioned cursor looks for a key on its current leaf page first
  (LMDB's MDB_SET), where ``mdb_get`` descends from the root every time.
* bench_async's 32 conversations (bench/ab_async13.py's ``compare``: both
  variants, AsyncSqliteSaver and no checkpointer in every round, order
  rotated, round 0 a warm-up). py-lmdb lets go of the GIL around every
  LMDB call, so on the event loop each one is a chance for the threads
  writing checkpoints to take it.

    python bench/ab_cursor13.py [ROUNDS]
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import timeit
from collections.abc import Sequence

import lmdb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ab_async13 import compare
from kvsaver.kv import lmdb_store as L

AFTER = (L._LMDBTxn.get, L._LMDBTxn.get_many, L._LMDBTxn.put)


def _get(self: L._LMDBTxn, key: bytes) -> bytes | None:
    if not key or len(key) > self._env.max_key:
        return None
    return self._txn.get(key)


def _get_many(self: L._LMDBTxn, keys: Sequence[bytes]) -> list[bytes | None]:
    get, max_key = self._txn.get, self._env.max_key
    return [get(k) if k and len(k) <= max_key else None for k in keys]


def _put(self: L._LMDBTxn, key: bytes, value: bytes) -> None:
    if not self._write:
        self._require_write()
    if not key or len(key) > self._env.max_key:
        self._check_key(key)
    if self._log is None:
        self._txn.put(bytes(key), bytes(value))
    else:
        self._mutate("put", bytes(key), bytes(value))


def before() -> None:
    L._LMDBTxn.get, L._LMDBTxn.get_many, L._LMDBTxn.put = _get, _get_many, _put


def after() -> None:
    L._LMDBTxn.get, L._LMDBTxn.get_many, L._LMDBTxn.put = AFTER


def raw() -> None:
    env = lmdb.open(tempfile.mkdtemp(prefix="ab-cursor-"), map_size=1 << 30)
    keys = [b"thread-%06d/blob/%02d" % (i // 12, i % 12) for i in range(200_000)]
    with env.begin(write=True) as txn:
        for k in keys:
            txn.put(k, b"v" * 200)
    rnd = random.Random(1)
    groups = [keys[j * 12 : (j + 1) * 12] for j in rnd.sample(range(len(keys) // 12), 2000)]
    n = [0]

    def by_txn() -> None:
        n[0] += 1
        txn = env.begin()
        get = txn.get
        [get(k) for k in groups[n[0] % 2000]]
        txn.abort()

    def by_cursor() -> None:
        n[0] += 1
        txn = env.begin()
        cur = txn.cursor()
        at, value = cur.set_key, cur.value
        [value() if at(k) else None for k in groups[n[0] % 2000]]
        txn.abort()

    for name, fn in (("Transaction.get", by_txn), ("Cursor.set_key + value", by_cursor)) * 2:
        best = min(timeit.repeat(fn, number=5000, repeat=5)) / 5000
        print(f"12 adjacent gets, {name}: {best * 1e6:.2f} µs")
    env.close()


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    raw()
    compare({"after": after, "before": before}, rounds, after)


if __name__ == "__main__":
    main()
