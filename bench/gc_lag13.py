"""What sets the worst event-loop lag of bench_async's 32 conversations
(issue #13): full garbage collections, timed with ``gc.callbacks``.

A measurement script, not a test. For each of KVSaver (LMDB), AsyncSqliteSaver
and no checkpointer, ``ROUNDS`` runs of bench_async's ``_timed_run`` (32
conversations ``ainvoke``d at once on one loop, a ticker measuring how late
the loop wakes it); per run: the worst loop lag and every collection that
took over 20 ms (generation, milliseconds). A collection holds the GIL, so it
stops the loop whichever thread triggered it.

    python bench/gc_lag13.py [ROUNDS]
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_async as B

_SLOW: list[tuple[int, int]] = []
_STARTED = [0.0]


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _STARTED[0] = time.perf_counter()
        return
    took = time.perf_counter() - _STARTED[0]
    if took > 0.02:
        _SLOW.append((info["generation"], round(took * 1e3)))


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    gc.callbacks.append(_on_gc)
    for r in range(rounds):
        for name in (B.KV_LMDB, B.ASQLITE, B.NONE):
            _SLOW.clear()
            with tempfile.TemporaryDirectory(prefix="gc-lag-") as wd:
                seconds, lag, _ = asyncio.run(B._timed_run(name, wd))
            print(
                f"round {r} {name:14s} {seconds:6.2f} s, worst loop lag {lag * 1e3:4.0f} ms, "
                f"collections over 20 ms (generation, ms): {_SLOW}"
            )


if __name__ == "__main__":
    main()
