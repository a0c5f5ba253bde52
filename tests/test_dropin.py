"""KVSaver as a drop-in for SqliteSaver/PostgresSaver code:
from_conn_string and setup, option checking, the message for an encrypted
store opened without its key, repr, a reader and a writer in one process, and
the langgraph-checkpoint versions without DeltaChannel or writes_sort_key.
Runs on the lowest LangGraph pyproject allows too (.ci/run)."""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kvsaver._compat
import langgraph.checkpoint.base as lg_base
import pytest
from kvsaver import EncryptedValueError, KVSaver
from kvsaver.kv import KVError, LMDBStore, MemoryStore, ReadOnlyError, StoreClosedError
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.types import Command
from saver_helpers import config
from saver_helpers_graphs import ahistory, approval_graph, chat_graph, history, human

KEY = b"0123456789abcdef"


# -- from_conn_string and setup, as SqliteSaver code uses them ---------------------------


def _sqlite_style_app(opener: Callable[[], Any]) -> list[Any]:
    """What code written for SqliteSaver does: open with from_conn_string,
    call setup(), run graphs, read their history."""
    with opener() as saver:
        saver.setup()
        saver.setup()  # idempotent
        chat, approve = chat_graph(saver), approval_graph(saver)
        c1, c2 = {"configurable": {"thread_id": "chat"}}, {"configurable": {"thread_id": "ok"}}
        for i in range(3):
            chat.invoke(human(i), c1)
        approve.invoke({"request": "deploy", "log": []}, c2)
        approve.invoke(Command(resume="yes"), c2)
        return [history(chat, c1), history(approve, c2), approve.get_state(c2).values]


def test_from_conn_string_runs_sqlitesaver_code(tmp_path: Path) -> None:
    want = _sqlite_style_app(lambda: SqliteSaver.from_conn_string(":memory:"))
    assert want[2]["log"] == ["prepared", "asked:yes", "acted:yes"]
    path = tmp_path / "state"
    assert _sqlite_style_app(lambda: KVSaver.from_conn_string(str(path))) == want
    assert _sqlite_style_app(lambda: KVSaver.from_conn_string(":memory:")) == want
    # The block closed the store: the directory can be opened again at once,
    # and holds what the first run wrote.
    with KVSaver.from_conn_string(path, readonly=True) as saver:
        assert saver.store.readonly
        assert saver.get_tuple(config("chat")) is not None
    opening = KVSaver.from_conn_string(path)
    with opening as saver:
        pass
    with pytest.raises(StoreClosedError):
        saver.get_tuple(config("chat"))


def test_from_conn_string_passes_options(tmp_path: Path) -> None:
    with KVSaver.from_conn_string(tmp_path / "s", durability="none", compress=False) as saver:
        assert isinstance(saver.store, LMDBStore)
        assert saver.store.durability == "none"
    with pytest.raises(TypeError, match="durabilty"):
        KVSaver.from_conn_string(tmp_path / "s", durabilty="none").__enter__()


async def test_async_from_conn_string_runs_asyncsqlitesaver_code(tmp_path: Path) -> None:
    async def app(opener: Callable[[], Any]) -> list[Any]:
        async with opener() as saver:
            await saver.setup()  # AsyncSqliteSaver's setup is a coroutine
            await saver.setup()
            chat = chat_graph(saver)
            cfg = {"configurable": {"thread_id": "a"}}
            for i in range(3):
                await chat.ainvoke(human(i), cfg)
            return await ahistory(chat, cfg)

    want = await app(lambda: AsyncSqliteSaver.from_conn_string(":memory:"))
    assert len(want) == 9  # three checkpoints per turn: input, loop, loop
    got = await app(lambda: KVSaver.from_conn_string(str(tmp_path / "a")))
    assert got == want
    async with KVSaver.from_conn_string(tmp_path / "a") as saver:
        pass
    with pytest.raises(StoreClosedError):
        saver.get_tuple(config("a"))


def test_setup_on_a_readonly_saver_and_a_given_store(tmp_path: Path) -> None:
    KVSaver(tmp_path / "s").close()
    with KVSaver(tmp_path / "s", readonly=True) as ro:
        ro.setup()
        assert ro.get_tuple(config("t")) is None
    store = MemoryStore()
    saver = KVSaver(store)
    saver.setup()
    assert saver.get_tuple(config("t")) is None


async def test_asetup_and_awaited_setup() -> None:
    saver = KVSaver(":memory:")
    await saver.asetup()
    await saver.setup()
    assert saver.setup() is not None  # awaitable, and fine to drop unawaited


# -- options --------------------------------------------------------------------------


