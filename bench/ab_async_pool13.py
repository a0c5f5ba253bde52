"""A/B of where KVSaver's async calls run, on bench_async's 32 conversations
(one event loop, ``ainvoke``): the saver's own pool of threads (``pool``, the
code as it is) against the loop's default executor (``default``, as before),
with AsyncSqliteSaver and a run without checkpointer in each round; order
rotated every round, round 0 a warm-up. Overhead per superstep = (time -
time without, same round) / checkpoints.

    python bench/ab_async_pool13.py [ROUNDS]
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import statistics
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_async as B
from kvsaver import KVSaver

_POOL = KVSaver._run


async def _default(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, functools.partial(fn, *args, **kwargs))


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    names = ["none", "pool", "default", "async-sqlite"]
    secs: dict[str, list[float]] = {n: [] for n in names}
    top = tempfile.mkdtemp(prefix="ab-async-pool-")
    steps = 1
    try:
        for r in range(rounds):
            for n in names[r % 4 :] + names[: r % 4]:
                wd = os.path.join(top, f"{n}-{r}")
                os.makedirs(wd)
                if n in ("pool", "default"):
                    KVSaver._run = _POOL if n == "pool" else _default  # type: ignore[method-assign]
                    s, _, w = asyncio.run(B._timed_run(B.KV_LMDB, wd))
                else:
                    name = B.ASQLITE if n == "async-sqlite" else B.NONE
                    s, _, w = asyncio.run(B._timed_run(name, wd))
                shutil.rmtree(wd, ignore_errors=True)
                if r > 0:
                    secs[n].append(s)
                if w:
                    steps = w
    finally:
        KVSaver._run = _POOL  # type: ignore[method-assign]
        shutil.rmtree(top, ignore_errors=True)
    over = {n: [(a - b) / steps * 1e6 for a, b in zip(secs[n], secs["none"])] for n in names[1:]}
    med = {n: statistics.median(v) for n, v in over.items()}
    print(f"load average {os.getloadavg()[0]:.2f}; overhead us/superstep, medians:")
    print({n: round(v) for n, v in med.items()})
    ratio = statistics.median(a / b for a, b in zip(over["pool"], over["default"]))
    print(
        f"pool/default (median of per-round ratios) {ratio:.3f}; x AsyncSqliteSaver: "
        f"pool {med['pool'] / med['async-sqlite']:.3f}, "
        f"default {med['default'] / med['async-sqlite']:.3f}"
    )


if __name__ == "__main__":
    main()
