"""Head records (issue #13, saver/heads.py; ``whole_latest=True``): a
thread's newest checkpoint whole in one record, read by get_tuple instead of
its blobs.

What must hold: a read through a head returns exactly what the blobs give
(every value type, forks, namespaces, hostile ids); a head is used only for
the very record it holds, so a stale one (another writer's put, a delete, a
put of an older checkpoint) is never served; deletes leave no head behind;
encrypted values never reach a head; a checkpoint too large has none."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from kvsaver import KVSaver
from kvsaver import heads as H
from kvsaver import schema as S
from kvsaver import threads as TH
from kvsaver.kv.keys import unpack
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from saver_helpers import config, make_checkpoint, open_kv, tuple_dict

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
        return tuple_dict(saver._load_tuple(txn, S.decode_checkpoint(raw), given))


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


def test_off_by_default_and_a_default_put_removes_a_head(tmp_path: Path) -> None:
    with KVSaver(tmp_path / "s") as plain:
        put(plain, "t", "1", {"a": 1}, {"a": "1"}, {"a": "1"})
        assert heads(plain) == {}
    with KVSaver(tmp_path / "s", whole_latest=True) as fast:
        put(fast, "t", "2", {"a": 2}, {"a": "2"}, {"a": "2"}, "1")
        assert list(heads(fast)) == [("t", "")]
    with KVSaver(tmp_path / "s") as plain:
        # a saver without whole_latest does not keep the head, so it drops it
        put(plain, "t", "3", {"a": 3}, {"a": "3"}, {"a": "3"}, "2")
        assert heads(plain) == {}
        got = plain.get_tuple(config("t"))
        assert got is not None and got.checkpoint["channel_values"] == {"a": 3}


def test_an_older_put_rewriting_a_held_version_drops_the_head(tmp_path: Path) -> None:
    with open_kv("lmdb", tmp_path, whole_latest=True) as saver:
        put(saver, "t", "2", {"a": 2}, {"a": "1"}, {"a": "1"})
        put(saver, "t", "1", {"a": 1}, {"a": "1"}, {"a": "1"})  # same version, other value
        assert heads(saver) == {}
        assert tuple_dict(saver.get_tuple(config("t"))) == from_blobs(saver, config("t"))


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_whole_latest_must_be_a_bool(tmp_path: Path, bad: Any) -> None:
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
