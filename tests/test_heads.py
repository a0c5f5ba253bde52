"""Head records (saver/heads.py, saver/whole/): a thread's newest checkpoint
whole in one record, read by get_tuple instead of its blobs; written by
every put with ``whole_latest=True``, once the thread is left alone with
``"idle"`` (the default), never with False.

What must hold: a read through a head returns exactly what the blobs give
(every value type, forks, namespaces, hostile ids); a head is used only for
the very record it holds, so a stale one (another writer's put, a delete, a
put of an older checkpoint) is never served; deletes leave no head behind;
encrypted values never reach a head; a checkpoint too large has none."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from kvsaver import KVSaver
from kvsaver import heads as H
from kvsaver import schema as S
from kvsaver import threads as TH
from kvsaver.kv.keys import unpack
from kvsaver.whole.idle import IdleWork
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from saver_helpers import config, damage_zstd_blob, make_checkpoint, open_kv, tuple_dict

LOCAL = ["lmdb", "memory", "file"]
HOSTILE = ["t", "", "a\x00b", "emoji 🧵", "x" * 10_000]


def heads(saver: KVSaver) -> dict[tuple[Any, ...], bytes]:
    with saver.store.read() as txn:
        return {unpack(k)[1:]: v for k, v in txn.scan(*S.heads_range())}


def from_blobs(saver: KVSaver, conf: dict[str, Any]) -> dict[str, Any] | None:
    """get_tuple as it reads without head records."""
    c = conf["configurable"]
    with saver.store.read() as txn:
        raw = TH.find_record(
            txn, c["thread_id"], c.get("checkpoint_ns", ""), c.get("checkpoint_id")
        )
        if raw is None:
            return None
        given = conf if c.get("checkpoint_id") else None
        return tuple_dict(saver._reads.load_tuple(txn, S.decode_checkpoint(raw), given))


def drop_blobs(saver: KVSaver) -> None:
    """Delete every blob behind the saver's back: what is read after this
    came from a head."""
    saver.store.transact(lambda txn: txn.delete_range(*S.keyspace_range(S.BLOB)))


def put(
    saver: KVSaver,
    thread: str,
    cid: str,
    values: dict[str, Any],
    versions: dict[str, Any],
    new: dict[str, Any],
    parent: str | None = None,
    ns: str = "",
    **meta: Any,
) -> None:
    cp = make_checkpoint(cid, values, versions)
    saver.put(config(thread, ns, parent), cp, {"source": "loop", "step": 1, **meta}, new)


@pytest.mark.parametrize("backend", LOCAL)
@pytest.mark.parametrize("thread", HOSTILE)
def test_latest_is_served_from_the_head(tmp_path: Path, backend: str, thread: str) -> None:
    with open_kv(backend, tmp_path, whole_latest=True) as saver:
        put(saver, thread, "1", {"a": [1, 2], "b": "x"}, {"a": "1", "b": "1"}, {"a": "1", "b": "1"})
        put(saver, thread, "2", {"a": [1, 2, 3], "b": "x"}, {"a": "2", "b": "1"}, {"a": "2"}, "1")
        saver.put_writes(config(thread, "", "2"), [("a", 4), ("b", None)], "task")
        want = from_blobs(saver, config(thread))
        assert list(heads(saver)) == [(S.k(thread), "")]
        drop_blobs(saver)  # the head alone must give the same tuple
        got = saver.get_tuple(config(thread))
        assert tuple_dict(got) == want
        assert got is not None and got.checkpoint["channel_values"] == {"a": [1, 2, 3], "b": "x"}
        # by id, the checkpoint the head holds: from the head too
        by_id = saver.get_tuple(config(thread, "", "2"))
        assert by_id is not None and by_id.checkpoint["channel_values"]["a"] == [1, 2, 3]
        assert by_id.pending_writes == [("task", "a", 4), ("task", "b", None)]


def test_another_saver_reads_by_id_the_same(tmp_path: Path) -> None:
    """A saver that did not write the head reads by id through the blobs,
    then (once it has read the latest) through the head: the same tuple."""
    with open_kv("lmdb", tmp_path / "a", whole_latest=True) as saver:
        put(saver, "t", "1", {"a": [1]}, {"a": "1"}, {"a": "1"})
        put(saver, "t", "2", {"a": [1, 2]}, {"a": "2"}, {"a": "2"}, "1")
    with KVSaver(tmp_path / "a" / "lmdb", whole_latest=True) as other:
        by_id = tuple_dict(other.get_tuple(config("t", "", "2")))
        assert by_id == from_blobs(other, config("t", "", "2"))
        other.get_tuple(config("t"))
        drop_blobs(other)
        assert tuple_dict(other.get_tuple(config("t", "", "2"))) == by_id


def test_random_puts_read_the_same_through_heads(tmp_path: Path) -> None:
    """Forks, namespaces, None/bytes/bytearray/large values, channels that
    appear and go: every latest read equals the blobs' reading."""
    rng = random.Random(7)
    values_pool: list[Any] = [
        None,
        0,
        1.5,
        "s",
        b"\x00bin",
        bytearray(b"ba"),
        {"k": [1, {"z": None}]},
        "y" * 40_000,
        [],
        ["m"] * 3,
    ]
    with open_kv("lmdb", tmp_path, whole_latest=True) as saver:
        ids: dict[tuple[str, str], list[str]] = {}
        state: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any]]] = {}
        n = 0
        for _ in range(300):
            n += 1
            key = (rng.choice(["t1", "t2"]), rng.choice(["", "sub"]))
            past = ids.setdefault(key, [])
            vals, vers = state.get(key, ({}, {}))
            vals, vers = dict(vals), dict(vers)
            new: dict[str, Any] = {}
            for ch in rng.sample(["a", "b", "c", "msgs"], rng.randint(1, 3)):
                v = f"{n:08d}"
                new[ch] = v
                vers[ch] = v
                if ch == "msgs":
                    vals[ch] = [*vals.get(ch, []), f"message {n} " * 20]
                elif rng.random() < 0.1:
                    vals.pop(ch, None)  # a version without a value
                else:
                    vals[ch] = rng.choice(values_pool)
            parent = (
                rng.choice(past) if past and rng.random() < 0.2 else (past[-1] if past else None)
            )
            cid = f"{n:06d}"
            put(saver, key[0], cid, vals, vers, new, parent, key[1])
            past.append(cid)
            state[key] = (vals, vers)
            for t, ns in ids:
                assert tuple_dict(saver.get_tuple(config(t, ns))) == from_blobs(
                    saver, config(t, ns)
                )
        assert heads(saver)  # some were made, some not (the 40 KB value)


