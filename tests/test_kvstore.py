"""KVStore: bad input refused with the store untouched, its keyspace apart
from KVSaver's on one directory (both ways, both opening orders), TTL
(expiry, refresh, the expiry index, the sweeper), timestamps, read-only
stores, the async API and the options."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import random
import shutil
import tarfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import ormsgpack
import pytest
from click.testing import CliRunner
from kvsaver import KVSaver, KVStore, OptionError, Retention
from kvsaver.kv import (
    CorruptStoreError,
    FormatVersionError,
    MemoryStore,
    MissingDependencyError,
    ReadOnlyError,
)
from kvsaver.kv.keys import unpack
from kvsaver.kvstore import keyspace as KS
from kvsaver.kvstore import ops as OPS
from kvsaver.tools.cli import cli
from kvstore_helpers import STORE_BACKENDS, block_numpy, open_store, problems
from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchItem,
    SearchOp,
)
from saver_helpers_graphs import chat_graph, human


@pytest.fixture(params=STORE_BACKENDS)
def store(request: pytest.FixtureRequest) -> Any:
    if request.param == "postgres":
        request.getfixturevalue("pg_server")
    with open_store(request.param) as s:
        yield s


def _dump(store: KVStore) -> list[tuple[bytes, bytes]]:
    with store.store.read() as txn:
        return list(txn.scan(None, None))


# -- bad input ------------------------------------------------------------------------

BAD_BATCHES = [
    ([PutOp(("a",), "k", ["not", "a", "dict"])], TypeError, "must be a dict"),
    ([PutOp(("a",), "k", {1: "int key"})], TypeError, "str keys"),
    ([PutOp(("a",), "k", {"v": object()})], TypeError, "JSON-serializable"),
    ([PutOp(("a", "b.c"), "k", {"v": 1})], InvalidNamespaceError, "periods"),
    ([PutOp(("a", ""), "k", {"v": 1})], InvalidNamespaceError, "empty"),
    ([PutOp(("a\x00b",), "k", {"v": 1})], InvalidNamespaceError, "NUL"),
    ([PutOp(("a", 1), "k", {"v": 1})], InvalidNamespaceError, "must be strings"),  # type: ignore[arg-type]
    ([PutOp("ab", "k", {"v": 1})], InvalidNamespaceError, "tuple"),  # type: ignore[arg-type]
    ([PutOp(("a",), 7, {"v": 1})], TypeError, "key must be a str"),  # type: ignore[arg-type]
    ([PutOp(("a",), "k", {"v": 1}, index="v")], TypeError, "index"),  # type: ignore[arg-type]
    ([PutOp(("a",), "k", {"v": 1}, ttl=-1)], ValueError, "ttl"),
    ([GetOp(("a",), b"k")], TypeError, "key must be a str"),  # type: ignore[arg-type]
    ([SearchOp(("a",), {"v": {"$regex": "x"}})], ValueError, "unknown filter operator"),
    ([SearchOp(("a",), {"v": {"$gt": 1, "w": 2}})], ValueError, "unknown filter operator"),
    ([SearchOp(("a",), {"v": {"$gt": "ten"}})], ValueError, "needs a number"),
    ([SearchOp(("a",), None, -1)], ValueError, "limit"),
    ([SearchOp(("a.b",))], InvalidNamespaceError, "periods"),
    ([ListNamespacesOp((MatchCondition("middle", ("a",)),))], ValueError, "match_type"),  # type: ignore[arg-type]
    ([ListNamespacesOp(None, -2)], ValueError, "max_depth"),
    (["not an op"], ValueError, "Unknown operation"),
]


@pytest.mark.parametrize("ops,error,words", BAD_BATCHES)
def test_a_batch_with_one_bad_op_changes_nothing(
    store: KVStore, ops: list[Any], error: type[Exception], words: str
) -> None:
    store.put(("a",), "k", {"v": 0})
    before = _dump(store)
    good = [PutOp(("a",), "k", {"v": 1}), PutOp(("b",), "new", {"v": 2})]
    with pytest.raises(error, match=words):
        store.batch(good + ops)
    with pytest.raises(error, match=words):
        asyncio.run(store.abatch(ops + good))
    assert _dump(store) == before
    assert store.get(("a",), "k").value == {"v": 0}  # type: ignore[union-attr]


def test_the_public_methods_check_namespaces_as_langgraph_does(store: KVStore) -> None:
    for bad in [(), ("langgraph", "x"), ("a.b",), ("",)]:
        with pytest.raises(InvalidNamespaceError):
            store.put(bad, "k", {"v": 1})
    with pytest.raises(TypeError):
        store.put(("a",), "k", "text")  # type: ignore[arg-type]
    assert store.list_namespaces() == []


# -- hostile names -------------------------------------------------------------------


def test_hostile_keys_and_labels_round_trip_and_do_not_collide(store: KVStore) -> None:
    long = "L" * 10_000
    names = [("a",), ("a", "b"), ("ab",), ("a b",), ("🙂",), (long,), (long, long), (long + "x",)]
    keys = ["", "a\x00b", "a", "a\x00", "\x00", "🙂", "K" * 10_000, "K" * 9_999 + "k"]
    for ns in names:
        for k in keys:
            store.put(ns, k, {"ns": list(ns), "k": k})
    for ns in names:
        for k in keys:
            item = store.get(ns, k)
            assert item is not None and item.value == {"ns": list(ns), "k": k}
            assert item.namespace == ns and item.key == k
        assert [i.key for i in store.search(ns, limit=100) if i.namespace == ns] == keys
    assert store.list_namespaces(limit=100) == sorted(names)
    assert store.list_namespaces(prefix=(long,), limit=100) == [(long,), (long, long)]
    deep = tuple(f"{i:03d}" + "d" * 60 for i in range(12))  # past one LMDB key
    store.put(deep, "k", {"deep": True})
    assert store.get(deep, "k").value == {"deep": True}  # type: ignore[union-attr]
    assert [i.namespace for i in store.search(deep[:9])] == [deep]
    assert store.list_namespaces(prefix=deep[:11]) == [deep]
    assert store.list_namespaces(prefix=(*deep[:11], "other")) == []


def test_a_filter_key_is_only_a_field_name(store: KVStore) -> None:
    # SqliteStore refuses filter keys it cannot put into SQL; KVStore builds
    # none, so quotes, SQL and dots are a field's name like any other, compared
    # with that one top-level field, as InMemoryStore does.
    odd = "k') = 'x' OR '1'='1' --"
    store.put(("f",), "a", {"kind": "a", odd: 1, "p.q": 2, "p": {"q": 3}})
    store.put(("f",), "b", {"kind": "b"})
    assert [i.key for i in store.search(("f",), filter={odd: 1})] == ["a"]
    assert store.search(("f",), filter={odd: "x"}) == []
    assert [i.key for i in store.search(("f",), filter={"p.q": 2})] == ["a"]
    assert store.search(("f",), filter={"p.q": 3}) == []  # not the nested p.q
    assert [i.key for i in store.search(("f",), filter={odd: None})] == ["b"]


def test_list_namespaces_pages_stop_early_only_where_key_order_is_label_order(
    store: KVStore,
) -> None:
    """Pages of list_namespaces over labels whose keys sort as they do (short
    ones) and labels keyed by surrogates (long ones, a deep namespace), with
    an emptied and an expired namespace left out."""
    short = [f"u{i:02d}" for i in range(12)]
    longs = ["z" * 30, "a" * 30, "m" * 24 + "1", "m" * 24 + "0", "b" * 2000]
    deep = tuple(f"{i:03d}" + "d" * 60 for i in range(12))
    names = [("p", a, b) for a in short + longs for b in ("x", "y")] + [("p", *deep), ("q",)]
    for ns in reversed(names):
        store.put(ns, "k", {"v": 1})
    store.delete(("p", "u03", "x"), "k")
    store.put(("p", "u05", "x"), "k", {"v": 1}, ttl=0.0001)
    time.sleep(0.05)  # expired
    live = [ns for ns in names if ns not in {("p", "u03", "x"), ("p", "u05", "x")}]
    for prefix in [None, ("p",)]:
        for depth in [None, 1, 2, 3]:
            listed = sorted(
                {ns[:depth] for ns in live if ns[: len(prefix or ())] == prefix or not prefix}
            )
            for limit, offset in [(1, 0), (3, 0), (5, 4), (7, 20), (100, 0), (2, 40)]:
                got = store.list_namespaces(
                    prefix=prefix, max_depth=depth, limit=limit, offset=offset
                )
                assert got == listed[offset : offset + limit], (prefix, depth, limit, offset)


# -- one directory, two keyspaces ----------------------------------------------------


def _saver_work(path: Path) -> None:
    with KVSaver(path) as saver:
        g = chat_graph(saver)
        for t in ("t1", "t2"):
            for i in range(3):
                g.invoke(human(i), {"configurable": {"thread_id": t}})


def _store_work(path: Path) -> None:
    with KVStore(path, ttl={"default_ttl": 60}) as store:
        for i in range(50):
            store.put(("mem", f"u{i % 5}"), f"k{i}", {"i": i})
        store.put(("c", "t1"), "t1", {"thread": "t1"})  # names that look like the saver's


@pytest.mark.parametrize("store_first", [True, False])
def test_a_saver_and_a_store_on_one_directory_never_see_each_others_keys(
    tmp_path: Path, store_first: bool
) -> None:
    path = tmp_path / "state"
    for step in (_store_work, _saver_work) if store_first else (_saver_work, _store_work):
        step(path)
    with KVSaver(path) as saver:
        stats = saver.stats()
        assert sorted(t.thread_id for t in stats.threads) == ["t1", "t2"]
        assert stats.checkpoints == len(list(saver.list(None)))
        n = len(list(saver.list(None)))
        assert {t.config["configurable"]["thread_id"] for t in saver.list(None)} == {"t1", "t2"}
        saver.delete_thread("t1")
        report = saver.sweep(Retention(keep_last=1, sweep_interval_minutes=None), full=True)
        assert report.complete
    runner = CliRunner()
    out = runner.invoke(cli, ["threads", str(path), "--json"])
    assert out.exit_code == 0, out.output
    out = runner.invoke(cli, ["compact", str(path), "--json"])
    assert out.exit_code == 0, out.output
    with KVStore(path) as store:
        assert len(store.search(("mem",), limit=100)) == 50
        assert store.get(("c", "t1"), "t1").value == {"thread": "t1"}  # type: ignore[union-attr]
        assert store.list_namespaces() == [("c", "t1")] + [("mem", f"u{i}") for i in range(5)]
        with store.store.read() as txn:
            lo, hi = KS.store_range()
            assert all(unpack(k)[0] == "s" for k, _ in txn.scan(lo, hi))
            assert n > 0


def test_stats_count_a_kvstores_items_apart_and_in_live_bytes() -> None:
    """A KVStore beside the saver on one store: its records are counted as
    store items and bytes, and in the live bytes; the saver's counts are as
    they were without it."""
    kv = MemoryStore()
    # No idle heads: one written a second after the last put, while the
    # KVStore's puts below run, would add to the saver's bytes between the counts.
    saver = KVSaver(kv, whole_latest=False)
    g = chat_graph(saver)
    for i in range(3):
        g.invoke(human(i), {"configurable": {"thread_id": "t"}})
    before = saver.stats()
    assert before.store_items == before.store_bytes == 0
    store = KVStore(kv, index={"dims": 2, "embed": lambda texts: [[1.0, 0.5]] * len(texts)})
    for i in range(7):
        store.put(("mem", f"u{i % 2}"), f"k{i}", {"text": f"note {i}"}, ttl=60 if i % 3 else None)
    store.delete(("mem", "u0"), "k0")
    after = saver.stats()
    lo, hi = KS.store_range()
    with kv.read() as txn:
        store_bytes = sum(len(k) + len(v) for k, v in txn.scan(lo, hi))
        live = sum(len(k) + len(v) for k, v in txn.scan(None, None))
    assert (after.store_items, after.store_bytes) == (6, store_bytes)
    assert after.live_bytes == live == before.live_bytes + store_bytes
    assert after.threads == before.threads and after.checkpoints == before.checkpoints
    assert f"store items               6  (KVStore, {store_bytes:,} bytes)" in after.format()


def test_a_store_on_an_old_kvsaver_directory_survives_its_upgrade(tmp_path: Path) -> None:
    data = Path(__file__).parent / "data"
    with tarfile.open(data / "store_0_1_0_lmdb.tar.gz") as tar:
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(tmp_path, **kw)  # type: ignore[arg-type]
    path = tmp_path / "store"
    with KVSaver(path, readonly=True) as old:
        before = [t.config for t in old.list(None)]
    with KVStore(path) as store:
        store.put(("m",), "k", {"v": 1})
    with KVSaver(path) as saver:  # upgrades the saver's records, not the store's
        assert [t.config for t in saver.list(None)] == before
    with KVStore(path) as store:
        assert store.get(("m",), "k").value == {"v": 1}  # type: ignore[union-attr]
    shutil.rmtree(path)


def test_a_saver_and_a_store_may_share_one_open_store() -> None:
    kv = MemoryStore()
    saver, store = KVSaver(kv), KVStore(kv)
    chat_graph(saver).invoke(human(0), {"configurable": {"thread_id": "t"}})
    store.put(("x",), "k", {"v": 1})
    assert [t.thread_id for t in saver.stats().threads] == ["t"]
    assert store.search(()) and store.list_namespaces() == [("x",)]
    saver.close()
    store.close()
    with kv.read() as txn:  # closing either did not close the store it was given
        assert txn.get(KS.SCHEMA_KEY) is not None


# -- TTL -----------------------------------------------------------------------------


def test_items_expire_and_are_never_returned(store: KVStore) -> None:
    store.put(("t",), "short", {"v": 1}, ttl=0.5 / 60)
    store.put(("t",), "long", {"v": 2}, ttl=10)
    store.put(("t",), "none", {"v": 3})
    assert {i.key for i in store.search(("t",))} == {"short", "long", "none"}
    time.sleep(0.7)
    assert store.get(("t",), "short") is None
    assert [i.key for i in store.search(("t",))] == ["long", "none"]
    store.put(("gone",), "k", {"v": 1}, ttl=0.2 / 60)
    time.sleep(0.3)
    assert store.list_namespaces() == [("t",)]
    assert store.sweep_ttl() == 2
    assert store.sweep_ttl() == 0
    with store.store.read() as txn:  # the expiry index holds only the live TTLs
        entries = [KS.expiry_ids(k) for k, _ in txn.scan(*KS.expiry_range(2**62))]
    assert len(entries) == 1
    # a key put again after it expired is a new item, at the end
    store.put(("t",), "short", {"v": 4})
    assert [i.key for i in store.search(("t",))] == ["long", "none", "short"]


def test_reads_refresh_ttls_unless_told_not_to(store: KVStore) -> None:
    store.put(("r",), "a", {"v": 1}, ttl=0.8 / 60)
    store.put(("r",), "b", {"v": 2}, ttl=0.8 / 60)
    for _ in range(4):
        time.sleep(0.3)
        assert store.get(("r",), "a") is not None  # refreshed each time
    assert store.get(("r",), "b", refresh_ttl=False) is None
    for _ in range(3):
        time.sleep(0.3)
        assert [i.key for i in store.search(("r",))] == ["a"]  # search refreshes too
    time.sleep(0.3)
    assert [i.key for i in store.search(("r",), refresh_ttl=False)] == ["a"]
    time.sleep(0.6)
    assert store.search(("r",), refresh_ttl=False) == []


def test_ttl_config_default_and_refresh_on_read(tmp_path: Path) -> None:
    with KVStore(tmp_path / "s", ttl={"default_ttl": 0.5 / 60, "refresh_on_read": False}) as s:
        s.put(("d",), "k", {"v": 1})
        s.put(("d",), "forever", {"v": 1}, ttl=None)
        time.sleep(0.3)
        assert s.get(("d",), "k") is not None  # read, not refreshed
        time.sleep(0.35)
        assert s.get(("d",), "k") is None and s.get(("d",), "forever") is not None
    with pytest.raises(ValueError, match="unknown TTLConfig"):
        KVStore(":memory:", ttl={"default_tll": 1})  # type: ignore[typeddict-unknown-key]


def test_the_sweeper_thread_sweeps_and_stops(tmp_path: Path) -> None:
    with KVStore(tmp_path / "s") as s:
        for i in range(600):  # more than a sweep's chunk
            s.put(("x",), f"k{i}", {"i": i}, ttl=0.1 / 60)
        s.put(("x",), "stays", {"i": -1})
        time.sleep(0.15)
        future = s.start_ttl_sweeper(sweep_interval_minutes=0.2 / 60)
        deadline = time.time() + 10
        while time.time() < deadline:
            with s.store.read() as txn:
                if not list(txn.scan(*KS.expiry_range(2**62), limit=1)):
                    break
            time.sleep(0.05)
        with s.store.read() as txn:
            items = list(txn.scan(*KS.items_range(1)))
        assert len(items) == 1
        assert s.stop_ttl_sweeper(timeout=5)
        assert future.done()
    with KVStore(tmp_path / "s", ttl={"sweep_interval_minutes": 1}) as s:
        assert s.stop_ttl_sweeper(timeout=5)  # started by the TTLConfig


async def test_start_ttl_sweeper_is_also_awaited(tmp_path: Path) -> None:
    # AsyncPostgresStore's form: ``await store.start_ttl_sweeper()`` gives the
    # running sweeper's task back at once; KVStore's sync form returns a future.
    # Both on one object: the await gives the same future, not yet done.
    with KVStore(tmp_path / "s") as s:
        s.put(("x",), "k", {"i": 1}, ttl=0.05 / 60)
        future = await s.start_ttl_sweeper(sweep_interval_minutes=0.1 / 60)
        assert isinstance(future, concurrent.futures.Future) and not future.done()
        deadline = time.time() + 10
        while True:  # the sweeper thread deletes the expired item
            with s.store.read() as txn:
                if not list(txn.scan(*KS.expiry_range(2**62), limit=1)):
                    break
            assert time.time() < deadline
            await asyncio.sleep(0.05)
        assert s.stop_ttl_sweeper(timeout=5)
        assert future.done() and future.result() is None


async def test_asweep_ttl_and_the_sweeper_sweep_where_sweep_ttl_is_a_coroutine(
    tmp_path: Path,
) -> None:
    # AsyncSqliteStore's and AsyncPostgresStore's sweep_ttl is a coroutine; a
    # KVStore subclass of that form (tests/upstream_suites.py's) keeps
    # asweep_ttl and the sweeper thread, which sweep without calling it.
    class AsyncForm(KVStore):
        async def sweep_ttl(self) -> int:  # type: ignore[override]
            return await self.asweep_ttl()

    with AsyncForm(tmp_path / "s") as s:
        s.put(("x",), "a", {"i": 1}, ttl=0.05 / 60)
        await asyncio.sleep(0.1)
        assert await s.sweep_ttl() == 1
        s.put(("x",), "b", {"i": 2}, ttl=0.05 / 60)
        await s.start_ttl_sweeper(sweep_interval_minutes=0.1 / 60)
        deadline = time.time() + 10
        while True:  # the sweeper thread deletes the expired item
            with s.store.read() as txn:
                if not list(txn.scan(*KS.expiry_range(2**62), limit=1)):
                    break
            assert time.time() < deadline, "the sweeper did not sweep"
            await asyncio.sleep(0.05)
        assert s.stop_ttl_sweeper(timeout=5)


# -- timestamps, read-only, options ---------------------------------------------------


def test_created_at_is_the_creation_and_updated_at_the_last_put(store: KVStore) -> None:
    store.put(("ts",), "k", {"v": 1})
    first = store.get(("ts",), "k")
    time.sleep(0.01)
    store.put(("ts",), "k", {"v": 2})
    second = store.get(("ts",), "k")
    assert first is not None and second is not None
    assert second.created_at == first.created_at
    assert second.updated_at > first.updated_at
    assert second.created_at.tzinfo is not None
    (found,) = store.search(("ts",))
    assert (found.created_at, found.updated_at) == (second.created_at, second.updated_at)
    store.delete(("ts",), "k")
    store.put(("ts",), "k", {"v": 3})
    third = store.get(("ts",), "k")
    assert third is not None and third.created_at > second.created_at


def test_stored_times_read_back_to_the_microsecond() -> None:
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    rnd = random.Random(7)
    edges = [0, 1, 999_999, 1_000_000, 2**31 * 10**6 - 1, 7_258_118_400 * 10**6 - 1]
    for us in edges + [rnd.randrange(7_258_118_400 * 10**6) for _ in range(200_000)]:
        assert OPS.when(us) == epoch + timedelta(microseconds=us), us


def test_a_damaged_item_record_is_a_clear_error(store: KVStore) -> None:
    store.put(("dmg",), "k", {"v": 1})
    with store.store.read() as txn:
        ns_id = OPS.stored_ns_id(txn, ("dmg",))
    assert ns_id is not None
    with store.store.write() as txn:
        txn.put(KS.item_key(ns_id, KS.key_element("k")), ormsgpack.packb(["k", 1, b""]))
    with pytest.raises(CorruptStoreError, match="3 fields, not 8"):
        store.get(("dmg",), "k")
    with pytest.raises(CorruptStoreError, match="3 fields, not 8"):
        store.search(("dmg",))


@pytest.mark.parametrize("slots_known", [True, False])
def test_items_are_langgraphs_own_built_either_way(
    store: KVStore, monkeypatch: pytest.MonkeyPatch, slots_known: bool
) -> None:
    """Items are built by setting their slots, or through LangGraph's
    constructors where its Item has slots we do not know: the same items."""
    monkeypatch.setattr(OPS, "_SLOTS_KNOWN", slots_known and OPS._SLOTS_KNOWN)
    store.put(("it", "a"), "k", {"v": [1, {"x": "y"}]})
    time.sleep(0.002)
    store.put(("it", "a"), "k", {"v": 2})
    got, (found,) = store.get(("it", "a"), "k"), store.search(("it",))
    assert got is not None and type(got) is Item and type(found) is SearchItem
    want = Item(
        value={"v": 2},
        key="k",
        namespace=("it", "a"),
        created_at=got.created_at,
        updated_at=got.updated_at,
    )
    assert got == want and found == want and found.score is None
    assert got.created_at < got.updated_at and got.updated_at.tzinfo is timezone.utc
    for item in (got, found):
        for cls in type(item).__mro__:
            for slot in getattr(cls, "__slots__", ()):
                getattr(item, slot)  # every slot set
        assert json.loads(json.dumps(item.dict())) == item.dict()


def test_a_read_only_store_reads_and_refuses_writes(tmp_path: Path) -> None:
    with KVStore(tmp_path / "s") as s:
        s.put(("a",), "k", {"v": 1}, ttl=1)
    with KVStore(tmp_path / "s", readonly=True) as ro:
        assert ro.get(("a",), "k").value == {"v": 1}  # type: ignore[union-attr]
        with pytest.raises(ReadOnlyError):
            ro.put(("a",), "k2", {"v": 2})
        assert ro.search(("a",))[0].key == "k"


def test_options_are_kvsavers_and_checked_first(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="durabilty"):
        KVStore(tmp_path / "s", durabilty="none")
    with pytest.raises(OptionError):
        KVStore(":memory:", durability="none")
    assert not (tmp_path / "s").exists()
    with KVStore(tmp_path / "s", durability="none", max_size=1 << 26) as s:
        s.put(("a",), "k", {"v": 1})
    with KVStore(tmp_path / "f.kvs", backend="file") as s:
        s.put(("a",), "k", {"v": 1})
    with KVStore(tmp_path / "f.kvs", backend="file") as s:
        assert s.get(("a",), "k") is not None


def test_option_errors_name_kvstore(tmp_path: Path) -> None:
    """The option checks are KVSaver's; raised for a KVStore, they name it."""
    cases: list[tuple[Any, dict[str, Any], str]] = [
        (tmp_path / "s", {"durabilty": "none"}, r"^KVStore got an unexpected keyword argument "
         r"'durabilty'; did you mean 'durability'\?"),
        (":memory:", {"durability": "none"}, r"^KVStore option 'durability' applies only to "
         r"the lmdb backend, not to ':memory:'"),
        (MemoryStore(), {"max_size": 1 << 20}, r"^KVStore\(store\): max_size apply only when "
         r"KVStore opens the store itself"),
    ]  # fmt: skip
    for where, options, message in cases:
        with pytest.raises(OptionError, match=message) as err:
            KVStore(where, **options)
        assert "KVSaver" not in str(err.value)
    with pytest.raises(OptionError, match=r"^KVSaver option 'durability'"):  # KVSaver's own
        KVSaver(":memory:", durability="none")


