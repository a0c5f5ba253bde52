"""Bad input: every mistake gets a clear error, and a failed write leaves the
store byte-for-byte as it was (no partial checkpoint, no orphan blob)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ormsgpack
import pytest
from kvsaver import KVSaver
from kvsaver import schema as S
from kvsaver.kv import (
    CorruptStoreError,
    FileStore,
    FormatVersionError,
    LMDBStore,
    MemoryStore,
    ReadOnlyError,
    pack,
)
from langgraph.checkpoint.serde.types import ERROR
from saver_helpers import BACKENDS, config, make_checkpoint, open_kv, scan_all
from saver_helpers_graphs import chat_graph, human


def seed(saver: KVSaver) -> None:
    """Some data: two checkpoints with blobs, writes and a run id."""
    v1 = {"a": "00000000000000000000000000000001.0", "b": 1}
    saver.put(
        config("t"),
        make_checkpoint("1", {"a": "x", "b": [1, 2]}, v1),
        {"run_id": "r1", "step": 0},
        v1,
    )
    v2 = {**v1, "a": "00000000000000000000000000000002.0"}
    saver.put(
        config("t", "", "1"), make_checkpoint("2", {"a": "y", "b": [1, 2]}, v2), {}, {"a": v2["a"]}
    )
    saver.put_writes(config("t", "", "2"), [("a", "w"), (ERROR, "boom")], "task-1")


@pytest.fixture(params=BACKENDS)
def kv(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KVSaver]:
    saver = open_kv(request.param, tmp_path)
    seed(saver)
    yield saver
    saver.close()


# -- missing thread_id and malformed configs ----------------------------------------

MISSING_THREAD = [
    {"configurable": {}},
    {"configurable": {"checkpoint_ns": "", "checkpoint_id": "2"}},
    {"configurable": {"thread_id": None}},
    {},
    {"metadata": {"thread_id": "t"}},
]


@pytest.mark.parametrize("bad", MISSING_THREAD, ids=repr)
def test_missing_thread_id_names_it(kv: KVSaver, bad: dict[str, Any]) -> None:
    before = scan_all(kv.store)
    cp = make_checkpoint("9", {"a": 1}, {"a": 1})
    calls = {
        "put": lambda: kv.put(bad, cp, {}, {"a": 1}),
        "put_writes": lambda: kv.put_writes(bad, [("a", 1)], "task"),
        "get_tuple": lambda: kv.get_tuple(bad),
        "list": lambda: list(kv.list(bad)),
        "get_delta_channel_history": lambda: kv.get_delta_channel_history(
            config=bad, channels=["a"]
        ),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match="thread_id") as info:
            call()
        assert name.split("_")[0] in str(info.value), f"{name}: {info.value}"
    assert scan_all(kv.store) == before


@pytest.mark.parametrize("bad", MISSING_THREAD[:2], ids=repr)
async def test_missing_thread_id_async(kv: KVSaver, bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="thread_id"):
        await kv.aget_tuple(bad)
    with pytest.raises(ValueError, match="thread_id"):
        await kv.aput(bad, make_checkpoint("9"), {}, {})
    with pytest.raises(ValueError, match="thread_id"):
        await kv.aput_writes(bad, [("a", 1)], "task")
    with pytest.raises(ValueError, match="thread_id"):
        [t async for t in kv.alist(bad)]


def test_graph_without_thread_id(kv: KVSaver) -> None:
    """The user-facing form of the same mistake (checked by langgraph first)."""
    with pytest.raises(ValueError, match="thread_id"):
        chat_graph(kv).invoke(human(0), {})


def test_malformed_configs(kv: KVSaver) -> None:
    with pytest.raises(TypeError, match="config must be a dict"):
        kv.get_tuple("t")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="checkpoint_id"):
        kv.put_writes(config("t"), [("a", 1)], "task")
    with pytest.raises(TypeError, match="filter"):
        list(kv.list(config("t"), filter=[("step", 1)]))  # type: ignore[arg-type]


# -- values the serializer cannot encode ---------------------------------------------


class Opaque:
    pass


def unserializable() -> list[Any]:
    return [object(), lambda x: x, threading.Lock(), Opaque(), {"nested": object()}, 2**70]


@pytest.mark.parametrize("where", ["channel_values", "metadata", "checkpoint"])
def test_unserializable_put_leaves_store_untouched(kv: KVSaver, where: str) -> None:
    before = scan_all(kv.store)
    file_bytes = Path(kv.store.path).read_bytes() if isinstance(kv.store, FileStore) else None
    sock = socket.socket()
    try:
        for bad in [*unserializable(), sock]:
            versions = {
                "a": "00000000000000000000000000000003.0",
                "b": 2,
                "c": "00000000000000000000000000000001.0",
            }
            values: dict[str, Any] = {"a": "fine", "b": [3], "c": "also fine"}
            metadata: dict[str, Any] = {"step": 2, "run_id": "r2"}
            extra: dict[str, Any] = {}
            if where == "channel_values":
                values["b"] = bad  # the good values before and after it must not land
            elif where == "metadata":
                metadata["evil"] = bad
            else:
                extra["versions_seen"] = {"node": {"a": bad}}
            cp = make_checkpoint("3", values, versions, **extra)
            with pytest.raises(TypeError):
                kv.put(config("t", "", "2"), cp, metadata, versions)
            assert scan_all(kv.store) == before, f"store changed after a failed put of {bad!r}"
    finally:
        sock.close()
    if file_bytes is not None:
        assert Path(kv.store.path).read_bytes() == file_bytes
    assert kv.get_tuple(config("t")).checkpoint["id"] == "2"
    # The saver is still usable afterwards.
    v3 = {"a": "00000000000000000000000000000003.0"}
    kv.put(config("t", "", "2"), make_checkpoint("3", {"a": "z", "b": [1, 2]}, v3), {}, v3)
    assert kv.get_tuple(config("t")).checkpoint["channel_values"] == {"a": "z"}


def test_unserializable_put_writes_leaves_store_untouched(kv: KVSaver) -> None:
    before = scan_all(kv.store)
    sock = socket.socket()
    for bad in [*unserializable(), sock]:
        for writes in (
            [("a", 1), ("b", bad), ("c", 3)],
            [(ERROR, bad)],
            [("a", "ok"), ("__interrupt__", bad)],
        ):
            with pytest.raises(TypeError):
                kv.put_writes(config("t", "", "2"), writes, "task-2", "~__pregel_pull, n")
            assert scan_all(kv.store) == before
    sock.close()
    assert kv.get_tuple(config("t")).pending_writes == [
        ("task-1", ERROR, "boom"),  # idx -1 sorts first (writes_sort_key)
        ("task-1", "a", "w"),
    ]


def test_unserializable_in_a_graph_keeps_last_good_state(kv: KVSaver) -> None:
    graph = chat_graph(kv)
    conf = {"configurable": {"thread_id": "g"}}
    graph.invoke(human(0), conf)
    good = graph.get_state(conf)
    with pytest.raises(TypeError):
        graph.invoke({"messages": [], "turns": Opaque()}, conf)  # type: ignore[dict-item]
    # Nothing half-written: the thread still reads, and continues.
    assert graph.get_state(conf).values["messages"] == good.values["messages"]
    graph.invoke(human(1), conf)
    assert [m.content for m in graph.get_state(conf).values["messages"]][-1] == "echo 3: turn 1"


# -- wrong arguments to maintenance methods -------------------------------------------


def test_unknown_prune_strategy(kv: KVSaver) -> None:
    before = scan_all(kv.store)
    with pytest.raises(ValueError, match="strategy"):
        kv.prune(["t"], strategy="keep_oldest")
    assert scan_all(kv.store) == before


async def test_unknown_prune_strategy_async(kv: KVSaver) -> None:
    with pytest.raises(ValueError, match="keep_latest"):
        await kv.aprune(["t"], strategy="")


@pytest.mark.parametrize("bare", ["t", b"t"])
def test_bare_string_ids_are_a_type_error(kv: KVSaver, bare: Any) -> None:
    before = scan_all(kv.store)
    with pytest.raises(TypeError, match="prune"):
        kv.prune(bare)
    with pytest.raises(TypeError, match="prune"):
        kv.prune(bare, strategy="delete")
    with pytest.raises(TypeError, match="delete_for_runs"):
        kv.delete_for_runs(bare)
    assert scan_all(kv.store) == before
    # The intended call works (and is not what a bare string would do, char by char).
    kv.delete_for_runs(["r1"])
    assert kv.get_tuple(config("t", "", "1")) is None


async def test_bare_string_ids_async(kv: KVSaver) -> None:
    with pytest.raises(TypeError):
        await kv.aprune("t")
    with pytest.raises(TypeError):
        await kv.adelete_for_runs("r1")
    assert kv.get_tuple(config("t")) is not None


# -- ids that are not text -------------------------------------------------------------

SURROGATE = "a\ud800b"  # a lone surrogate: a valid Python str that UTF-8 cannot encode


def _id_calls(kv: KVSaver, bad: Any) -> list[tuple[str, Any]]:
    """(what the message must name, a call passing ``bad`` as an id)."""
    cp = make_checkpoint("9", {"a": "x"}, {"a": "00000000000000000000000000000009.0"})
    return [
        ("thread_id", lambda: kv.put(config(bad), cp, {}, {})),
        ("checkpoint_ns", lambda: kv.put(config("t", bad), cp, {}, {})),
        ("thread_id", lambda: kv.put_writes(config(bad, "", "2"), [("a", 1)], "task")),
        ("task_id", lambda: kv.put_writes(config("t", "", "2"), [("a", 1)], bad)),
        ("thread_id", lambda: kv.get_tuple(config(bad))),
        ("thread_id", lambda: list(kv.list(config(bad)))),
        ("delete_thread", lambda: kv.delete_thread(bad)),
        ("source_thread_id", lambda: kv.copy_thread(bad, "t2")),
        ("target_thread_id", lambda: kv.copy_thread("t", bad)),
        ("prune", lambda: kv.prune([bad])),
        ("delete_for_runs", lambda: kv.delete_for_runs([bad])),
    ]


def test_lone_surrogate_id_is_a_clear_value_error(kv: KVSaver) -> None:
    """It used to reach ormsgpack and fail with a bare "TypeError: string
    contains surrogates" (or, on reads, return nothing)."""
    before = scan_all(kv.store)
    for name, call in _id_calls(kv, SURROGATE):
        with pytest.raises(ValueError, match="surrogate") as info:
            call()
        message = str(info.value)
        assert name in message and "UTF-8" in message and repr(SURROGATE) in message, message
    assert scan_all(kv.store) == before


