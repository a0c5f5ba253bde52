"""kill -9 and durability: real processes, really killed.

* A tight put/put_writes loop (two writer processes on one store, one of them
  killed at a random moment each round; each also deletes its own old runs,
  so deletes are killed too) and a real LangGraph graph are SIGKILLed again
  and again. After each kill a *new* process opens the store and, before
  writing anything, checks it: it opens; every listed checkpoint loads whole
  (a blob record for every channel version, checksums match, writes
  all-or-nothing); every put acknowledged before the kill is there (or was
  removed by an acknowledged delete; a delete in flight removed all of its
  run or nothing); the graph resumes an interrupted run from its latest
  checkpoint. A last fresh process checks everything at the end.
* Each durability setting gets a test of what it promises: kill -9 loses
  nothing acknowledged, for all three; and what has reached the disk when a
  commit returns, read from the page cache of a disk-backed directory (an
  fsynced page is clean and can be dropped; a page written but not synced is
  dirty and cannot). The page cache survives a SIGKILL on any filesystem, so
  the kill tests run in the suite's (tmpfs) tmp_path.

Writers run as ``python tests/procs_helpers.py <worker>`` subprocesses (no
fork: fresh interpreters, which import only what the worker needs). To keep
the kill loops fast, the next writer is started while the current one still
runs, and opens the store only when told to (a line on its stdin), after the
kill. Processes are always killed and reaped on the way out.
"""

from __future__ import annotations

import itertools
import random
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import procs_helpers as H
import pytest
from kvsaver import KVSaver

pytestmark = pytest.mark.timeout(240)

# Loop writers delete their own run b-2 when they start run b (WINDOW puts
# each): the store stays small however fast the disk, so each check after a
# kill reads all of it, and deletes are killed mid-way too.
WINDOW = 100


@dataclass
class Incarnation:
    proc: H.Child
    status: Path

    def go(self) -> None:
        self.proc.go()

    def ready(self) -> dict[str, Any]:
        """Its first status report (after it checked the store); must be ok."""
        first = H.wait_for(lambda: H.read_reports(self.status), 120, "writer ready", self.proc)[0]
        assert first["ok"], f"check after the kill failed: {first}"
        return first


class Launcher:
    """Starts workers (``python procs_helpers.py``), each waiting for its go."""

    def __init__(self, tmp_path: Path, worker: str, procs: list[Any]) -> None:
        self.tmp_path, self.worker, self.procs = tmp_path, worker, procs
        self.n = 0

    def __call__(self, **kwargs: Any) -> Incarnation:
        self.n += 1
        status = self.tmp_path / f"status-{self.n}.jsonl"
        proc = H.Child(self.worker, status_path=str(status), go=True, **kwargs)
        self.procs.append(proc)
        return Incarnation(proc, status)


def _kill(inc: Incarnation) -> None:
    inc.proc.kill()
    inc.proc.join(30)
    assert inc.proc.exitcode == -9, f"the writer died on its own first: {inc.proc.exitcode}"


def run_loop_kills(
    tmp_path: Path, kills: int, max_delay: float = 0.3, store: str | None = None
) -> dict[str, int]:
    """Two tight-loop writers on one store (an LMDB directory in ``tmp_path``,
    or ``store``: a postgresql:// URL); each round SIGKILLs one of them at a
    random moment and a new process takes over its thread after checking the
    store. Returns counts for the report."""
    store, ack_dir = store or str(tmp_path / "store"), tmp_path / "acks"
    ack_dir.mkdir()
    rng = random.Random()
    slots = ["A", "B"]
    procs: list[Any] = []
    launch = Launcher(tmp_path, "crash_loop_writer", procs)
    checks = 0
    acks_at_kill = []
    with H.reaped(procs):
        running = {}

        def start(slot: str) -> Incarnation:
            return launch(store_dir=store, thread=slot, ack_dir=str(ack_dir), window=WINDOW)

        for slot in slots:
            running[slot] = start(slot)
            running[slot].go()
            running[slot].ready()
        spare = {slot: start(slot) for slot in slots}
        for r in range(kills):
            slot = slots[r % 2]
            time.sleep(rng.uniform(0.0, max_delay))
            _kill(running[slot])
            acks_at_kill.append(len(H.read_acks(ack_dir.glob("*.ack"))))
            nxt = spare[slot]
            nxt.go()
            result = nxt.ready()
            assert result["acked"] >= acks_at_kill[-1]
            checks += 1
            running[slot] = nxt
            if r + 2 < kills:  # this slot is killed again later
                spare[slot] = start(slot)
        for slot in slots:  # the last two kills, checked by the final process
            time.sleep(rng.uniform(0.0, max_delay))
            _kill(running[slot])
        for inc in spare.values():
            if inc.proc.is_alive() and not inc.proc.gone():
                inc.proc.kill()
        final = tmp_path / "final.jsonl"
        acks = sorted(str(p) for p in ack_dir.glob("*.ack"))
        verifier = H.Child(
            "verify_worker", store_dir=store, ack_paths=acks, result_path=str(final), window=WINDOW
        )
        procs.append(verifier)
        verifier.join(120)
        result = H.read_reports(final)[-1]
    assert result["ok"], f"final check failed: {result}"
    total_acks = len(H.read_acks(ack_dir.glob("*.ack")))
    assert result["acked"] == total_acks > 0
    # Every round's writer made progress between kills (kills landed mid-loop).
    assert all(b > a for a, b in itertools.pairwise(acks_at_kill))
    deleted = H.read_deletions(ack_dir.glob("*.ack"))
    return {
        "kills": kills + 2,
        "checks": checks + 1,
        "acked": total_acks,
        "runs deleted": sum(b + 1 for b in deleted.values()),
        "checked at the end": result["checked"],
    }


