"""The read workloads again, every saver in the same round (issue #6).

bench_saver_ops.py times each saver's reads as its own test, one after the
other, and this shared machine's speed drifts between them by more than the
gaps being measured: in four runs of one commit, SqliteSaver's get_tuple
latest took 46 to 86 µs and InMemorySaver's 45 to 100 µs. Here the four
read stores (the same ones: bench/_workloads.py, ``build_read_store``) are
open at once, and each round times every saver on the workload back to back,
in an order that rotates every round. extra_info holds each saver's median
per operation and, per saver, the median over rounds of its time / SqliteSaver's
time in the same round; the report's targets use those ratios.

Groups: ``paired:get_tuple:latest``, ``paired:get_tuple:by_id``,
``paired:list:limit10`` (one call = one round; the numbers are in extra_info).
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Callable
from typing import Any

import pytest
from _workloads import (
    SAVERS,
    SQLITE,
    ReadStore,
    build_read_store,
    close_saver,
    label,
    median,
    rotated,
    timed,
)

ROUNDS = 60
WORKLOADS: dict[str, tuple[Callable[[ReadStore], Any], int]] = {
    # workload: (one operation, operations per saver per round)
    "get_tuple:latest": (lambda rs: rs.saver.get_tuple(rs.big_latest), 20),
    "get_tuple:by_id": (lambda rs: rs.saver.get_tuple(rs.big_by_id), 20),
    "list:limit10": (lambda rs: list(rs.saver.list(rs.big_latest, limit=10)), 3),
}


@pytest.fixture(scope="module")
def stores(tmp_path_factory: Any) -> Any:
    dirs = {name: str(tmp_path_factory.mktemp(f"paired-{name}")) for name in SAVERS}
    built = {name: build_read_store(name, d) for name, d in dirs.items()}
    yield built
    for name, rs in built.items():
        close_saver(rs.saver)
        shutil.rmtree(dirs[name], ignore_errors=True)


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_reads_paired(benchmark: Any, stores: dict[str, ReadStore], workload: str) -> None:
    op, n = WORKLOADS[workload]
    names = list(stores)
    times: dict[str, list[float]] = {name: [] for name in names}
    rounds = itertools.count()

    def one_round(r: int) -> None:
        for name in rotated(names, r):
            rs = stores[name]
            t = timed(lambda rs=rs: [op(rs) for _ in range(n)])
            if r > 0:  # round 0 is the warm-up
                times[name].append(t / n)

    label(benchmark, f"paired:{workload}", "all savers", 1)
    benchmark.pedantic(one_round, setup=lambda: ((next(rounds),), {}), rounds=ROUNDS + 1)
    ref = times[SQLITE]
    benchmark.extra_info.update(
        rounds=ROUNDS,
        ops_per_saver_per_round=n,
        per_op_us={k: round(median(v) * 1e6, 1) for k, v in times.items()},
        x_sqlite={k: round(median([a / b for a, b in zip(v, ref)]), 3) for k, v in times.items()},
    )
