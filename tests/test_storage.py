"""Storage: stats, disk usage, offline compaction and its refusal
while the store is open elsewhere, and the ``tools.storage`` command line."""

from __future__ import annotations

import fcntl
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import kvsaver.kv.lmdb.environment as lmdb_environment
import kvsaver.kv.lmdb.lockfile as lmdb_lockfile
import lmdb
import pytest
from crafted_helpers import plant
from kvsaver import KVSaver
from kvsaver import schema as S
from kvsaver.kv import (
    FileStore,
    LMDBStore,
    MemoryStore,
    PostgresStore,
    StoreBusyError,
    SupportsDiskUsage,
)
from kvsaver.kv.keys import unpack
from kvsaver.kv.lmdb.compact import compact_lmdb
from kvsaver.kv.lmdb.lockfile import LOCK_FILE
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = [f"w{i}" for i in range(3000)]


def sentence(rnd: random.Random, chars: int) -> str:
    out: list[str] = []
    while sum(len(w) + 1 for w in out) < chars:
        out.append(rnd.choice(VOCAB))
    return " ".join(out)


def chat_thread(saver: KVSaver, thread: str, turns: int, seed: int) -> None:
    """A chat thread as a graph writes it: every turn a checkpoint with the
    whole (growing) message list as a new blob, and a pending write."""
    rnd = random.Random(seed)
    messages: list[Any] = []
    parent: str | None = None
    version = None
    for turn in range(turns):
        messages = [
            *messages,
            HumanMessage(sentence(rnd, rnd.randint(100, 400)), id=f"h{turn}"),
            AIMessage(sentence(rnd, rnd.randint(200, 600)), id=f"a{turn}"),
        ]
        cp = empty_checkpoint()
        cp["id"] = str(uuid6(clock_seq=turn))
        version = saver.get_next_version(version, None)
        cp["channel_values"] = {"messages": messages, "turn": turn}
        cp["channel_versions"] = {"messages": version, "turn": version}
        conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
        if parent is not None:
            conf["checkpoint_id"] = parent
        config = saver.put(
            {"configurable": conf},
            cp,
            {"source": "loop", "step": turn},
            {"messages": version, "turn": version},
        )
        saver.put_writes(config, [("messages", messages[-1:])], task_id=f"task-{turn}")
        parent = cp["id"]


def snapshot(saver: KVSaver) -> dict[str, Any]:
    """Every checkpoint of the store, loaded: id -> (values, writes, metadata)."""
    return {
        t.checkpoint["id"]: (t.checkpoint["channel_values"], t.pending_writes, t.metadata)
        for t in saver.list(None)
    }


# -- stats -----------------------------------------------------------------------------------