def run_graph_kills(
    tmp_path: Path, kills: int, max_delay: float = 0.4, store: str | None = None
) -> dict[str, int]:
    """A real StateGraph invoked in a loop, SIGKILLed at random moments; each
    new process checks the thread and resumes an interrupted run (``store``:
    as run_loop_kills)."""
    store, ack = store or str(tmp_path / "store"), str(tmp_path / "graph.ack")
    rng = random.Random()
    procs: list[Any] = []
    launch = Launcher(tmp_path, "crash_graph_writer", procs)
    resumed = 0
    with H.reaped(procs):
        current = launch(store_dir=store, thread="g", ack_path=ack)
        current.go()
        current.ready()
        nxt = launch(store_dir=store, thread="g", ack_path=ack)
        for r in range(kills):
            time.sleep(rng.uniform(0.05, max_delay))
            _kill(current)
            acked = len(H.read_acks([ack]))
            nxt.go()
            result = nxt.ready()
            assert result["acked"] == acked
            resumed += bool(result["resumed"])
            current = nxt
            last = r + 1 == kills  # the final process checks everything
            nxt = launch(
                store_dir=store,
                thread="g",
                ack_path=ack,
                max_runs=1 if last else None,
                recent=None if last else 200,
            )
        time.sleep(rng.uniform(0.05, max_delay))
        _kill(current)
        acked = len(H.read_acks([ack]))
        nxt.go()  # the final process: check, resume, one more run, exit
        result = nxt.ready()
        resumed += bool(result["resumed"])
        nxt.proc.join(120)
        assert nxt.proc.exitcode == 0, H.read_reports(nxt.status)
        done = H.read_reports(nxt.status)[-1]
        assert done["ok"] and done["done"], done
    total = len(H.read_acks([ack]))
    assert result["acked"] == acked and total == acked + 1
    # A kill mid-run leaves a checkpoint with tasks left to run; invoke(None)
    # finished them (checked in the child). Runs take most of the time, so
    # among this many random kills some land mid-run.
    assert resumed >= 1
    with KVSaver(store, readonly=True) as saver:
        graph = H.build_graph(saver)
        state = graph.get_state(H.thread_config("g"))
        assert state.values["log"] == list(range(1, state.values["count"] + 1))
        assert state.values["count"] >= H.GRAPH_RUN * total
    return {"kills": kills + 1, "resumed": resumed, "acked": total}


def test_kill9_tight_loop_writers(tmp_path: Path) -> None:
    stats = run_loop_kills(tmp_path, kills=20)
    print(f"\nkill -9 loop: {stats}")


def test_kill9_graph_writer(tmp_path: Path) -> None:
    stats = run_graph_kills(tmp_path, kills=11)
    print(f"\nkill -9 graph: {stats}")


@pytest.fixture
def pg_database(postgres_url: str) -> Iterator[str]:
    """A database of its own on the suite's PostgreSQL server; its URL."""
    from pg_helpers import create_database, drop_database, unique_table

    name = unique_table("db")
    yield create_database(postgres_url, name)
    drop_database(postgres_url, name)


def test_kill9_tight_loop_writers_on_postgres(tmp_path: Path, pg_database: str) -> None:
    """Clients SIGKILLed mid-put, mid-put_writes and mid-delete on
    PostgreSQL: the server ends their sessions and rolls back what they had
    not committed; nothing acknowledged is lost, no checkpoint is half there,
    no run half deleted, and the next process writes on at once."""
    stats = run_loop_kills(tmp_path, kills=8, store=pg_database)
    print(f"\nkill -9 loop, PostgreSQL: {stats}")


def test_kill9_graph_writer_on_postgres(tmp_path: Path, pg_database: str) -> None:
    stats = run_graph_kills(tmp_path, kills=5, store=pg_database)
    print(f"\nkill -9 graph, PostgreSQL: {stats}")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_kill9_tight_loop_writers_many(tmp_path: Path) -> None:
    stats = run_loop_kills(tmp_path, kills=100, max_delay=0.5)
    print(f"\nkill -9 loop (slow): {stats}")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_kill9_graph_writer_many(tmp_path: Path) -> None:
    stats = run_graph_kills(tmp_path, kills=40, max_delay=0.6)
    print(f"\nkill -9 graph (slow): {stats}")


