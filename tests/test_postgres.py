"""PostgresStore beyond the shared store suite: round trips per
operation, retries on conflicts, faults (a killed session, a statement
timeout, a server restart under a running writer), two processes as two
machines, and the schema record. On the session's throwaway cluster
(tests/pg_helpers.py); skipped, with the reason, where PostgreSQL is not
installed."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from kvsaver import KVSaver
from kvsaver.kv import (
    CommitUnknownError,
    CorruptStoreError,
    FormatVersionError,
    KVError,
    PostgresStore,
    StoreClosedError,
    StoreConflictError,
    StoreTimeoutError,
    StoreUnavailableError,
)
from pg_helpers import drop_tables, unique_table
from psycopg import pq, sql
from psycopg_pool import ConnectionPool
from saver_helpers import config, make_checkpoint


@pytest.fixture
def table(postgres_url: str) -> Iterator[str]:
    name = unique_table("pg")
    yield name
    drop_tables(postgres_url, [name])


def _admin(url: str, query: Any, params: Any = None) -> list[Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def _kill_sessions(url: str, table: str | None = None) -> int:
    """pg_terminate_backend every other session (of this database): what a
    failover or a network cut does to a pool's connections. Returns once they
    have ended (as after a restart), not while their ending is in flight."""
    rows = _admin(
        url,
        "SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity "
        "WHERE pid <> pg_backend_pid() AND datname = current_database() "
        "AND backend_type = 'client backend'",
    )
    return int(rows[0][0])


# -- round trips -------------------------------------------------------------------


class TracedPool:
    """A one-connection pool whose connection writes libpq's protocol trace
    to a file: a round trip is a run of client messages that ends in a Sync
    or a Flush (the client then waits for the server's answer; a Flush in
    the middle of a pipeline is a round trip too), counted independently of
    the store's code."""

    def __init__(self, url: str) -> None:
        self.trace = tempfile.TemporaryFile()
        self.parses = 0  # Parse messages the last count() saw (0: prepared statements)
        self.table_parses = 0  # those of statements on the table

        def configure(conn: psycopg.Connection) -> None:
            conn.pgconn.trace(self.trace.fileno())
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)

        self.configure = configure  # also for a store's own pool (pool_options)

        self.pool = ConnectionPool(
            url,
            min_size=1,
            max_size=1,
            kwargs={"autocommit": True},
            configure=configure,
            open=False,
        )
        self.pool.open(wait=True)

    def count(self, fn: Any) -> tuple[int, int]:
        """(round trips, statements) that fn() sends."""
        self.trace.seek(0)
        self.trace.truncate()
        fn()
        self.trace.seek(0)
        lines = self.trace.read().decode(errors="replace").splitlines()
        waits, run = 0, False  # run: client messages since the last server message
        for ln in lines:
            if ln.startswith("F\t"):
                if ("\tSync" in ln or "\tFlush" in ln) and not run:
                    waits += 1
                    run = True
            elif ln.startswith("B\t"):
                run = False
        queries = sum(1 for ln in lines if ln.startswith("F\t") and "\tExecute" in ln)
        parses = [ln for ln in lines if ln.startswith("F\t") and "\tParse" in ln]
        self.parses = len(parses)
        # Parses of statements on the table (not BEGIN, ROLLBACK, COMMIT)
        self.table_parses = sum(1 for ln in parses if " FROM " in ln or "INSERT" in ln)
        return waits, queries

    def close(self) -> None:
        self.pool.close()
        self.trace.close()


def _chat(saver: KVSaver, thread: str, n: int) -> list[str]:
    ids, parent = [], None
    for i in range(n):
        cid = f"{i:04d}"
        versions = {"messages": i + 1, "other": 1}
        values = {"messages": list(range(i + 1)), "other": "x"}
        saver.put(config(thread, "", parent), make_checkpoint(cid, values, versions), {}, versions)
        ids.append(cid)
        parent = cid
    return ids


def test_round_trips_per_operation(postgres_url: str, table: str) -> None:
    """get_tuple = 2 round trips (BEGIN + the record's reverse scan; the
    writes scan + the blobs' get_many; its ROLLBACK travels with the next
    transaction's first statement), 1 for the latest checkpoint when this
    saver wrote it (all three queued together); put and put_writes = 1, COMMIT included
    (their reads answered from the store's cache, verified by a guard in the
    same pipeline); list of a page = 2 (the records' scan; every writes scan
    and blob of the page). Counted from libpq's trace."""
    traced = TracedPool(postgres_url)
    saver = KVSaver(PostgresStore(traced.pool, table=table))
    other = KVSaver(PostgresStore(traced.pool, table=table))  # wrote nothing: no guess
    try:
        _chat(saver, "t", 20)
        saver.put_writes(config("t", "", "0019"), [("a", 1), ("b", 2)], "task")
        latest = config("t")
        figures = {
            "get_tuple (latest)": traced.count(lambda: saver.get_tuple(latest)),
            "get_tuple (latest, another saver)": traced.count(lambda: other.get_tuple(latest)),
            "get_tuple (by id)": traced.count(lambda: saver.get_tuple(config("t", "", "0010"))),
            "put": traced.count(
                lambda: saver.put(
                    config("t", "", "0019"),
                    make_checkpoint("0020", {"messages": [1]}, {"messages": 21, "other": 1}),
                    {},
                    {"messages": 21},
                )
            ),
            "put_writes": traced.count(
                lambda: saver.put_writes(config("t", "", "0020"), [("a", 1), ("b", 2)], "t2")
            ),
            "list (limit 10)": traced.count(lambda: list(saver.list(latest, limit=10))),
        }
        print("\nround trips, statements per operation:", json.dumps(figures))
        assert saver.get_tuple(latest).pending_writes == [("t2", "a", 1), ("t2", "b", 2)]
        assert figures["get_tuple (latest)"][0] == 1
        assert figures["get_tuple (latest, another saver)"][0] == 2
        assert figures["get_tuple (by id)"][0] == 2
        assert figures["put"][0] == 1  # BEGIN, guard, writes, COMMIT: one pipeline
        assert figures["put_writes"][0] == 1
        assert figures["list (limit 10)"][0] == 2  # the records; the page's writes and blobs
        held, failed = saver.store.speculations
        assert failed == 0 and held >= 20
        # Reads are named prepared statements, parsed once per connection:
        # executed by name from then on, so the server plans each only once.
        for read in (lambda: saver.get_tuple(latest), lambda: list(saver.list(latest, limit=3))):
            read()
            traced.count(read)
            assert traced.parses > 0 and traced.table_parses == 0  # BEGIN, ROLLBACK: unnamed

        # A store on its own pool: its sessions are SERIALIZABLE by default, so
        # a write-only transaction is a single statement (no BEGIN, no COMMIT).
        own = KVSaver(
            PostgresStore(
                postgres_url, table=table, max_size=1, pool_options={"configure": traced.configure}
            )
        )
        try:
            # Warm-up: the first put takes over the connection of the saver's
            # schema check (a read: its ROLLBACK goes first) and prepares the
            # write in that same pipeline, so the next put names it at once.
            own.put(config("t", "", "0020"), make_checkpoint("0021", {}, {}), {}, {})
            first = traced.count(
                lambda: own.put(config("t", "", "0021"), make_checkpoint("0022", {}, {}), {}, {})
            )
            put = traced.count(
                lambda: own.put(config("t", "", "0022"), make_checkpoint("0023", {}, {}), {}, {})
            )
            writes = traced.count(lambda: own.put_writes(config("t", "", "0023"), [("a", 1)], "t3"))
            print("own pool: first put, put, put_writes:", first, put, writes)
            assert first == (1, 1)  # prepared already: no PREPARE round trip
            assert put == (1, 1) and writes == (1, 1)
            # Prepared: executed by name, not parsed (and planned) again.
            traced.count(
                lambda: own.put(config("t", "", "0023"), make_checkpoint("0024", {}, {}), {}, {})
            )
            assert traced.parses == 0
        finally:
            own.store.close()  # a passed-in store is not closed by the saver
        # prepare=False (PgBouncer in transaction mode): parsed every time, still 1.
        plain = KVSaver(
            PostgresStore(
                postgres_url,
                table=table,
                max_size=1,
                prepare=False,
                pool_options={"configure": traced.configure},
            )
        )
        try:
            plain.put(config("t", "", "0024"), make_checkpoint("0025", {}, {}), {}, {})
            put = traced.count(
                lambda: plain.put(config("t", "", "0025"), make_checkpoint("0026", {}, {}), {}, {})
            )
            assert put == (1, 1) and traced.parses == 1
            # ... and its reads are parsed every time too: no named statement
            # for a pooler to lose between transactions.
            read = traced.count(lambda: plain.get_tuple(config("t")))
            assert read[0] == 1 and traced.table_parses == read[1] - 1  # all but BEGIN
        finally:
            plain.store.close()
    finally:
        # The stores first: a read's connection lingering in one of them would
        # outlive the pool and write its trace into a closed, reused descriptor.
        for one in (saver, other):
            one.store.close()
        traced.close()


