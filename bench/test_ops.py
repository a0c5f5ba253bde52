"""Single saver operations, every saver and the floors in the same rounds.

Groups (bench/results/ops.json; one timed call = one round of every row, in
an order that rotates every round; medians per operation):

  put, put_writes       50 calls per row and round on a fresh thread: KVSaver
                        (LMDB, durability "full"; ":memory:"), SqliteSaver,
                        InMemorySaver, and the floors of the layout measured
                        in the same round: serialization alone
                        (``floor:serialize``), one raw py-lmdb commit per
                        operation of the very bytes KVSaver writes (recorded
                        through a Store of our own) into a fresh file
                        (``floor:lmdb-commit``) and into a file zeroed ahead
                        (``floor:lmdb-commit-zeroed``), and both chained, each
                        operation serialized then committed before the next
                        (``serialize+fresh``, ``serialize+zeroed``): a durable
                        commit right after CPU work takes longer on a VM than
                        one right after the last, so the sum of separately
                        timed parts can be below what a saver reaches.
                        ``x_floor`` = median over rounds of KVSaver /
                        (serialize + commit).
  get_tuple:latest      on a store of 1,000 threads, one of them with 1,000
  get_tuple:by_id       checkpoints (latest: no pending writes; by id: 3)
  list:limit10          list(thread, limit=10) of the big thread
  list:thread1000       list(thread): all 1,000 checkpoints
  list:filter_global    list(None, filter={"source": "input", "tag": X}): 5 of ~4,000
  delete_thread         a 50-checkpoint thread (with writes), inserted untimed per round

The read stores (one per saver, all open at once) are written through each
saver's own put/put_writes without fsync, then reopened with the defaults.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from _workloads import (
    INMEM,
    KV_LMDB,
    KV_MEM,
    SAVERS,
    SQLITE,
    PutArgs,
    ReadStore,
    Recorder,
    ThreadGen,
    build_read_store,
    close_saver,
    make_saver,
    median,
    metric_rows,
    paired_rounds,
    pick,
    raw_commit,
    raw_lmdb,
    record,
    run_puts,
    serialize_put,
    stores_per_saver,
    target,
    task_id,
    us,
    writes_for,
    x_of,
)

AREA = "ops"
PER_ROUND = 50
WRITE_ROUNDS = pick(12, 2)
READ_THREADS = pick(1_000, 100)
_ids = itertools.count()


def _fresh(prefix: str) -> str:
    return f"{prefix}-{next(_ids):06d}"


def _put_ops(saver: Any) -> list[PutArgs]:
    gen = ThreadGen(saver, _fresh("put"))
    return [gen.next() for _ in range(PER_ROUND)]


def _writes_ops() -> list[tuple[dict, list, str]]:
    thread = _fresh("pw")
    base = next(_ids) * 1000
    cfg = {"configurable": {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": thread}}
    return [(cfg, writes_for(i), task_id(base + i)) for i in range(PER_ROUND)]


# -- put and put_writes against their floors ------------------------------------------


@pytest.mark.parametrize("workload", ["put", "put_writes"])
def test_write_floor(benchmark: Any, tmp_path: Any, workload: str) -> None:
    savers = {}
    for name in SAVERS:
        d = tmp_path / name
        d.mkdir()
        savers[name] = make_saver(name, str(d))
    serde = savers[KV_LMDB].serde  # type: ignore[attr-defined]
    rec = Recorder()
    envs = {
        "floor:lmdb-commit": raw_lmdb(str(tmp_path / "fresh")),
        "floor:lmdb-commit-zeroed": raw_lmdb(str(tmp_path / "zeroed"), zeroed=True),
    }
    chained = {
        "serialize+fresh": raw_lmdb(str(tmp_path / "chained-fresh")),
        "serialize+zeroed": raw_lmdb(str(tmp_path / "chained-zeroed"), zeroed=True),
    }

    def steps(r: int) -> dict[str, Callable[[], Any]]:
        out: dict[str, Callable[[], Any]] = {}
        if workload == "put":
            theirs = _put_ops(rec.saver)
            pairs = [rec.put(a) for a in theirs]

            def one(a: Any) -> None:
                serialize_put(serde, a)

            for name, s in savers.items():
                mine = _put_ops(s)
                out[name] = lambda s=s, ops=mine: run_puts(s, ops)
        else:
            theirs = _writes_ops()
            pairs = [rec.put_writes(*op) for op in theirs]

            def one(a: Any) -> None:
                for _, v in a[1]:
                    serde.dumps_typed(v)

            for name, s in savers.items():
                w = _writes_ops()
                out[name] = lambda s=s, ops=w: [s.put_writes(*op) for op in ops]
        out["floor:serialize"] = lambda: [one(a) for a in theirs]
        for name, env in envs.items():
            out[name] = lambda env=env: [raw_commit(env, p) for p in pairs]
        for name, env in chained.items():
            out[name] = lambda env=env: [
                (one(a), raw_commit(env, p)) for a, p in zip(theirs, pairs)
            ]
        return out

    wall, cpu = paired_rounds(benchmark, f"{workload}", steps, WRITE_ROUNDS, per=PER_ROUND)

    def x_floor(commit: str) -> float:
        parts = zip(wall[KV_LMDB], wall["floor:serialize"], wall[commit])
        return round(median([k / (s + c) for k, s, c in parts]), 3)

    def x_chained(name: str) -> float:
        return round(median([k / c for k, c in zip(wall[KV_LMDB], wall[name])]), 3)

    floors = {
        "x_floor": x_floor("floor:lmdb-commit"),
        "x_zeroed_floor": x_floor("floor:lmdb-commit-zeroed"),
        "x_chained_floor": x_chained("serialize+fresh"),
        "x_chained_zeroed_floor": x_chained("serialize+zeroed"),
    }
    record(
        AREA,
        workload,
        f"one {workload} ({PER_ROUND} per row and round), every saver and the floors",
        metric_rows(us=us(wall), x_sqlite=x_of(wall, SQLITE), cpu_us=us(cpu)),
        info={"rounds": WRITE_ROUNDS, "ops_per_row_per_round": PER_ROUND, **floors},
        targets=[
            target(f"{workload}: KVSaver vs serialize + raw LMDB commit", floors["x_floor"], 1.15),
            target(
                f"{workload}: KVSaver vs serialize + raw commit, file zeroed ahead",
                floors["x_zeroed_floor"],
                1.15,
            ),
        ],
    )
    for s in savers.values():
        close_saver(s)
    for env in (*envs.values(), *chained.values()):
        env.close()
    rec.saver.close()


# -- reads (and delete_thread) on the 1,000-thread store, every saver each round ---------


@pytest.fixture(scope="module")
def stores(tmp_path_factory: Any) -> Any:
    yield from stores_per_saver(
        tmp_path_factory, "ops", SAVERS, lambda name, d: build_read_store(name, d, READ_THREADS)
    )


def _delete_step(rs: ReadStore) -> Callable[[], Any]:
    """A 50-checkpoint thread inserted now (untimed); the step deletes it."""
    gen = ThreadGen(rs.saver, _fresh("del"), window=20)
    for j in range(50):
        a = gen.next()
        rs.saver.put(a.config, a.checkpoint, a.metadata, a.new_versions)
        rs.saver.put_writes(gen.config(), writes_for(j), task_id(j))
    return lambda: rs.saver.delete_thread(gen.thread_id)


def _filter(rs: ReadStore) -> list[Any]:
    return list(rs.saver.list(None, filter={"source": "input", "tag": rs.filter_tag}))


# workload: (the step of one saver in one round, operations per step, rounds, goal)
READS: dict[str, tuple[Callable[[ReadStore], Callable[[], Any]], int, int, float | None]] = {
    "get_tuple:latest": (
        lambda rs: lambda: [rs.saver.get_tuple(rs.big_latest) for _ in range(20)],
        20,
        pick(60, 3),
        0.5,
    ),
    "get_tuple:by_id": (
        lambda rs: lambda: [rs.saver.get_tuple(rs.big_by_id) for _ in range(20)],
        20,
        pick(60, 3),
        0.5,
    ),
    "list:limit10": (
        lambda rs: lambda: [list(rs.saver.list(rs.big_latest, limit=10)) for _ in range(3)],
        3,
        pick(40, 3),
        0.5,
    ),
    "list:thread1000": (lambda rs: lambda: list(rs.saver.list(rs.big_latest)), 1, pick(5, 2), None),
    "list:filter_global": (lambda rs: lambda: _filter(rs), 1, pick(15, 2), 0.3),
    "delete_thread": (_delete_step, 1, pick(12, 2), 0.5),
}


@pytest.mark.parametrize("workload", list(READS))
def test_reads(benchmark: Any, stores: dict[str, ReadStore], workload: str) -> None:
    make, per, rounds, goal = READS[workload]
    wall, cpu = paired_rounds(
        benchmark, workload, lambda r: {n: make(rs) for n, rs in stores.items()}, rounds, per
    )
    rs = stores[KV_LMDB]
    assert rs.saver.get_tuple(rs.big_by_id) is not None
    assert len(_filter(rs)) == rs.filter_matches
    x = x_of(wall, SQLITE)
    record(
        AREA,
        workload,
        f"{workload} on a store of {READ_THREADS:,} threads, one of 1,000 checkpoints",
        metric_rows(us=us(wall), x_sqlite=x, cpu_us=us(cpu), x_inmemory=x_of(wall, INMEM)),
        info={
            "rounds": rounds,
            "ops_per_row_per_round": per,
            "store_checkpoints": rs.checkpoints,
            "build_seconds": {n: round(s.build_seconds, 1) for n, s in stores.items()},
            "filter_matches": rs.filter_matches,
        },
        targets=[]
        if goal is None
        else [target(f"{workload}: KVSaver vs SqliteSaver", x.get(KV_LMDB), goal)],
    )
    assert KV_MEM in wall
