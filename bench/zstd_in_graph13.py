"""What the small-value zstd calls of put/put_writes cost inside a real graph
(issue #13, the CPU rows): KVSaver(":memory:") in the agent loop, variants in
the same process, paired rounds in rotating order, medians of per-round ratios.

    python bench/zstd_in_graph13.py [--rounds 7] [--workload loop|invokes]

Variants (thread CPU inside put / put_writes, and the process CPU of the run):

* ``inmemory``: InMemorySaver, the reference.
* ``kvsaver``: KVSaver(":memory:") as it is.
* ``no-small-zstd``: ``compress_small`` returns its input (values stored
  uncompressed: what the zstd calls cost, all included).
* ``zstd-at-end``: as ``no-small-zstd``, plus the same zstd calls (one per
  put_writes, two per put, on the bytes the call would have compressed) made
  after the call has done everything else. The gap to ``kvsaver`` is what the
  calls cost by releasing the GIL in the middle of the call: LangGraph runs
  put/put_writes in worker threads while its main thread runs the next step,
  and the rest of the call then runs after a GIL hand-off.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ab_methods13
from _workloads import run_invokes, run_loop
from kvsaver import KVSaver
from langgraph.checkpoint.memory import InMemorySaver


def _kvsaver(kind: str) -> Callable[[], Any]:
    def make() -> Any:
        saver = KVSaver(":memory:")
        if kind == "kvsaver":
            return saver
        comp = saver.serde
        last: list[bytes] = [b""]

        def skip(typ: str, data: bytes, *, remember: bool = True) -> tuple[str, bytes]:
            last[0] = data
            return typ, data

        comp.compress_small = skip  # type: ignore[method-assign]
        if kind == "zstd-at-end":
            put, put_writes = saver.put, saver.put_writes

            def put_then(*a: Any, **kw: Any) -> Any:
                out = put(*a, **kw)
                for _ in range(2):
                    comp._compress(last[0], small=True)
                return out

            def put_writes_then(*a: Any, **kw: Any) -> Any:
                out = put_writes(*a, **kw)
                comp._compress(last[0], small=True)
                return out

            saver.put, saver.put_writes = put_then, put_writes_then
        return saver

    return make


def _run(make: Callable[[], Any], run: Any, tag: str, threads: int) -> dict[str, float]:
    """put's and put_writes' thread CPU and the process CPU, per checkpoint (µs)."""
    out = ab_methods13._run(make, run, tag, threads, methods=("put", "put_writes"))
    return {
        "put": out["put"],
        "put_writes": out["put_writes"],
        "process": out["process"] / out["steps"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=6)
    parser.add_argument("--workload", choices=["loop", "invokes"], default="loop")
    args = parser.parse_args(argv)
    run = run_loop if args.workload == "loop" else run_invokes
    variants: dict[str, Callable[[], Any]] = {
        "inmemory": InMemorySaver,
        **{k: _kvsaver(k) for k in ("kvsaver", "no-small-zstd", "zstd-at-end")},
    }
    names = list(variants)
    got: dict[str, dict[str, list[float]]] = {n: defaultdict(list) for n in names}
    for r in range(args.rounds):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            for k, v in _run(variants[n], run, f"{n}{r}", args.threads).items():
                got[n][k].append(v)
    med = statistics.median
    for k in ("put", "put_writes", "process"):
        ratios = {
            n: med(a / b for a, b in zip(got[n][k], got["kvsaver"][k]) if b > 0) for n in names
        }
        row = ", ".join(f"{n} {med(got[n][k]):,.0f} us ({ratios[n]:.3f})" for n in names)
        print(f"{k} per checkpoint (x kvsaver): {row}")
    print(f"load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