def test_every_put_of_a_chat_is_one_round_trip_long_steps_included(
    postgres_url: str, table: str
) -> None:
    """A list's delta chain takes a long step every 8th version (it extends
    the version 8 back, saver/delta.py), found by walking the versions
    between: they were read with a scan, a second round trip at every 8th
    put on PostgreSQL. Now the put reads them with its other
    reads (from the speculation cache when this process wrote them): every
    put is one round trip, and the records are the ones a local store gets."""
    from kvsaver import delta
    from kvsaver import schema as S
    from kvsaver.kv import MemoryStore

    store = PostgresStore(postgres_url, table=table)
    saver, local = KVSaver(store), KVSaver(MemoryStore())
    try:
        trips = []
        for one in (saver, local):
            parent = None
            for i in range(40):
                cid = f"{i:04d}"
                versions = {"messages": i + 1}
                values = {"messages": [f"message {n} " * 20 for n in range(i + 1)]}
                before = store._round_trips
                one.put(
                    config("t", "", parent), make_checkpoint(cid, values, versions), {}, versions
                )
                if one is saver and i > 0:  # the first put reads from the server
                    trips.append(store._round_trips - before)
                parent = cid
        assert trips == [1] * 39
        blobs = []
        for one in (saver, local):
            with one.store.read() as txn:
                blobs.append(list(txn.scan(*S.blobs_range("t"))))
        assert blobs[0] == blobs[1]
        refs = {
            delta.decode(v).depth: delta.decode(v).ref for _, v in blobs[0] if v[:1] == delta.MARK
        }
        # depth 8 extends the whole version (2), depth 16 the one at depth 8 (10)
        assert (refs[7], refs[8], refs[9], refs[16]) == (8, 2, 10, 10)
    finally:
        store.close()
        local.close()


def test_a_write_takes_its_own_result_after_earlier_unread_ones(postgres_url: str) -> None:
    """``_own_result``: results of statements sent earlier and not read yet
    come first; the write's is the last. A failed earlier one fails the call.
    (CI once saw "too many values to unpack" from a write under two processes
    writing at once; I could not make that race happen on
    demand, so this checks the rule on the connection's real results.)"""
    from kvsaver.kv.postgres.driver import _own_result, _results

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        pgconn = conn.pgconn
        pgconn.send_query(b"SELECT 1; SELECT 2")
        results = _results(pgconn)
        assert len(results) == 2
        assert _own_result(results, conn).get_value(0, 0) == b"2"
        pgconn.send_query(b"SELECT 1/0; SELECT 2")
        results = _results(pgconn)
        with pytest.raises(psycopg.errors.DivisionByZero):
            _own_result([*results, results[-1]], conn)


def _step(saver: KVSaver, i: int, parent: str | None) -> str:
    """Checkpoint ``i`` of thread "t" (after ``parent``), with one pending
    write; its id."""
    cid = f"{i:04d}"
    versions = {"messages": i + 1}
    saver.put(
        config("t", "", parent), make_checkpoint(cid, {"messages": [i]}, versions), {}, versions
    )
    saver.put_writes(config("t", "", cid), [("a", i)], "task")
    return cid


def test_the_prepared_write_outlives_reads_rollbacks_and_deallocate(
    postgres_url: str, table: str
) -> None:
    """The write-only statement and the reads' statements are prepared once
    per connection; reads whose
    deferred ROLLBACK rides with the next write or is sent by the reaper, a
    rolled-back write, and a
    DEALLOCATE ALL from elsewhere (a pool's reset) never leave a put or a
    read naming a statement the server no longer has. (With psycopg's own prepared
    statements, a ROLLBACK result queued a DEALLOCATE ALL that it sent just
    after preparing the next statement: "prepared statement does not exist".)"""
    from kvsaver.kv.postgres.connections import _LINGER

    store = PostgresStore(postgres_url, table=table, max_size=1)  # one connection
    saver = KVSaver(store)
    try:
        parent = None
        for i in range(8):
            cid = _step(saver, i, parent)
            assert saver.get_tuple(config("t")).checkpoint["id"] == cid  # a read lingers
            if i == 2:  # the reaper rolls the read back, on the connection
                time.sleep(3 * _LINGER)
            if i == 3:
                with pytest.raises(ValueError):
                    store.transact(lambda txn: (txn.put(b"x", b"1"), int("not a number")))
            if i in (5, 6):
                with store._pool.connection() as conn:  # behind psycopg's back
                    assert conn.pgconn.exec_(b"DEALLOCATE ALL").status == pq.ExecStatus.COMMAND_OK
            if i == 6:  # the reads' prepared statements are gone too: prepared again
                assert saver.get_tuple(config("t")).checkpoint["id"] == cid
                assert len(list(saver.list(config("t"), limit=2))) == 2
            parent = cid
        assert [c.checkpoint["id"] for c in saver.list(config("t"))] == [
            f"{i:04d}" for i in reversed(range(8))
        ]
    finally:
        store.close()


def _read_then_write(store: PostgresStore) -> None:
    with store.write() as txn:  # no speculation in write(): a real read first
        txn.put(b"n", (txn.get(b"x") or b"") + b"1")


@pytest.mark.parametrize("own_pool", [True, False], ids=["own pool", "pool passed in"])
def test_every_commit_is_a_prepared_statement_after_a_read_too(
    postgres_url: str, table: str, own_pool: bool
) -> None:
    """A write that takes over a lingering read's connection (its ROLLBACK in
    the same round trip), a write on a pool passed in (BEGIN and COMMIT
    around it), and a transaction that read first, commit prepared
    statements: no statement on the table is parsed (planned) again. Before,
    psycopg's pipeline sent these unprepared, one Parse (and plan) each."""
    traced = TracedPool(postgres_url)
    if own_pool:  # the store's own pool, traced the same way
        opts = {"configure": traced.configure}
        store = PostgresStore(postgres_url, table=table, max_size=1, pool_options=opts)
    else:
        store = PostgresStore(traced.pool, table=table)
    saver = KVSaver(store)
    try:
        parent = None
        for i in range(3):  # everything prepared once
            parent = _step(saver, i, parent)
            saver.get_tuple(config("t"))
            _read_then_write(store)
        for i in range(3, 6):
            saver.get_tuple(config("t"))  # its connection lingers in its snapshot
            assert store._lingering.items[-1][2]
            assert traced.count(lambda i=i, p=parent: _step(saver, i, p))[0] == 2
            assert traced.table_parses == 0
            parent = f"{i:04d}"
            trips, _ = traced.count(lambda: _read_then_write(store))
            assert trips == 2 and traced.table_parses == 0  # the read, then the commit
        assert [c.checkpoint["id"] for c in saver.list(config("t"))] == [
            f"{i:04d}" for i in reversed(range(6))
        ]
        with store.read() as txn:
            assert txn.get(b"n") == b"1"
    finally:
        store.close()
        traced.close()


_TYPE_NAMES = {17: "bytea", 20: "int8", 1000: "bool[]", 1001: "bytea[]"}


def test_no_statement_of_a_put_or_a_read_scans_the_whole_table(
    postgres_url: str, table: str
) -> None:
    """The plans PostgreSQL keeps for our prepared statements (generic, from
    a statement's sixth run) on a table of 500 rows, where a scan
    of the whole table is the planner's guess for ``key = ANY($1)`` (it
    assumes 10 keys): every statement of a put, a put_writes and a read
    looks keys up in the index. Before, get_many and the write statement
    (its DELETE of no key) scanned the table at every call, costing the
    server time at every put until the table grew past a few thousand
    rows. A few deleted keys are a statement each; only a
    transaction that deletes more uses ``key = ANY`` (``delete_many``),
    left so."""
    store = PostgresStore(postgres_url, table=table)
    saver = KVSaver(store)
    try:
        _chat(saver, "t", 20)
        # 500 rows more, ~20 pages, stored in no order of their keys (as a
        # chat's: index order and table order apart)
        with store.write() as txn:
            for i in range(500):
                txn.put(b"z%05d" % (i * 7919 % 500), b"x" * 250)
        saver.get_tuple(config("t"))
        q = store._q
        checked = {
            "get": q.get,
            "get_many": q.get_many,
            "guard": q.guard,
            "write_all": q.write_all,
            "delete_one": q.delete_one,
            "upsert": q.upsert,
            "scan": q.scan(True, True, False),
            "scan reverse": q.scan(True, True, True),
            "scan from": q.scan(True, False, False),
        }
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            # (autovacuum's ANALYZE of a table this size, at once)
            conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))
            conn.execute("SET plan_cache_mode = force_generic_plan")
            conn.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
            for i, (name, stmt) in enumerate(checked.items()):
                stmt.render(conn)
                types = ", ".join(_TYPE_NAMES[t] for t in stmt.types)
                conn.execute(f"PREPARE s{i} ({types}) AS ".encode() + stmt.numbered)
                args = ", ".join(f"NULL::{_TYPE_NAMES[t]}" for t in stmt.types)
                plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN EXECUTE s{i}({args})"))
                assert "Seq Scan" not in plan, f"{name}:\n{plan}"
            # The statements left with key = ANY do scan a table this size:
            # the check above can see one.
            stmt = q.delete_many
            stmt.render(conn)
            conn.execute(b"PREPARE d (bytea[]) AS " + stmt.numbered)
            plan = "\n".join(r[0] for r in conn.execute("EXPLAIN EXECUTE d(NULL::bytea[])"))
            assert "Seq Scan" in plan
            conn.execute("ROLLBACK")
    finally:
        saver.close()


