"""Small values in the checkpoint record (format 6, ``saver/small.py``): no
blob of their own, every record holding all of its checkpoint's, reads the
same as when every value was a blob."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kvsaver import KVSaver
from kvsaver import heads as H
from kvsaver import schema as S
from langgraph.checkpoint.memory import InMemorySaver
from saver_helpers import blob_keys, config, make_checkpoint, open_kv, tuple_dict

SMALL = {"none": None, "flag": True, "n": 7, "big_int": 2**63, "x": 1.5, "s": "s" * 32}
NOT_SMALL = {
    "list": [1],
    "long_str": "s" * 33,
    "bytes": b"b",
    "dict": {"k": 1},
}


def _put(
    saver: Any,
    cid: str,
    values: dict[str, Any],
    versions: dict[str, Any],
    new: dict[str, Any],
    parent: str | None = None,
    thread: str = "t",
) -> None:
    saver.put(config(thread, "", parent), make_checkpoint(cid, values, versions), {}, new)


def _record_values(saver: KVSaver, thread: str, cid: str) -> dict[str, Any]:
    with saver.store.read() as txn:
        raw = txn.get(S.checkpoint_key(thread, "", cid))
    assert raw is not None
    return saver.serde.loads_typed(S.decode_checkpoint(raw).checkpoint).get("channel_values", {})


def test_is_small() -> None:
    assert all(S.is_small(v) for v in SMALL.values())
    assert not any(S.is_small(v) for v in NOT_SMALL.values())
    assert not S.is_small(2**64) and not S.is_small(-(2**63) - 1)  # past msgpack's ints
    import enum

    class E(enum.IntEnum):
        A = 1

    assert not S.is_small(E.A)  # a subclass goes to a blob, as its type must survive


def test_small_values_are_in_the_record_and_read_back(kv: KVSaver) -> None:
    values = {**SMALL, **NOT_SMALL}
    versions = {ch: "1" for ch in values}
    _put(kv, "1", values, versions, versions)
    assert {k[3] for k in blob_keys(kv)} == set(NOT_SMALL)
    assert _record_values(kv, "t", "1") == SMALL
    got = kv.get_tuple(config("t"))
    assert got is not None and got.checkpoint["channel_values"] == values
    listed = list(kv.list(config("t")))
    assert [t.checkpoint["channel_values"] for t in listed] == [values]


def test_unchanged_small_values_are_in_every_record(kv: KVSaver) -> None:
    """A thread pruned to its latest still reads whole: the latest record holds
    the counter its first checkpoint wrote."""
    _put(kv, "1", {"n": 1, "msgs": ["a"]}, {"n": "1", "msgs": "1"}, {"n": "1", "msgs": "1"})
    _put(kv, "2", {"n": 1, "msgs": ["a", "b"]}, {"n": "1", "msgs": "2"}, {"msgs": "2"}, "1")
    assert _record_values(kv, "t", "2") == {"n": 1}
    kv.prune(["t"])
    got = kv.get_tuple(config("t"))
    assert got is not None and got.checkpoint["channel_values"] == {"n": 1, "msgs": ["a", "b"]}


@pytest.mark.parametrize("cold", [False, True])
def test_an_unchanged_value_not_given_is_taken_from_the_parent(tmp_path: Path, cold: bool) -> None:
    """A put that leaves an unchanged channel's value out (LangGraph gives
    them all; a hand-made checkpoint may not): the parent's record holds it,
    read from this process's memo or, by another saver, from the store."""
    path = tmp_path / "s"
    with KVSaver(path) as saver:
        _put(saver, "1", {"n": 1, "s": "x"}, {"n": "1", "s": "1"}, {"n": "1", "s": "1"})
        other = KVSaver(path) if cold else saver
        _put(other, "2", {"s": "y"}, {"n": "1", "s": "2"}, {"s": "2"}, "1")
        _put(other, "3", {}, {"n": "2", "s": "2"}, {"n": "2"}, "2")  # n: a version, no value
        assert _record_values(saver, "t", "2") == {"n": 1, "s": "y"}
        assert _record_values(saver, "t", "3") == {"s": "y"}
        ref = InMemorySaver()
        _put(ref, "1", {"n": 1, "s": "x"}, {"n": "1", "s": "1"}, {"n": "1", "s": "1"})
        _put(ref, "2", {"s": "y"}, {"n": "1", "s": "2"}, {"s": "2"}, "1")
        _put(ref, "3", {}, {"n": "2", "s": "2"}, {"n": "2"}, "2")
        for cid in ("1", "2", "3"):
            want = ref.get_tuple(config("t", "", cid))
            got = saver.get_tuple(config("t", "", cid))
            assert got is not None and want is not None
            assert got.checkpoint["channel_values"] == want.checkpoint["channel_values"]
        if cold:
            other.close()