def test_a_stale_head_is_not_served(tmp_path: Path) -> None:
    with open_kv("lmdb", tmp_path, whole_latest=True) as saver:
        put(saver, "t", "1", {"a": 1}, {"a": "1"}, {"a": "1"})
        head_of_1 = heads(saver)[("t", "")]
        put(saver, "t", "2", {"a": 2}, {"a": "2"}, {"a": "2"}, "1")
        # another writer (a kvsaver without heads) left the old head behind
        saver.store.transact(lambda txn: txn.put(S.head_key("t", ""), head_of_1))
        got = saver.get_tuple(config("t"))
        assert got is not None and got.checkpoint["channel_values"] == {"a": 2}
        # and the next put of the thread builds a right one from the blobs
        put(saver, "t", "3", {"a": 2, "b": 3}, {"a": "2", "b": "3"}, {"b": "3"}, "2")
        drop_blobs(saver)
        got = saver.get_tuple(config("t"))
        assert got is not None and got.checkpoint["channel_values"] == {"a": 2, "b": 3}


def test_a_put_of_an_older_checkpoint_keeps_the_newer_head(tmp_path: Path) -> None:
    with open_kv("lmdb", tmp_path, whole_latest=True) as saver:
        put(saver, "t", "2", {"a": 2}, {"a": "2"}, {"a": "2"})
        put(saver, "t", "1", {"a": 1}, {"a": "1"}, {"a": "1"})
        assert H.parse(heads(saver)[("t", "")]) is not None
        assert H.parse(heads(saver)[("t", "")])[0] == "2"  # type: ignore[index]
        drop_blobs(saver)
        got = saver.get_tuple(config("t"))
        assert got is not None and got.checkpoint["channel_values"] == {"a": 2}


def test_too_large_a_checkpoint_has_no_head(tmp_path: Path) -> None:
    big = "z" * (H.MAX_BYTES + 1)
    with open_kv("lmdb", tmp_path, whole_latest=True) as saver:
        put(saver, "t", "1", {"a": 1}, {"a": "1"}, {"a": "1"})
        assert heads(saver)
        put(saver, "t", "2", {"a": big}, {"a": "2"}, {"a": "2"}, "1")
        assert not heads(saver)
        got = saver.get_tuple(config("t"))
        assert got is not None and got.checkpoint["channel_values"] == {"a": big}
        put(saver, "t", "3", {"a": 3}, {"a": "3"}, {"a": "3"}, "2")
        assert heads(saver)


