"""KVSaver on PostgreSQL against PostgresSaver on the same server, same run.

    pytest bench/test_postgres.py --benchmark-only -s

Workloads (both savers on one database of one server; put, get_tuple and
list are paired: the two savers' calls alternate one by one, A B B A ..., so
a change in the machine's load hits both alike). Each round gives a ratio
(KVSaver's median / PostgresSaver's median in that round); the ratio
reported is the median of the per-round ratios, printed with their lowest
and highest ("rounds"), so a figure is seen with its spread:
  put              50 puts per round on a fresh thread (bench/_workloads.ThreadGen:
                   10 channels, 1-2 changed per put, a growing message list);
                   "floor:commit" in the same rounds: BEGIN, an INSERT of 2.9 KB,
                   COMMIT in one round trip on a plain connection (one WAL flush:
                   what a durable put waits for at least), each saver's put also
                   given as "x floor"
  put:51-100       the same, on threads of 50 checkpoints put before (untimed):
                   checkpoints 51 to 100 (not a target: how a
                   put's cost moves as a conversation grows)
  get_tuple        latest checkpoint of a 100-checkpoint thread with 3 pending
                   writes, 50 calls per round
  list:limit10     list(thread, limit=10) read through, 20 calls per round
  graph            a real LangGraph agent loop (bench/_workloads.build_agent),
                   3 threads x 30 turns, 12 rounds (fewer let the figure move
                   between runs); each thread run without a
                   saver and with each saver back to back, order rotated; per
                   round, overhead per superstep = (with saver - without) /
                   checkpoints
  bytes            three workloads, each saver in a database of its own, then
                   VACUUM FULL: table + indexes + TOAST of each saver's tables
                   (KVSaver's heap / index / TOAST and rows per keyspace too):
                   "long chat" (one thread, 60 invokes of 2 agent turns),
                   "agent loop" (5 threads x one 30-turn invoke: the target),
                   "short threads" (200 threads x one 2-turn invoke)

Targets: put, get_tuple, list, graph <= 1.0x PostgresSaver; bytes of the agent
loop and the long chat <= 0.3x.

The client's CPU per operation (time.process_time: the whole process, so
psycopg's and the pool's threads too; medians as above) is printed as well: a
put's wall time is mostly the WAL flush both savers wait for at each commit
(one each), so on a busy disk the wall ratio tends to 1.0 whatever the client
does, and the CPU figure shows what each saver costs the application.

KVSAVER_BENCH_PG_AB=1 adds a third saver to the paired rounds: KVSaver with
``PostgresStore(..., prepare=False)``, whose statements are all parsed and
planned by the server every time (an A/B of the prepared statements in the
same run, ratios to PostgresSaver alike).

The server: a throwaway cluster started here with PostgreSQL's default
durability (fsync and synchronous_commit on: a commit is a WAL flush, as in
production), or the one named by KVSAVER_BENCH_PG_URL. Skipped, with the
reason, where PostgreSQL is not installed. Results: bench/results/postgres.json
(groups ``postgres:ops`` and ``postgres:bytes``).
The smoke mode (``--quick``) runs 2 rounds of 10 calls and small byte workloads.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from _workloads import (
    ThreadGen,
    build_agent,
    fresh_database,
    human,
    pick,
    record,
    run_loop,
    target,
    task_id,
    writes_for,
)
from kvsaver import KVSaver

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

ROUNDS = pick(7, 2)
GRAPH_ROUNDS = pick(12, 2)
PUTS = pick(50, 10)
READS = pick(50, 10)
LISTS = pick(20, 5)
HISTORY = pick(100, 20)
GRAPH_THREADS = pick(3, 1)
CHAT_INVOKES = pick(60, 6)
LOOP_THREADS = pick(5, 1)
SHORT_THREADS = pick(200, 10)
METHOD = (
    "ratio = median over rounds of (KVSaver's round median / PostgresSaver's round "
    "median), each round pairing the savers' calls one by one; graph: per round, "
    "(time with the saver - time without) / checkpoints, each thread run without and "
    "with every saver back to back, order rotated; "
    "'rounds': the lowest and highest per-round ratio"
)
PG_TABLES = ["checkpoints", "checkpoint_blobs", "checkpoint_writes", "checkpoint_migrations"]
# KVSAVER_BENCH_PG_AB=1: also KVSaver without its prepared write statement (A/B)
AB = os.environ.get("KVSAVER_BENCH_PG_AB") == "1"
UNPREPARED = "KVSaver(prepare=False)"
# The floor of a durable write on this server, in the put rounds: one round
# trip of BEGIN, one INSERT of a new key with FLOOR_BYTES of value, COMMIT
# (one WAL flush), on a plain psycopg connection: what any saver's put waits
# for at least, timed in the same rounds as the savers' puts.
FLOOR = "floor:commit"
LATER = f"put:{PUTS + 1}-{2 * PUTS}"  # not a target: fresh threads of PUTS puts made untimed first
FLOOR_BYTES = 2_900  # about the WAL bytes of a KVSaver put (pg_stat_wal)


@pytest.fixture(scope="module")
def server_url(pg_url: str | None) -> str:
    if pg_url is None:
        pytest.skip("PostgreSQL is not installed")
    return pg_url


def _savers(url: str, ab: bool = False) -> dict[str, Any]:
    """The two savers; ``ab``: also KVSaver with ``prepare=False`` (its
    statements parsed and planned at every call), in the same rounds."""
    from kvsaver.kv import PostgresStore
    from langgraph.checkpoint.postgres import PostgresSaver

    pg_cm = PostgresSaver.from_conn_string(url)
    pg = pg_cm.__enter__()
    pg.setup()
    pg._bench_cm = pg_cm  # type: ignore[attr-defined]
    savers = {"KVSaver": KVSaver(url), "PostgresSaver": pg}
    if ab:
        store = PostgresStore(url, table="kv_unprepared", prepare=False)
        savers[UNPREPARED] = KVSaver(store)
    return savers


def _close(savers: dict[str, Any]) -> None:
    for name, saver in savers.items():
        if name == "PostgresSaver":
            saver._bench_cm.__exit__(None, None, None)
        else:
            saver.close()
            if name == UNPREPARED:
                saver.store.close()  # a passed-in store is not closed by the saver


Rounds = tuple[dict[str, list[float]], dict[str, list[float]]]  # wall, CPU: per round


def _paired(
    savers: dict[str, Any], calls: Callable[[str, Any, int], list[Callable[[], Any]]]
) -> Rounds:
    """``calls(name, saver, round)`` -> that round's operations (made untimed);
    the savers' operations run alternately, one by one (A B, then B A); the
    median per round: seconds per operation, one figure per round, wall and
    the process's CPU (the client's: psycopg and its pool included)."""
    names = list(savers)
    per: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(ROUNDS):
        ops = {n: calls(n, savers[n], r) for n in names}
        times: dict[str, list[float]] = {n: [] for n in names}
        cpus: dict[str, list[float]] = {n: [] for n in names}
        for i in range(max(len(v) for v in ops.values())):
            for n in names if i % 2 == 0 else names[::-1]:
                if i < len(ops[n]):
                    c = time.process_time()
                    t = time.perf_counter()
                    ops[n][i]()
                    times[n].append(time.perf_counter() - t)
                    cpus[n].append(time.process_time() - c)
        for n in names:
            per[n].append(statistics.median(times[n]))
            cpu[n].append(statistics.median(cpus[n]))
    return per, cpu


def _puts(name: str, saver: Any, r: int, done: int = 0) -> list[Callable[[], Any]]:
    """PUTS puts on a fresh thread, after ``done`` put here (untimed)."""
    gen = ThreadGen(saver, f"put-{name}-{r}-{done}")
    for _ in range(done):
        a = gen.next()
        saver.put(a.config, a.checkpoint, a.metadata, a.new_versions)
    ops = [gen.next() for _ in range(PUTS)]
    return [lambda a=a: saver.put(a.config, a.checkpoint, a.metadata, a.new_versions) for a in ops]


def _later_puts(name: str, saver: Any, r: int) -> list[Callable[[], Any]]:
    """Checkpoints PUTS+1 to 2*PUTS of a thread: PostgresSaver stores a channel's
    whole value at each version (the message list grows), KVSaver a delta."""
    return _puts(name, saver, r, done=PUTS)


class CommitFloor:
    """A durable write and nothing else: see FLOOR."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute("CREATE TABLE IF NOT EXISTS commit_floor (k bytea PRIMARY KEY, v bytea)")
        self.cur = self.conn.cursor(binary=True)
        self.n = 0

    def commit(self, value: bytes) -> None:
        self.n += 1
        with self.conn.pipeline():
            self.cur.execute("BEGIN")
            self.cur.execute(
                "INSERT INTO commit_floor (k, v) VALUES (%b, %b)",
                (self.n.to_bytes(8, "big"), value),
            )
            self.cur.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()


