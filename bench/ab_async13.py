"""A/B of the LMDB gather rule (bench/ab_invokes13.py's "before" and "after")
on bench_async's 32 conversations: every variant, AsyncSqliteSaver and a run
without checkpointer in each round, order rotated, round 0 a warm-up;
overhead per superstep = (time - time without, same round) / checkpoints.

    python bench/ab_async13.py [ROUNDS]
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ab_invokes13 as A
import bench_async as B
from _workloads import rotated


def compare(
    variants: dict[str, Callable[[], None]], rounds: int, restore: Callable[[], None]
) -> None:
    """Time bench_async's 32 conversations with KVSaver under each variant
    (``variants[name]()`` installs it), AsyncSqliteSaver and no checkpointer,
    in rotating rounds (round 0 a warm-up), ``restore()`` at the end; print
    the median overheads, the worst loop lags and the first variant against
    the second."""
    names = ["none", *variants, "async-sqlite"]
    secs: dict[str, list[float]] = {n: [] for n in names}
    lags: dict[str, list[float]] = {n: [] for n in names}
    top = tempfile.mkdtemp(prefix="ab-async-")
    steps = 1
    try:
        for r in range(rounds):
            for n in rotated(names, r):
                wd = os.path.join(top, f"{n}-{r}")
                os.makedirs(wd)
                if n in variants:
                    variants[n]()
                    s, lag, w = asyncio.run(B._timed_run(B.KV_LMDB, wd))
                else:
                    name = B.ASQLITE if n == "async-sqlite" else B.NONE
                    s, lag, w = asyncio.run(B._timed_run(name, wd))
                shutil.rmtree(wd, ignore_errors=True)
                if r > 0:
                    secs[n].append(s)
                    lags[n].append(lag)
                if w:
                    steps = w
    finally:
        restore()
        shutil.rmtree(top, ignore_errors=True)
    over = {n: [(a - b) / steps * 1e6 for a, b in zip(secs[n], secs["none"])] for n in names[1:]}
    med = {n: statistics.median(v) for n, v in over.items()}
    print(f"load average {os.getloadavg()[0]:.2f}; overhead us/superstep, medians:")
    print({n: round(v) for n, v in med.items()})
    print(
        "worst loop lag, ms, median (largest): "
        + ", ".join(
            f"{n} {statistics.median(v) * 1e3:.0f} ({max(v) * 1e3:.0f})" for n, v in lags.items()
        )
    )
    new, old = list(variants)[:2]
    ratio = statistics.median(a / b for a, b in zip(over[new], over[old]))
    print(
        f"{new}/{old} (median of per-round ratios) {ratio:.3f}; x AsyncSqliteSaver: "
        + ", ".join(f"{n} {med[n] / med['async-sqlite']:.3f}" for n in variants)
    )


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    compare(
        {n: functools.partial(A._install, n) for n in ("after", "before")},
        rounds,
        functools.partial(A._install, "after"),
    )


if __name__ == "__main__":
    main()
