"""Issue #13's read workloads: a store of 1,000 threads of ~13 KB, 10-channel
checkpoints (bench/_workloads.py, ``build_store13``), every saver timed in the
same rounds, in an order that rotates every round.

Groups (one call = one round; the numbers are in extra_info):
  reads13:get_tuple:latest   get_tuple of a thread's latest checkpoint, a
                             different thread at each call (cold: no thread is
                             read twice within 1,000 calls, so no cache helps)
  reads13:get_tuple:by_id    get_tuple of a thread's 6th checkpoint, which has
                             3 pending writes
  reads13:list:limit10       list(thread, limit=10): a whole thread
  reads13:list:filter        list(None, filter={"source": "input"}): one
                             checkpoint per thread, ~1,000 in all

Savers: KVSaver (LMDB, defaults: the store's threads, written then left
alone, have their heads, saver/heads.py, written by the builder's background
thread or its close()), SqliteSaver, and in the get_tuple groups
KVSaver(dir, whole_latest=True) (``kvsaver-lmdb-whole``: every put rewrites
the head) and KVSaver(dir, whole_latest=False) (``kvsaver-lmdb-blobs``: no
heads, what a read of a thread written in the last second pays), each on a
store it wrote itself.

extra_info, per saver: the median per operation over rounds (wall clock and
CPU time of the thread), and the median over rounds of the per-round ratio to
SqliteSaver (``x_sqlite``, wall; ``x_sqlite_cpu``, CPU): the report's targets
use ``x_sqlite``. ``KVSAVER_BENCH_QUICK=1`` builds 100 threads instead.
"""

from __future__ import annotations

import gc
import itertools
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

import ormsgpack
import pytest
import zstandard
from _workloads import (
    KV_BLOBS,
    KV_LMDB,
    KV_WHOLE,
    R13_FILTER,
    R13_THREADS,
    SQLITE,
    Store13,
    build_store13,
    close_saver,
    label,
    median,
    rotated,
)
from kvsaver import compression as C
from kvsaver import delta as D
from kvsaver import heads as H
from kvsaver import schema as S
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

QUICK = bool(os.environ.get("KVSAVER_BENCH_QUICK"))
THREADS = 100 if QUICK else R13_THREADS
SAVERS13 = [KV_LMDB, SQLITE, KV_WHOLE, KV_BLOBS]
# whole_latest (saver/heads.py) changes only what get_tuple reads
WHOLE_WORKLOADS = ("get_tuple:latest", "get_tuple:by_id")
ONLY_GET_TUPLE = (KV_WHOLE, KV_BLOBS)
HEAD_FLOOR = "floor:head"
# workload: (one operation on call number i, operations per saver per round, rounds)
WORKLOADS: dict[str, tuple[Callable[[Store13, int], Any], int, int]] = {
    "get_tuple:latest": (lambda st, i: st.saver.get_tuple(st.latest[i % len(st.latest)]), 25, 30),
    "get_tuple:by_id": (lambda st, i: st.saver.get_tuple(st.by_id[i % len(st.by_id)]), 25, 30),
    "list:limit10": (
        lambda st, i: list(st.saver.list(st.latest[i % len(st.latest)], limit=10)),
        3,
        30,
    ),
    "list:filter": (
        lambda st, i: list(st.saver.list(None, filter=R13_FILTER)),
        1,
        6 if QUICK else 8,
    ),
}


@pytest.fixture(scope="module")
def stores13(tmp_path_factory: Any) -> Any:
    dirs = {name: str(tmp_path_factory.mktemp(f"r13-{name}")) for name in SAVERS13}
    built = {name: build_store13(name, d, THREADS) for name, d in dirs.items()}
    yield built
    for name, st in built.items():
        close_saver(st.saver)
        shutil.rmtree(dirs[name], ignore_errors=True)


FLOOR = "floor:lmdb+serde"