@pytest.fixture(params=["memory", "lmdb", "file", "postgres"])
def any_saver(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[KVSaver]:
    if request.param == "postgres":
        from pg_helpers import unique_table

        url = request.getfixturevalue("postgres_url")
        saver = KVSaver(url, table=unique_table("stats"))
    elif request.param == "memory":
        saver = KVSaver(":memory:")
    elif request.param == "lmdb":
        saver = KVSaver(str(tmp_path / "store"), durability="none")
    else:
        saver = KVSaver(str(tmp_path / "store.kvs"), backend="file")
    with saver:
        yield saver


def test_stats_agree_with_what_was_written(any_saver: KVSaver) -> None:
    saver = any_saver
    turns = {"small": 2, "big": 6, "medium": 4}
    for i, (thread, n) in enumerate(turns.items()):
        chat_thread(saver, thread, n, seed=i)
    # a second namespace of "big", and a thread with writes only
    saver.put(
        {"configurable": {"thread_id": "big", "checkpoint_ns": "sub:1"}},
        empty_checkpoint(),
        {"source": "loop", "step": 0},
        {},
    )
    saver.put_writes(
        {"configurable": {"thread_id": "orphan", "checkpoint_ns": "", "checkpoint_id": "x"}},
        [("a", 1), ("b", 2)],
        task_id="t",
    )
    stats = saver.stats()
    by_thread = {t.thread_id: t for t in stats.threads}
    assert set(by_thread) == {"small", "big", "medium", "orphan"}
    # counted independently, from the raw keys
    expected: dict[str, dict[str, int]] = {}
    live = 0
    with saver.store.read() as txn:
        for key, value in txn.scan(None, None):
            live += len(key) + len(value)
            kind, *rest = unpack(key)
            if kind in (S.CHECKPOINT, S.BLOB, S.WRITE, S.HEAD):
                e = expected.setdefault(rest[0], {"c": 0, "b": 0, "w": 0, "bytes": 0})
                if kind == S.WRITE:  # a record holds one write or a batch
                    e[kind] += len(S.decode_writes(value))
                elif kind != S.HEAD:  # a head counts in bytes only
                    e[kind] += 1
                e["bytes"] += len(key) + len(value)
    for thread, e in expected.items():
        t = by_thread[thread]
        assert (t.checkpoints, t.blobs, t.writes, t.bytes) == (e["c"], e["b"], e["w"], e["bytes"])
    assert by_thread["big"].checkpoints == 6 + 1 and by_thread["big"].writes == 6
    assert by_thread["big"].blobs == 6  # the message lists; each turn number is in its record
    assert by_thread["orphan"].writes == 2 and by_thread["orphan"].checkpoints == 0
    assert stats.live_bytes == live
    assert stats.checkpoints == 2 + 7 + 4 and stats.writes == 2 + 6 + 4 + 2
    assert [t.thread_id for t in stats.threads][:3] == ["big", "medium", "small"]
    assert all(a.bytes >= b.bytes for a, b in zip(stats.threads, stats.threads[1:]))
    assert by_thread["big"].last_activity is not None
    # disk: the backend's files (memory: the live bytes themselves)
    store = saver.store
    assert isinstance(store, SupportsDiskUsage)
    if isinstance(store, LMDBStore):
        files = [os.path.join(store.path, f) for f in os.listdir(store.path)]
        assert stats.disk_bytes == sum(os.path.getsize(f) for f in files) >= live
    elif isinstance(store, FileStore):
        assert stats.disk_bytes == os.path.getsize(store.path)
    elif isinstance(store, PostgresStore):  # the table with its index and TOAST
        assert stats.disk_bytes == store.disk_usage() >= live
    else:
        assert isinstance(store, MemoryStore) and stats.disk_bytes == live
    assert "big" in stats.format(top=2) and "more threads" in stats.format(top=2)


def test_stats_of_an_empty_store() -> None:
    stats = KVSaver(":memory:").stats()
    assert stats.threads == [] and stats.checkpoints == stats.writes == stats.blobs == 0
    assert stats.live_bytes == stats.disk_bytes > 0  # the schema record
    assert stats.store_items == stats.store_bytes == 0
    assert "store items" not in stats.format()


# -- compaction --------------------------------------------------------------------------------


def test_compaction_after_deleting_90_percent_of_threads(tmp_path: Any) -> None:
    path = str(tmp_path / "store")
    rnd = random.Random(5)
    with KVSaver(path, durability="none") as saver:
        for t in range(40):  # short and long chat threads
            chat_thread(saver, f"thread-{t:02d}", rnd.randint(3, 25), seed=t)
        for t in range(40):
            if t % 10:
                saver.delete_thread(f"thread-{t:02d}")
        kept = snapshot(saver)
    with KVSaver(path, readonly=True) as saver:  # as closed (with the heads close wrote)
        live = saver.stats().live_bytes
    assert len(kept) > 0
    data = os.path.join(path, "data.mdb")
    grown = os.path.getsize(data)
    assert grown > 5 * live  # LMDB never gives pages back by itself
    result = compact_lmdb(path)
    assert result.before == grown and result.after == os.path.getsize(data)
    assert result.after <= 1.5 * live
    assert not os.path.exists(data + ".compact")
    with KVSaver(path) as saver:
        assert snapshot(saver) == kept  # every remaining checkpoint loads, unchanged
        assert saver.stats().live_bytes == live
        chat_thread(saver, "after", 2, seed=99)  # and the store takes writes
        assert len(snapshot(saver)) == len(kept) + 2


def test_compaction_refused_in_this_process_while_open(tmp_path: Any) -> None:
    path = str(tmp_path / "store")
    saver = KVSaver(path)
    with pytest.raises(StoreBusyError, match="this process has it open"):
        compact_lmdb(path)
    saver.close()
    compact_lmdb(path)


_HOLDER = """
import sys, lmdb
sys.path.insert(0, {root!r})
from kvsaver.kv import LMDBStore
mode = sys.argv[1]
if mode == "raw":   # an LMDB user that is not LMDBStore
    env = lmdb.open({path!r}, subdir=True)
else:
    store = LMDBStore({path!r}, readonly=(mode == "readonly"))
print("ready", flush=True)
sys.stdin.read()  # hold it open until the parent closes our stdin
"""


@pytest.mark.parametrize("mode", ["writer", "readonly", "raw"])
def test_compaction_refused_while_another_process_holds_the_store(tmp_path: Any, mode: str) -> None:
    path = str(tmp_path / "store")
    with KVSaver(path) as saver:
        chat_thread(saver, "t", 3, seed=1)
        before = snapshot(saver)
    size = os.path.getsize(os.path.join(path, "data.mdb"))
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER.format(root=ROOT, path=path), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        with pytest.raises(StoreBusyError, match="another process has it open"):
            compact_lmdb(path)
        assert os.path.getsize(os.path.join(path, "data.mdb")) == size  # untouched
        # the refusal does not disturb the holder: it still reads
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0
    compact_lmdb(path)  # nobody left: it goes ahead
    with KVSaver(path) as saver:
        assert snapshot(saver) == before


def test_an_opener_waits_for_a_running_compaction(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While compaction holds kvsaver.lock exclusively, an opener waits (here:
    no time at all, so it gives up with a clear error) and opens afterwards."""
    path = str(tmp_path / "store")
    LMDBStore(path).close()
    monkeypatch.setattr(lmdb_lockfile, "_COMPACTION_WAIT_SECONDS", 0.0)
    fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what compact_lmdb holds while it works
        with pytest.raises(StoreBusyError, match="being compacted"):
            LMDBStore(path)
        with pytest.raises(StoreBusyError):
            LMDBStore(path, readonly=True)
    finally:
        os.close(fd)
    LMDBStore(path).close()


def test_lock_file_does_not_make_a_directory_look_foreign(tmp_path: Any) -> None:
    path = str(tmp_path / "store")
    os.makedirs(path)
    open(os.path.join(path, LOCK_FILE), "w").close()  # left by an open that failed
    with KVSaver(path) as saver:
        chat_thread(saver, "t", 1, seed=0)


def test_compaction_of_something_that_is_not_a_store(tmp_path: Any) -> None:
    with pytest.raises(Exception, match="not an LMDB store"):
        compact_lmdb(str(tmp_path))


def test_compaction_replaces_a_stale_temporary_file(tmp_path: Any) -> None:
    path = str(tmp_path / "store")
    with KVSaver(path) as saver:
        chat_thread(saver, "t", 2, seed=3)
        before = snapshot(saver)
    with open(os.path.join(path, "data.mdb.compact"), "wb") as f:
        f.write(b"half a file from a crashed compaction")
    done: list[tuple[int, int]] = []
    compact_lmdb(path, progress=lambda n, total: done.append((n, total)))
    assert done and done[-1][0] == done[-1][1] > 0
    with KVSaver(path) as saver:
        assert snapshot(saver) == before
    env = lmdb.open(path, readonly=True, lock=False)  # a valid LMDB file
    try:
        assert env.stat()["entries"] == done[-1][1]
    finally:
        env.close()


# -- the command line ------------------------------------------------------------------------

sys.path.insert(0, ROOT)  # tools/ is not installed: it runs from the repository
from kvsaver.tools import storage as storage_cli  # noqa: E402


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = storage_cli.main([*args, "--quiet"])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_command_line_stats_sweep_compact(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "store")
    with KVSaver(path) as saver:
        for t in range(4):
            chat_thread(saver, f"t{t}", 3 + t, seed=t)
    code, out, err = cli(capsys, "stats", path, "--json")
    assert code == 0, err
    stats = json.loads(out)
    assert stats["checkpoints"] == 3 + 4 + 5 + 6
    assert [t["thread_id"] for t in stats["threads"]] == ["t3", "t2", "t1", "t0"]
    code, out, err = cli(capsys, "sweep", path, "--keep-last", "2")
    assert code == 0, err
    assert "10 checkpoints removed" in out
    code, out, err = cli(capsys, "compact", path)
    assert code == 0 and "compacted" in out, err
    code, out, err = cli(capsys, "stats", path, "--top", "1")
    assert code == 0 and "t3" in out and "t2" not in out and "3 more threads" in out
    with KVSaver(path, readonly=True) as saver:
        assert saver.stats().checkpoints == 4 * 2
    code, out, err = cli(capsys, "sweep", path)
    assert code == 2 and "--keep-last" in err
    code, out, err = cli(capsys, "stats", str(tmp_path / "nothing"))
    assert code == 2 and "not a KVSaver store" in err


def test_command_line_on_a_postgres_url(
    postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stats, sweep and compact (VACUUM / VACUUM FULL) on a PostgreSQL URL."""
    from pg_helpers import fresh_database

    url = fresh_database(postgres_url)
    with KVSaver(url) as saver:
        for t in range(4):
            chat_thread(saver, f"t{t}", 3 + t, seed=t)
    code, out, err = cli(capsys, "stats", url, "--json")
    assert code == 0, err
    before = json.loads(out)
    assert before["checkpoints"] == 3 + 4 + 5 + 6 and before["disk_bytes"] > 0
    code, out, err = cli(capsys, "sweep", url, "--keep-last", "2")
    assert code == 0 and "10 checkpoints removed" in out, err
    code, out, err = cli(capsys, "compact", url)
    assert code == 0 and out.startswith("VACUUM kv_store") and "compact --full" in out, err
    code, out, err = cli(capsys, "compact", url, "--full")
    assert code == 0 and out.startswith("VACUUM FULL kv_store"), err
    code, out, err = cli(capsys, "stats", url, "--json")
    after = json.loads(out)
    assert after["checkpoints"] == 4 * 2 and after["disk_bytes"] < before["disk_bytes"]


def test_command_line_compact_refused_while_open(tmp_path: Any) -> None:
    """As a program (python -m tools.storage): exit status 2 and the reason."""
    path = str(tmp_path / "store")
    with KVSaver(path) as saver:
        chat_thread(saver, "t", 2, seed=0)
        out = subprocess.run(
            [sys.executable, "-m", "tools.storage", "compact", path],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 2 and "another process has it open" in out.stderr


def test_threads_of_a_forked_child_wait_for_the_reopen(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a child's first use reopens the store (and retakes the lock
    file); a second thread must wait for the new environment, not use the
    closed inherited one. The lock-file step is slowed down to widen the window."""
    path = str(tmp_path / "store")
    store = LMDBStore(path)
    with store.write() as txn:
        txn.put(b"k", b"v")
    real = lmdb_environment._hold_shared

    def slow(path: str, readonly: bool) -> int | None:
        time.sleep(0.2)
        return real(path, readonly)

    monkeypatch.setattr(lmdb_environment, "_hold_shared", slow)
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status only
        code = 1
        try:
            errors: list[BaseException] = []

            def reader() -> None:
                try:
                    with store.read() as txn:
                        assert txn.get(b"k") == b"v"
                except BaseException as e:
                    errors.append(e)

            threads = [threading.Thread(target=reader) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            code = 0 if not errors else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    store.close()


def test_tools_never_run_code_named_in_stored_data(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """LangGraph's default serializer imports and calls what stored
    data names. stats and compact decode no value; sweep decodes checkpoints
    and metadata, in strict msgpack mode; none of them runs the planted call."""
    path = str(tmp_path / "store")
    marker = tmp_path / "the-planted-call-ran"
    with KVSaver(path) as saver:
        for t in range(3):
            chat_thread(saver, f"t{t}", 3, seed=t)
        assert plant(saver.store, marker) > 9
    for args in (
        ["stats", path],
        ["stats", path, "--json"],
        ["sweep", path, "--keep-last", "1"],
        ["sweep", path, "--ttl-minutes", "0.0001", "--strategy", "keep_latest"],
        ["compact", path],
    ):
        code, out, err = cli(capsys, *args)
        assert code == 0, (args, err)
        assert not marker.exists(), f"{args} ran the planted call"
        if args[2:4] == ["--keep-last", "1"]:
            assert "6 checkpoints removed" in out
    with KVSaver(path, readonly=True) as saver:  # stats() of the saver itself
        assert saver.stats().checkpoints == 3
    assert not marker.exists()
    # The planted calls are live: LangGraph's permissive mode runs them.
    permissive = JsonPlusSerializer(allowed_msgpack_modules=True)
    with KVSaver(path, readonly=True, serde=permissive) as saver:
        saver.get_tuple({"configurable": {"thread_id": "t0"}})
    assert marker.is_dir()
