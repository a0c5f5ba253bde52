"""Reads of realistic checkpoints, and the latest checkpoint of a very long thread.

Groups (bench/results/reads.json; one timed call = one round of every row, in
an order that rotates every round; each row's calls start after a full garbage
collection, so none pays for the collector's debt of the one before):

  wide:get_tuple:latest   the wide store (bench/_workloads.py, ``build_wide_store``):
  wide:get_tuple:by_id    1,000 threads of 10 checkpoints of ~13 KB in 10 channels;
  wide:list:limit10       get_tuple of a thread's latest checkpoint, a different
  wide:list:filter        thread at each call (cold: no thread read twice within
                          1,000 calls), of its 6th checkpoint (3 pending writes),
                          list(thread, limit=10) (a whole thread), and
                          list(None, filter={"source": "input"}) (~1,000 matches).
                          Rows: KVSaver(dir) (defaults: the heads of threads left
                          idle are written by the builder's background thread or
                          its close()), SqliteSaver, and in the get_tuple groups
                          KVSaver(dir, whole_latest=True) (every put rewrites the
                          head) and KVSaver(dir, whole_latest=False) (no heads: what
                          a read of a thread written in the last second pays).
  long_thread             get_tuple latest of a thread of 100,000 checkpoints and of
                          one of 100 in the same store, KVSaver (LMDB) and
                          SqliteSaver. All but the last checkpoint of each thread
                          are written in batches: KVSaver's recorded records of a
                          real put cloned under new ids through the Store
                          protocol; SqliteSaver's rows by executemany. The last
                          is a real put (all channels).

Per row: the median per operation (wall, and the calling thread's CPU), and
the median over rounds of its ratio to SqliteSaver in the same round.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable
from typing import Any

import pytest
from _workloads import (
    DISK_SAVERS,
    KV_BLOBS,
    KV_LMDB,
    KV_WHOLE,
    SQLITE,
    WIDE_FILTER,
    WIDE_THREADS,
    Recorder,
    ThreadGen,
    WideStore,
    build_wide_store,
    chunks,
    close_saver,
    make_saver,
    median,
    metric_rows,
    paired_rounds,
    pick,
    record,
    stores_per_saver,
    target,
    us,
    x_of,
)
from langgraph.checkpoint.base import get_checkpoint_metadata
from langgraph.checkpoint.base.id import uuid6

AREA = "reads"
THREADS = pick(WIDE_THREADS, 100)
WIDE_SAVERS = [KV_LMDB, SQLITE, KV_WHOLE, KV_BLOBS]
ONLY_GET_TUPLE = (KV_WHOLE, KV_BLOBS)  # whole_latest changes only what get_tuple reads
# workload: (one operation on call number i, operations per row and round, rounds, goal)
WIDE: dict[str, tuple[Callable[[WideStore, int], Any], int, int, float]] = {
    "get_tuple:latest": (
        lambda st, i: st.saver.get_tuple(st.latest[i % len(st.latest)]),
        25,
        pick(30, 3),
        0.7,
    ),
    "get_tuple:by_id": (
        lambda st, i: st.saver.get_tuple(st.by_id[i % len(st.by_id)]),
        25,
        pick(30, 3),
        0.7,
    ),
    "list:limit10": (
        lambda st, i: list(st.saver.list(st.latest[i % len(st.latest)], limit=10)),
        3,
        pick(30, 3),
        0.8,
    ),
    "list:filter": (
        lambda st, i: list(st.saver.list(None, filter=WIDE_FILTER)),
        1,
        pick(8, 2),
        0.8,
    ),
}


@pytest.fixture(scope="module")
def wide(tmp_path_factory: Any) -> Any:
    yield from stores_per_saver(
        tmp_path_factory, "wide", WIDE_SAVERS, lambda name, d: build_wide_store(name, d, THREADS)
    )


@pytest.mark.parametrize("workload", list(WIDE))
def test_wide(benchmark: Any, wide: dict[str, WideStore], workload: str) -> None:
    op, n, rounds, goal = WIDE[workload]
    names = [s for s in wide if s not in ONLY_GET_TUPLE or workload.startswith("get_tuple")]

    def steps(r: int) -> dict[str, Callable[[], Any]]:
        def step(st: WideStore) -> Callable[[], Any]:
            first = r * n  # each round reads the next threads
            return lambda: [op(st, i) for i in range(first, first + n)]

        return {name: step(wide[name]) for name in names}

    wall, cpu = paired_rounds(
        benchmark, f"wide:{workload}", steps, rounds, per=n, before_each=gc.collect
    )
    if workload == "list:filter":
        got = len(list(wide[KV_LMDB].saver.list(None, filter=WIDE_FILTER)))
        assert got == THREADS, got
    x = x_of(wall, SQLITE)
    record(
        AREA,
        f"wide:{workload}",
        f"{workload} on the wide store ({THREADS:,} threads of ~13 KB checkpoints)",
        metric_rows(us=us(wall), x_sqlite=x, cpu_us=us(cpu), x_sqlite_cpu=x_of(cpu, SQLITE)),
        info={
            "threads": THREADS,
            "rounds": rounds,
            "ops_per_row_per_round": n,
            "checkpoint_bytes": wide[KV_LMDB].checkpoint_bytes,
        },
        targets=[target(f"wide {workload}: KVSaver vs SqliteSaver", x.get(KV_LMDB), goal)],
    )


# -- the latest checkpoint of a 100,000-checkpoint thread ------------------------------

LONG = pick(100_000, 10_000)
SHORT = 100
BATCH = 10_000


def _gen(saver: Any, thread: str) -> ThreadGen:
    return ThreadGen(saver, thread, msg_chars=60, field_chars=40, window=5)


def _bulk_kv(saver: Any, thread: str, n: int) -> str:
    """n checkpoints on ``thread`` through the Store protocol; the last id."""
    rec = Recorder()
    gen = _gen(rec.saver, thread)
    first = rec.put(gen.next())  # all channels, source "input"
    step = gen.next()  # a typical step
    template = rec.put(step)
    tid = step.checkpoint["id"].encode()
    with saver.store.write() as txn:
        for k, v in first:
            txn.put(k, v)
    ids = [str(uuid6(clock_seq=i)) for i in range(n - 1)]
    for batch in chunks(ids, BATCH):
        with saver.store.write() as txn:
            for cid in batch:
                b = cid.encode()
                for k, v in template:
                    txn.put(k.replace(tid, b), v.replace(tid, b))
    rec.saver.close()
    return ids[-1]


def _bulk_sqlite(saver: Any, thread: str, n: int) -> str:
    gen = _gen(saver, thread)
    gen.next()
    step = gen.next()
    ctype, cbytes = saver.serde.dumps_typed(step.checkpoint)
    meta = json.dumps(get_checkpoint_metadata(step.config, step.metadata)).encode()
    ids = [str(uuid6(clock_seq=i)) for i in range(n - 1)]
    saver.setup()
    with saver.cursor() as cur:
        cur.executemany(
            "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, "
            "parent_checkpoint_id, type, checkpoint, metadata) VALUES (?, '', ?, ?, ?, ?, ?)",
            [
                (thread, cid, ids[i - 1] if i else None, ctype, cbytes, meta)
                for i, cid in enumerate(ids)
            ],
        )
    return ids[-1]


def _finish(saver: Any, thread: str, parent: str) -> tuple[dict[str, Any], str]:
    """The last checkpoint, through the saver's own put (all channels)."""
    gen = _gen(saver, thread)
    gen.parent_id = parent
    a = gen.next()
    saver.put(a.config, a.checkpoint, a.metadata, a.new_versions)
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}, a.checkpoint["id"]


