"""Stores written by kvsaver 0.1.0 (format 1) open and read correctly.

The fixtures in tests/data were made by the 0.1.0 code itself (commit
2ddca5a; see tests/data/make_store_0_1_0.py for how, and what they hold):
a FileStore and an LMDB directory, written by the same calls, whose
SqliteSaver results are in store_0_1_0.json. In format 1 a pending write was
keyed by (task_path, task_id, idx); format 2 keys it by (task_id, idx) as
SqliteSaver does. Opened writable, a store is upgraded in one write
transaction recorded in its schema record; opened read-only, it is read as it
is, with the same results.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import ormsgpack
import pytest
from kvsaver import KVSaver
from kvsaver import schema as S
from kvsaver import upgrade as U
from kvsaver.kv import FileStore
from kvsaver.kv.keys import pack, prefix_range, unpack
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT
from saver_helpers import config, make_checkpoint, scan_all, sqlite_saver, tuple_dict, tuples

DATA = Path(__file__).parent / "data"
FIXTURE = json.loads((DATA / "store_0_1_0.json").read_text())
CALLS: list[list[Any]] = FIXTURE["calls"]
EXPECTED: list[dict[str, Any]] = FIXTURE["expected"]
THREADS = sorted({e["thread_id"] for e in EXPECTED})


def _open_copy(backend: str, tmp_path: Path, **kwargs: Any) -> KVSaver:
    """A copy of the 0.1.0 fixture (the checked-in files are never opened: a
    FileStore takes a lock file beside itself, even read-only)."""
    if backend == "file":
        path = tmp_path / "store.kvs"
        if not path.exists():
            shutil.copyfile(DATA / "store_0_1_0.kvs", path)
        return KVSaver(path, backend="file", **kwargs)
    path = tmp_path / "store"
    if not path.exists():
        with tarfile.open(DATA / "store_0_1_0_lmdb.tar.gz") as tar:
            # The "data" filter (3.12, backported to 3.10.12/3.11.4) where there is one.
            kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(tmp_path, **kw)
    return KVSaver(path, durability="none", **kwargs)


def _apply(saver: Any, calls: list[list[Any]]) -> None:
    """The fixture's calls (see make_store_0_1_0.py) on any saver."""
    for call in calls:
        if call[0] == "put":
            _, thread, ns, parent, cp, metadata, new_versions = call
            saver.put(config(thread, ns, parent), cp, metadata, new_versions)
        else:
            _, thread, ns, cid, writes, task_id, task_path = call
            saver.put_writes(
                config(thread, ns, cid), [tuple(w) for w in writes], task_id, task_path
            )


def _ids(e: dict[str, Any]) -> tuple[str, str, str]:
    return e["thread_id"], e["checkpoint_ns"], e["checkpoint_id"]


def _schema(saver: KVSaver) -> dict[str, Any]:
    with saver.store.read() as txn:
        return dict(ormsgpack.unpackb(txn.get(S.SCHEMA_KEY)))


def _write_key_lengths(saver: KVSaver) -> set[int]:
    with saver.store.read() as txn:
        return {len(unpack(k)) for k, _ in txn.scan(*prefix_range((S.WRITE,)))}


def _check_expected(saver: KVSaver) -> None:
    """Every checkpoint of the fixture, as SqliteSaver returned it."""
    for e in EXPECTED:
        t = saver.get_tuple(config(e["thread_id"], e["checkpoint_ns"], e["checkpoint_id"]))
        where = (e["thread_id"][:12], e["checkpoint_ns"], e["checkpoint_id"])
        assert t is not None, where
        assert t.checkpoint["channel_values"] == e["channel_values"], where
        assert t.metadata == e["metadata"], where
        parent = t.parent_config["configurable"]["checkpoint_id"] if t.parent_config else None
        assert parent == e["parent_id"], where
        assert [list(w) for w in t.pending_writes] == e["pending_writes"], where


def _same_as(saver: KVSaver, ref: Any) -> None:
    for thread in THREADS:
        conf = {"configurable": {"thread_id": thread}}
        assert tuples(saver.list(conf)) == tuples(ref.list(conf))
        for ns in ("", "child:1"):
            latest = config(thread, ns)
            assert tuple_dict(saver.get_tuple(latest)) == tuple_dict(ref.get_tuple(latest))
            history = dict(config=latest, channels=["messages", "count", ERROR])
            assert saver.get_delta_channel_history(**history) == ref.get_delta_channel_history(
                **history
            )