@pytest.mark.parametrize("bad", [None, b"t", object(), 1.5, True], ids=repr)
def test_id_of_another_type_is_a_type_error(kv: KVSaver, bad: Any) -> None:
    """delete_thread(None) used to delete a thread named "None"; every id is
    checked the same way, instead of being str()ed into another id."""
    kv.copy_thread("t", "None")  # a thread that str(None) would name
    kv.copy_thread("t", "True")
    before = scan_all(kv.store)
    for name, call in _id_calls(kv, bad):
        if bad is None and name in ("thread_id", "checkpoint_ns"):
            continue  # a config without a thread_id is its own error (tested above)
        with pytest.raises(TypeError, match="must be a str") as info:
            call()
        assert name in str(info.value), str(info.value)
    assert scan_all(kv.store) == before
    assert kv.get_tuple(config("None")) is not None


def test_int_and_uuid_ids_are_their_text_as_in_sqlite_saver(kv: KVSaver) -> None:
    import uuid

    run = uuid.UUID(int=7)
    v = {"a": "00000000000000000000000000000001.0"}
    kv.put(config(42), make_checkpoint("5", {"a": "x"}, v), {"run_id": str(run)}, v)  # type: ignore[arg-type]
    assert kv.get_tuple(config("42")) is not None
    kv.copy_thread(42, 43)
    assert kv.get_tuple(config(43)) is not None  # type: ignore[arg-type]
    kv.delete_for_runs([run])
    assert kv.get_tuple(config("42")) is None
    kv.delete_thread(43)
    assert kv.get_tuple(config("43")) is None