def test_deletes_leave_no_head(tmp_path: Path) -> None:
    with open_kv("lmdb", tmp_path, whole_latest=True) as saver:
        for t in ("t", "u"):
            put(saver, t, "1", {"a": 1}, {"a": "1"}, {"a": "1"}, run_id="r1")
            put(saver, t, "2", {"a": 2}, {"a": "2"}, {"a": "2"}, "1", run_id="r2")
        saver.delete_thread("t")
        assert list(heads(saver)) == [("u", "")]
        saver.delete_for_runs(["r2"])  # u's latest goes, and its head with it
        assert heads(saver) == {}
        got = saver.get_tuple(config("u"))
        assert got is not None and got.checkpoint["channel_values"] == {"a": 1}
        put(saver, "v", "1", {"a": 1}, {"a": "1"}, {"a": "1"})
        put(saver, "w", "5", {"a": 5}, {"a": "5"}, {"a": "5"})
        saver.copy_thread("v", "w")  # the target's head may no longer be its latest
        assert list(heads(saver)) == [("v", "")]
        got = saver.get_tuple(config("w"))
        assert got is not None and got.checkpoint["id"] == "5"


def test_encrypted_values_never_reach_a_head(tmp_path: Path) -> None:
    serde = EncryptedSerializer.from_pycryptodome_aes(key=b"k" * 16)
    with KVSaver(tmp_path / "enc", serde=serde, whole_latest=True) as saver:
        put(saver, "t", "1", {"a": "secret value"}, {"a": "1"}, {"a": "1"})
        assert heads(saver) == {}
        got = saver.get_tuple(config("t"))
        assert got is not None and got.checkpoint["channel_values"] == {"a": "secret value"}


def test_heads_count_in_the_thread_stats(tmp_path: Path) -> None:
    with open_kv("lmdb", tmp_path, whole_latest=True) as saver:
        put(saver, "t", "1", {"a": "v" * 1000}, {"a": "1"}, {"a": "1"})
        head = heads(saver)[("t", "")]
        stats = saver.stats()
        assert stats.threads[0].bytes >= len(head)


@pytest.mark.parametrize("mode", [False, "idle"])
def test_a_put_without_whole_latest_true_removes_a_head(tmp_path: Path, mode: Any) -> None:
    with KVSaver(tmp_path / "s", whole_latest=False) as plain:
        put(plain, "t", "1", {"a": 1}, {"a": "1"}, {"a": "1"})
        assert heads(plain) == {}
    assert heads_of(tmp_path / "s") == {}  # False: none, not even at close
    with KVSaver(tmp_path / "s", whole_latest=True) as fast:
        put(fast, "t", "2", {"a": 2}, {"a": "2"}, {"a": "2"}, "1")
        assert list(heads(fast)) == [("t", "")]
    with KVSaver(tmp_path / "s", whole_latest=mode) as other:
        if other._heads.idle is not None:
            other._heads.idle.delay = 3600
        # a put that does not write the head in its transaction drops it
        put(other, "t", "3", {"a": 3}, {"a": "3"}, {"a": "3"}, "2")
        assert heads(other) == {}
        got = other.get_tuple(config("t"))
        assert got is not None and got.checkpoint["channel_values"] == {"a": 3}


def idle_of(saver: KVSaver) -> IdleWork:
    assert saver._heads.idle is not None
    return saver._heads.idle


def heads_of(path: Path) -> dict[tuple[Any, ...], bytes]:
    with KVSaver(path, whole_latest=False) as saver:
        return heads(saver)


# -- whole_latest="idle" (the default): heads of threads left alone -----------------


def test_idle_is_the_default(tmp_path: Path) -> None:
    with KVSaver(tmp_path / "s") as saver:
        assert saver._whole_latest == "idle"


