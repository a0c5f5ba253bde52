"""32 concurrent conversations on one event loop (``ainvoke``).

An async server's shape: 32 conversations (threads), each doing TURNS
``ainvoke``s of the agent graph (bench/_workloads.py, ``build_agent``: 2 agent
turns per invoke, the thread's state reloaded each time), all 32 at once on
one event loop (``asyncio.gather``). Savers: KVSaver(dir) (LMDB, durability
"full") and AsyncSqliteSaver (aiosqlite), the reference; and the same work
with no checkpointer (the caller carries the messages), the baseline. Each
round runs all three, in an order that rotates every round, each saver on a
fresh store.

overhead / superstep = (time with the saver - time without, same round) /
checkpoints written; ``x_async_sqlite`` is the ratio of the median
overheads. A ticker task (``sleep(1 ms)`` in a loop)
records how late the loop wakes it: ``worst_lag_ms`` is the median over
rounds of each run's worst lateness (``worst_lag_ms_max``: the largest).
Results: bench/results/async.json.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import tempfile
import time
from typing import Any

from _workloads import (
    INVOKE_TURNS,
    KV_LMDB,
    build_agent,
    human,
    label,
    median,
    metric_rows,
    pick,
    record,
    rotated,
    target,
)
from kvsaver import KVSaver

CONVERSATIONS = 32
TURNS = pick(4, 2)
ROUNDS = pick(5, 2)
NONE, ASQLITE = "none", "async-sqlite"


async def _conversations(graph: Any, with_checkpointer: bool) -> None:
    async def one(c: int) -> None:
        carried: list[Any] = []
        for t in range(TURNS):
            msg = human(1000 * c + t)
            inp = {"turns": 0, "max_turns": INVOKE_TURNS}
            if with_checkpointer:
                cfg = {"configurable": {"thread_id": f"conv-{c}"}}
                await graph.ainvoke({"messages": [msg], **inp}, cfg)
            else:
                out = await graph.ainvoke({"messages": [*carried, msg], **inp})
                carried = out["messages"]

    await asyncio.gather(*(one(c) for c in range(CONVERSATIONS)))


async def _timed_run(name: str, workdir: str) -> tuple[float, float, int]:
    """(seconds, worst loop lag in seconds, checkpoints written)."""
    saver: Any = None
    conn: Any = None
    if name == KV_LMDB:
        saver = KVSaver(os.path.join(workdir, "kv"))
    elif name == ASQLITE:
        import aiosqlite
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        conn = await aiosqlite.connect(os.path.join(workdir, "cp.sqlite"))
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
    graph = build_agent(saver)
    done = False
    worst = 0.0

    async def ticker() -> None:
        nonlocal worst
        while not done:
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, time.perf_counter() - t0 - 0.001)

    tick = asyncio.create_task(ticker())
    t0 = time.perf_counter()
    await _conversations(graph, saver is not None)
    elapsed = time.perf_counter() - t0
    done = True
    await tick
    written = 0
    if saver is not None:
        written = len([t async for t in saver.alist(None)])
    if isinstance(saver, KVSaver):
        saver.close()
    if conn is not None:
        await conn.close()
    return elapsed, worst, written


def test_32_conversations(benchmark: Any) -> None:
    names = [NONE, KV_LMDB, ASQLITE]
    secs: dict[str, list[float]] = {n: [] for n in names}
    lags: dict[str, list[float]] = {n: [] for n in names}
    written: dict[str, int] = {}
    counter = itertools.count()
    top = tempfile.mkdtemp(prefix="bench-async-")

    def one_round(r: int) -> None:
        for name in rotated(names, r):
            workdir = os.path.join(top, f"{name}-{r}")
            os.makedirs(workdir)
            s, lag, n = asyncio.run(_timed_run(name, workdir))
            shutil.rmtree(workdir, ignore_errors=True)
            if r > 0:  # round 0 is the warm-up
                secs[name].append(s)
                lags[name].append(lag)
                if n:
                    written[name] = n

    label(benchmark, "async:32_conversations", "all savers", 1)
    try:
        benchmark.pedantic(one_round, setup=lambda: ((next(counter),), {}), rounds=ROUNDS + 1)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    assert written[KV_LMDB] == written[ASQLITE], written
    steps = written[KV_LMDB]
    over = {n: [(a - b) / steps for a, b in zip(secs[n], secs[NONE])] for n in (KV_LMDB, ASQLITE)}
    x = (
        # a ratio of medians: a round's overhead can come out near zero or
        # below on a busy machine, and a per-round ratio then means nothing
        round(median(over[KV_LMDB]) / median(over[ASQLITE]), 3)
        if median(over[ASQLITE]) > 0
        else None
    )
    record(
        "async",
        "async:32_conversations",
        f"{CONVERSATIONS} conversations x {TURNS} ainvokes at once on one event loop",
        metric_rows(
            seconds={n: round(median(v), 3) for n, v in secs.items()},
            overhead_us_per_superstep={n: round(median(v) * 1e6, 1) for n, v in over.items()},
            worst_lag_ms={n: round(median(v) * 1e3, 2) for n, v in lags.items()},
            worst_lag_ms_max={n: round(max(v) * 1e3, 2) for n, v in lags.items()},
        ),
        info={
            "conversations": CONVERSATIONS,
            "turns": TURNS,
            "rounds": ROUNDS,
            "supersteps": steps,
            "x_async_sqlite": x,
        },
        targets=[target("32 conversations: overhead vs AsyncSqliteSaver", x, 0.5)],
    )