def _puts_and_floor(name: str, saver: Any, r: int) -> list[Callable[[], Any]]:
    if name != FLOOR:
        return _puts(name, saver, r)
    values = [os.urandom(FLOOR_BYTES) for _ in range(PUTS)]
    return [lambda v=v: saver.commit(v) for v in values]


def _history(saver: Any, thread: str) -> dict[str, Any]:
    gen = ThreadGen(saver, thread, window=40)
    for _ in range(HISTORY):
        a = gen.next()
        saver.put(a.config, a.checkpoint, a.metadata, a.new_versions)
    saver.put_writes(gen.config(), writes_for(HISTORY), task_id(1))
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


def _graph(savers: dict[str, Any]) -> Rounds:
    """Per round, each of the 3 threads is run (one invoke of the 30-turn
    loop) without a saver and then with each saver, back to back, in an
    order rotated from one thread to the next (so a change in the machine's
    load hits every saver alike); a saver's overhead per superstep in that
    round = (its time - the time without a saver) / checkpoints written."""
    plain = build_agent(None)
    run_loop(plain, "warm", False, threads=1)
    graphs = {n: build_agent(s) for n, s in savers.items()}
    per: dict[str, list[float]] = {n: [] for n in savers}
    cpu: dict[str, list[float]] = {n: [] for n in savers}
    order = [None, *savers]
    for r in range(GRAPH_ROUNDS):
        took = dict.fromkeys(savers, 0.0)
        used = dict.fromkeys(savers, 0.0)
        steps = dict.fromkeys(savers, 0)
        base = base_cpu = 0.0
        for i in range(GRAPH_THREADS):
            k = (r * GRAPH_THREADS + i) % len(order)
            for n in order[k:] + order[:k]:
                prefix = f"graph-{n}-{r}-{i}"
                c = time.process_time()
                t = time.perf_counter()
                run_loop(plain if n is None else graphs[n], prefix, n is not None, threads=1)
                spent = time.perf_counter() - t
                spent_cpu = time.process_time() - c
                if n is None:
                    base += spent
                    base_cpu += spent_cpu
                    continue
                took[n] += spent
                used[n] += spent_cpu
                steps[n] += len(
                    list(savers[n].list({"configurable": {"thread_id": f"{prefix}-0"}}))
                )
        for n in savers:
            per[n].append((took[n] - base) / steps[n])
            cpu[n].append((used[n] - base_cpu) / steps[n])
    return per, cpu


