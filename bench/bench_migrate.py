"""Migration rate and sizes: SqliteSaver database -> KVSaver (issue #5).

    python bench/bench_migrate.py [--threads 100] [--turns 26] [--repeat 3]

Builds a SqliteSaver database by running a real LangGraph chat graph
(``messages`` with ``add_messages``, a ``facts`` dict, two nodes), with user
and assistant messages of a few hundred characters, over many threads: by
default 100 threads x 26 turns = 10,400 checkpoints (LangGraph makes four
per turn: the input, then one after each of ``__start__``, ``remember`` and
``reply``). Then times
``saver.migrate.migrate_from_sqlite`` (what ``python -m
tools.migrate_from_sqlite`` runs) into a fresh KVSaver directory ``--repeat``
times (durability "full", as the command's default; verification timed
separately, once), and prints checkpoints/s (median and range) and the sizes
before and after.

Not a pytest-benchmark suite (bench/conftest.py collects ``bench_*.py``; this
module defines no tests): the build alone takes about a minute.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from typing import Annotated, Any, TypedDict

from _workloads import disk_bytes, words_text
from kvsaver import KVSaver
from kvsaver.migrate import migrate_from_sqlite, open_sqlite_saver, verify
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

WORDS = (
    "the a checkpoint graph thread state message reply user assistant memory store "
    "order invoice shipping weather travel budget meeting schedule report draft "
    "summary question answer because therefore however perhaps tomorrow yesterday"
).split()


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    facts: dict[str, str]


def _text(rng: random.Random, lo: int, hi: int) -> str:
    return words_text(rng, rng.randint(lo, hi), WORDS)


def _remember(state: Chat) -> dict[str, Any]:
    facts = dict(state.get("facts") or {})
    text = str(state["messages"][-1].content)
    facts[f"turn{len(state['messages'])}"] = text[:40]
    return {"facts": facts}


def _reply(state: Chat) -> dict[str, Any]:
    n = len(state["messages"])
    rng = random.Random(n * 7919 + len(state.get("facts") or {}))
    return {"messages": [AIMessage(_text(rng, 300, 600), id=f"ai-{n}")]}


def build_graph(saver: SqliteSaver) -> Any:
    g = StateGraph(Chat)
    g.add_node("remember", _remember)
    g.add_node("reply", _reply)
    g.add_edge(START, "remember")
    g.add_edge("remember", "reply")
    g.add_edge("reply", END)
    return g.compile(checkpointer=saver)


def build_source(path: str, threads: int, turns: int, seed: int = 5) -> int:
    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    conn.execute("PRAGMA synchronous=OFF")  # build speed only; the file is the same
    graph = build_graph(saver)
    rng = random.Random(seed)
    for t in range(threads):
        config = {"configurable": {"thread_id": f"user-{t:04d}"}}
        for i in range(turns):
            msg = HumanMessage(_text(rng, 150, 450), id=f"u-{t}-{i}")
            graph.invoke({"messages": [msg]}, config)
    n = conn.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0]
    conn.close()
    return int(n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=100)
    ap.add_argument("--turns", type=int, default=26)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir, removed)")
    args = ap.parse_args()

    work = args.dir or tempfile.mkdtemp(prefix="bench-migrate-")
    os.makedirs(work, exist_ok=True)
    source = os.path.join(work, "source.sqlite")
    try:
        print(
            f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cpus, "
            f"load average {os.getloadavg()[0]:.2f}"
        )
        if not os.path.exists(source):
            t0 = time.perf_counter()
            n = build_source(source, args.threads, args.turns)
            print(
                f"built {source}: {n:,} checkpoints, {args.threads} threads x {args.turns} "
                f"turns, in {time.perf_counter() - t0:.1f} s"
            )
        con = sqlite3.connect(source)
        n = con.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0]
        writes = con.execute("SELECT COUNT(*) FROM writes").fetchone()[0]
        con.close()
        src_bytes = os.path.getsize(source)

        rates, secs, cpus = [], [], []
        dest = ""
        for r in range(args.repeat):
            dest = os.path.join(work, f"state-{r}")
            shutil.rmtree(dest, ignore_errors=True)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            # The whole call: opening, PRAGMA quick_check, counting, copying.
            stats = migrate_from_sqlite(source, dest, verify=False)
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            assert stats.checkpoints_copied == n
            rates.append(n / wall)
            secs.append(wall)
            cpus.append(cpu)
            print(
                f"  run {r + 1}: {wall:.2f} s wall ({stats.seconds:.2f} s copying), "
                f"{cpu:.2f} s CPU, {n / wall:,.0f} checkpoints/s "
                f"(load average {os.getloadavg()[0]:.2f})"
            )
        with KVSaver(dest, readonly=True) as kv:
            info = kv.store.info()  # type: ignore[attr-defined]
            t0 = time.perf_counter()
            src = open_sqlite_saver(source)
            try:
                compared = verify(src, kv, stats.namespace_list)
            finally:
                src.conn.close()
            verify_s = time.perf_counter() - t0
        kv_bytes = disk_bytes(dest)
        print()
        print(f"checkpoints        {n:,} ({writes:,} pending writes, {stats.threads} threads)")
        print(
            f"migration          median {statistics.median(secs):.2f} s = "
            f"{statistics.median(rates):,.0f} checkpoints/s "
            f"(min {min(rates):,.0f}, max {max(rates):,.0f}; {args.repeat} runs, "
            "durability full; the whole call, source checks included)"
        )
        print(
            f"CPU time           median {statistics.median(cpus):.2f} s = "
            f"{n / statistics.median(cpus):,.0f} checkpoints per CPU-second (the rate on an "
            "idle core; the machine is shared)"
        )
        print(
            f"verification       {compared:,} checkpoints in {verify_s:.2f} s "
            f"({compared / verify_s:,.0f}/s)"
        )
        print(f"SQLite file        {src_bytes / 1e6:,.1f} MB")
        print(
            f"KVSaver directory  {kv_bytes / 1e6:,.1f} MB on disk (data.mdb "
            f"{info['file_bytes'] / 1e6:,.1f} MB, {info['used_bytes'] / 1e6:,.1f} MB in use): "
            f"{kv_bytes / src_bytes:.2f}x the SQLite file"
        )
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
