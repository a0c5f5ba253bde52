"""A real StateGraph agent with each saver as its checkpointer (issue #6).

graph:loop     20 threads x one invoke of a 30-turn agent <-> tools loop
               (~61 supersteps per thread; messages of 300 characters)
graph:invokes  20 threads x 10 invokes of a 2-turn exchange; each invoke
               reloads the thread's latest checkpoint

The timed call is the whole workload on a fresh saver (LangGraph's default
durability, "async"); 3 rounds. Warm-up, discarded: the workload on 2 threads,
with a throwaway saver and without one (a full warm-up round would double the
suite's time). Each round's untimed setup also times the same workload with no
checkpointer, so the baseline is measured interleaved with the saver runs, in
the same process. extra_info holds

    overhead_us_per_superstep = (median with saver - median without) / supersteps

with supersteps = checkpoints written (one per superstep, the input step
included), and the bytes the on-disk savers left after the workload.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from _workloads import (
    GRAPH_THREADS,
    INVOKES,
    LOOP_TURNS,
    SAVERS,
    build_agent,
    close_saver,
    count_checkpoints,
    disk_bytes,
    label,
    make_saver,
    median,
    run_invokes,
    run_loop,
    timed,
)
from kvsaver import KVSaver

WORKLOADS = {"loop": run_loop, "invokes": run_invokes}
ROUNDS = 3


@pytest.mark.parametrize("name", SAVERS)
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_graph(benchmark: Any, workload: str, name: str, tmp_path: Any) -> None:
    run = WORKLOADS[workload]
    plain = build_agent(None)
    warm = make_saver(name, str(tmp_path))  # warm-up, discarded
    run(build_agent(warm), "warmup", True, threads=2)
    run(plain, "warmup", False, threads=2)
    close_saver(warm)
    baseline: list[float] = []
    made: list[tuple[Any, str, str]] = []

    def setup() -> tuple[tuple[Any, ...], dict]:
        baseline.append(timed(lambda: run(plain, "none", False)))
        workdir = str(tmp_path / f"round{len(made)}")
        os.makedirs(workdir)
        saver = make_saver(name, workdir)
        prefix = f"{workload}-{len(made)}"
        made.append((saver, workdir, prefix))
        return (build_agent(saver), prefix, True), {}

    label(benchmark, f"graph:{workload}", name, 1)
    benchmark.pedantic(run, setup=setup, rounds=ROUNDS)

    if benchmark.stats is None:  # --benchmark-disable: a smoke run, nothing to record
        for s, _, _ in made:
            close_saver(s)
        return
    saver, workdir, prefix = made[-1]
    supersteps = count_checkpoints(saver, prefix)
    with_saver = benchmark.stats.stats.median
    without = median(baseline)
    info: dict[str, Any] = {
        "threads": GRAPH_THREADS,
        "turns_or_invokes": LOOP_TURNS if workload == "loop" else INVOKES,
        "supersteps": supersteps,
        "baseline_median_s": round(without, 4),
        "baseline_rounds_s": [round(b, 4) for b in baseline],
        "overhead_us_per_superstep": round((with_saver - without) / supersteps * 1e6, 1),
    }
    if isinstance(saver, KVSaver) and hasattr(saver.store, "info"):
        info["lmdb_used_bytes"] = saver.store.info().get("used_bytes")
    on_disk = name in ("kvsaver-lmdb", "sqlite")
    if on_disk:
        info["disk_bytes_open"] = disk_bytes(workdir)  # SqliteSaver: db + WAL + shm
    for s, _, _ in made:
        close_saver(s)  # SqliteSaver: the last close checkpoints and removes the WAL
    if on_disk:
        info["disk_bytes"] = disk_bytes(workdir)
    benchmark.extra_info.update(info)