def test_unknown_backend_and_durability(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="backend"):
        KVSaver(tmp_path / "x", backend="sqlite")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="durability"):
        KVSaver(tmp_path / "y", durability="sometimes")  # type: ignore[arg-type]


# -- paths that are not stores -------------------------------------------------------


def test_lmdb_path_is_a_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"just some notes\n")
    with pytest.raises(CorruptStoreError, match="not a directory"):
        KVSaver(path)
    assert path.read_bytes() == b"just some notes\n"


def test_lmdb_path_is_a_directory_of_other_files(tmp_path: Path) -> None:
    path = tmp_path / "project"
    path.mkdir()
    (path / "README").write_text("hello")
    (path / "src").mkdir()
    with pytest.raises(CorruptStoreError, match=r"data\.mdb"):
        KVSaver(path)
    assert sorted(os.listdir(path)) == ["README", "src"]  # nothing created among them


def test_lmdb_data_file_is_garbage(tmp_path: Path) -> None:
    path = tmp_path / "broken"
    path.mkdir()
    (path / "data.mdb").write_bytes(b"\x00garbage" * 1000)
    with pytest.raises(CorruptStoreError):
        KVSaver(path)


def test_lmdb_store_of_someone_else(tmp_path: Path) -> None:
    """A valid LMDB store without the kvsaver schema record is not ours."""
    path = tmp_path / "foreign"
    with LMDBStore(path) as store, store.write() as txn:
        txn.put(pack(("user", 1)), b"Ada")
    with pytest.raises(CorruptStoreError, match="schema"):
        KVSaver(path)
    with pytest.raises(CorruptStoreError):
        KVSaver(path, readonly=True)
    with LMDBStore(path) as store:
        assert scan_all(store) == [(pack(("user", 1)), b"Ada")]