def test_an_index_without_numpy_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    block_numpy(monkeypatch)
    with pytest.raises(MissingDependencyError, match=r"pip install 'kvsaver\[vector\]'"):
        KVStore(":memory:", index={"dims": 2, "embed": lambda texts: [[1.0, 0.0]] * len(texts)})
    with KVStore(":memory:") as plain:  # no index: no numpy needed
        plain.put(("a",), "k", {"v": 1})
        assert plain.search(("a",), query="anything")[0].score is None


def test_async_methods_share_the_sync_core(store: KVStore) -> None:
    async def run() -> None:
        await store.aput(("a", "b"), "k", {"v": 1}, ttl=5)
        await asyncio.gather(*(store.aput(("a",), f"k{i}", {"v": i}) for i in range(20)))
        assert (await store.aget(("a", "b"), "k")).value == {"v": 1}  # type: ignore[union-attr]
        assert len(await store.asearch(("a",), limit=100)) == 21
        assert await store.alist_namespaces() == [("a",), ("a", "b")]
        await store.adelete(("a", "b"), "k")
        assert await store.aget(("a", "b"), "k") is None
        assert await store.asweep_ttl() == 0

    asyncio.run(run())
    assert json.dumps(store.get(("a",), "k3").dict())  # type: ignore[union-attr]