def _more_calls() -> list[list[Any]]:
    """Writes after the upgrade, on both savers: a retry of a 0.1.0 task under
    another path (ignored), special channels replacing across paths, a new
    checkpoint with one task id under two paths."""
    thread, ns, cid = EXPECTED[2]["thread_id"], "", EXPECTED[2]["checkpoint_id"]
    cp = make_checkpoint("1f0b0000-0000-6000-8000-999999999999", {"count": 9}, {"count": "9"})
    return [
        ["put_writes", thread, ns, cid, [["messages", "again"]], "task-c", "path-0"],
        ["put_writes", thread, ns, cid, [[INTERRUPT, "new"]], "task-d", "path-3"],
        ["put_writes", thread, ns, cid, [["count", 0], [ERROR, "no"]], "task-b", "path-9"],
        ["put", thread, ns, cid, cp, {"source": "loop", "step": 3}, {"count": "9"}],
        ["put_writes", thread, ns, cp["id"], [["count", 1]], "T", "b"],
        ["put_writes", thread, ns, cp["id"], [["count", 2], ["messages", "m"]], "T", "a"],
    ]


def test_fixture_is_a_0_1_0_store(tmp_path: Path) -> None:
    """The checked-in fixtures are what 0.1.0 wrote: format 1, write keys with
    a task_path element, one task id stored under two paths; and small."""
    with _open_copy("file", tmp_path, readonly=True) as saver:
        assert _schema(saver) == {"format": 1}
        assert _write_key_lengths(saver) == {U.LEGACY_WRITE_KEY_LEN}
        with saver.store.read() as txn:
            recs = [S.decode_write(v) for _, v in txn.scan(*prefix_range((S.WRITE,)))]
        paths = {}
        for w in recs:
            paths.setdefault((w.task_id, w.idx), set()).add(w.task_path)
        assert any(len(p) > 1 for p in paths.values())
    assert (DATA / "store_0_1_0_lmdb.tar.gz").stat().st_size < 50_000
    assert (DATA / "store_0_1_0.kvs").stat().st_size < 50_000


@pytest.mark.parametrize("backend", ["file", "lmdb"])
def test_0_1_0_store_upgrades_on_open_and_reads_as_sqlitesaver(
    backend: str, tmp_path: Path
) -> None:
    ref = sqlite_saver()
    _apply(ref, CALLS)
    with _open_copy(backend, tmp_path) as saver:
        schema = _schema(saver)
        assert schema["format"] == S.FORMAT_VERSION == 6
        # 2 -> 3 -> 4 -> 5 -> 6: nothing rewritten
        [step, deltas, small, batches, inline] = schema["upgrades"]
        assert (step["from"], step["to"]) == (1, 2)
        assert deltas == {"from": 2, "to": 3}
        assert small == {"from": 3, "to": 4}
        assert batches == {"from": 4, "to": 5}
        assert inline == {"from": 5, "to": 6}
        # Three (task_id, idx) pairs held under two paths (task-c idx 0, task-d
        # INTERRUPT, the long task id idx 0) in the last checkpoint of each of
        # the 4 (thread, ns) chains.
        assert step["writes_dropped"] == 3 * 4
        writes_0_1_0 = step["writes"]
        assert _write_key_lengths(saver) == {6}
        _check_expected(saver)
        _same_as(saver, ref)
        assert saver.stats().writes == writes_0_1_0 - step["writes_dropped"]
        with ref.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM writes")
            assert saver.stats().writes == cur.fetchone()[0]
        # Written to after the upgrade: the same results as SqliteSaver.
        _apply(saver, _more_calls())
        _apply(ref, _more_calls())
        _same_as(saver, ref)
    # Reopened: no second upgrade, the same contents.
    with _open_copy(backend, tmp_path) as saver:
        assert _schema(saver)["upgrades"] == [step, deltas, small, batches, inline]
        _same_as(saver, ref)
        # The other operations over write keys, on the upgraded store.
        thread = EXPECTED[0]["thread_id"]
        mine = [e for e in EXPECTED if e["thread_id"] == thread]
        saver.copy_thread(thread, "copy")
        for e in mine:
            got = saver.get_tuple(config("copy", e["checkpoint_ns"], e["checkpoint_id"]))
            want = ref.get_tuple(config(*_ids(e)))
            assert got.pending_writes == want.pending_writes
        saver.prune([thread])
        for ns in ("", "child:1"):
            assert tuples(saver.list(config(thread, ns))) == [
                tuple_dict(ref.get_tuple(config(thread, ns)))
            ]
        saver.delete_for_runs(["run-0"])  # steps 0 and 2 of each 0.1.0 chain
        left = [
            t.config["configurable"]["checkpoint_id"]
            for t in saver.list({"configurable": {"thread_id": "copy"}})
        ]
        run_1 = {e["checkpoint_id"] for e in mine if e["metadata"]["run_id"] == "run-1"}
        assert set(left) == run_1 | {_more_calls()[3][4]["id"]}
        with saver.store.read() as txn:
            cids = {unpack(k)[3] for k, _ in txn.scan(*S.writes_range("copy"))}
        assert cids == set(left)  # the deleted checkpoints' writes went with them
        by_thread = {t.thread_id: t.writes for t in saver.stats().threads}
        copies = saver.list({"configurable": {"thread_id": "copy"}})
        assert by_thread["copy"] == sum(len(t.pending_writes) for t in copies)
    ref.conn.close()


