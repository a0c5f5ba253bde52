"""Paired A/B of the CPU rows of issue #13 (KVSaver(":memory:") against
InMemorySaver), for two versions of the code in one process.

    python bench/ab_cpu13.py --old /tmp/old   # /tmp/old/kvsaver_old: main's
                                              # saver/ (and kv/ as .kv), imports renamed

Every round times each variant once, in an order that rotates every round:

* graph: ``process_time`` of a workload (bench/_workloads: the agent loop,
  or 2-turn invokes that reload the thread) minus the same workload with no
  checkpointer in the same round, per checkpoint written; LangGraph writes
  checkpoints from a background thread, hence process (not thread) time.
* put / put_writes: the calls a graph made (recorded once through an
  InMemorySaver, deep-copied; a message passed again is the same copy, as
  in the graph), replayed into a fresh saver; ``thread_time`` per call.

Ratios are medians over rounds of the per-round ratio to InMemorySaver
(AB13.md's method). Without ``--old`` only this checkout is measured.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _workloads import SaverClock, build_agent, run_invokes, run_loop
from kvsaver import KVSaver
from langgraph.checkpoint.memory import InMemorySaver


def _models(value: Any) -> Iterator[Any]:
    """The pydantic objects (messages) inside a saver call's arguments."""
    if hasattr(value, "model_dump"):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _models(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _models(v)


def record(run: Any, threads: int) -> list[tuple[str, tuple[Any, ...]]]:
    """The calls a graph made, deep-copied as they were made. A message
    object passed again in a later call (the history a graph puts at every
    step holds the same objects) is passed again as the same copy, as in
    the graph: ``saver/elements.py`` reuses the bytes of such messages."""
    calls: list[tuple[str, tuple[Any, ...]]] = []
    copies: dict[int, Any] = {}  # id(original message) -> its copy
    originals: list[Any] = []  # kept alive: their ids stay theirs

    def snapshot(args: tuple[Any, ...]) -> tuple[Any, ...]:
        memo = dict(copies)
        out = copy.deepcopy(args, memo)
        for m in _models(args):
            if id(m) not in copies:
                copies[id(m)] = memo[id(m)]
                originals.append(m)
        return out

    class Recording(InMemorySaver):
        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            calls.append(("put", snapshot((config, checkpoint, metadata, new_versions))))
            return super().put(config, checkpoint, metadata, new_versions)

        def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
            calls.append(("put_writes", snapshot((config, writes, task_id, task_path))))
            super().put_writes(config, writes, task_id, task_path)

    run(build_agent(Recording()), "rec", True, threads=threads)
    return calls


def replay(saver: Any, calls: list[tuple[str, tuple[Any, ...]]], kind: str) -> float:
    fn = getattr(saver, kind)
    todo = [args for k, args in calls if k == kind]
    t0 = time.thread_time()
    for args in todo:
        fn(*args)
    return (time.thread_time() - t0) / len(todo)


def graph_cpu(make: Any, run: Any, threads: int, tag: str) -> tuple[float, float, int]:
    """(process CPU of the workload, thread CPU inside the saver's methods,
    checkpoints written). The second excludes the graph's own work, so it is
    far less noisy on a loaded machine."""
    saver = make()
    clock = SaverClock(saver, time.thread_time, SaverClock.GRAPH_METHODS)
    graph = build_agent(saver)
    t0 = time.process_time()
    run(graph, tag, True, threads=threads)
    cpu = time.process_time() - t0
    n = sum(1 for _ in saver.list(None))
    return cpu, clock.total, n


def _row(per: dict, ratios: dict, names: list[str], digits: int) -> str:
    """Each variant's median and median ratio to InMemorySaver; with an old
    variant, also the median of the per-round new/old ratios."""
    med = statistics.median
    row = ", ".join(
        f"{n} {med(per[n]) * 1e6:,.{digits}f} us ({med(ratios[n]):.2f}x)" for n in names
    )
    if "old" in per:
        row += f"; new/old {med(a / b for a, b in zip(per['new'], per['old'])):.2f}"
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--old", help="directory holding the kvsaver_old package")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=6)
    parser.add_argument("--only", choices=["graph", "ops"], default=None)
    parser.add_argument(
        "--workload", choices=["loop", "invokes"], default="loop", help="ops: whose calls"
    )
    args = parser.parse_args(argv)
    variants: dict[str, Any] = {"inmemory": InMemorySaver, "new": lambda: KVSaver(":memory:")}
    if args.old:
        sys.path.insert(0, args.old)
        from kvsaver_old import KVSaver as OldKVSaver

        variants["old"] = lambda: OldKVSaver(":memory:")
    names = list(variants)
    if args.only != "ops":
        for wname, run in (("loop", run_loop), ("invokes", run_invokes)):
            plain = build_agent(None)
            for make in variants.values():  # warm-up, discarded
                graph_cpu(make, run, 2, "warm")
            ratios: dict[str, list[float]] = {n: [] for n in names}
            per: dict[str, list[float]] = {n: [] for n in names}
            in_ratios: dict[str, list[float]] = {n: [] for n in names}
            in_per: dict[str, list[float]] = {n: [] for n in names}
            for r in range(args.rounds):
                t0 = time.process_time()
                run(plain, "none", False, threads=args.threads)
                base = time.process_time() - t0
                got, got_in = {}, {}
                for n in names[r % len(names) :] + names[: r % len(names)]:
                    cpu, inside, steps = graph_cpu(variants[n], run, args.threads, f"{wname}{r}")
                    got[n] = (cpu - base) / steps
                    got_in[n] = inside / steps
                for n in names:
                    per[n].append(got[n])
                    ratios[n].append(got[n] / got["inmemory"])
                    in_per[n].append(got_in[n])
                    in_ratios[n].append(got_in[n] / got_in["inmemory"])
            row = _row(per, ratios, names, 0)
            print(f"graph:{wname} overhead/checkpoint: {row}", flush=True)
            row = _row(in_per, in_ratios, names, 0)
            print(f"graph:{wname} CPU in saver calls/checkpoint: {row}", flush=True)
    if args.only != "graph":
        calls = record(run_loop if args.workload == "loop" else run_invokes, args.threads)
        for kind in ("put", "put_writes"):
            for make in variants.values():
                replay(make(), calls, kind)
            ratios = {n: [] for n in names}
            per = {n: [] for n in names}
            for r in range(args.rounds * 3):
                got = {}
                for n in names[r % len(names) :] + names[: r % len(names)]:
                    got[n] = replay(variants[n](), calls, kind)
                for n in names:
                    per[n].append(got[n])
                    ratios[n].append(got[n] / got["inmemory"])
            row = _row(per, ratios, names, 1)
            print(f"{kind} (graph's calls): {row}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