# -- durability ---------------------------------------------------------------------


@pytest.mark.parametrize("durability", ["full", "meta", "none"])
def test_durability_kill9_loses_nothing_acknowledged(tmp_path: Path, durability: str) -> None:
    """All three settings promise that kill -9 loses no acknowledged put."""
    store, ack_dir = str(tmp_path / "store"), tmp_path / "acks"
    ack_dir.mkdir()
    procs: list[Any] = []
    launch = Launcher(tmp_path, "crash_loop_writer", procs)

    def start() -> Incarnation:
        return launch(store_dir=store, thread="A", ack_dir=str(ack_dir), durability=durability)

    with H.reaped(procs):
        current = start()
        current.go()
        current.ready()
        for r in range(2):
            nxt = start()
            # At least 20 more acknowledged puts, then a random moment.
            floor = len(H.read_acks(ack_dir.glob("*.ack"))) + 20
            H.wait_for(
                lambda f=floor: len(H.read_acks(ack_dir.glob("*.ack"))) >= f,
                60,
                "acks",
                current.proc,
            )
            time.sleep(random.uniform(0, 0.05))
            _kill(current)
            acked = len(H.read_acks(ack_dir.glob("*.ack")))
            nxt.go()
            result = nxt.ready()  # the new process found every acknowledged put whole
            assert result["acked"] == acked >= 20 * (r + 1)
            current = nxt
        _kill(current)


@contextmanager
def _removed(path: Path) -> Iterator[Path]:
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _flags(durability: str, path: Path) -> dict[str, bool]:
    with KVSaver(path, durability=durability) as saver:  # type: ignore[arg-type]
        return saver.store._env.env.flags()  # type: ignore[attr-defined]


def test_durability_what_reaches_the_disk(tmp_path: Path) -> None:
    """What is on disk (not just in the page cache) when a commit returned:
    "full": everything; "meta": the data pages, not the last meta page;
    "none": not even the data, until ``sync()``.

    A writer process commits, reports, and is SIGKILLed while idle; then the
    kernel's page flags tell which pages of data.mdb are dirty or under
    writeback, i.e. not on the disk yet (procs_helpers.unwritten_pages).
    Meta pages are pages 0 and 1."""
    expected_flags = {
        "full": (True, True),
        "meta": (True, False),
        "none": (False, False),
    }
    for durability, (sync, metasync) in expected_flags.items():
        flags = _flags(durability, tmp_path / f"flags-{durability}")
        assert (flags["sync"], flags["metasync"]) == (sync, metasync), (durability, flags)
    disk = H.real_disk_dir(tmp_path)
    if disk is None:
        # Only tmpfs and the like here: every page stays in memory, nothing to
        # observe beyond the flags above (which LMDB's fsync behaviour follows).
        print("\nno disk-backed directory found; checked LMDB's flags only")
        return
    resident: dict[str, list[int]] = {}
    procs: list[Any] = []
    with H.reaped(procs), _removed(disk):

        def unwritten_after(case: str, durability: str, sync: bool) -> list[int]:
            d = disk / case
            shutil.rmtree(d, ignore_errors=True)
            (d / "acks").mkdir(parents=True)
            status = d / "status.jsonl"
            p = H.Child(
                "commit_then_wait",
                store_dir=str(d / "store"),
                thread="A",
                ack_dir=str(d / "acks"),
                status_path=str(status),
                n=30,
                durability=durability,
                sync=sync,
            )
            procs.append(p)
            report = H.wait_for(lambda s=status: H.read_reports(s), 60, case, p)[0]
            assert report["ok"] and report["acked"] == 30, report
            p.kill()
            p.join(30)
            unwritten = H.unwritten_pages(d / "store" / "data.mdb")
            assert unwritten is not None  # the probe worked on this directory
            with KVSaver(d / "store", readonly=True) as saver:
                result = H.verify_loop_store(saver, [d / "acks" / "A.ack"])
            assert result["n"] == 0 and result["acked"] == 30, result
            return unwritten

        for case, durability, sync, still_dirty in [
            ("full", "full", False, None),
            ("meta", "meta", False, lambda u: bool(u)),
            ("none", "none", False, lambda u: bool(set(u) - {0, 1})),
            ("none+sync()", "none", True, None),
        ]:
            # Where pages must still be dirty, the kernel's own writeback (another
            # job writing a lot) may have cleaned them first: up to 3 tries, each
            # on a fresh store. A commit that synced what it must not is clean in
            # every try; one that left dirty what it must sync fails the first.
            for _ in range(3):
                resident[case] = unwritten_after(case, durability, sync)
                if still_dirty is None or still_dirty(resident[case]):
                    break
    print(f"\nunwritten pages of data.mdb after the last commit: {resident}")
    assert resident["full"] == []
    assert resident["meta"] and set(resident["meta"]) <= {0, 1}
    assert set(resident["none"]) - {0, 1}
    assert resident["none+sync()"] == []