def test_misspelled_option_names_it_and_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(TypeError) as err:
        KVSaver(tmp_path / "s", durabilty="none")
    msg = str(err.value)
    assert "'durabilty'" in msg and "did you mean 'durability'?" in msg
    for valid in ("durability", "max_size", "map_size", "max_readers", "serde", "readonly"):
        assert valid in msg
    assert not (tmp_path / "s").exists()  # refused before anything was opened
    with pytest.raises(TypeError, match=r"'compres'.*did you mean 'compress'\?"):
        KVSaver(":memory:", compres=False)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'zzz'\. Valid options"):
        KVSaver(":memory:", zzz=1)


@pytest.mark.parametrize(
    ("typo", "meant"), [("whole_lates", "whole_latest"), ("async_thread", "async_threads")]
)
def test_every_saver_option_is_suggested_and_listed(typo: str, meant: str) -> None:
    """The list of KVSaver's own options was written by hand and missed the
    two added last; it is read from the signature now. ':memory:' refuses
    ``backend=``, so its list does not offer it."""
    with pytest.raises(TypeError) as err:
        KVSaver(":memory:", **{typo: 1})
    assert isinstance(err.value, kvsaver.OptionError)  # what the migration tool catches
    msg = str(err.value)
    assert f"did you mean {meant!r}?" in msg
    valid = msg.split("Valid options for ':memory:': ")[1].split(", ")
    assert {"whole_latest", "async_threads", "serde", "retention"} <= set(valid)
    assert "backend" not in valid and "durability" not in valid


@pytest.mark.parametrize("option", ["durability", "max_size", "map_size", "max_readers"])
def test_lmdb_options_are_refused_elsewhere(tmp_path: Path, option: str) -> None:
    value = {"durability": "none"}.get(option, 1 << 20)
    with pytest.raises(
        TypeError, match=rf"'{option}' applies only to the lmdb backend.*':memory:'"
    ):
        KVSaver(":memory:", **{option: value})
    with pytest.raises(TypeError, match=rf"'{option}'.*only to the lmdb.*backend='file'"):
        KVSaver(tmp_path / "f.kvs", backend="file", **{option: value})
    assert not (tmp_path / "f.kvs").exists()
    with pytest.raises(TypeError, match=rf"{option} apply only when KVSaver opens the store"):
        KVSaver(MemoryStore(), **{option: value})
    # ... and taken by LMDB.
    with KVSaver(tmp_path / "lmdb", **{option: value}) as saver:
        assert isinstance(saver.store, LMDBStore)


def test_backend_choice_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="':memory:' is the in-memory store"):
        KVSaver(":memory:", backend="file")
    with pytest.raises(ValueError, match="unknown backend 'memory'"):
        KVSaver(tmp_path / "x", backend="memory")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="backend apply only when KVSaver opens"):
        KVSaver(MemoryStore(), backend="lmdb")


# -- an encrypted store opened without its key -------------------------------------------


@pytest.mark.parametrize("size", [10, 5000])  # stored plain, and compressed before encryption
def test_encrypted_store_without_key_says_so(tmp_path: Path, size: int) -> None:
    enc = EncryptedSerializer.from_pycryptodome_aes(key=KEY)
    with KVSaver(tmp_path / "s", serde=enc) as saver:
        graph = chat_graph(saver)
        graph.invoke(human(0, "x" * size), {"configurable": {"thread_id": "t"}})
    with KVSaver(tmp_path / "s", readonly=True) as plain:
        with pytest.raises(EncryptedValueError) as err:
            plain.get_tuple(config("t"))
        assert isinstance(err.value, ValueError)
        msg = str(err.value)
        assert "written with EncryptedSerializer" in msg and "pass serde=" in msg
        assert "+aes" in err.value.type
        with pytest.raises(EncryptedValueError):
            list(plain.list(None))
    with KVSaver(tmp_path / "s", serde=enc, readonly=True) as keyed:
        assert keyed.get_tuple(config("t")) is not None


def test_unknown_plain_type_keeps_langgraph_error() -> None:
    saver = KVSaver(":memory:")
    with pytest.raises(NotImplementedError, match="Unknown serialization type"):
        saver.serde.loads_typed(("no-such-type", b""))


# -- repr ---------------------------------------------------------------------------------