def _long_chat(graph: Any) -> None:
    from langchain_core.messages import HumanMessage

    cfg = {"configurable": {"thread_id": "long-chat"}}
    for i in range(CHAT_INVOKES):
        graph.invoke(
            {"messages": [HumanMessage(content=f"turn {i} " * 30)], "turns": 0, "max_turns": 2},
            cfg,
        )


def _short_threads(graph: Any) -> None:
    for t in range(SHORT_THREADS):
        cfg = {"configurable": {"thread_id": f"short-{t}"}}
        graph.invoke({"messages": [human(100 * t)], "turns": 0, "max_turns": 2}, cfg)


# The bytes workloads: the long chat; an agent loop on a few threads (the
# shape of an outside check's graph run); many threads of one short invoke.
BYTES_WORKLOADS: dict[str, Callable[[Any], None]] = {
    "long chat": _long_chat,
    "agent loop": lambda graph: run_loop(graph, "loop", True, threads=LOOP_THREADS),
    "short threads": _short_threads,
}
BYTES_HEADLINE = "agent loop"


def _sizes(conn: Any, tables: list[str]) -> dict[str, int]:
    """heap, indexes and TOAST of ``tables`` after VACUUM FULL."""
    from psycopg import sql

    out = {"heap": 0, "index": 0, "toast": 0, "total": 0}
    for t in tables:
        conn.execute(sql.SQL("VACUUM FULL {}").format(sql.Identifier(t)))
        row = conn.execute(
            "SELECT pg_relation_size(c.oid), pg_indexes_size(c.oid),"
            " coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0),"
            " pg_total_relation_size(c.oid) FROM pg_class c WHERE c.oid = to_regclass(%s)",
            (t,),
        ).fetchone()
        if row is not None:
            for k, v in zip(("heap", "index", "toast", "total"), row):
                out[k] += int(v)
    return out