@pytest.mark.parametrize("deleted", [1, 3, 9])
@pytest.mark.parametrize("own_pool", [True, False], ids=["own pool", "pool passed in"])
def test_a_write_that_deletes_a_few_keys_is_still_one_round_trip(
    postgres_url: str, table: str, deleted: int, own_pool: bool
) -> None:
    """A write-only transaction that deletes keys (a put a second or more
    after its thread's last: the previous activity entry goes) is one round
    trip: its statement, then a DELETE of one key each, in one pipeline and
    one transaction; more than a few keys, one DELETE of them all. A guess
    found wrong fails the statement before the DELETEs run. On the store's
    own pool (SERIALIZABLE sessions) there is no BEGIN and COMMIT: the
    pipeline's statements are one implicit transaction."""
    traced = TracedPool(postgres_url)
    if own_pool:
        opts = {"configure": traced.configure}
        store = PostgresStore(postgres_url, table=table, max_size=1, pool_options=opts)
    else:
        store = PostgresStore(traced.pool, table=table)
    try:
        keys = [b"k%02d" % i for i in range(12)]

        def fill(txn: Any) -> None:
            for k in keys:
                txn.put(k, b"v")

        store.transact(fill)

        def change(txn: Any) -> None:
            assert txn.get(b"k00") == b"v"  # a guess (this store wrote it), guarded
            txn.put(b"new", b"n")
            for k in keys[1 : 1 + deleted]:
                txn.delete(k)

        trips, statements = traced.count(lambda: store.transact(change))
        assert trips == 1
        # (BEGIN,) the write, a DELETE each of a few (more: one of all), (COMMIT)
        assert statements == (1 if own_pool else 3) + (deleted if deleted <= 8 else 1)
        with store.read() as txn:
            assert dict(txn.scan()) == {
                **{k: b"v" for k in keys if k not in keys[1 : 1 + deleted]},
                b"new": b"n",
            }
        # Another writer changed a guessed key: the guard fails the statement,
        # nothing of the transaction is applied, it is rerun reading for real.
        _admin(
            postgres_url,
            sql.SQL("UPDATE {} SET value = 'w' WHERE key = 'k00'").format(sql.Identifier(table)),
        )
        seen = []

        def again(txn: Any) -> None:
            seen.append(txn.get(b"k00"))
            txn.delete(b"k11")

        store.transact(again)
        assert seen == [b"v", b"w"]
        with store.read() as txn:
            assert txn.get(b"k11") is None and txn.get(b"k00") == b"w"
    finally:
        store.close()
        traced.close()


def test_reads_of_several_round_trips_survive_a_deallocate_all(
    postgres_url: str, table: str
) -> None:
    """DEALLOCATE ALL (or DISCARD ALL, a pool's reset) drops every statement
    of the session: a transaction's first round trip finds one of them gone
    and the others must be prepared again too, or the transaction's next
    round trip names a statement the server no longer has. A saver that
    did not write the thread (another process) reads it in several round
    trips: get_tuple, list."""
    store = PostgresStore(postgres_url, table=table, max_size=1)  # one connection
    writer = KVSaver(store)
    other = PostgresStore(postgres_url, table=table, max_size=1)
    reader = KVSaver(other)
    try:
        parent = None
        for i in range(4):
            parent = _step(writer, i, parent)
        for step in range(3):
            assert reader.get_tuple(config("t")).checkpoint["id"] == "0003"  # all prepared
            assert len(list(reader.list(config("t"), limit=3))) == 3
            with other._pool.connection() as conn:  # behind psycopg's back
                what = b"DEALLOCATE ALL" if step != 1 else b"DISCARD ALL"
                assert conn.pgconn.exec_(what).status == pq.ExecStatus.COMMAND_OK
            assert len(list(reader.list(config("t"), limit=3))) == 3
            assert reader.get_tuple(config("t")).checkpoint["id"] == "0003"
            assert reader.get_tuple(config("t", "", "0001")).pending_writes == [("task", "a", 1)]
    finally:
        other.close()
        store.close()


def test_the_reaper_lives_while_connections_come_and_go(monkeypatch: pytest.MonkeyPatch) -> None:
    """A store in steady use has its one connection out during each
    transaction, and back (lingering) only between two: the reaper ends
    only once nothing lingers and nothing came back since its last look.
    Before, it ended at any look that found nothing lingering, and the next
    transaction started a thread again (four times a second)."""
    from kvsaver.kv.postgres import connections as P

    class Pool:
        closed = False

        def putconn(self, conn: object) -> None:
            pass

    # Twice the default: a stall of this thread between take() and add() longer
    # than a reaper's period would end the reaper with nothing wrong.
    monkeypatch.setattr(P, "_LINGER", 1.0)
    lingering = P._Lingering(Pool())
    conn = object()
    lingering.add(conn, False)
    reaper = lingering.reaper
    assert reaper is not None
    end = time.monotonic() + 2 * P._LINGER  # four of the reaper's looks
    while time.monotonic() < end:  # out during each "transaction", back after
        assert lingering.take() == (conn, False)
        time.sleep(0.01)
        lingering.add(conn, False)
        assert lingering.reaper is reaper
    assert lingering.take() == (conn, False)  # nothing lingers from here on
    reaper.join(timeout=10 * P._LINGER)
    assert not reaper.is_alive() and lingering.reaper is None


def test_a_statement_rendered_by_two_threads_at_once() -> None:
    """_Stmt.render reads each attribute once: another thread may render
    the same statement between its test and its use (the first use of a
    scan's statement, from several threads), and then finds bytes there."""
    from kvsaver.kv.postgres.statements import _Stmt

    class Composed:
        def as_bytes(self, conn: object) -> bytes:
            return b"SELECT 1"

    class Racing(_Stmt):
        """Whose text another thread renders right after the first read."""

        __slots__ = ("reads",)

        @property  # type: ignore[override]
        def text(self) -> object:
            self.reads += 1
            return Composed() if self.reads == 1 else b"SELECT 1"

        @text.setter
        def text(self, value: object) -> None:
            pass

    stmt = Racing(Composed(), b"name", Composed(), ())
    stmt.reads = 0
    stmt.render(None)
    assert stmt.numbered == b"SELECT 1"