def test_async_reads_awaiting_their_ttl_refresh_hold_no_lmdb_reader_slot(tmp_path: Path) -> None:
    """An ended LMDB read transaction keeps its reader slot while anything
    references it: reads that awaited their TTL refresh while holding their
    run took a slot each, and a gather of many reads ran out of them (LangGraph's
    AsyncPostgresStore suite, test_large_batches_async, on LMDB)."""
    ttl: Any = {"default_ttl": 10, "refresh_on_read": True}
    with KVStore(str(tmp_path), ttl=ttl, max_readers=8) as store:
        store.put(("a",), "k", {"v": 1})

        async def run() -> list[Any]:
            return await asyncio.gather(*(store.aget(("a",), "k") for _ in range(64)))

        assert all(item is not None for item in asyncio.run(run()))


def test_a_put_on_postgresql_reads_only_what_it_must(pg_server: Any) -> None:
    """Round trips of a put of a new item on PostgreSQL (reads answered from
    the speculation cache cost none): its seq's scan (or, first in a new
    namespace, the scan for the namespace's id: a new namespace has no items
    to look up or to number after), the vector counter's read where it has
    vectors (a new item has none stored to remove first), then the commit."""

    def embed(texts: list[str]) -> list[list[float]]:
        return [[1.0, float(t.split()[-1]), 0.0, 0.5] for t in texts]

    index = {"dims": 4, "embed": embed, "fields": ["t"]}
    for options, per_put in (({}, 2), ({"index": index}, 3)):
        with open_store("postgres", **options) as store:
            kv = store.store
            trips = []
            for i in range(12):
                before = kv._round_trips  # type: ignore[attr-defined]
                store.put(("u", f"n{i // 4}"), f"k{i}", {"t": f"text {i}"})
                trips.append(kv._round_trips - before)  # type: ignore[attr-defined]
            assert trips == [per_put] * 12, options
            assert [i.key for i in store.search(("u", "n1"))] == ["k4", "k5", "k6", "k7"]
            if options:
                assert store.search(("u",), query="text 5", limit=1)[0].key == "k5"


