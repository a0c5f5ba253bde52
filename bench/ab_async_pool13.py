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
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ab_async13 import compare
from kvsaver import KVSaver

_POOL = KVSaver._run


async def _default(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, functools.partial(fn, *args, **kwargs))


def _use(run: Any) -> None:
    KVSaver._run = run  # type: ignore[method-assign]


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    compare(
        {"pool": functools.partial(_use, _POOL), "default": functools.partial(_use, _default)},
        rounds,
        functools.partial(_use, _POOL),
    )


if __name__ == "__main__":
    main()