def test_repr_names_the_store(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with KVSaver(path) as saver:
        assert repr(saver) == f"KVSaver({str(path)!r}, backend='lmdb', readonly=False)"
    with KVSaver(path, readonly=True) as saver:
        assert repr(saver) == f"KVSaver({str(path)!r}, backend='lmdb', readonly=True)"
    with KVSaver(tmp_path / "f.kvs", backend="file") as saver:
        assert (
            repr(saver) == f"KVSaver({str(tmp_path / 'f.kvs')!r}, backend='file', readonly=False)"
        )
    assert repr(KVSaver(":memory:")) == "KVSaver(':memory:', backend='memory', readonly=False)"
    with LMDBStore(tmp_path / "given") as store:
        assert repr(KVSaver(store)) == f"KVSaver({store!r})"
        assert str(tmp_path / "given") in repr(KVSaver(store))


# -- a reader and a writer on one directory in one process ------------------------------


def _put(saver: KVSaver, thread: str) -> None:
    cp = empty_checkpoint()
    saver.put(config(thread), cp, {"source": "input", "step": -1}, {})


def test_writer_then_reader_in_one_process(tmp_path: Path) -> None:
    with KVSaver(tmp_path / "s") as writer, KVSaver(tmp_path / "s", readonly=True) as reader:
        _put(writer, "a")
        assert reader.get_tuple(config("a")) is not None
        with pytest.raises(ReadOnlyError):
            _put(reader, "b")
        _put(writer, "c")  # the reader changed nothing for the writer
        assert [t.config["configurable"]["thread_id"] for t in reader.list(None)] == ["c", "a"]
    with KVSaver(tmp_path / "s", readonly=True) as again:  # both closed: nothing held
        assert again.get_tuple(config("c")) is not None


def test_reader_then_writer_in_one_process_is_refused_clearly(tmp_path: Path) -> None:
    """LMDB opens a directory once per process, so a read-only handle opened
    first cannot become a writer's (README "Processes"): the writer gets an
    error saying what to do, and works once the reader is closed."""
    KVSaver(tmp_path / "s").close()
    reader = KVSaver(tmp_path / "s", readonly=True)
    with pytest.raises(KVError, match="already open read-only in this process"):
        KVSaver(tmp_path / "s")
    assert reader.get_tuple(config("x")) is None  # the reader is unharmed
    reader.close()
    with KVSaver(tmp_path / "s") as writer:
        _put(writer, "x")


# -- langgraph-checkpoint versions -----------------------------------------------------


def test_delta_channel_methods_exactly_where_langgraph_has_them() -> None:
    has = hasattr(BaseCheckpointSaver, "get_delta_channel_history")
    assert kvsaver._compat.HAS_DELTA_CHANNELS is has
    for name in ("get_delta_channel_history", "aget_delta_channel_history"):
        assert hasattr(KVSaver, name) is has
        if has:  # ours, not the base class's generic walk
            assert getattr(KVSaver, name) is not getattr(BaseCheckpointSaver, name)


def test_writes_sort_key_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy used where langgraph-checkpoint < 4.3 lacks writes_sort_key."""
    real = getattr(lg_base, "writes_sort_key", None)
    monkeypatch.delattr(lg_base, "writes_sort_key", raising=False)
    spec = importlib.util.spec_from_file_location("_compat_old", kvsaver._compat.__file__)
    assert spec is not None and spec.loader is not None
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    assert old.writes_sort_key is not real
    assert old.writes_sort_key.__module__ == "_compat_old"
    samples = [("", "t", 0), ("~a", "t2", -1), ("b", "", 3), ("a", "z", 2)]
    for path, task, idx in samples:
        assert old.writes_sort_key(path, task, idx) == (path, task, idx)
        if real is not None:
            assert old.writes_sort_key(path, task, idx) == real(path, task, idx)
    assert old.writes_sort_key("p") == ("p", "", 0)
    assert sorted(samples, key=lambda s: old.writes_sort_key(*s)) == sorted(samples)


def test_with_allowlist_on_every_version() -> None:
    """langgraph-checkpoint 4.0.0 has no msgpack allowlist: nothing to extend,
    the saver itself comes back (4.0.1+: tests/test_compression.py)."""
    saver = KVSaver(":memory:")
    allowed = saver.with_allowlist([("some.module", "Custom")])
    assert allowed.store is saver.store
    _put(allowed, "t")
    assert saver.get_tuple(config("t")) is not None
    assert allowed.get_tuple(config("t")) is not None


def test_async_methods_have_docstrings() -> None:
    own = {n: f for n, f in vars(KVSaver).items() if n.startswith("a") and callable(f)}
    asyncs = {
        n: f
        for n, f in own.items()
        if inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f)
    }
    assert {"aget_tuple", "alist", "aput", "aput_writes", "asetup"} <= set(asyncs)
    assert [n for n, f in asyncs.items() if not (f.__doc__ or "").strip()] == []