def floor_reader(st: Store13, workload: str, head: bool = False) -> Callable[[int], Any]:
    """The floor of a read on KVSaver's layout: a raw py-lmdb read
    transaction that fetches exactly the records KVSaver fetches (a latest
    record by one reverse cursor step, a record by key, or a thread's 10
    records by a reverse cursor walk; each checkpoint's channel blobs and its
    pending writes' range) and decodes them with the serializer alone (zstd,
    with the small-record dictionary where stored so, + JsonPlusSerializer),
    with every key built in advance: no saver or kv code runs in the timed
    call, and no cache of decompressed values serves it. ``head=True`` (get_tuple latest of a
    store written with ``whole_latest=True``): the thread's head record
    (saver/heads.py) instead of the blobs: the record by one reverse step, the
    head by key, compared, its payload decoded by the serializer in one call,
    and the writes' range."""
    saver: Any = st.saver
    env = saver.store._env.env
    serde = JsonPlusSerializer()
    dz = zstandard.ZstdDecompressor()  # no cache of decompressed values: a cold read's cost
    ddz = zstandard.ZstdDecompressor(dict_data=C._ZDICT)
    codec = D.codec(saver.serde)
    plans = []
    cfgs = st.by_id if workload == "get_tuple:by_id" else st.latest
    for cfg in cfgs if workload != "list:filter" else []:
        thread = cfg["configurable"]["thread_id"]
        if workload == "list:limit10":
            tuples = list(saver.list(cfg, limit=10))
            where = S.checkpoints_range(thread, "")[1]
        else:
            tuples = [saver.get_tuple(cfg)]
            cid = tuples[0].config["configurable"]["checkpoint_id"]
            where = S.checkpoints_range(thread, "")[1]
            if workload == "get_tuple:by_id":
                where = S.checkpoint_key(thread, "", cid)
        per = []
        for tup in tuples:
            cid = tup.config["configurable"]["checkpoint_id"]
            versions = tup.checkpoint["channel_versions"]
            blobs = [S.blob_key(thread, "", ch, v) for ch, v in versions.items()]
            per.append((blobs, S.writes_range(thread, "", cid)))
        plans.append((workload == "get_tuple:by_id", where, per))
    if workload == "list:filter":  # every match, newest first, as list() returns them
        matches = list(saver.list(None, filter=R13_FILTER))
        ((key, value),) = R13_FILTER.items()
        index = S.meta_range(key, S.meta_value(value)[1])
        per = []
        for tup in matches:
            c = tup.config["configurable"]
            thread, cid = c["thread_id"], c["checkpoint_id"]
            versions = tup.checkpoint["channel_versions"]
            blobs = [S.blob_key(thread, "", ch, v) for ch, v in versions.items()]
            per.append((S.checkpoint_key(thread, "", cid), blobs, S.writes_range(thread, "", cid)))

    def load(typ: str, body: bytes) -> Any:
        if typ.endswith(C.SUFFIX):
            typ, body = typ[: -len(C.SUFFIX)], dz.decompress(body)
        elif typ.endswith(C.DICT_SUFFIX):  # small records: zstd with the dictionary (#15)
            typ, body = typ[: -len(C.DICT_SUFFIX)], ddz.decompress(body)
        return serde.loads_typed((typ, body))

    def one(txn: Any, raw: bytes, blobs: list[bytes], wrange: tuple[bytes, bytes]) -> Any:
        rec = ormsgpack.unpackb(raw)
        checkpoint = load(rec[4], rec[5])
        values = {}
        for ch, key in zip(checkpoint["channel_versions"], blobs):
            b = txn.get(key)
            if b[:1] == D.MARK:  # a delta (none in this store's latest states)
                values[ch] = load(*codec.typed(txn, key, b))
            else:
                typ, _, body = b.partition(b"\x00")
                values[ch] = load(typ.decode(), body)
        return checkpoint, values, load(rec[6], rec[7]), writes_of(txn, wrange)

    def writes_of(txn: Any, wrange: tuple[bytes, bytes]) -> list[Any]:
        """A checkpoint's pending writes: one cursor pass over their range."""
        writes = []
        cur = txn.cursor()
        if cur.set_range(wrange[0]):
            for key, w in cur:
                if key >= wrange[1]:
                    break
                task, channel, wt, wb, _, _ = ormsgpack.unpackb(w)
                writes.append((task, channel, load(wt, wb)))
        return writes

    def read_filtered(i: int) -> Any:
        # The index walk (one reverse cursor pass over its range), then each
        # match's record by its key, built in advance like every other key.
        with env.begin() as txn:
            cur = txn.cursor()
            cur.set_range(index[1])
            n = 0
            while cur.prev() and cur.key() >= index[0]:
                n += 1
            assert n == len(per), (n, len(per))
            return [one(txn, txn.get(rkey), blobs, wr) for rkey, blobs, wr in per]

    if workload == "list:filter":
        return read_filtered

    if head:
        heads = [
            (where, S.head_key(cfg["configurable"]["thread_id"], ""), per[0][1])
            for cfg, (_, where, per) in zip(cfgs, plans)
        ]

        def read_head(i: int) -> Any:
            where, hkey, wrange = heads[i % len(heads)]
            with env.begin() as txn:
                cur = txn.cursor()
                cur.set_range(where)
                cur.prev()
                raw = cur.value()
                rec = ormsgpack.unpackb(raw)
                head = txn.get(hkey)
                body = H.payload(head, raw)
                assert body is not None, "the store has no head for this thread"
                parent, metadata, checkpoint = serde.loads_typed(("msgpack", bytes(body)))
                return rec, parent, checkpoint, metadata, writes_of(txn, wrange)

        return read_head

    def read(i: int) -> Any:
        by_key, where, per = plans[i % len(plans)]
        with env.begin() as txn:
            if by_key:
                return [one(txn, txn.get(where), *per[0])]
            cur = txn.cursor()
            cur.set_range(where)
            out = []
            for blobs, wrange in per:
                cur.prev()
                out.append(one(txn, cur.value(), blobs, wrange))
            return out

    return read


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_reads13(benchmark: Any, stores13: dict[str, Store13], workload: str) -> None:
    op, n, rounds = WORKLOADS[workload]
    names = [n for n in stores13 if n not in ONLY_GET_TUPLE or workload in WHOLE_WORKLOADS]
    floor = floor_reader(stores13[KV_LMDB], workload)
    names.append(FLOOR)
    floors = {FLOOR: floor}
    if workload == "get_tuple:latest":  # the floor of a read through a head
        floors[HEAD_FLOOR] = floor_reader(stores13[KV_LMDB], workload, head=True)
        names.append(HEAD_FLOOR)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    # Time the garbage collector spends inside each saver's timed calls, by
    # generation: a full collection walks every object of the process (the
    # whole benchmark session's heap), so whichever call happens to trigger
    # one pays for all of it. Each saver's calls start after a full
    # collection (so none inherits the collector's debt of the one before);
    # what is collected inside them is reported, not subtracted.
    gc_seconds: dict[str, list[float]] = {name: [0.0, 0.0, 0.0] for name in names}
    timing: list[Any] = [None, 0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if timing[0] is None:
            return
        if phase == "start":
            timing[1] = time.perf_counter()
        else:
            gc_seconds[timing[0]][info["generation"]] += time.perf_counter() - timing[1]

    counter = itertools.count()
    calls = {name: itertools.count() for name in names}  # each saver walks the threads

    def one_round(r: int) -> None:
        for name in rotated(names, r):
            first = next(calls[name]) * n
            gc.collect()  # each saver's calls start from the same collector state
            timing[0] = name if r > 0 else None
            w0, c0 = time.perf_counter(), time.thread_time()
            if name in floors:
                read = floors[name]
                for i in range(first, first + n):
                    read(i)
            else:
                st = stores13[name]
                for i in range(first, first + n):
                    op(st, i)
            w, c = time.perf_counter() - w0, time.thread_time() - c0
            timing[0] = None
            if r > 0:  # round 0 is the warm-up
                wall[name].append(w / n)
                cpu[name].append(c / n)

    label(benchmark, f"reads13:{workload}", "all savers", 1)
    gc.callbacks.append(on_gc)
    try:
        benchmark.pedantic(one_round, setup=lambda: ((next(counter),), {}), rounds=rounds + 1)
    finally:
        gc.callbacks.remove(on_gc)
    if workload == "list:filter":
        got = len(list(stores13[KV_LMDB].saver.list(None, filter=R13_FILTER)))
        assert got == THREADS, got
    st = stores13[KV_LMDB]
    benchmark.extra_info.update(
        threads=THREADS,
        rounds=rounds,
        ops_per_saver_per_round=n,
        checkpoint_bytes=st.checkpoint_bytes,
        per_op_us={k: round(median(v) * 1e6, 1) for k, v in wall.items()},
        cpu_per_op_us={k: round(median(v) * 1e6, 1) for k, v in cpu.items()},
        x_sqlite={k: _x(v, wall[SQLITE]) for k, v in wall.items()},
        x_sqlite_cpu={k: _x(v, cpu[SQLITE]) for k, v in cpu.items()},
        gc_us_per_op_by_generation={
            k: [round(g / (rounds * n) * 1e6, 1) for g in v] for k, v in gc_seconds.items()
        },
    )


def _x(times: list[float], ref: list[float]) -> float:
    return round(median([a / b for a, b in zip(times, ref) if b > 0]), 3)