def test_file_backend_not_a_store(tmp_path: Path) -> None:
    directory = tmp_path / "adir"
    directory.mkdir()
    with pytest.raises(CorruptStoreError):
        KVSaver(directory, backend="file")
    garbage = tmp_path / "garbage.kvs"
    garbage.write_bytes(b"SQLite format 3\x00" + b"\x01" * 100)
    with pytest.raises(CorruptStoreError):
        KVSaver(garbage, backend="file")
    assert garbage.read_bytes() == b"SQLite format 3\x00" + b"\x01" * 100


# -- a store written by a newer format --------------------------------------------------


def _newer(raw_store: Any) -> None:
    with raw_store.write() as txn:
        txn.put(S.SCHEMA_KEY, ormsgpack.packb({"format": S.FORMAT_VERSION + 1}))


def test_newer_format_lmdb(tmp_path: Path) -> None:
    path = tmp_path / "future"
    with KVSaver(path) as saver:
        seed(saver)
    with LMDBStore(path) as store:
        _newer(store)
        image = scan_all(store)
    for readonly in (False, True):
        with pytest.raises(FormatVersionError, match=str(S.FORMAT_VERSION + 1)):
            KVSaver(path, readonly=readonly)
    with LMDBStore(path) as store:
        assert scan_all(store) == image  # refused without touching anything
    # A failed open released the directory: it can be opened again at once.
    with LMDBStore(path, readonly=True) as store:
        assert store.readonly


