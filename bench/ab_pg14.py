"""Paired A/B of issue #14's writes on PostgreSQL: this checkout's PostgresStore
against another revision's ``kv/postgres.py`` (the saver code is this
checkout's for both), with PostgresSaver, on one throwaway server, one process.

    python bench/ab_pg14.py [--rev 6ed9d40] [--rounds 9] [--ops 50] [--puts-only | --graph]

Every round gives each of the three savers a fresh thread of ``--ops`` puts
(bench/_workloads.ThreadGen), each put followed by a put_writes of 3 writes on
it (what a graph superstep writes), the savers' calls alternating one by one
in an order rotated every call. Per call: wall time and this thread's CPU
(``thread_time``: psycopg's work and the kernel's for its socket, not the
server's). Reported: medians per call, and the median of the per-round
ratios (their lowest and highest) new/old, new/PostgresSaver and
old/PostgresSaver. Tells a store change's effect apart from the machine's
drift, which moved bench_postgres's put ratio by 0.2 between runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from _workloads import ThreadGen, build_agent, rotated, run_loop, task_id, writes_for
from kvsaver import KVSaver
from kvsaver.kv import PostgresStore

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def old_store_class(rev: str) -> Any:
    """``PostgresStore`` of ``rev``'s kv/postgres.py, loaded beside ours as
    ``kvsaver.kv._postgres_ab`` (its relative imports find our kv/)."""
    text = subprocess.run(
        ["git", "show", f"{rev}:kv/postgres.py"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    path = os.path.join(tempfile.mkdtemp(prefix="kvsaver-ab-"), "_postgres_ab.py")
    with open(path, "wb") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location("kvsaver.kv._postgres_ab", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.PostgresStore


def graph_rounds(savers: dict[str, Any], rounds: int) -> None:
    """Per round, the agent loop once without a saver and once with each, in
    an order rotated every round: (time with - time without) / checkpoints."""
    plain = build_agent(None)
    run_loop(plain, "warm", False, threads=1)
    graphs = {n: build_agent(s) for n, s in savers.items()}
    per: dict[str, list[float]] = {n: [] for n in savers}
    order: list[str | None] = [None, *savers]
    for r in range(rounds):
        took: dict[str | None, float] = {}
        for n in rotated(order, r):
            t = time.perf_counter()
            run_loop(plain if n is None else graphs[n], f"g-{n}-{r}", n is not None, threads=1)
            took[n] = time.perf_counter() - t
        for n, s in savers.items():
            steps = len(list(s.list({"configurable": {"thread_id": f"g-{n}-{r}-0"}})))
            per[n].append((took[n] - took[None]) / steps)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    names = list(savers)
    print("graph overhead per superstep, us: " + "  ".join(
        f"{n} {statistics.median(per[n]) * 1e6:.0f}" for n in names
    ))  # fmt: skip
    for a, b in (("new", "old"), ("new", "PostgresSaver"), ("old", "PostgresSaver")):
        ratios = [x / y for x, y in zip(per[a], per[b])]
        print(f"  {a}/{b}: {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="6ed9d40", help="the old revision (git)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--ops", type=int, default=50)
    ap.add_argument("--puts-only", action="store_true", help="no put_writes between puts")
    ap.add_argument(
        "--graph",
        action="store_true",
        help="instead: bench_postgres's graph row (the agent loop, one thread of 30 turns "
        "per saver and round, and once without a saver): overhead per superstep",
    )
    args = ap.parse_args(argv)
    from langgraph.checkpoint.postgres import PostgresSaver
    from pg_helpers import PgServer, Unavailable

    try:
        server = PgServer()
    except Unavailable as e:
        print(f"skipped: {e}")
        return 0
    old_cls = old_store_class(args.rev)
    server.start(durable=True)
    try:
        cm = PostgresSaver.from_conn_string(server.url)
        pg = cm.__enter__()
        pg.setup()
        savers: dict[str, Any] = {
            "new": KVSaver(PostgresStore(server.url, table="kv_new")),
            "old": KVSaver(old_cls(server.url, table="kv_old")),
            "PostgresSaver": pg,
        }
        print(f"load average {os.getloadavg()[0]:.2f}; old = {args.rev}")
        if args.graph:
            graph_rounds(savers, args.rounds)
        else:
            paired_rounds(savers, args.rounds, args.ops, args.puts_only)
        for n in ("new", "old"):
            savers[n].close()
        cm.__exit__(None, None, None)
    finally:
        server.stop()
    return 0


def paired_rounds(savers: dict[str, Any], rounds: int, n_ops: int, puts_only: bool) -> None:
    """put (and put_writes) calls of the savers alternating one by one."""
    names = list(savers)
    rows = ("put",) if puts_only else ("put", "put_writes")
    per: dict[tuple[str, str, str], list[float]] = {}  # (row, wall|cpu, saver): round medians
    for r in range(rounds):
        gens = {n: ThreadGen(s, f"ab-{n}-{r}") for n, s in savers.items()}
        ops = {n: [g.next() for _ in range(n_ops)] for n, g in gens.items()}
        got: dict[tuple[str, str, str], list[float]] = {}
        for i in range(n_ops):
            for n in rotated(names, r + i):
                saver, a = savers[n], ops[n][i]
                on = {**a.config["configurable"], "checkpoint_id": a.checkpoint["id"]}
                calls = (
                    lambda s=saver, a=a: s.put(a.config, a.checkpoint, a.metadata, a.new_versions),
                    lambda s=saver, on=on, i=i: s.put_writes(
                        {"configurable": on}, writes_for(i), task_id(i)
                    ),
                )
                for row, call in zip(rows, calls):
                    c, t = time.thread_time(), time.perf_counter()
                    call()
                    got.setdefault((row, "wall", n), []).append(time.perf_counter() - t)
                    got.setdefault((row, "cpu", n), []).append(time.thread_time() - c)
        for k, v in got.items():
            per.setdefault(k, []).append(statistics.median(v))
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    for row in rows:
        for kind in ("wall", "cpu"):
            us = "  ".join(f"{n} {statistics.median(per[(row, kind, n)]) * 1e6:.0f}" for n in names)
            print(f"{row:<10} {kind:<4} us: {us}")
            for a, b in (("new", "old"), ("new", "PostgresSaver"), ("old", "PostgresSaver")):
                ratios = [x / y for x, y in zip(per[(row, kind, a)], per[(row, kind, b)])]
                print(
                    f"{'':<16}{a}/{b}: {statistics.median(ratios):.3f} "
                    f"({min(ratios):.3f}-{max(ratios):.3f})"
                )


if __name__ == "__main__":
    raise SystemExit(main())