def test_a_deferred_rollback_never_outlives_the_linger_time(
    postgres_url: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read leaves its connection in its transaction for the next one to end
    (one round trip less); nobody coming, the reaper ends it: no session
    stays idle in transaction, holding back vacuum."""
    from kvsaver.kv.postgres import connections as kvpg

    # Long enough for a second connection to look while the read lingers, on
    # a loaded machine (the default is 0.5 s).
    monkeypatch.setattr(kvpg, "_LINGER", 2.0)
    store = PostgresStore(postgres_url, table=table)
    try:
        store.transact(lambda txn: txn.put(b"a", b"1"))
        with store.read() as txn:
            assert txn.get(b"a") == b"1"
        query = (
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' "
            "AND datname = current_database()"
        )
        assert _admin(postgres_url, query) == [(1,)]
        store.transact(lambda txn: txn.put(b"a", b"2"))  # ends it, in its first round trip
        with store.read() as txn:
            assert txn.get(b"a") == b"2"  # a new snapshot
        deadline = time.monotonic() + 10 * kvpg._LINGER
        while _admin(postgres_url, query) != [(0,)] and time.monotonic() < deadline:
            time.sleep(kvpg._LINGER / 5)
        assert _admin(postgres_url, query) == [(0,)]
    finally:
        store.close()


def test_a_store_dropped_unclosed_gives_its_lingering_connection_back(
    postgres_url: str, table: str
) -> None:
    """A read's connection lingers for the store's next transaction; a store
    dropped without close() (one per request, on the application's pool)
    must still give it back to that pool, or a pool of one connection is
    empty for good after the first such store."""
    import gc

    pool = ConnectionPool(postgres_url, min_size=1, max_size=1, timeout=5, open=True)
    try:
        for i in range(3):
            store = PostgresStore(pool, table=table, pool_timeout=5)
            store.transact(lambda txn, i=i: txn.put(b"a", str(i).encode()))
            with store.read() as txn:
                assert txn.get(b"a") == str(i).encode()
            assert store._lingering.items  # the read's connection stayed with the store
            del store, txn
            gc.collect()
        with pool.connection(timeout=5) as conn:  # given back by the reaper
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        pool.close()


def test_a_caller_waiting_for_the_pool_takes_a_connection_left_lingering(
    postgres_url: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every connection of the pool out, a caller waiting for one also
    takes a connection another thread of the store leaves lingering, not only
    one the reaper gives back to the pool (here not before 30 s: the wait
    for the pool would time out)."""
    from kvsaver.kv.postgres import connections as kvpg

    monkeypatch.setattr(kvpg, "_LINGER", 30.0)
    store = PostgresStore(postgres_url, table=table, max_size=1, pool_timeout=10)
    held, go = threading.Event(), threading.Event()
    out: dict[str, Any] = {}

    def write(txn: Any) -> None:
        held.set()
        assert go.wait(10)
        txn.put(b"a", b"1")

    def read() -> None:
        try:
            with store.read() as txn:
                out["read"] = txn.get(b"a")
        except Exception as e:
            out["read"] = e

    try:
        writer = threading.Thread(target=store.transact, args=(write,))
        writer.start()
        assert held.wait(10)
        reader = threading.Thread(target=read)
        reader.start()  # waits: the pool's one connection is the writer's
        time.sleep(0.2)
        go.set()
        writer.join(15)
        reader.join(15)
        assert out["read"] == b"1"
    finally:
        go.set()
        store.close()


def test_a_write_keeps_its_connection_only_on_the_stores_own_pool(
    postgres_url: str, table: str
) -> None:
    """On its own pool a store keeps a write's idle connection for its next
    transaction (no pool round trip per put); a pool passed in gets it back
    at once (it may be shared)."""
    own = PostgresStore(postgres_url, table=table)
    pool = ConnectionPool(postgres_url, min_size=1, max_size=2, open=True)
    passed = PostgresStore(pool, table=table)
    try:
        own.transact(lambda txn: txn.put(b"a", b"1"))
        assert [dirty for _, _, dirty in own._lingering.items] == [False]
        conn = own._lingering.items[0][1]
        own.transact(lambda txn: txn.put(b"a", b"2"))
        assert own._lingering.items[0][1] is conn  # the same session, taken and kept again
        passed.transact(lambda txn: txn.put(b"b", b"1"))
        assert passed._lingering.items == []
        with passed.read() as txn:
            assert txn.get(b"a") == b"2"
    finally:
        passed.close()
        pool.close()
        own.close()


# -- transactions: conflicts and retries --------------------------------------------


def _counter(store: PostgresStore) -> int:
    with store.read() as txn:
        return int(txn.get(b"n") or b"0")


def test_transact_reruns_the_function_after_a_serialization_failure(
    postgres_url: str, table: str
) -> None:
    """Two stores (two machines) increment one counter; the first attempt of
    each is held until both have read it, so one of them must fail to
    serialize and be rerun. Every increment lands exactly once. (Reads from
    the server: speculation off, so both reads happen before the barrier.)"""
    a = PostgresStore(postgres_url, table=table, speculate=False)
    b = PostgresStore(postgres_url, table=table, speculate=False)
    try:
        a.transact(lambda txn: txn.put(b"n", b"0"))
        both_read = threading.Barrier(2, timeout=60)
        calls = {"a": 0, "b": 0}

        def work(store: PostgresStore, name: str) -> None:
            def fn(txn: Any) -> None:
                calls[name] += 1
                n = int(txn.get(b"n"))
                if calls[name] == 1:
                    both_read.wait()
                txn.put(b"n", b"%d" % (n + 1))
                txn.put(name.encode(), b"%d" % calls[name])

            store.transact(fn)

        threads = [threading.Thread(target=work, args=(s, n)) for s, n in ((a, "a"), (b, "b"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert _counter(a) == 2
        assert sum(calls.values()) == 3  # exactly one rerun
    finally:
        a.close()
        b.close()


class _Queue:
    """A call "first" holding its store's lead (inside its function) while
    other calls queue behind it; each call's outcome, result or exception,
    in ``out``."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self.held, self.go = threading.Event(), threading.Event()
        self.out: dict[str, Any] = {}
        self.threads: list[threading.Thread] = []
        self.start("first", self._first)
        assert self.held.wait(60)

    def _first(self, txn: Any) -> None:
        self.held.set()
        assert self.go.wait(120)
        txn.put(b"first", b"1")

    def start(self, name: str, fn: Any) -> threading.Thread:
        def run() -> None:
            try:
                self.out[name] = self.store.transact(fn)
            except BaseException as e:
                self.out[name] = e

        t = threading.Thread(target=run)
        t.start()
        self.threads.append(t)
        return t

    def wait_queued(self, n: int) -> None:
        deadline = time.monotonic() + 60
        while len(self.store._commits.queue) < n and time.monotonic() < deadline:
            time.sleep(0.001)
        queued = len(self.store._commits.queue)
        assert queued >= n, f"{queued} calls queued, not {n}"

    def release(self) -> None:
        self.go.set()
        for t in self.threads:
            t.join(30)


def _group(store: PostgresStore, fns: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
    """Calls "first" alone, holding its function until the other calls are
    queued behind it; they then commit as one batch. Each call's outcome
    (result or exception), and the sizes of the batches run."""
    sizes: list[int] = []
    run_batch = store._run_batch

    def counted(batch: list[Any]) -> None:
        sizes.append(len(batch))
        run_batch(batch)

    store._run_batch = counted  # type: ignore[method-assign]
    queue = _Queue(store)
    for name, fn in fns.items():
        queue.start(name, fn)
    queue.wait_queued(len(fns))
    queue.release()
    store._run_batch = run_batch  # type: ignore[method-assign]
    return queue.out, sizes


@pytest.mark.parametrize("speculate", [True, False], ids=["speculating", "reading"])
def test_transact_calls_queued_behind_a_commit_share_the_next_one(
    postgres_url: str, table: str, speculate: bool
) -> None:
    """Group commit: calls made while a transaction runs are committed
    together in the next one (one round trip and WAL flush), in order, each
    seeing the changes of those before it; a function that raises undoes
    only its own changes, and its error reaches only its caller."""
    store = PostgresStore(postgres_url, table=table, speculate=speculate)
    try:
        store.transact(lambda txn: txn.put(b"n", b"0"))

        def add(txn: Any) -> int:
            n = int(txn.get(b"n")) + 1
            txn.put(b"n", b"%d" % n)
            return n

        def bad(txn: Any) -> None:
            txn.put(b"bad", b"1")
            txn.put(b"n", b"100")
            raise ValueError("refused")

        fns = {"a": add, "bad": bad, "b": add, "c": lambda txn: txn.put(b"c", b"1")}
        out, sizes = _group(store, fns)
        assert sizes == [1, 4]
        assert {k: v for k, v in out.items() if k != "bad"} == {
            "first": None, "a": 1, "b": 2, "c": None
        }  # fmt: skip
        assert isinstance(out["bad"], ValueError)
        with store.read() as txn:
            assert txn.get_many([b"n", b"bad", b"c", b"first"]) == [b"2", None, b"1", b"1"]
        if speculate:  # write-only calls: a batch is one round trip, COMMIT included
            trips = store._round_trips
            out, sizes = _group(store, {"a": add, "b": add})
            assert sizes == [1, 2] and out == {"first": None, "a": 3, "b": 4}
            assert store._round_trips - trips == 2  # "first", then the batch
    finally:
        store.close()


def test_a_call_that_read_and_raised_in_a_batch_reruns_the_others(
    postgres_url: str, table: str
) -> None:
    """Without speculation a function's reads are round trips, which send the
    batch's earlier writes: its changes cannot be undone alone, so the
    transaction is rolled back, the others run again without it and commit,
    and then it runs by itself, seeing their committed changes, as if it
    had come after them alone: its error is that run's."""
    store = PostgresStore(postgres_url, table=table, speculate=False)
    runs = {"a": 0, "bad": 0}
    seen: list[Any] = []
    try:

        def a(txn: Any) -> None:
            runs["a"] += 1
            txn.put(b"a", b"%d" % runs["a"])

        def bad(txn: Any) -> None:
            runs["bad"] += 1
            seen.append(txn.get(b"other"))  # a round trip, which sends the write of "a"
            seen.append(txn.get(b"a"))
            raise KeyError(f"no {runs['bad']}")

        out, sizes = _group(store, {"a": a, "bad": bad})
        assert sizes == [1, 2]
        assert out["a"] is None and out["bad"].args == ("no 2",)
        assert runs == {"a": 2, "bad": 2}
        assert seen == [None, b"1", None, b"2"]  # then a's second run, committed
        with store.read() as txn:
            assert txn.get(b"a") == b"2"
    finally:
        store.close()


def test_a_function_that_catches_the_stores_error_fails_the_batch_not_only_itself(
    postgres_url: str, table: str
) -> None:
    """In a batch, a function catches the error of a round trip that failed
    (its session killed) and returns: the transaction cannot commit, so no
    call of the batch may report success; they are rerun (the connection
    lost: retried), and every write reported done is stored."""
    store = PostgresStore(postgres_url, table=table, speculate=False)
    kills: list[int] = []
    try:
        store.transact(lambda txn: txn.put(b"seed", b"1"))

        def a(txn: Any) -> str:
            txn.get(b"seed")  # a round trip: the transaction has begun
            txn.put(b"A", b"1")
            return "A"

        def b(txn: Any) -> str:
            if not kills:  # once: the rerun goes through
                kills.append(txn._conn.info.backend_pid)
                _admin(postgres_url, "SELECT pg_terminate_backend(%s)", (kills[0],))
            try:
                txn.get(b"other")
            except KVError:
                return "B caught"
            txn.put(b"B", b"1")
            return "B"

        out, sizes = _group(store, {"a": a, "b": b})
        assert sizes == [1, 2] and kills
        assert out == {"first": None, "a": "A", "b": "B"}
        with store.read() as txn:
            assert txn.get_many([b"A", b"B", b"first"]) == [b"1", b"1", b"1"]
    finally:
        store.close()


def test_closing_the_store_under_queued_calls_fails_each_and_hangs_none(
    postgres_url: str, table: str
) -> None:
    """close() while calls wait behind a running leader: the leader's call
    commits; each queued one gets StoreClosedError in its own thread, none
    is left waiting, and no leader is left set."""
    store = PostgresStore(postgres_url, table=table)
    store.transact(lambda txn: txn.put(b"a", b"1"))
    queue = _Queue(store)
    for i in range(3):
        queue.start(f"f{i}", lambda txn: txn.put(b"f", b"1"))
    queue.wait_queued(3)
    closer = threading.Thread(target=store.close)
    closer.start()
    deadline = time.monotonic() + 30
    while not store._closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store._closed
    queue.release()
    closer.join(15)
    assert not any(t.is_alive() for t in queue.threads)
    assert queue.out["first"] is None
    assert all(isinstance(queue.out[f"f{i}"], StoreClosedError) for i in range(3)), queue.out
    assert store._commits.leader is None and store._commits.queue == []


def test_an_interrupted_waiting_call_leaves_the_queue(
    postgres_url: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller interrupted while its call waits behind a leader takes the
    call out of the queue: it is not applied, and the calls behind it go on."""
    from kvsaver.kv import group_commit as kvpg

    class Interrupted:  # the wait of the call queued raises, as a ^C would
        def acquire(self, timeout: float = -1) -> bool:
            if getattr(self, "held", False):
                raise KeyboardInterrupt
            self.held = True
            return True

        def release(self) -> None:
            raise AssertionError("a withdrawn call is never woken")

    store = PostgresStore(postgres_url, table=table)
    try:
        queue = _Queue(store)
        locks: list[Any] = [Interrupted()]  # for the next call made
        monkeypatch.setattr(
            kvpg, "_allocate_lock", lambda: locks.pop() if locks else threading.Lock()
        )
        queue.start("b", lambda t: t.put(b"b", b"1")).join(60)
        assert isinstance(queue.out["b"], KeyboardInterrupt) and store._commits.queue == []
        queue.start("c", lambda t: t.put(b"c", b"1"))
        queue.wait_queued(1)
        queue.release()
        assert queue.out["first"] is None and queue.out["c"] is None
        with store.read() as txn:
            assert txn.get_many([b"first", b"b", b"c"]) == [b"1", None, b"1"]
    finally:
        store.close()


def test_conflict_in_a_write_block_raises_and_applies_nothing(
    postgres_url: str, table: str
) -> None:
    a = PostgresStore(postgres_url, table=table)
    b = PostgresStore(postgres_url, table=table)
    try:
        a.transact(lambda txn: txn.put(b"n", b"0"))
        with pytest.raises(StoreConflictError, match="retry"):
            with a.write() as ta:
                ta.put(b"from-a", b"1")
                ta.put(b"n", b"%d" % (int(ta.get(b"n")) + 1))
                with b.write() as tb:
                    tb.put(b"n", b"%d" % (int(tb.get(b"n")) + 10))
        with a.read() as txn:
            assert txn.get(b"n") == b"10" and txn.get(b"from-a") is None
    finally:
        a.close()
        b.close()


# -- faults ---------------------------------------------------------------------------


def test_dead_pooled_connections_are_replaced_without_an_error(
    postgres_url: str, table: str
) -> None:
    """Sessions killed while idle in the pool (a failover, a restart): the
    next transaction's first statement is resent on a fresh connection."""
    with KVSaver(postgres_url, table=table, pool_min_size=2) as saver:
        _chat(saver, "t", 3)
        assert _kill_sessions(postgres_url) >= 1
        assert saver.get_tuple(config("t")).checkpoint["id"] == "0002"  # no error
        _chat(saver, "u", 2)
        assert len(list(saver.list(None))) == 5


@pytest.mark.parametrize("deletes", [False, True], ids=["one statement", "and a delete"])
@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not applied"])
def test_a_commit_whose_result_is_lost_is_looked_for(
    postgres_url: str, table: str, monkeypatch: pytest.MonkeyPatch, applied: bool, deletes: bool
) -> None:
    """The connection breaks after a write-only transaction was sent and
    before its result (the transaction's id) came back: when every write is
    in the table as sent, the call succeeds; when not, its outcome is
    unknown (CommitUnknownError), as before. Before, both raised. (A
    transaction that read first has its id already: txid_status answers.)"""
    from kvsaver.kv.postgres import txn as P

    store = PostgresStore(postgres_url, table=table)
    try:
        # prepares the write statement on the connection; k0 then in the
        # cache, so the delete below reads nothing: the transaction is write-only
        store.transact(lambda txn: txn.put(b"k0", b"0"))

        def broken(orig: Any) -> Any:
            def send(self: Any, *args: Any) -> Any:
                if applied:
                    orig(self, *args)
                self._conn.close()
                raise psycopg.OperationalError("server closed the connection unexpectedly")

            return send

        for name in ("_exec_prepared", "_exchange_commit"):
            monkeypatch.setattr(P._PGTxn, name, broken(getattr(P._PGTxn, name)))

        def write(txn: Any) -> None:
            txn.put(b"k1", b"1")
            if deletes:
                assert txn.delete(b"k0")

        if applied:
            store.transact(write)
        else:
            with pytest.raises(CommitUnknownError):
                store.transact(write)
        monkeypatch.undo()
        with store.read() as txn:
            got = txn.get_many([b"k0", b"k1"])
        if applied:
            assert got == [None if deletes else b"0", b"1"]
        else:
            assert got == [b"0", None]
    finally:
        store.close()


def test_a_pipeline_broken_mid_way_keeps_the_results_that_came(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """_exchange: the connection lost after some results came: the error
    carries them (kv_rows), each statement's rows in order."""
    from kvsaver.kv.postgres import driver as P

    orig = P._round_trip

    def cut(pgconn: Any, results: list[Any]) -> None:
        orig(pgconn, results)
        del results[2:]  # as if the third had not come
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(P, "_round_trip", cut)
    P._psycopg()
    conn = psycopg.connect(postgres_url, autocommit=True, prepare_threshold=None)
    try:
        with pytest.raises(psycopg.OperationalError) as info:
            P._exchange(conn, [("SELECT 1", None), ("SELECT 2", None), ("SELECT 3", None)])
        assert [r.rows for r in info.value.kv_rows] == [[(1,)], [(2,)]]  # type: ignore[attr-defined]
        assert conn.closed
    finally:
        conn.close()


def test_a_commit_lost_after_its_id_came_is_asked_about_and_rerun(
    postgres_url: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a pool passed in a write is BEGIN, the statement (which returns the
    transaction's id) and COMMIT in one pipeline. The connection lost after
    the id came back and before COMMIT was applied: txid_status says
    "aborted", so nothing was committed, and transact runs the write again
    on a new connection. Before, the id was dropped with the connection:
    CommitUnknownError."""
    from kvsaver.kv.postgres import txn as P

    pool = ConnectionPool(
        postgres_url, min_size=1, max_size=2, kwargs={"autocommit": True}, open=True
    )
    store = PostgresStore(pool, table=table)
    try:
        store.transact(lambda txn: txn.put(b"k0", b"0"))
        orig = P._exchange
        broke: list[int] = []

        def exchange(conn: Any, items: Any) -> Any:
            if broke or not items or items[-1][0] != "COMMIT":
                return orig(conn, items)
            broke.append(1)
            came = orig(conn, items[:-1])  # all but COMMIT: the transaction stays open
            conn.close()  # and the server rolls it back
            error = psycopg.OperationalError("server closed the connection unexpectedly")
            error.kv_rows = came  # type: ignore[attr-defined]
            raise error

        monkeypatch.setattr(P, "_exchange", exchange)
        store.transact(lambda txn: txn.put(b"k1", b"1"))
        monkeypatch.undo()
        assert broke == [1]
        with store.read() as txn:
            assert txn.get_many([b"k0", b"k1"]) == [b"0", b"1"]
    finally:
        store.close()
        pool.close()


def test_a_session_killed_mid_transaction_fails_that_call_only(
    postgres_url: str, table: str
) -> None:
    store = PostgresStore(postgres_url, table=table, retries=0)
    try:
        store.transact(lambda txn: txn.put(b"a", b"1"))
        with pytest.raises(StoreUnavailableError, match="not committed"):
            with store.write() as txn:
                txn.put(b"b", b"2")
                assert txn.get(b"a") == b"1"  # the transaction has begun
                _kill_sessions(postgres_url)
                txn.get(b"zz")  # the connection is gone: nothing was committed
        with store.read() as txn:
            assert list(txn.scan()) == [(b"a", b"1")]  # the same store works again

        # transact() reruns the function on a new connection instead.
        killed = []

        def fn(txn: Any) -> None:
            txn.get(b"a")
            if not killed:
                killed.append(_kill_sessions(postgres_url))
            txn.put(b"c", b"3")

        retrying = PostgresStore(postgres_url, table=table)
        try:
            retrying.transact(fn)
            with retrying.read() as txn:
                assert txn.get(b"c") == b"3"
        finally:
            retrying.close()
    finally:
        store.close()


def test_a_connection_that_died_idle_in_the_pool_is_replaced(postgres_url: str, table: str) -> None:
    """Connections the pool holds idle, never used by the store, are ended by
    the server (a killed session, a restart): the next transaction sets up
    another instead of failing, even with retries=0, since nothing of the
    caller's was sent."""
    from kvsaver.kv.postgres import connections as kvpg

    store = PostgresStore(postgres_url, table=table, retries=0, min_size=3)
    try:
        store.transact(lambda txn: txn.put(b"a", b"1"))
        store._pool.wait(timeout=10)  # the pool's other connections, idle, unused
        time.sleep(3 * kvpg._LINGER)  # the one used is back in the pool, not lingering
        _kill_sessions(postgres_url)
        with store.read() as txn:
            assert txn.get(b"a") == b"1"
    finally:
        store.close()


def test_statement_timeout(postgres_url: str, table: str) -> None:
    store = PostgresStore(postgres_url, table=table, statement_timeout=2)
    try:
        store.transact(lambda txn: txn.put(b"a", b"1"))
        with psycopg.connect(postgres_url) as blocker:  # holds the table locked
            blocker.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                sql.Identifier(table)
            ))  # fmt: skip
            with pytest.raises(StoreTimeoutError, match="statement_timeout"):
                with store.read() as txn:
                    txn.get(b"a")
            blocker.rollback()
        with store.read() as txn:
            assert txn.get(b"a") == b"1"
    finally:
        store.close()


def test_unreachable_server_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing listens: the first use says so with the server's refusal, a
    grace period into the wait (a server still starting refuses for a
    moment), not after pool_timeout (before: "no connection to PostgreSQL
    within 30 s", after 30 s, the cause only in the pool's log)."""
    from kvsaver.kv.postgres import connections as P

    monkeypatch.setattr(P, "_FIRST_CONNECT_GRACE", 0.3)
    url = "postgresql://postgres@127.0.0.1:9/postgres?sslmode=disable"
    store = PostgresStore(url, connect_timeout=2)
    try:
        with pytest.raises(StoreUnavailableError, match=r"cannot connect to PostgreSQL: .*refused"):
            with store.read() as txn:
                txn.get(b"a")
    finally:
        store.close()
    with pytest.raises(StoreUnavailableError, match=r"cannot connect to PostgreSQL: .*refused"):
        KVSaver(url)


def test_a_store_that_never_connected_says_why_and_works_once_it_can(postgres_url: str) -> None:
    """A database that does not exist (yet): the first use fails at once with
    the server's reason, no wait cures it; once the database is there, the
    same store works (the pool keeps trying)."""
    from pg_helpers import create_database, database_url, drop_database

    name = unique_table("kv_late")
    store = PostgresStore(database_url(postgres_url, name), connect_timeout=2)
    try:
        with pytest.raises(
            StoreUnavailableError, match=f'cannot connect to PostgreSQL: .*"{name}" does not exist'
        ):
            store.setup()
        create_database(postgres_url, name)
        with store.write() as txn:
            txn.put(b"a", b"1")
        with store.read() as txn:
            assert txn.get(b"a") == b"1"
    finally:
        store.close()
        drop_database(postgres_url, name)


@pytest.mark.parametrize(
    "reason, raised_at_once, raised_after_grace",
    [
        ('FATAL:  database "x" does not exist', True, True),
        ('FATAL:  password authentication failed for user "me"', True, True),
        ('connection to server at "10.0.0.1", port 5432 failed: Connection refused', False, True),
        ('could not translate host name "db" to address', False, True),
        ("FATAL:  sorry, too many clients already", False, False),
        ("FATAL:  the database system is starting up", False, False),
        ("connection timeout expired", False, False),
    ],
)
def test_why_a_store_cannot_connect_decides_how_long_it_waits(
    monkeypatch: pytest.MonkeyPatch, reason: str, raised_at_once: bool, raised_after_grace: bool
) -> None:
    """_unreachable, for a store not connected yet whose pool failed: a
    reason no wait cures is raised at once; a refusal or an unknown host,
    after the grace period; anything else (the server full, starting up, a
    timeout) is waited for up to pool_timeout, the reason kept for the
    message."""
    from kvsaver.kv.postgres import connections as P

    store = PostgresStore("postgresql://me@127.0.0.1:9/x", min_size=0, pool_timeout=30)
    try:
        monkeypatch.setattr(store, "_pool_errors", lambda: 1)
        monkeypatch.setattr(store, "_connect_error", lambda left: psycopg.OperationalError(reason))
        now = time.monotonic()
        for start, raises in (
            (now, raised_at_once),
            (now - P._FIRST_CONNECT_GRACE, raised_after_grace),
        ):
            store._asked_at = -1e9
            if raises:
                with pytest.raises(StoreUnavailableError, match="cannot connect to PostgreSQL"):
                    store._unreachable(start, start + 30)
            else:
                assert store._unreachable(start, start + 30) == " ".join(reason.split())
    finally:
        store.close()


def test_a_pool_passed_in_that_failed_before_is_waited_for(postgres_url: str, table: str) -> None:
    """A shared pool's failures from before the store was made say nothing
    about it: a store on a healthy pool whose connections are all out waits
    for one, and opens none of its own to ask the server why."""
    pool = ConnectionPool(postgres_url, min_size=1, max_size=1, open=True)
    try:
        pool.wait()
        pool._stats["connections_errors"] += 3  # as after an outage, long over
        store = PostgresStore(pool, table=table)
        asked: list[float] = []
        store._connect_error = lambda left: asked.append(left)  # type: ignore[method-assign]
        held = pool.getconn()
        threading.Timer(0.5, pool.putconn, (held,)).start()
        with store.write() as txn:  # setup() and the write wait for the pool
            txn.put(b"a", b"1")
        assert asked == []
        store.close()
    finally:
        pool.close()


@pytest.mark.parametrize("pool", ["own", "passed in"])
def test_server_restart_under_a_running_writer(pg_server: Any, table: str, pool: str) -> None:
    """``pg_ctl restart -m fast`` while a writer puts checkpoints in a loop:
    calls during the outage fail with a KVError (or are retried by
    transact), the writer resumes on the same saver within seconds, and
    every checkpoint whose put returned is there. On a pool passed in, a
    put is BEGIN, the write and COMMIT in one pipeline (not one statement)."""
    passed = None
    if pool == "own":
        saver = KVSaver(pg_server.url, table=table, pool_max_size=2)
    else:
        passed = ConnectionPool(
            pg_server.url, min_size=1, max_size=2, kwargs={"autocommit": True}, open=True
        )
        saver = KVSaver(PostgresStore(passed, table=table))
    acked: list[str] = []
    errors: list[str] = []
    stop = threading.Event()
    first_after: list[float] = []
    restarted = threading.Event()

    def writer() -> None:
        i = 0
        parent = None
        while not stop.is_set():
            cid = f"{i:06d}"
            versions = {"messages": i + 1}
            try:
                saver.put(
                    config("w", "", parent), make_checkpoint(cid, {"messages": i}, versions), {},
                    versions,
                )  # fmt: skip
            except KVError as e:
                errors.append(type(e).__name__)
                time.sleep(0.05)
                continue  # the same checkpoint again: a put is idempotent
            acked.append(cid)
            if restarted.is_set() and not first_after:
                first_after.append(time.monotonic())
            parent = cid
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        while len(acked) < 20:
            time.sleep(0.01)
        began = time.monotonic()
        pg_server.restart()
        back = time.monotonic()
        restarted.set()
        deadline = back + 30
        while not first_after and time.monotonic() < deadline:
            time.sleep(0.01)
        n_at_back = len(acked)
        while len(acked) < n_at_back + 20 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        t.join(60)
    assert first_after, f"the writer did not resume within 30 s of the restart; errors={errors}"
    print(
        f"\nrestart took {back - began:.2f} s; first put acknowledged "
        f"{first_after[0] - back:.2f} s after; {len(acked)} acknowledged, "
        f"{len(errors)} failed calls during the outage ({sorted(set(errors))})"
    )
    with saver.store.read() as txn:  # nothing acknowledged was lost
        stored = {saver.get_tuple(config("w", "", cid)) is not None for cid in acked}
        assert txn is not None
    assert stored == {True}
    assert [t.checkpoint["id"] for t in saver.list(config("w"))][: len(acked)] == acked[::-1]
    saver.close()
    if passed is not None:
        saver.store.close()
        passed.close()


# -- two processes as two machines -------------------------------------------------------

_WRITER = r"""
import json, sys
from kvsaver import KVSaver
from langgraph.checkpoint.base import empty_checkpoint
url, table, me, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
saver = KVSaver(url, table=table, pool_max_size=2)
errors, acked = [], []
for i in range(n):
    for thread in ("shared", "own-" + me):
        cid = f"{me}-{i:04d}"
        cp = empty_checkpoint()
        cp["id"] = cid
        cp["channel_values"] = {"v": [me, i]}
        cp["channel_versions"] = {"v": f"{me}{i:04d}"}
        conf = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        try:
            saver.put(conf, cp, {"step": i, "writer": me}, {"v": cp["channel_versions"]["v"]})
            saver.put_writes({"configurable": {**conf["configurable"], "checkpoint_id": cid}},
                             [("out", i)], "task-" + me)
            acked.append([thread, cid])
        except Exception as e:
            errors.append(repr(e))
saver.close()
print(json.dumps({"acked": acked, "errors": errors}))
"""

_READER = r"""
import json, sys, time
from kvsaver import KVSaver
url, table, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
saver = KVSaver(url, table=table, pool_max_size=2)
errors, reads, end = [], 0, time.monotonic() + seconds
while time.monotonic() < end:
    try:
        t = saver.get_tuple({"configurable": {"thread_id": "shared"}})
        if t is not None:
            assert t.checkpoint["channel_values"]["v"][1] >= 0
            assert len(t.pending_writes) in (0, 1)
        list(saver.list({"configurable": {"thread_id": "shared"}}, limit=5))
        reads += 1
    except Exception as e:
        errors.append(repr(e))
saver.close()
print(json.dumps({"reads": reads, "errors": errors}))
"""


def test_two_processes_as_two_machines(postgres_url: str, table: str) -> None:
    """Two writer processes, each with its own pool, put into one shared
    thread and one thread of their own at the same time, while a reader
    process reads the shared one: no error anywhere, and every acknowledged
    checkpoint (with its write) is stored."""
    n = 40
    KVSaver(postgres_url, table=table).close()  # created once, before the race
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, postgres_url, table, me, str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for me in ("m1", "m2")
    ]
    reader = subprocess.Popen(
        [sys.executable, "-c", _READER, postgres_url, table, "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    outs = []
    for p in [*procs, reader]:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        outs.append(json.loads(out))
    *writers, read = outs
    assert [w["errors"] for w in writers] == [[], []]
    assert read["errors"] == [] and read["reads"] > 0
    print(f"\n2 writers x {2 * n} checkpoints, reader made {read['reads']} reads, 0 errors")
    with KVSaver(postgres_url, table=table) as saver:
        acked = [tuple(a) for w in writers for a in w["acked"]]
        assert len(acked) == 2 * 2 * n
        for thread, cid in acked:
            t = saver.get_tuple(config(thread, "", cid))
            assert t is not None, (thread, cid)
            assert t.checkpoint["channel_values"]["v"][0] == cid.split("-")[0]
            assert len(t.pending_writes) == 1
        assert len(list(saver.list(config("shared")))) == 2 * n


# -- the schema record ------------------------------------------------------------------


def test_setup_is_idempotent_and_refuses_foreign_or_newer_tables(
    postgres_url: str, table: str
) -> None:
    for _ in range(2):
        with PostgresStore(postgres_url, table=table) as store:
            store.setup()
            store.transact(lambda txn: txn.put(b"k", b"v"))
    comment = _admin(postgres_url, "SELECT obj_description(to_regclass(%s), 'pg_class')", (table,))
    assert comment == [("kvsaver.kv PostgresStore format 1",)]

    ident = sql.Identifier(table)
    _admin(postgres_url, sql.SQL("COMMENT ON TABLE {} IS 'kvsaver.kv PostgresStore format 9'")
           .format(ident))  # fmt: skip
    with PostgresStore(postgres_url, table=table) as store, pytest.raises(FormatVersionError):
        store.setup()

    foreign = unique_table("foreign")
    _admin(postgres_url, sql.SQL("CREATE TABLE {} (key bytea)").format(sql.Identifier(foreign)))
    try:
        with PostgresStore(postgres_url, table=foreign) as store:
            with pytest.raises(CorruptStoreError, match="not a kvsaver store"), store.read():
                pass
        with PostgresStore(postgres_url, table=unique_table("nope"), readonly=True) as store:
            with pytest.raises(CorruptStoreError, match="does not exist"), store.read():
                pass
    finally:
        drop_tables(postgres_url, [foreign])


def test_kvsaver_options_for_a_url(postgres_url: str, table: str) -> None:
    with pytest.raises(TypeError, match="pool_max_size"):
        KVSaver(postgres_url, table=table, max_size=10)
    with pytest.raises(TypeError, match="map_size"):
        KVSaver(postgres_url, table=table, map_size=1 << 20)
    with KVSaver(postgres_url.replace("postgresql://", "postgres://"), table=table) as saver:
        assert isinstance(saver.store, PostgresStore) and saver.store.table == table
        _chat(saver, "t", 2)
        assert saver.stats().checkpoints == 2
        assert saver.stats().disk_bytes > 0
    with KVSaver(postgres_url, table=table, readonly=True) as ro:
        assert ro.get_tuple(config("t")).checkpoint["id"] == "0001"


# -- moving an LMDB directory to PostgreSQL (the README's recipe) -----------------------


def test_move_an_lmdb_directory_to_postgres_with_copy_all(
    postgres_url: str, table: str, tmp_path: Any
) -> None:
    from kvsaver.migrate import copy_all
    from migrate_helpers import populate, resume_all

    with KVSaver(str(tmp_path / "state")) as local, KVSaver(postgres_url, table=table) as shared:
        populate(local)
        n = sum(1 for _ in local.list(None))
        stats = copy_all(local, shared)  # verified: every list()/get_tuple() equal
        assert stats.checkpoints_copied == stats.verified == n
        assert copy_all(local, shared).checkpoints_copied == 0  # a re-run adds nothing
        assert resume_all(shared) == resume_all(local)  # the threads continue the same


# -- speculation: reads answered from the cache, verified in the commit --------------


def test_a_stale_cached_read_is_caught_by_the_guard_and_rerun(
    postgres_url: str, table: str
) -> None:
    """Store a caches n=1 (it wrote it); store b (another machine) sets n=2.
    a's increment first reads the stale 1 from its cache: the guard in its
    committing pipeline fails, nothing is applied, the function is rerun
    reading from the server. Exactly one increment lands, on 2."""
    a = PostgresStore(postgres_url, table=table)
    b = PostgresStore(postgres_url, table=table)
    try:
        a.transact(lambda txn: txn.put(b"n", b"1"))
        b.transact(lambda txn: txn.put(b"n", b"2"))
        seen: list[bytes | None] = []

        def incr(txn: Any) -> None:
            v = txn.get(b"n")
            seen.append(v)
            txn.put(b"n", b"%d" % (int(v) + 1))

        a.transact(incr)
        assert seen == [b"1", b"2"]  # the cached guess, then the server's value
        assert _counter(a) == 3
        assert a.speculations == [0, 1]
        seen.clear()
        a.transact(incr)  # the cache is right now: one attempt
        assert seen == [b"3"] and _counter(a) == 4
        assert a.speculations == [1, 1]

        # A guess that makes the function raise (a key assumed absent that is
        # not) reruns it too, instead of raising what the guess caused.
        fresh = PostgresStore(postgres_url, table=table)
        try:
            seen.clear()
            fresh.transact(incr)
            assert seen == [None, b"4"] and _counter(a) == 5
        finally:
            fresh.close()
    finally:
        a.close()
        b.close()


def test_two_savers_writing_one_thread_in_turn_stay_exact(postgres_url: str, table: str) -> None:
    """Two KVSavers, each with its own store (two machines), put the
    checkpoints of one growing chat in turn: each one's cached view of the
    thread (its delta base, the activity record) is stale every other put.
    The guards catch it: every checkpoint reads back exact from a third."""
    a = KVSaver(PostgresStore(postgres_url, table=table))
    b = KVSaver(PostgresStore(postgres_url, table=table))
    c = KVSaver(PostgresStore(postgres_url, table=table))
    try:
        parent, expected = None, {}
        for i in range(12):
            saver = (a, b)[i % 2]
            cid = f"{i:04d}"
            values = {"messages": [f"message {j} " * 20 for j in range(i + 1)], "other": i}
            versions = {"messages": f"{i + 1:08d}", "other": f"{i + 1:08d}"}
            saver.put(config("t", "", parent), make_checkpoint(cid, values, versions), {}, versions)
            saver.put_writes(config("t", "", cid), [("w", i)], f"task{i}")
            expected[cid] = values
            parent = cid
            for reader in (a, b):  # one of them guesses its own, older latest
                got = reader.get_tuple(config("t"))
                assert got is not None and got.checkpoint["id"] == cid
                assert got.checkpoint["channel_values"] == values
                assert got.pending_writes == [(f"task{i}", "w", i)]
        for cid, values in expected.items():
            got = c.get_tuple(config("t", "", cid))
            assert got is not None and got.checkpoint["channel_values"] == values
            assert got.pending_writes == [(f"task{int(cid)}", "w", int(cid))]
        failed = a.store.speculations[1] + b.store.speculations[1]
        assert failed >= 1  # the stale guesses were made, and caught
    finally:
        for s in (a, b, c):
            s.close()


# -- maintenance goes through transact(): conflicts are retried ----------------------


class _Interleaved(PostgresStore):
    """Runs ``between()`` once, when the first write transaction has done its
    work and is about to commit: another connection commits there. Counts
    the write transactions that try to commit."""

    attempts = 0
    at = 1  # the write transaction (counted from 1) that between() runs before
    between: Any = None

    def _close_txn(self, txn: Any, commit: bool) -> None:
        try:
            if txn._write and commit:
                self.attempts += 1
                if self.attempts == self.at and self.between is not None:
                    self.between()
        finally:  # the transaction ends whatever between() did
            super()._close_txn(txn, commit)


def _concurrent_write(url: str, table: str, key: bytes, value: bytes) -> None:
    """Another connection's SERIALIZABLE transaction: it reads every key,
    writes ``key`` and commits (a lock wait ends in an error, not a hang)."""
    with psycopg.connect(url, autocommit=True) as other:
        ident = sql.Identifier(table)
        other.execute("SET lock_timeout = '5s'")
        other.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        other.execute(sql.SQL("SELECT count(*) FROM {}").format(ident))  # reads every key
        other.execute(sql.SQL("INSERT INTO {} VALUES (%b, %b)").format(ident), (key, value))
        other.execute("COMMIT")


@pytest.mark.parametrize("op", ["delete_thread", "prune", "copy_thread", "delete_for_runs"])
def test_maintenance_retries_a_serialization_conflict(
    postgres_url: str, table: str, op: str
) -> None:
    """Another connection reads the thread's keys and writes a key into the
    thread's ranges, and commits while the operation's first attempt is in
    flight: a write skew SERIALIZABLE refuses. The operation is rerun (it
    used to raise StoreConflictError) and its result includes that write."""
    store = _Interleaved(postgres_url, table=table)
    saver = KVSaver(store)
    try:
        _chat(saver, "t", 3)
        versions = {"messages": 4, "other": 1}
        saver.put(
            config("t", "", "0002"),
            make_checkpoint("0003", {"messages": [0, 1, 2, 3], "other": "x"}, versions),
            {"run_id": "r1"},
            versions,
        )
        for cid in ("0000", "0001", "0002", "0003"):
            saver.put_writes(config("t", "", cid), [("a", 1)], "task")
        other = psycopg.connect(postgres_url, autocommit=True)
        ident = sql.Identifier(table)
        other.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        other.execute(sql.SQL("SELECT count(*) FROM {}").format(ident))  # reads every key
        # A write (one more pending write of the latest checkpoint) the first
        # attempt cannot see; its scans cover it.
        from kvsaver import schema as S

        extra = S.write_keys(S.task_write_prefix("t", "", "0003", "late"), [0])[0]
        value = S.encode_write(S.WriteRecord("late", "b", saver.serde.dumps_typed(2), "", 0))
        other.execute(sql.SQL("INSERT INTO {} VALUES (%b, %b)").format(ident), (extra, value))
        store.between = lambda: other.execute("COMMIT")
        store.attempts = 0
        if op == "delete_thread":
            saver.delete_thread("t")
        elif op == "prune":
            saver.prune(["t"], strategy="delete")
        elif op == "copy_thread":
            saver.copy_thread("t", "u")
        else:
            saver.delete_for_runs(["r1"])
        other.close()
        assert store.attempts == 2  # rerun once, not raised
        if op in ("delete_thread", "prune"):
            assert store.attempts == 2  # rerun once, not raised
            assert saver.get_tuple(config("t")) is None
            with store.read() as txn:
                assert txn.get(extra) is None  # the rerun saw the late write
        elif op == "copy_thread":
            got = saver.get_tuple(config("u"))
            assert got is not None and ("late", "b", 2) in got.pending_writes
        else:
            assert saver.get_tuple(config("t", "", "0003")) is None
            assert saver.get_tuple(config("t")).checkpoint["id"] == "0002"
            with store.read() as txn:
                assert txn.get(extra) is None
    finally:
        saver.close()


def test_a_sweep_retries_a_serialization_conflict_and_counts_once(
    postgres_url: str, table: str
) -> None:
    """A retention sweep's per-thread transaction conflicts with another
    connection's (which wrote a pending write of a checkpoint the sweep
    deletes): it is rerun, not raised (it used to go through write(): a
    StoreConflictError), the rerun deletes that write too, and the report
    counts the thread's pruned checkpoints once."""
    from kvsaver import Retention
    from kvsaver import schema as S

    # speculate=False: every read goes to the server, so the conflict is
    # PostgreSQL's (SERIALIZABLE), not a guard's.
    store = _Interleaved(postgres_url, table=table, speculate=False)
    saver = KVSaver(store)
    try:
        _chat(saver, "t", 4)
        for cid in ("0000", "0001", "0002", "0003"):
            saver.put_writes(config("t", "", cid), [("a", 1)], "task")
        extra = S.write_keys(S.task_write_prefix("t", "", "0001", "late"), [0])[0]
        value = S.encode_write(S.WriteRecord("late", "b", saver.serde.dumps_typed(2), "", 0))
        # When the sweep's transaction for "t" has read (and deleted) and is
        # about to commit, another transaction reads every key, writes a
        # pending write of a checkpoint the sweep deletes, and commits first.
        store.between = lambda: _concurrent_write(postgres_url, table, extra, value)
        store.at = 2  # 1: the sweep records its start; 2: its transaction for "t"
        store.attempts = 0
        report = saver.sweep(Retention(keep_last=1))
        assert store.attempts == 4  # start, "t" twice (rerun once), finish
        assert (report.threads_checked, report.threads_pruned) == (1, 1)
        assert report.checkpoints_deleted == 3  # not 6: the rerun's count only
        assert [t.checkpoint["id"] for t in saver.list(config("t"))] == ["0003"]
        assert saver.get_tuple(config("t")).pending_writes == [("task", "a", 1)]
        with store.read() as txn:
            assert txn.get(extra) is None  # the rerun saw the late write
    finally:
        saver.close()


def test_the_migration_retries_a_serialization_conflict_and_counts_once(
    postgres_url: str, table: str, tmp_path: Any
) -> None:
    """A batch of migrate_from_sqlite conflicts with another connection that
    wrote one of the batch's pending writes (the very record the migration
    writes): the batch is rerun, not raised (it went through write(), where
    this is a StoreConflictError or a lock wait),
    the rerun finds that write present, and the store and the counts are
    exactly a clean migration's (nothing applied or counted twice)."""
    from kvsaver import delta as D
    from kvsaver import schema as S
    from kvsaver.migrate import migrate_from_sqlite
    from migrate_helpers import populate, sqlite_saver, store_image

    path = str(tmp_path / "source.sqlite")
    src = sqlite_saver(path)
    populate(src, chat_threads=1)
    src.conn.close()
    ref_table = unique_table("ref")
    try:
        with KVSaver(postgres_url, table=ref_table) as ref:
            D.codec(ref.serde).stride = 1  # as below
            clean = migrate_from_sqlite(path, ref, verify=False)
            want = store_image(ref.store)
        lo, hi = S.keyspace_range(S.WRITE)
        wkey = next(k for k in sorted(want) if lo <= k < hi)
        # Speculating (the default): the batch's reads are guesses checked
        # by the guard in its one statement, which finds the other's write.
        store = _Interleaved(postgres_url, table=table)
        saver = KVSaver(store)
        # No long steps in delta chains: their base is found by a scan, which
        # sends the batch's buffered writes ahead of the commit, and the other
        # connection's insert of the same key would then wait for our lock.
        D.codec(saver.serde).stride = 1
        try:
            # When the batch is about to commit, another connection writes
            # one of its pending writes (the record the migration writes).
            store.between = lambda: _concurrent_write(postgres_url, table, wkey, want[wkey])
            store.at, store.attempts = 1, 0
            stats = migrate_from_sqlite(path, saver, verify=False)
            assert store.attempts == 2  # one batch, rerun once
            # the record holds the regular writes of one task (schema.write_records)
            held = len(S.decode_writes(want[wkey]))
            assert stats.writes_present == held
            assert stats.writes_copied == clean.writes_copied - held
            assert stats.checkpoints_copied == clean.checkpoints_copied > 0
            assert stats.blobs_written == clean.blobs_written
            assert store_image(store) == want
        finally:
            saver.close()
    finally:
        drop_tables(postgres_url, [ref_table])


@pytest.mark.parametrize("write", [False, True])
def test_an_interrupt_while_waiting_for_the_server_discards_the_connection(
    postgres_url: str, table: str, monkeypatch: pytest.MonkeyPatch, write: bool
) -> None:
    """Ctrl-C while a round trip waits for the server's answer (the driver's
    own wait on the socket): that connection is closed, neither kept for the
    next transaction nor given back to the pool half-read, and the next
    transactions work on another one."""
    from kvsaver.kv.postgres import driver as P

    store = PostgresStore(postgres_url, table=table)
    try:
        with store.write() as txn:
            txn.put(b"k", b"1")
        with store.read() as txn:  # the read's statements prepared too
            assert txn.get(b"k") == b"1"
        closed: list[Any] = []
        close, wait = psycopg.Connection.close, P._wait

        def closing(self: Any) -> None:
            closed.append(self)
            close(self)

        def interrupted(fd: int, writable: bool, timeout: float | None = None) -> bool:
            if timeout is None:  # a wait for the server, not _ended's look
                raise KeyboardInterrupt
            return wait(fd, writable, timeout)

        monkeypatch.setattr(psycopg.Connection, "close", closing)
        monkeypatch.setattr(P, "_wait", interrupted)
        with pytest.raises(KeyboardInterrupt):
            if write:
                with store.write() as txn:
                    txn.put(b"k", b"2")
            else:
                with store.read() as txn:
                    txn.get(b"k")
        monkeypatch.setattr(P, "_wait", wait)
        assert closed and all(c.closed for c in closed)
        assert not [c for _, c, _ in store._lingering.items if c.closed]
        with store.read() as txn:  # the write was sent: applied or not, never half
            assert txn.get(b"k") in ([b"1", b"2"] if write else [b"1"])
        with store.write() as txn:
            txn.put(b"k", b"3")
        with store.read() as txn:
            assert txn.get(b"k") == b"3"
    finally:
        store.close()


def test_speculation_cache_forgets_exactly_a_ranges_keys() -> None:
    """The cache against a plain dict of what it should hold: learning a
    range (a delete_range's) drops the cached keys inside it and no others,
    through evictions, keys evicted then learned again, and the rebuilds of
    its key order; its size stays the sum of its entries' costs."""
    import random

    from kvsaver.kv.postgres.cache import _Cache

    rnd = random.Random(7)
    cache = _Cache(max_bytes=40_000)
    keys = [bytes([a, b]) for a in range(40) for b in range(250)]
    order, rebuilds = cache.order, 0
    for step in range(3000):
        known = {k: bytes(rnd.randrange(60)) for k in rnd.sample(keys, rnd.randrange(1, 12))}
        ranges = []
        if step % 5 == 0:
            lo = bytes([rnd.randrange(40), rnd.randrange(250)])
            hi = None if step % 700 == 0 else bytes([lo[0], min(lo[1] + rnd.randrange(1, 40), 255)])
            ranges.append((None if step % 1000 == 0 else lo, hi))
        before = dict(cache.items)
        cache.learn(known, ranges)
        rebuilds += cache.order is not order
        order = cache.order
        for k in before:
            inside = any((a is None or k >= a) and (b is None or k < b) for a, b in ranges)
            if inside and k not in known:
                assert k not in cache.items, (step, k)
        for k, v in known.items():
            assert cache.items.get(k, v) == v  # learned, or evicted since (oldest first)
        assert cache.size == sum(cache._cost(k, v) for k, v in cache.items.items())
        assert cache.size <= cache.max_bytes
        assert set(cache.items) <= set(cache.order)
    assert rebuilds > 3  # the key order was rebuilt, and checked after
