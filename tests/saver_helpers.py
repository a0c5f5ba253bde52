"""Shared helpers for the saver tests (test_saver_*.py): store scans, result
normalization for comparing KVSaver with SqliteSaver, and checkpoint builders."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kvsaver import KVSaver
from kvsaver import schema as S
from kvsaver.kv import Store
from kvsaver.kv.keys import prefix_range, unpack
from langgraph.checkpoint.base import Checkpoint, CheckpointTuple, empty_checkpoint
from langgraph.checkpoint.sqlite import SqliteSaver

BACKENDS = ["lmdb", "memory", "file", "postgres"]


def open_kv(backend: str, tmp_path: Path, **kwargs: Any) -> KVSaver:
    """A KVSaver on one of the backends, in tmp_path (PostgreSQL: in a table
    named after tmp_path, on the session's server)."""
    if backend == "postgres":
        from pg_helpers import shared_server, table_for

        url = shared_server().url
        return KVSaver(url, table=table_for(tmp_path), pool_max_size=4, **kwargs)
    if backend == "memory":
        return KVSaver(":memory:", **kwargs)
    if backend == "file":
        tmp_path.mkdir(parents=True, exist_ok=True)  # FileStore does not create parents
        return KVSaver(tmp_path / "store.kvs", backend="file", **kwargs)
    return KVSaver(tmp_path / "lmdb", **kwargs)


def sqlite_saver() -> SqliteSaver:
    """The reference: SqliteSaver on a private in-memory database."""
    return SqliteSaver(sqlite3.connect(":memory:", check_same_thread=False))


def scan_all(store: Store) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of a store, in key order: a byte-exact image."""
    with store.read() as txn:
        return list(txn.scan(None, None))


def keys_of(store: Store, kind: str) -> list[tuple[Any, ...]]:
    """The unpacked keys of one keyspace of the saver schema (e.g. S.BLOB)."""
    with store.read() as txn:
        return [unpack(k) for k, _ in txn.scan(*prefix_range((kind,)))]


INDEX_KEYSPACES = (S.BY_ID, S.RUN, S.META)
CORE_KEYSPACES = (S.CHECKPOINT, S.BLOB, S.WRITE, *INDEX_KEYSPACES)


def core_image(saver: KVSaver) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of the keyspaces that hold checkpoint data (DESIGN.md's
    table and the id index): what must be identical after equivalent
    operations. Bookkeeping keyspaces (e.g. activity times) are left out."""
    with saver.store.read() as txn:
        return [kv for kind in CORE_KEYSPACES for kv in txn.scan(*prefix_range((kind,)))]


def assert_indexes_consistent(saver: KVSaver, label: str = "") -> None:
    """Every index entry (id, run, metadata) belongs to a stored checkpoint
    record, and every record has all of its entries: no orphan pointing at a
    deleted or rewritten checkpoint, none missing."""
    with saver.store.read() as txn:
        want = {
            key
            for _, raw in txn.scan(*prefix_range((S.CHECKPOINT,)))
            for key in S.index_keys(S.decode_checkpoint(raw))
        }
        have = {k for kind in INDEX_KEYSPACES for k, _ in txn.scan(*prefix_range((kind,)))}
    orphans = sorted(unpack(k) for k in have - want)
    missing = sorted(unpack(k) for k in want - have)
    assert not orphans and not missing, f"{label}: orphans={orphans} missing={missing}"


def normalize(value: Any) -> Any:
    """JSON-like form: tuples -> lists, recursively (SqliteSaver keeps metadata
    as JSON, so a tuple comes back as a list there)."""
    if isinstance(value, Mapping):
        return {k: normalize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalize(v) for v in value]
    return value


def tuple_dict(t: CheckpointTuple | None) -> dict[str, Any] | None:
    """A CheckpointTuple as a plain dict with every field compared."""
    if t is None:
        return None
    return {
        "config": t.config,
        "checkpoint": t.checkpoint,
        "metadata": normalize(t.metadata),
        "parent_config": t.parent_config,
        "pending_writes": [list(w) for w in (t.pending_writes or [])],
    }


def tuples(items: Iterable[CheckpointTuple]) -> list[dict[str, Any] | None]:
    return [tuple_dict(t) for t in items]


def make_checkpoint(
    checkpoint_id: str,
    values: Mapping[str, Any] | None = None,
    versions: Mapping[str, Any] | None = None,
    **extra: Any,
) -> Checkpoint:
    """A checkpoint with the given id, channel values and versions."""
    cp = empty_checkpoint()
    cp["id"] = checkpoint_id
    cp["ts"] = "2024-05-04T06:32:42.235444+00:00"
    cp["channel_values"] = dict(values or {})
    cp["channel_versions"] = dict(versions or {})
    cp.update(extra)  # type: ignore[typeddict-item]
    return cp


def config(thread: str, ns: str = "", checkpoint_id: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def blob_keys(saver: KVSaver) -> list[tuple[Any, ...]]:
    return keys_of(saver.store, S.BLOB)


def damage_zstd_blob(saver: KVSaver, key: bytes) -> None:
    """Overwrite 6 bytes inside the zstd frame of the stored blob at ``key``
    (asserted to be one) so that it no longer decompresses."""
    with saver.store.read() as txn:
        raw = txn.get(key)
    n = len(S.BLOB_PREFIX_MSGPACK_ZST)
    assert raw is not None and raw.startswith(S.BLOB_PREFIX_MSGPACK_ZST)
    damaged = raw[: n + 4] + b"\xff" * 6 + raw[n + 10 :]
    saver.store.transact(lambda txn: txn.put(key, damaged))