def test_a_parent_at_another_version_lends_nothing(kv: KVSaver) -> None:
    _put(kv, "1", {"n": 1}, {"n": "1"}, {"n": "1"})
    _put(kv, "2", {"n": 2}, {"n": "2"}, {"n": "2"}, "1")
    _put(kv, "3", {}, {"n": "1"}, {}, "2")  # names version 1, its parent holds 2
    got = kv.get_tuple(config("t"))
    assert got is not None and got.checkpoint["channel_values"] == {}


def test_a_store_whose_values_are_all_blobs_reads_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records of format 5 and older (every value a blob, no channel_values in
    the record), and a thread continued on them by this code."""
    path = tmp_path / "s"
    with monkeypatch.context() as m:
        m.setattr(S, "is_small", lambda value: False)
        with KVSaver(path) as old:
            _put(old, "1", {"n": 1, "s": "x"}, {"n": "1", "s": "1"}, {"n": "1", "s": "1"})
            assert _record_values(old, "t", "1") == {}
            before = tuple_dict(old.get_tuple(config("t")))
    with KVSaver(path) as new:
        assert tuple_dict(new.get_tuple(config("t"))) == before
        _put(new, "2", {"s": "y"}, {"n": "1", "s": "2"}, {"s": "2"}, "1")
        got = new.get_tuple(config("t"))
        assert got is not None and got.checkpoint["channel_values"] == {"n": 1, "s": "y"}
        assert _record_values(new, "t", "2") == {"s": "y"}  # n: still its blob's


def test_putting_a_small_version_again_changes_only_the_new_checkpoint(kv: KVSaver) -> None:
    """Versions that are not unique (never LangGraph's): a small value lives in
    each record, so the older checkpoint keeps its own, as SqliteSaver's does."""
    _put(kv, "1", {"n": 1}, {"n": "1"}, {"n": "1"})
    _put(kv, "2", {"n": 5}, {"n": "1"}, {"n": "1"}, "1")
    values = {
        cid: kv.get_tuple(config("t", "", cid)).checkpoint["channel_values"]  # type: ignore[union-attr]
        for cid in ("1", "2")
    }
    assert values == {"1": {"n": 1}, "2": {"n": 5}}


def test_copy_thread_carries_the_small_values(kv: KVSaver) -> None:
    _put(kv, "1", {"n": 1, "msgs": ["a"]}, {"n": "1", "msgs": "1"}, {"n": "1", "msgs": "1"})
    kv.copy_thread("t", "u")
    got = kv.get_tuple(config("u"))
    assert got is not None and got.checkpoint["channel_values"] == {"n": 1, "msgs": ["a"]}


def test_heads_hold_the_small_values(tmp_path: Path) -> None:
    """A head made by a put and one made by the idle writer from the stored
    record read as the record and blobs do."""
    with open_kv("lmdb", tmp_path / "a", whole_latest=True) as saver:
        _put(saver, "1", {"n": 1, "m": ["a"]}, {"n": "1", "m": "1"}, {"n": "1", "m": "1"})
        _put(saver, "2", {"n": 1, "m": ["b"]}, {"n": "1", "m": "2"}, {"m": "2"}, "1")
        with saver.store.read() as txn:
            assert txn.get(S.head_key("t", "")) is not None
        via_head = tuple_dict(saver.get_tuple(config("t")))
    with KVSaver(tmp_path / "a" / "lmdb", whole_latest=False) as plain:
        assert tuple_dict(plain.get_tuple(config("t"))) == via_head
    with KVSaver(tmp_path / "b") as idle:
        _put(idle, "1", {"n": 1, "m": ["a"]}, {"n": "1", "m": "1"}, {"n": "1", "m": "1"})
        idle._heads.idle_heads.write([("t", "")])
        with idle.store.read() as txn:
            assert txn.get(S.head_key("t", "")) is not None
        got = idle.get_tuple(config("t"))
        assert got is not None and got.checkpoint["channel_values"] == {"n": 1, "m": ["a"]}


def test_split_values() -> None:
    import ormsgpack

    cp = {"id": "1", "channel_versions": {"n": "1"}}
    plain = ormsgpack.packb(cp)
    assert H.split_values(plain) == (plain, {})
    spliced = H.with_values(plain, {"n": None, "s": "x"})
    assert spliced is not None
    assert ormsgpack.unpackb(spliced) == {**cp, "channel_values": {"n": None, "s": "x"}}
    rest, values = H.split_values(spliced) or (b"", {})
    assert ormsgpack.unpackb(rest) == cp
    assert values == {"n": None, "s": "x"}
    # an extension type in the checkpoint: it could not be written again as it was
    ext = ormsgpack.packb({**cp, "channel_values": {}, "x": ormsgpack.Ext(5, b"?")})
    assert H.split_values(ext) is None