@pytest.mark.parametrize("backend", LOCAL)
@pytest.mark.parametrize("thread", HOSTILE)
def test_idle_heads_are_written_when_the_thread_is_left_alone(
    tmp_path: Path, backend: str, thread: str
) -> None:
    with open_kv(backend, tmp_path) as saver:
        idle_of(saver).delay = 3600  # not before flush(): no timing in this test
        put(saver, thread, "1", {"a": [1, 2], "b": "x"}, {"a": "1", "b": "1"}, {"a": "1", "b": "1"})
        put(saver, thread, "2", {"a": [1, 2, 3], "b": "x"}, {"a": "2", "b": "1"}, {"a": "2"}, "1")
        saver.put_writes(config(thread, "", "2"), [("a", 4), ("b", None)], "task")
        assert heads(saver) == {}  # not written by the puts
        want = from_blobs(saver, config(thread))
        assert idle_of(saver).pending() == 1
        idle_of(saver).flush()
        assert list(heads(saver)) == [(S.k(thread), "")]
        drop_blobs(saver)  # the head alone must give the same tuple
        assert tuple_dict(saver.get_tuple(config(thread))) == want
        by_id = saver.get_tuple(config(thread, "", "2"))
        assert by_id is not None and by_id.pending_writes == [("task", "a", 4), ("task", "b", None)]