def test_a_store_of_the_unreleased_format_1_is_refused(tmp_path: Path) -> None:
    """Format 1 (a get was two lookups) was never released: a store of it is
    refused with a clear error, never read with format 2's layout."""
    with KVStore(tmp_path / "s") as store:
        store.put(("a",), "k", {"v": 1})
        store.store.transact(lambda txn: txn.put(KS.SCHEMA_KEY, ormsgpack.packb({"format": 1})))
    with pytest.raises(FormatVersionError, match="format 1, a development format"):
        KVStore(tmp_path / "s")


def test_a_namespace_says_once_an_item_of_it_had_a_ttl(tmp_path: Path) -> None:
    """The namespace record's ttl is set by the first put with a TTL (in a
    new namespace or an old one) and stays; list_namespaces and an offset
    search read items' records only where it is set."""
    with KVStore(tmp_path / "s") as store:
        store.put(("plain",), "a", {"v": 1})
        store.put(("later",), "a", {"v": 1})
        store.put(("later",), "b", {"v": 2}, ttl=0.2 / 60)
        store.put(("new",), "a", {"v": 1}, ttl=0.2 / 60)
        with store.store.read() as txn:
            flags = {
                rec.labels: rec.ttl
                for rec in (
                    KS.decode_namespace(v) for _, v in txn.scan(*KS.namespace_prefix_range(())[:2])
                )
            }
        assert flags == {("plain",): False, ("later",): True, ("new",): True}
        assert problems(store) == []
        time.sleep(0.3)
        assert store.list_namespaces() == [("later",), ("plain",)]
        assert [i.key for i in store.search(("later",), offset=0)] == ["a"]
        store.put(("later",), "c", {"v": 3})
        assert [i.key for i in store.search(("later",), offset=1)] == ["c"]
        store.delete(("plain",), "a")
        assert store.list_namespaces() == [("later",)]
        assert problems(store) == []


def test_a_search_reads_past_an_order_entry_without_its_record() -> None:
    """None is written so, but a plain search over one (no TTL in the
    namespace) still returns the live items around it."""
    store = KVStore(":memory:")
    for i in range(4):
        store.put(("n",), f"k{i}", {"i": i})
    with store.store.write() as txn:
        ns_id = OPS.stored_ns_id(txn, ("n",))
        assert ns_id is not None
        txn.delete(KS.item_key(ns_id, KS.key_element("k1")))  # its order entry stays
    assert [i.key for i in store.search(("n",))] == ["k0", "k2", "k3"]
    assert [i.key for i in store.search(("n",), offset=1, limit=1)] == ["k2"]
    store.close()