@pytest.mark.parametrize("backend", ["file", "lmdb"])
def test_0_1_0_store_read_only_reads_the_same_without_upgrading(
    backend: str, tmp_path: Path
) -> None:
    """Opened read-only, a format-1 store is read as it is (nothing written),
    with the results of the upgraded store; stats count writes the same."""
    with _open_copy(backend, tmp_path, readonly=True) as saver:
        before = scan_all(saver.store)
        assert _schema(saver) == {"format": 1}
        _check_expected(saver)
        old_view = [tuples(saver.list({"configurable": {"thread_id": t}})) for t in THREADS]
        old_writes = saver.stats().writes
        old_history = saver.get_delta_channel_history(
            config=config(THREADS[0], ""), channels=["messages", "count"]
        )
        assert scan_all(saver.store) == before
    with _open_copy(backend, tmp_path) as saver:  # now upgraded
        assert _schema(saver)["format"] == S.FORMAT_VERSION
        assert [tuples(saver.list({"configurable": {"thread_id": t}})) for t in THREADS] == old_view
        assert saver.stats().writes == old_writes == sum(len(e["pending_writes"]) for e in EXPECTED)
        assert old_history == saver.get_delta_channel_history(
            config=config(THREADS[0], ""), channels=["messages", "count"]
        )


def _format_1_store(path: Path) -> None:
    """A format-1 FileStore made by hand: one checkpoint whose writes hold
    (task_id, idx) pairs under two task paths, in key order the later-written
    path second (0.1.0 kept no order of writing)."""
    with KVSaver(path, backend="file") as saver:
        saver.put(config("t"), make_checkpoint("1"), {}, {})
    store = FileStore(path)
    try:
        with store.write() as txn:
            txn.put(S.SCHEMA_KEY, ormsgpack.packb({"format": 1}))
            for path_, task, idx, channel, value in [
                ("b", "T", 0, "x", "b0"),  # written first: SqliteSaver would keep this one
                ("a", "T", 0, "x", "a0"),  # smallest task_path: kept
                ("b", "T", 1, "x", "b1"),
                ("z", "U", -1, ERROR, "z"),
                ("y", "U", -1, ERROR, "y"),  # smallest task_path: kept
                ("y", "U", 0, "x", "u0"),
            ]:
                rec = S.WriteRecord(task, channel, ("json", json.dumps(value).encode()), path_, idx)
                key = pack((S.WRITE, "t", "", "1", path_, task, idx))
                txn.put(key, S.encode_write(rec))
    finally:
        store.close()


def test_colliding_0_1_0_writes_keep_the_smallest_task_path(tmp_path: Path) -> None:
    """Which of two format-1 writes with the same (task_id, idx) survives is
    deterministic, the same read-only and after the upgrade: the one with the
    smallest task_path (saver/upgrade.py says why)."""
    path = tmp_path / "old.kvs"
    _format_1_store(path)
    want = [("T", "x", "a0"), ("T", "x", "b1"), ("U", ERROR, "y"), ("U", "x", "u0")]
    with KVSaver(path, backend="file", readonly=True) as saver:
        assert saver.get_tuple(config("t")).pending_writes == want
        assert saver.stats().writes == 4
    with KVSaver(path, backend="file") as saver:
        assert _schema(saver)["upgrades"] == [
            {"from": 1, "to": 2, "writes": 6, "writes_dropped": 2},
            {"from": 2, "to": 3},
            {"from": 3, "to": 4},
            {"from": 4, "to": 5},
            {"from": 5, "to": 6},
        ]
        assert saver.get_tuple(config("t")).pending_writes == want
        assert saver.stats().writes == 4
        assert _write_key_lengths(saver) == {6}


def test_a_failed_upgrade_leaves_the_store_as_it_was(tmp_path: Path, monkeypatch) -> None:
    """The upgrade is one write transaction: when it fails, nothing of it is
    stored, and the next open upgrades the store whole."""
    path = tmp_path / "old.kvs"
    _format_1_store(path)
    store = FileStore(path, readonly=True)
    before = scan_all(store)
    store.close()

    def half_then_fail(txn: Any) -> dict[str, int]:
        U._writes_by_task_id(txn)
        raise OSError("disk gone")

    monkeypatch.setitem(U.UPGRADES, 1, half_then_fail)
    with pytest.raises(OSError, match="disk gone"):
        KVSaver(path, backend="file")
    store = FileStore(path, readonly=True)
    assert scan_all(store) == before
    store.close()
    monkeypatch.undo()
    with KVSaver(path, backend="file") as saver:
        assert _schema(saver)["format"] == S.FORMAT_VERSION
        assert len(saver.get_tuple(config("t")).pending_writes) == 4