def test_idle_heads_come_by_themselves(tmp_path: Path) -> None:
    """Without flush(): the background thread writes them after the delay."""
    import time

    with KVSaver(tmp_path / "s") as saver:
        idle_of(saver).delay = 0.05
        for t in ("t", "u"):
            put(saver, t, "1", {"a": [1]}, {"a": "1"}, {"a": "1"})
        deadline = time.monotonic() + 30
        while len(heads(saver)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert list(heads(saver)) == [("t", ""), ("u", "")]
        # a put of an idle thread drops its head; the thread gets one again
        put(saver, "t", "2", {"a": [1, 2]}, {"a": "2"}, {"a": "2"}, "1")
        while H.parse(heads(saver).get(("t", ""))) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        drop_blobs(saver)
        got = saver.get_tuple(config("t"))
        assert got is not None and got.checkpoint["channel_values"] == {"a": [1, 2]}


@pytest.mark.parametrize("backend", ["lmdb", "file"])
def test_close_writes_the_heads_still_waiting(tmp_path: Path, backend: str) -> None:
    with open_kv(backend, tmp_path) as saver:
        idle_of(saver).delay = 3600
        put(saver, "t", "1", {"a": [1]}, {"a": "1"}, {"a": "1"})
        put(saver, "t", "2", {"a": [1, 2]}, {"a": "2"}, {"a": "2"}, "1")
        want = from_blobs(saver, config("t"))
        assert heads(saver) == {}
    with open_kv(backend, tmp_path) as saver:
        assert list(heads(saver)) == [("t", "")]
        drop_blobs(saver)
        assert tuple_dict(saver.get_tuple(config("t"))) == want


def _changed_under(saver: KVSaver, change: Any) -> None:
    """Run ``change(txn)`` in a write transaction between the idle head's
    making (in a read transaction) and its writing."""
    heads = saver._heads.idle_heads
    made = heads.make

    def between(txn: Any, thread: str, ns: str) -> Any:
        out = made(txn, thread, ns)
        saver.store.transact(change)
        return out

    heads.make = between  # type: ignore[method-assign]


@pytest.mark.parametrize("what", ["blob", "record", "head"])
def test_an_idle_head_made_from_what_changed_since_is_not_written(
    tmp_path: Path, what: str
) -> None:
    """The same checkpoint put again with another value under the same
    version (versions that are not unique, as in tests), a newer record, or
    another writer's head, after the head was made: it is not written."""
    with KVSaver(tmp_path / "s") as saver:
        idle_of(saver).delay = 3600
        # b's values are lists: a str this short would be in the record, no blob
        put(saver, "t", "1", {"a": [1], "b": ["x"]}, {"a": "1", "b": "1"}, {"a": "1", "b": "1"})
        other = KVSaver(":memory:", whole_latest=False)
        put(other, "t", "1", {"a": [9], "b": ["y"]}, {"a": "1", "b": "1"}, {"a": "1", "b": "1"})
        put(other, "t", "2", {"a": [9], "b": ["y"]}, {"a": "1", "b": "1"}, {}, "1")
        with other.store.read() as txn:
            foreign = dict(txn.scan(None, None))
        if what == "blob":
            key = S.blob_key("t", "", "b", "1")
            _changed_under(saver, lambda txn: txn.put(key, foreign[key]))
        elif what == "record":
            key = S.checkpoint_key("t", "", "2")
            _changed_under(saver, lambda txn: txn.put(key, foreign[key]))
        else:
            _changed_under(saver, lambda txn: txn.put(S.head_key("t", ""), b"someone's"))
        idle_of(saver).flush()
        assert heads(saver) in ({}, {("t", ""): b"someone's"})
        if what == "blob":
            got = saver.get_tuple(config("t"))
            assert got is not None and got.checkpoint["channel_values"]["b"] == ["y"]


def test_an_idle_head_the_store_cannot_take_is_left_out(tmp_path: Path) -> None:
    """A full store (or a closed one): no head, no error, the data intact."""
    from kvsaver.kv import StoreFullError

    with KVSaver(tmp_path / "s") as saver:
        idle_of(saver).delay = 3600
        put(saver, "t", "1", {"a": [1]}, {"a": "1"}, {"a": "1"})
        want = from_blobs(saver, config("t"))

        def full() -> Any:
            raise StoreFullError("full")

        write, saver.store.write = saver.store.write, full  # type: ignore[method-assign]
        idle_of(saver).flush()
        saver.store.write = write  # type: ignore[method-assign]
        assert heads(saver) == {}
        assert tuple_dict(saver.get_tuple(config("t"))) == want
    saver.close()  # closed twice: nothing left to write, no error


def test_no_idle_heads_for_encrypted_values(tmp_path: Path) -> None:
    serde = EncryptedSerializer.from_pycryptodome_aes(key=b"k" * 16)
    with KVSaver(tmp_path / "enc", serde=serde) as saver:
        put(saver, "t", "1", {"a": "secret value"}, {"a": "1"}, {"a": "1"})
        assert idle_of(saver).pending() == 0  # nothing noted
    assert heads_of(tmp_path / "enc") == {}


def test_an_idle_head_of_a_value_too_large_is_none(tmp_path: Path) -> None:
    big = "z" * (H.MAX_BYTES + 1)
    with KVSaver(tmp_path / "s") as saver:
        put(saver, "t", "1", {"a": big}, {"a": "1"}, {"a": "1"})
        put(saver, "u", "1", {"a": "small"}, {"a": "1"}, {"a": "1"})
    assert list(heads_of(tmp_path / "s")) == [("u", "")]


def test_one_record_it_cannot_read_leaves_the_others_their_heads(tmp_path: Path) -> None:
    with KVSaver(tmp_path / "s") as saver:
        for t in ("t", "u", "v"):
            put(saver, t, "1", {"a": [1]}, {"a": "1"}, {"a": "1"})
        key = S.checkpoint_key("u", "", "1")
        saver.store.transact(lambda txn: txn.put(key, b"not a record"))
    assert list(heads_of(tmp_path / "s")) == [("t", ""), ("v", "")]


def test_no_idle_heads_on_a_store_near_its_cap(tmp_path: Path) -> None:
    """Within a quarter of ``max_size`` the room is for checkpoints."""
    with KVSaver(tmp_path / "s", max_size=1 << 20) as saver:
        used = saver.store.info()["used_bytes"]  # type: ignore[attr-defined]
        saver.store.max_size = used + used // 3  # type: ignore[attr-defined]
        put(saver, "t", "1", {"a": [1]}, {"a": "1"}, {"a": "1"})
        idle_of(saver).flush()
        assert heads(saver) == {}
        saver.store.max_size = 1 << 20  # type: ignore[attr-defined]
        put(saver, "t", "2", {"a": [1, 2]}, {"a": "2"}, {"a": "2"}, "1")
    assert list(heads_of(tmp_path / "s")) == [("t", "")]


def test_a_thread_that_cannot_start_fails_no_put(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the process's thread limit: the put stands, close() writes the head."""
    import threading

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with KVSaver(tmp_path / "s") as saver:
        monkeypatch.setattr(threading.Thread, "start", refuse)
        put(saver, "t", "1", {"a": [1]}, {"a": "1"}, {"a": "1"})
        put(saver, "t", "2", {"a": [1, 2]}, {"a": "2"}, {"a": "2"}, "1")
        monkeypatch.undo()
        assert idle_of(saver)._thread is None
        got = saver.get_tuple(config("t"))
        assert got is not None and got.checkpoint["channel_values"] == {"a": [1, 2]}
    assert list(heads_of(tmp_path / "s")) == [("t", "")]


def test_a_with_allowlist_clone_writes_heads_when_the_original_is_gone(tmp_path: Path) -> None:
    """LangGraph's strict msgpack mode keeps only the clone a compile makes."""
    import gc

    strict = JsonPlusSerializer(allowed_msgpack_modules=None)  # LANGGRAPH_STRICT_MSGPACK
    saver = KVSaver(tmp_path / "s", serde=strict)
    clone = saver.with_allowlist([("my.module", "Thing")])
    assert clone is not saver
    del saver
    gc.collect()
    idle_of(clone).delay = 3600
    put(clone, "t", "1", {"a": [1]}, {"a": "1"}, {"a": "1"})
    idle_of(clone).flush()
    assert list(heads(clone)) == [("t", "")]
    clone.close()


def test_an_older_put_rewriting_a_held_version_drops_the_head(tmp_path: Path) -> None:
    with open_kv("lmdb", tmp_path, whole_latest=True) as saver:
        put(saver, "t", "2", {"a": 2}, {"a": "1"}, {"a": "1"})
        put(saver, "t", "1", {"a": 1}, {"a": "1"}, {"a": "1"})  # same version, other value
        assert heads(saver) == {}
        assert tuple_dict(saver.get_tuple(config("t"))) == from_blobs(saver, config("t"))


@pytest.mark.parametrize("bad", [1, "yes", None, "IDLE"])
def test_whole_latest_must_be_a_bool_or_idle(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(ValueError, match="whole_latest"):
        KVSaver(tmp_path / "s", whole_latest=bad)
    assert not (tmp_path / "s").exists()


def test_a_damaged_head_is_read_around(tmp_path: Path) -> None:
    """A head is only a copy: one that does not decode is not served (the
    blobs are read, and a damaged blob is still a CorruptStoreError)."""
    from kvsaver.kv import CorruptStoreError

    with open_kv("lmdb", tmp_path, whole_latest=True) as saver:
        put(saver, "t", "1", {"a": [1, 2]}, {"a": "1"}, {"a": "1"})
        want = from_blobs(saver, config("t"))
        head = heads(saver)[("t", "")]
        saver.store.transact(lambda txn: txn.put(S.head_key("t", ""), head[:-3]))
        assert tuple_dict(saver.get_tuple(config("t"))) == want
        saver.store.transact(
            lambda txn: txn.put(S.blob_key("t", "", "a", "1"), b"no type separator")
        )
        with pytest.raises(CorruptStoreError):
            saver.get_tuple(config("t"))
        put(saver, "t", "2", {"a": [3]}, {"a": "2"}, {"a": "2"}, "1")  # mends the head
        drop_blobs(saver)
        got = saver.get_tuple(config("t"))
        assert got is not None and got.checkpoint["channel_values"] == {"a": [3]}


def _with(head: bytes, header: Any = None, body: Any = None) -> bytes:
    """``head`` with its header (msgpack [id, values_at, entries]) or its
    payload replaced: a damaged head of a given shape."""
    import ormsgpack

    frame = H._frame(head)
    assert frame is not None
    at, start = frame
    old_header = head[at + 2 : start]
    hdr = old_header if header is None else ormsgpack.packb(header)
    payload = head[start:] if body is None else ormsgpack.packb(body)
    return head[:at] + len(hdr).to_bytes(2, "big") + hdr + payload


@pytest.mark.parametrize("cid", [UUID("0b4e1c1e-7f0a-4f65-9c57-1f0e8d9c2a11"), 7])
def test_an_id_given_as_a_uuid_or_an_int_reads_the_same(tmp_path: Path, cid: Any) -> None:
    """put stores an int or UUID id as its text: a read through the head
    named the checkpoint by the payload's object and failed (TypeError)."""
    with open_kv("lmdb", tmp_path, whole_latest=True) as saver:
        cp = make_checkpoint(cid, {"a": 1}, {"a": "1"})
        saver.put(config("t"), cp, {"source": "loop", "step": 1}, {"a": "1"})
        assert heads(saver)
        for conf in (config("t"), config("t", "", str(cid))):
            got = saver.get_tuple(conf)
            assert got is not None and got.config["configurable"]["checkpoint_id"] == str(cid)
            assert tuple_dict(got) == from_blobs(saver, conf)
        assert saver._heads.ids[("t", "")] == str(cid)


def test_thousands_of_channels_put_and_read(tmp_path: Path) -> None:
    """A head's header lists every channel, under a 2-byte length: a put
    of 3,000 channels raised OverflowError. Now: no head, the put stored."""
    values = {f"channel-{i:05d}": i for i in range(3000)}
    versions = {ch: "1" for ch in values}
    with open_kv("lmdb", tmp_path, whole_latest=True) as saver:
        put(saver, "t", "1", values, versions, versions)
        assert heads(saver) == {}
        got = saver.get_tuple(config("t"))
        assert got is not None and got.checkpoint["channel_values"] == values


_DAMAGED_HEADERS: dict[str, Any] = {
    "an entry cut short": lambda h: [h[0], h[1], [e[:3] for e in h[2]]],
    "values_at not a number": lambda h: [h[0], "x", h[2]],
    "entries not a list": lambda h: [h[0], h[1], {"a": 1}],
    "an id not a str": lambda h: [1, h[1], h[2]],
    "two values' places swapped": lambda h: [
        h[0],
        h[1],
        [h[2][0][:2] + h[2][1][2:], h[2][1][:2] + h[2][0][2:], *h[2][2:]],
    ],
    "a value's place shifted": lambda h: [
        h[0],
        h[1],
        [[*h[2][0][:2], h[2][0][2] + 1, h[2][0][3]], *h[2][1:]],
    ],
    # the next head, whose record is trusted, dropped b's value
    "the last value said to have none": lambda h: [
        h[0],
        h[1],
        [*h[2][:-1], [*h[2][-1][:2], h[2][-1][3], h[2][-1][3]]],
    ],
}


@pytest.mark.parametrize("damage", list(_DAMAGED_HEADERS))
def test_a_damaged_header_lends_nothing_and_fails_no_put(tmp_path: Path, damage: str) -> None:
    """A head whose header does not say where its values are (damage of any
    shape): the next put neither fails nor copies bytes from it (swapped
    places made the next head, whose record is trusted, serve a's value as
    b's); it reads the unchanged values from their blobs."""
    import ormsgpack

    with open_kv("lmdb", tmp_path, whole_latest=True) as saver:
        put(saver, "t", "1", {"a": "AAAA", "b": "BBBB"}, {"a": "1", "b": "1"}, {"a": "1", "b": "1"})
        head = heads(saver)[("t", "")]
        parsed = H.parse(head)
        assert parsed is not None
        frame = H._frame(head)
        assert frame is not None
        header = ormsgpack.unpackb(head[frame[0] + 2 : frame[1]])
        bad = _with(head, header=_DAMAGED_HEADERS[damage](header))
        saver.store.transact(lambda txn: txn.put(S.head_key("t", ""), bad))
        values = {"a": "AAAA", "b": "BBBB", "c": "CCCC"}
        put(saver, "t", "2", values, {"a": "1", "b": "1", "c": "2"}, {"c": "2"}, "1")
        assert heads(saver)  # made again, from the blobs
        drop_blobs(saver)  # what is read now comes from the new head
        got = saver.get_tuple(config("t"))
        assert got is not None and got.checkpoint["channel_values"] == values


@pytest.mark.parametrize(
    "body",
    [
        [None, {}, {"no": "id"}],
        [None, {}, ["a", "list"]],
        [None, "metadata?", {"id": "1", "channel_values": {}}],
        [None, {}, {"id": "1", "channel_values": "values?"}],
        [1, 2],
        "text",
    ],
)
def test_a_payload_of_another_shape_is_read_around(tmp_path: Path, body: Any) -> None:
    """A payload that decodes but is not [parent, metadata, checkpoint] made
    get_tuple raise KeyError or TypeError instead of reading the blobs."""
    with open_kv("lmdb", tmp_path, whole_latest=True) as saver:
        put(saver, "t", "1", {"a": [1, 2]}, {"a": "1"}, {"a": "1"})
        want = from_blobs(saver, config("t"))
        bad = _with(heads(saver)[("t", "")], body=body)
        saver.store.transact(lambda txn: txn.put(S.head_key("t", ""), bad))
        assert tuple_dict(saver.get_tuple(config("t"))) == want


def test_a_value_too_large_for_a_head_is_not_read_at_every_put(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no head to take an unchanged value from, a put reads it from its
    blob: a 40 KB value that never changes was read and unpacked (and found
    too large) by every put of its thread, inside the write transaction.
    Now its size is remembered: read once per process."""
    from kvsaver import delta as D

    reads: list[bytes] = []
    real = D.Codec.head_value

    def counted(self: Any, txn: Any, key: bytes, raw: bytes | None) -> Any:
        reads.append(key)
        return real(self, txn, key, raw)

    monkeypatch.setattr(D.Codec, "head_value", counted)
    big = ["m" * 100] * 400  # ~40 KB
    with open_kv("lmdb", tmp_path, whole_latest=True) as saver:
        put(saver, "t", "1", {"big": big, "s": 1}, {"big": "1", "s": "1"}, {"big": "1", "s": "1"})
        assert reads == []  # this put's own value: too large without a read
        for i in range(2, 6):
            values = {"big": big, "s": i}
            put(saver, "t", str(i), values, {"big": "1", "s": str(i)}, {"s": str(i)}, str(i - 1))
            got = saver.get_tuple(config("t"))
            assert got is not None and got.checkpoint["channel_values"] == values
        assert len(reads) == 1 and heads(saver) == {}
        # it shrinks (a new version): a head again
        put(saver, "t", "6", {"big": ["x"], "s": 6}, {"big": "6", "s": "6"}, {"big": "6"}, "5")
        assert heads(saver)


def test_a_blob_the_saver_cannot_read_fails_no_put(tmp_path: Path) -> None:
    """A value another process wrote encrypted, unchanged in this put: the
    put of a whole_latest saver without the key read it for the head and
    failed (ValueError) where a default put succeeds. Now: no head."""
    serde = EncryptedSerializer.from_pycryptodome_aes(key=b"k" * 16)
    secret = "secret " * 10  # a blob (a str this long is not kept in the record)
    with KVSaver(tmp_path / "s", serde=serde) as enc:
        put(enc, "t", "1", {"a": secret, "b": 1}, {"a": "1", "b": "1"}, {"a": "1", "b": "1"})
    with KVSaver(tmp_path / "s", whole_latest=True) as plain:
        put(plain, "t", "2", {"a": secret, "b": 2}, {"a": "1", "b": "2"}, {"b": "2"}, "1")
        assert heads(plain) == {}
    with KVSaver(tmp_path / "s", serde=serde) as enc:
        got = enc.get_tuple(config("t"))
        assert got is not None and got.checkpoint["channel_values"] == {"a": secret, "b": 2}


@pytest.mark.parametrize("first,second", [(1, 1.0), (1, True), (1.0, 1), (True, 1)])
def test_versions_equal_in_python_but_of_other_types_are_other_values(
    tmp_path: Path, first: Any, second: Any
) -> None:
    """1, 1.0 and True are one dict key but three blobs: a head holding a's
    value at version 1.0 lent it to a checkpoint naming version 1."""
    with open_kv("lmdb", tmp_path, whole_latest=True) as saver:
        put(saver, "t", "1", {"a": "X"}, {"a": first}, {"a": first})
        put(saver, "t", "2", {"a": "Y"}, {"a": second}, {"a": second}, "1")
        put(saver, "t", "3", {"a": "X", "b": 1}, {"a": first, "b": "3"}, {"b": "3"}, "2")
        want = from_blobs(saver, config("t"))
        assert want is not None and want["checkpoint"]["channel_values"] == {"a": "X", "b": 1}
        assert tuple_dict(saver.get_tuple(config("t"))) == want


def test_a_damaged_compressed_blob_fails_no_put(tmp_path: Path) -> None:
    """A stored zstd frame that does not decompress, in a channel the put
    leaves alone: zstandard's own error escaped the put of a whole_latest
    saver, where a default put succeeds. Now: no head."""
    big = "some text that compresses " * 200  # stored zstd
    with KVSaver(tmp_path / "s") as saver:
        put(saver, "t", "1", {"a": big, "b": 1}, {"a": "1", "b": "1"}, {"a": "1", "b": "1"})
        damage_zstd_blob(saver, S.blob_key("t", "", "a", "1"))
    with KVSaver(tmp_path / "s", whole_latest=True) as saver:
        put(saver, "t", "2", {"a": big, "b": 2}, {"a": "1", "b": "2"}, {"b": "2"}, "1")
        assert heads(saver) == {}


def test_a_bytes_subclass_value_puts_and_reads_as_its_bytes(tmp_path: Path) -> None:
    """The head's msgpack of a ``bytes`` value: ormsgpack refused a subclass
    (TypeError: the put failed, where a default put succeeds)."""

    class Token(bytes):
        pass

    with open_kv("lmdb", tmp_path, whole_latest=True) as saver:
        put(saver, "t", "1", {"a": Token(b"abc")}, {"a": "1"}, {"a": "1"})
        assert heads(saver)
        want = from_blobs(saver, config("t"))
        got = saver.get_tuple(config("t"))
        assert got is not None and got.checkpoint["channel_values"] == {"a": b"abc"}
        assert tuple_dict(got) == want
