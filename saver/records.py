"""The record formats of KVSaver's schema: what each keyspace's values hold
(``saver/schema.py``'s table: checkpoint, blob and write records, activity,
idle and sweep records), and which channel values a checkpoint record keeps
inline (format 6). The keys they are stored under are ``saver/keyspace.py``'s."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import ormsgpack
from kvsaver.kv import CorruptStoreError
from kvsaver.kv.keys import pack

from .keyspace import BY_ID, META, _el, _idx_element, _memo, meta_entries, run_key, write_keys

EMPTY_TYPE = "empty"

Typed = tuple[str, bytes]


SMALL_STR = 32  # characters of a str value kept in the checkpoint record
_INT64 = (-(1 << 63), (1 << 64) - 1)  # ints msgpack holds as one of its own


def is_small(value: Any) -> bool:
    """Whether a channel value is kept in its checkpoint's record instead of
    a blob of its own: None, a bool, a float, an int msgpack holds, a short
    str (exact types: an enum or a subclass goes to a blob). A graph's
    triggers and counters are most of its values and a few bytes each; a
    blob of its own would cost a row, its key twice and a get per read.
    Decided by the value alone, so every writer decides alike."""
    t = type(value)
    if value is None or t is bool or t is float:
        return True
    if t is int:
        return _INT64[0] <= value <= _INT64[1]
    return t is str and len(value) <= SMALL_STR


def blob_versions(checkpoint: Mapping[str, Any]) -> Mapping[str, Any]:
    """The channel_versions of a stored checkpoint whose values are in blobs:
    those not in its record's ``channel_values`` (format 6 keeps the small
    values there; an older record has none, and every value is a blob)."""
    versions = checkpoint["channel_versions"]
    small = checkpoint.get("channel_values")
    if not small:
        return versions
    return {ch: v for ch, v in versions.items() if ch not in small}


class CheckpointRecord(NamedTuple):
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_id: str | None
    checkpoint: Typed  # the checkpoint, its channel_values only the small ones
    metadata: Typed
    run_id: str | None
    meta: list[list[Any]]  # meta index entries (see meta_entries)


def make_checkpoint_record(
    thread: str,
    ns: str,
    checkpoint_id: str,
    parent_id: Any,
    checkpoint: Typed,
    metadata: Mapping[str, Any],
    dumps: Callable[[Any], Typed],
) -> CheckpointRecord:
    """The record of a checkpoint (serialized with only its small
    channel_values), with the run id and meta index entries its metadata
    implies."""
    run_id = metadata.get("run_id")
    return CheckpointRecord(
        thread_id=thread,
        checkpoint_ns=ns,
        checkpoint_id=checkpoint_id,
        parent_id=str(parent_id) if parent_id else None,
        checkpoint=checkpoint,
        metadata=dumps(metadata),
        run_id=None if run_id is None else str(run_id),
        meta=meta_entries(metadata),
    )


def index_keys(rec: CheckpointRecord) -> list[bytes]:
    """Every index key pointing at this checkpoint (id, run, metadata): the
    same bytes as by_id_key, run_key and meta_key, with the (checkpoint id,
    thread, ns) elements they share packed once (put and every delete of a
    checkpoint come here)."""
    t, ns, cid = rec.thread_id, rec.checkpoint_ns, rec.checkpoint_id
    tail = _el(cid) + _el(t) + _el(ns)
    keys = [_BY_ID_PREFIX + tail]
    if rec.run_id is not None:
        keys.append(run_key(rec.run_id, t, ns, cid))
    for e in rec.meta:
        # 1 == 1.0, but their encodings differ; the type's name, not the type:
        # a tuple holding a type stays tracked by the garbage collector.
        mark = (e[0], type(e[1]).__name__, e[1])
        prefix = _META_PREFIXES.get(mark)
        if prefix is None:
            prefix = _memo(_META_PREFIXES, mark, pack((META, e[0], e[1])))
        keys.append(prefix + tail)
    return keys


_BY_ID_PREFIX = pack((BY_ID,))
# (key, type name, value) -> packed (META, key, value): the same few metadata
# values ("source": "loop", small "step"s) are indexed at every put.
_META_PREFIXES: dict[tuple[Any, str, Any], bytes] = {}


def encode_checkpoint(rec: CheckpointRecord) -> bytes:
    return ormsgpack.packb(
        [
            rec.thread_id,
            rec.checkpoint_ns,
            rec.checkpoint_id,
            rec.parent_id,
            rec.checkpoint[0],
            rec.checkpoint[1],
            rec.metadata[0],
            rec.metadata[1],
            rec.run_id,
            rec.meta,
        ]
    )


def _damaged(kind: str, e: Exception) -> CorruptStoreError:
    """A record of ours that does not decode: the store is damaged."""
    error = CorruptStoreError(f"a damaged {kind} record in the store ({e})")
    error.__cause__ = e
    return error


def decode_checkpoint(raw: bytes) -> CheckpointRecord:
    try:
        t, ns, cid, parent, ctype, cbytes, mtype, mbytes, run_id, meta = ormsgpack.unpackb(raw)
    except (ValueError, TypeError) as e:
        raise _damaged("checkpoint", e) from e
    # tuple.__new__: a NamedTuple's own __new__ is a Python frame (every read).
    return _new_tuple(
        CheckpointRecord, (t, ns, cid, parent, (ctype, cbytes), (mtype, mbytes), run_id, meta)
    )


_new_tuple = tuple.__new__


def bare_record(
    thread: str, ns: str, checkpoint_id: str, parent_id: str | None
) -> CheckpointRecord:
    """A CheckpointRecord with only its identity (a head record's read, which
    has the checkpoint and metadata decoded already: ``heads``)."""
    return _new_tuple(
        CheckpointRecord, (thread, ns, checkpoint_id, parent_id, None, None, None, [])
    )


def encode_blob(typed: Typed | None) -> bytes:
    """``type`` (ASCII, never containing NUL), ``\x00``, then the serialized
    bytes: no envelope to decode on the read path, which loads every channel."""
    if typed is None:
        return b"empty\x00"
    return typed[0].encode("ascii") + b"\x00" + typed[1]


BLOB_PREFIX_MSGPACK = b"msgpack\x00"  # encode_blob of a ("msgpack", ...) value
BLOB_PREFIX_MSGPACK_ZST = b"msgpack.zst\x00"  # of a ("msgpack.zst", ...) value


def decode_blob(raw: bytes | None) -> Typed | None:
    """The serde-typed value, or None for the "empty" marker or no blob."""
    if raw is None:
        return None
    if raw.startswith(BLOB_PREFIX_MSGPACK):  # the common case: every read of a value
        return "msgpack", raw[len(BLOB_PREFIX_MSGPACK) :]
    head, sep, body = raw.partition(b"\x00")
    if not sep:
        raise CorruptStoreError("a damaged channel value record in the store (no type)")
    try:
        type_ = _TYPE_NAMES.get(head) or head.decode("ascii")
    except UnicodeDecodeError as e:
        raise _damaged("channel value", e) from e
    return None if type_ == EMPTY_TYPE else (type_, body)


# The serde types every read meets, decoded once (each channel of each read).
_TYPE_NAMES = {
    t.encode(): t for t in ("msgpack", "msgpack.zst", "null", "bytes", "bytearray", "json")
}


class WriteRecord(NamedTuple):
    task_id: str
    channel: str
    value: Typed
    task_path: str
    idx: int


def encode_write(rec: WriteRecord) -> bytes:
    return encode_write_fields(rec.task_id, rec.channel, rec.value, rec.task_path, rec.idx)


def encode_write_fields(
    task_id: str, channel: str, value: Typed, task_path: str, idx: int
) -> bytes:
    """``encode_write`` of a record not built first (put_writes' path)."""
    return ormsgpack.packb([task_id, channel, value[0], value[1], task_path, idx])


def _one_write(fields: Any) -> WriteRecord:
    task_id, channel, vtype, vbytes, task_path, idx = fields
    return _new_tuple(WriteRecord, (task_id, channel, (vtype, vbytes), task_path, idx))


def decode_write(raw: bytes) -> WriteRecord:
    """A record of one write (every write record of a store before format 5)."""
    try:
        return _one_write(ormsgpack.unpackb(raw))
    except (ValueError, TypeError) as e:
        raise _damaged("write", e) from e


def decode_writes(raw: bytes) -> list[WriteRecord]:
    """The writes of a write record: one, or a batch's, in idx order."""
    try:
        fields = ormsgpack.unpackb(raw)
        if len(fields) == 6:
            return [_one_write(fields)]
        task_id, task_path, flat = fields
        return [
            _new_tuple(
                WriteRecord, (task_id, flat[i], (flat[i + 1], flat[i + 2]), task_path, flat[i + 3])
            )
            for i in range(0, len(flat), 4)
        ]
    except (ValueError, TypeError, IndexError) as e:
        raise _damaged("write", e) from e


def write_probe_keys(prefix: bytes, idxs: Iterable[int]) -> list[bytes]:
    """The keys that may hold a stored write of one of ``idxs`` for this task:
    each special idx's, and every regular idx's up to the largest of them (a
    batch is keyed at its first idx, at or below each one it holds). A get
    of them, not a scan: a network store answers the gets with the writes."""
    special, top = [], -1
    for i in idxs:
        if i < 0:
            special.append(i)
        elif i > top:
            top = i
    return write_keys(prefix, (*special, *range(top + 1)))


def stored_idxs(records: Iterable[bytes | None]) -> set[int]:
    """The idx of every write in ``records`` (None: no record)."""
    return {w.idx for raw in records if raw is not None for w in decode_writes(raw)}


def write_records(
    prefix: bytes, task_id: str, task_path: str, writes: list[tuple[int, str, Typed]]
) -> list[tuple[bytes, bytes]]:
    """(key, record) pairs storing one task's ``writes`` ((idx, channel,
    value), regular ones in ascending idx) under its ``task_write_prefix``:
    the regular writes (idx >= 0) in one record under the first one's key,
    since most are a few bytes and a record costs a key and a row; each
    special write (negative idx) in a record of its own, which a later batch
    of special writes replaces."""
    out = []
    flat: list[Any] = []  # the regular writes: channel, type, bytes, idx, ...
    for idx, channel, value in writes:
        if idx < 0:
            record = encode_write_fields(task_id, channel, value, task_path, idx)
            out.append((prefix + _idx_element(idx), record))
        else:
            flat += (channel, value[0], value[1], idx)
    if len(flat) == 4:  # one: a record of its own
        record = encode_write_fields(task_id, flat[0], (flat[1], flat[2]), task_path, flat[3])
        out.append((prefix + _idx_element(flat[3]), record))
    elif flat:
        out.append((prefix + _idx_element(flat[3]), ormsgpack.packb([task_id, task_path, flat])))
    return out


def encode_activity(ms: int, thread: str) -> bytes:
    return ormsgpack.packb([ms, thread])


def decode_activity(raw: bytes) -> tuple[int, str]:
    try:
        ms, thread = ormsgpack.unpackb(raw)
        return int(ms), thread
    except (ValueError, TypeError) as e:
        raise _damaged("activity", e) from e


def encode_thread(thread: str) -> bytes:
    return ormsgpack.packb(thread)


def decode_thread(raw: bytes) -> str:
    return ormsgpack.unpackb(raw)


def encode_sweep(state: dict[str, Any]) -> bytes:
    return ormsgpack.packb(state)


def decode_sweep(raw: bytes | None) -> dict[str, Any]:
    return {} if raw is None else dict(ormsgpack.unpackb(raw))