def test_long_thread(benchmark: Any, tmp_path: Any) -> None:
    savers, configs = {}, {}
    for name in DISK_SAVERS:
        (tmp_path / name).mkdir()
        saver = savers[name] = make_saver(name, str(tmp_path / name))
        bulk = _bulk_kv if name == KV_LMDB else _bulk_sqlite
        for n in (LONG, SHORT):
            thread = f"long-{n}"
            configs[f"{name}:{n}"] = (saver, *_finish(saver, thread, bulk(saver, thread, n)))
    for saver, config, latest in configs.values():
        tup = saver.get_tuple(config)
        assert tup.checkpoint["id"] == latest and len(tup.checkpoint["channel_values"]) == 10
    per = 20
    rounds = pick(30, 3)

    def steps(r: int) -> dict[str, Callable[[], Any]]:
        return {
            row: (lambda s=s, c=c: [s.get_tuple(c) for _ in range(per)])
            for row, (s, c, _) in configs.items()
        }

    wall, cpu = paired_rounds(
        benchmark, "long_thread", steps, rounds, per=per, before_each=gc.collect
    )
    k = f"{KV_LMDB}:{LONG}"
    grows = round(median([a / b for a, b in zip(wall[k], wall[f"{KV_LMDB}:{SHORT}"])]), 3)
    record(
        AREA,
        "long_thread",
        f"get_tuple latest of a thread of {LONG:,} checkpoints and of {SHORT} (row saver:length)",
        metric_rows(us=us(wall), cpu_us=us(cpu), x_sqlite_same_length=_x_same_length(wall)),
        info={"rounds": rounds, "ops_per_row_per_round": per, "x_long_over_short": grows},
        targets=[target(f"KVSaver latest of {LONG:,} / latest of {SHORT}", grows, 1.5)],
    )
    for s in savers.values():
        close_saver(s)


def _x_same_length(wall: dict[str, list[float]]) -> dict[str, float]:
    out = {}
    for row in wall:
        n = row.rsplit(":", 1)[1]
        ref = wall.get(f"{SQLITE}:{n}")
        if ref:
            out[row] = round(median([a / b for a, b in zip(wall[row], ref)]), 3)
    return out