def _rows_by_keyspace(conn: Any) -> dict[str, int]:
    """KVSaver's rows per keyspace (the first element of each key)."""
    from kvsaver.kv.keys import unpack

    counts: dict[str, int] = {}
    for (key,) in conn.execute("SELECT key FROM kv_store"):
        ks = str(unpack(bytes(key))[0])
        counts[ks] = counts.get(ks, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _bytes(url: str) -> dict[str, dict[str, Any]]:
    """Each workload per saver in a database of its own, then VACUUM FULL:
    table + indexes + TOAST of each saver's tables."""
    import psycopg

    out: dict[str, dict[str, Any]] = {}
    for workload, run in BYTES_WORKLOADS.items():
        entry: dict[str, Any] = {}
        for name in ("KVSaver", "PostgresSaver"):
            db = fresh_database(url, f"bytes_{name.lower()}")
            savers = _savers(db)
            run(build_agent(savers[name]))
            _close(savers)
            tables = ["kv_store"] if name == "KVSaver" else PG_TABLES
            with psycopg.connect(db, autocommit=True) as conn:
                sizes = _sizes(conn, tables)
                entry[name] = sizes["total"]
                entry[name + " layout"] = sizes
                if name == "KVSaver":
                    entry["KVSaver rows"] = _rows_by_keyspace(conn)
        entry["ratio"] = entry["KVSaver"] / entry["PostgresSaver"]
        out[workload] = entry
    return out


def test_kvsaver_vs_postgressaver(benchmark: Any, server_url: str) -> None:
    def run_all() -> dict[str, Any]:
        url = fresh_database(server_url, "bench_ops")
        savers = _savers(url, ab=AB)
        try:
            floor = CommitFloor(url)
            try:
                results: dict[str, Rounds] = {
                    "put": _paired({**savers, FLOOR: floor}, _puts_and_floor)
                }
            finally:
                floor.close()
            results[LATER] = _paired(savers, _later_puts)
            configs = {n: _history(s, f"read-{n}") for n, s in savers.items()}
            results["get_tuple"] = _paired(
                savers, lambda n, s, r: [lambda: s.get_tuple(configs[n])] * READS
            )
            results["list:limit10"] = _paired(
                savers, lambda n, s, r: [lambda: list(s.list(configs[n], limit=10))] * LISTS
            )
            results["graph (per superstep)"] = _graph(savers)
        finally:
            _close(savers)
        sizes = _bytes(server_url)
        return {"seconds": results, "bytes": sizes}

    load_start = os.getloadavg()
    out = benchmark.pedantic(run_all, rounds=1, iterations=1)
    rows = []
    report: dict[str, Any] = {
        "method": METHOD,
        "loadavg": {"start": load_start, "end": os.getloadavg()},
        "microseconds": {},
    }
    for op, (v, cpu) in out["seconds"].items():
        entry: dict[str, Any] = {}
        for n in v:
            entry["cpu " + n] = statistics.median(cpu[n]) * 1e6
            suffix = "" if n == "KVSaver" else " " + n
            if n != "PostgresSaver":
                rounds = [a / b for a, b in zip(v[n], v["PostgresSaver"])]
                entry["ratio" + suffix] = statistics.median(rounds)
                entry["ratio rounds" + suffix] = [round(x, 3) for x in rounds]
            entry[n] = statistics.median(v[n]) * 1e6
        report["microseconds"][op] = entry
        rounds = entry["ratio rounds"]
        rows.append(
            (op, entry["KVSaver"], entry["PostgresSaver"], entry["ratio"], min(rounds), max(rounds))
        )
        entry["cpu ratio"] = entry["cpu KVSaver"] / entry["cpu PostgresSaver"]
        if FLOOR in v:  # each saver against the commit floor of the same rounds
            for n in v:
                if n != FLOOR:
                    entry["x floor " + n] = statistics.median(a / f for a, f in zip(v[n], v[FLOOR]))
    report["bytes"] = out["bytes"]
    _record(report)
    print()
    load = report["loadavg"]
    print(f"load average {load['start'][0]:.2f} at start, {load['end'][0]:.2f} at end")
    print(f"{'workload':<24}{'KVSaver us':>12}{'PostgresSaver us':>18}{'ratio':>8}  rounds")
    for op, k, p, r, lo, hi in rows:
        print(f"{op:<24}{k:>12.0f}{p:>18.0f}{r:>8.2f}  {lo:.2f}-{hi:.2f}")
        m = report["microseconds"][op]
        if FLOOR in m:
            print(f"{'  ' + FLOOR:<24}{m[FLOOR]:>12.0f}{'':>18}"
                  f"{m['ratio ' + FLOOR]:>8.2f}  (x floor: KVSaver "
                  f"{m['x floor KVSaver']:.2f}, PostgresSaver "
                  f"{m['x floor PostgresSaver']:.2f})")  # fmt: skip
        if AB:
            rounds = m["ratio rounds " + UNPREPARED]
            spread = f"{min(rounds):.2f}-{max(rounds):.2f}"
            print(f"{'  ' + UNPREPARED:<24}{m[UNPREPARED]:>12.0f}{'':>18}"
                  f"{m['ratio ' + UNPREPARED]:>8.2f}  {spread}")  # fmt: skip
    print("bytes after VACUUM FULL (table + indexes + TOAST); KVSaver's heap / index / TOAST:")
    for workload, b in report["bytes"].items():
        lay = b["KVSaver layout"]
        split = f"{lay['heap']:,} / {lay['index']:,} / {lay['toast']:,}"
        print(f"{'  ' + workload:<24}{b['KVSaver']:>12,}{b['PostgresSaver']:>18,}"
              f"{b['ratio']:>8.2f}  {split}")  # fmt: skip
    print("client CPU per operation (process_time, medians; graph: with - without saver):")
    for op, m in report["microseconds"].items():
        print(f"{op:<24}{m['cpu KVSaver']:>12.0f}{m['cpu PostgresSaver']:>18.0f}"
              f"{m['cpu ratio']:>8.2f}")  # fmt: skip
        if AB:
            kv = m["cpu " + UNPREPARED]
            print(f"{'  ' + UNPREPARED:<24}{kv:>12.0f}{'':>18}"
                  f"{kv / m['cpu PostgresSaver']:>8.2f}")  # fmt: skip


TARGETS = ("put", "get_tuple", "list:limit10", "graph (per superstep)")
BYTES_TARGETS = ("agent loop", "long chat")


def _record(report: dict[str, Any]) -> None:
    rows: dict[str, dict[str, Any]] = {}
    for op, m in report["microseconds"].items():
        row = rows[op] = {
            "KVSaver_us": round(m["KVSaver"], 1),
            "PostgresSaver_us": round(m["PostgresSaver"], 1),
            "x_postgres": round(m["ratio"], 3),
            "rounds_low": min(m["ratio rounds"]),
            "rounds_high": max(m["ratio rounds"]),
            "KVSaver_cpu_us": round(m["cpu KVSaver"], 1),
            "PostgresSaver_cpu_us": round(m["cpu PostgresSaver"], 1),
        }
        for k in (FLOOR, "x floor KVSaver", "x floor PostgresSaver"):
            if k in m:
                row[k.replace(" ", "_")] = round(m[k], 3 if k.startswith("x") else 1)
        if AB:
            row["x_postgres_unprepared"] = round(m["ratio " + UNPREPARED], 3)
    load = report["loadavg"]
    info = {
        "method": report["method"],
        "rounds": ROUNDS,
        "graph_rounds": GRAPH_ROUNDS,
        "loadavg_start": [round(x, 2) for x in load["start"]],
    }
    record(
        "postgres",
        "postgres:ops",
        "KVSaver on PostgreSQL vs PostgresSaver on the same server, paired calls",
        rows,
        info=info,
        targets=[
            target(f"{op} vs PostgresSaver", rows[op]["x_postgres"], 1.0)
            for op in TARGETS
            if op in rows
        ],
    )
    sizes: dict[str, dict[str, Any]] = {}
    for workload, b in report["bytes"].items():
        lay = b["KVSaver layout"]
        sizes[workload] = {
            "KVSaver_bytes": b["KVSaver"],
            "PostgresSaver_bytes": b["PostgresSaver"],
            "x_postgres": round(b["ratio"], 3),
            "KVSaver_heap": lay["heap"],
            "KVSaver_index": lay["index"],
            "KVSaver_toast": lay["toast"],
            "KVSaver_rows": sum(b["KVSaver rows"].values()),
        }
    record(
        "postgres",
        "postgres:bytes",
        "bytes after VACUUM FULL (table + indexes + TOAST), each saver in its own database",
        sizes,
        info={
            "KVSaver_rows_by_keyspace": {w: b["KVSaver rows"] for w, b in report["bytes"].items()}
        },
        targets=[
            target(f"bytes after {w} vs PostgresSaver", sizes[w]["x_postgres"], 0.3)
            for w in BYTES_TARGETS
            if w in sizes
        ],
    )