def test_newer_format_given_store_and_file(tmp_path: Path) -> None:
    store = MemoryStore()
    _newer(store)
    with pytest.raises(FormatVersionError, match="Upgrade"):
        KVSaver(store)
    with store.read() as txn:  # a store passed in is not closed by the saver
        assert txn.get(S.SCHEMA_KEY) is not None
    path = tmp_path / "future.kvs"
    with FileStore(path) as fs:
        _newer(fs)
    with pytest.raises(FormatVersionError):
        KVSaver(path, backend="file")


def test_older_format_record_is_read(tmp_path: Path) -> None:
    """The check is "newer than me", not "different from me"."""
    store = MemoryStore()
    with store.write() as txn:
        txn.put(S.SCHEMA_KEY, ormsgpack.packb({"format": S.FORMAT_VERSION}))
    assert KVSaver(store).get_tuple(config("t")) is None


# -- read-only savers ------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["lmdb", "file"])
async def test_readonly_saver_reads_and_refuses_writes(backend: str, tmp_path: Path) -> None:
    writer = open_kv(backend, tmp_path)
    seed(writer)
    want = writer.get_tuple(config("t"))
    history = list(writer.list(None))
    writer.close()

    ro = open_kv(backend, tmp_path, readonly=True)
    try:
        image = scan_all(ro.store)
        assert ro.get_tuple(config("t")) == want
        assert list(ro.list(None)) == history
        assert await ro.aget_tuple(config("t")) == want
        assert [t async for t in ro.alist(config("t"))] == history
        assert ro.get_delta_channel_history(config=config("t"), channels=["a"])["a"]["seed"] == "x"
        cp = make_checkpoint("3", {"a": 1}, {"a": 1})
        sync_writes = {
            "put": lambda: ro.put(config("t", "", "2"), cp, {}, {"a": 1}),
            "put_writes": lambda: ro.put_writes(config("t", "", "2"), [("a", 1)], "x"),
            "delete_thread": lambda: ro.delete_thread("t"),
            "prune": lambda: ro.prune(["t"]),
            "copy_thread": lambda: ro.copy_thread("t", "u"),
            "delete_for_runs": lambda: ro.delete_for_runs(["r1"]),
        }
        for name, call in sync_writes.items():
            with pytest.raises(ReadOnlyError):
                call()
            assert scan_all(ro.store) == image, name
        with pytest.raises(ReadOnlyError):
            await ro.aput(config("t", "", "2"), cp, {}, {"a": 1})
        with pytest.raises(ReadOnlyError):
            await ro.aput_writes(config("t", "", "2"), [("a", 1)], "x")
        with pytest.raises(ReadOnlyError):
            await ro.adelete_thread("t")
        assert scan_all(ro.store) == image
        assert ro.get_tuple(config("t")) == want
    finally:
        ro.close()


def test_readonly_memory_saver_refuses_writes() -> None:
    ro = KVSaver(":memory:", readonly=True)
    assert ro.get_tuple(config("t")) is None
    assert list(ro.list(None)) == []
    with pytest.raises(ReadOnlyError):
        ro.put(config("t"), make_checkpoint("1"), {}, {})
    with pytest.raises(ReadOnlyError):
        ro.put_writes(config("t", "", "1"), [("a", 1)], "x")
    with pytest.raises(ReadOnlyError):
        ro.delete_thread("t")


def test_readonly_open_of_a_missing_store(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        KVSaver(tmp_path / "nothing-here", readonly=True)
    assert not (tmp_path / "nothing-here").exists()
    # An existing but empty directory is no store either (regression: this
    # raised a bare lmdb.Error, outside the documented errors).
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no store"):
        KVSaver(tmp_path / "empty", readonly=True)
    with pytest.raises(FileNotFoundError):
        KVSaver(tmp_path / "missing.kvs", backend="file", readonly=True)
