"""The writes of a checkpoint's records and of a task's pending writes in
their transactions: what ``KVSaver.put`` and the migration from SQLite store
for a checkpoint (the same bytes both ways), and what ``put_writes`` stores."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kvsaver.kv import Txn
from langgraph.checkpoint.base import WRITES_IDX_MAP

from . import delta as D
from . import schema as S
from . import threads as TH

__all__ = ["task_writes", "write_checkpoint"]


def write_checkpoint(
    txn: Txn,
    codec: D.Codec,
    rec: S.CheckpointRecord,
    ckey: bytes,
    record: bytes,
    index: Iterable[bytes],
    blobs: Sequence[D.Pending],
    known: Mapping[bytes, bytes | None],
    put: Callable[[bytes, bytes], None] | None = None,
    akey: bytes | None = None,
    now: int = 0,
) -> None:
    """Write checkpoint ``rec`` in ``txn``: its blobs through ``codec`` (a
    list that extends its parent's version as a delta), the record
    (``record``, ``rec`` encoded, at ``ckey``) replacing one stored there
    (whose index rows go), its index rows (``index``), and, with ``akey``,
    its thread's activity at ``now`` (ms; the migration stamps none: a
    migrated thread was not active). ``known``: the records already read in
    this transaction (``ckey``, ``akey`` and the codec's ``read_keys``, in one
    ``get_many``); ``put``: ``txn.put`` or one that counts."""
    put = put or txn.put
    old = known.get(ckey)
    if old is not None:  # replaced: drop the old record's index entries
        for key in S.index_keys(S.decode_checkpoint(old)):
            txn.delete(key)
    codec.write(txn, rec.thread_id, rec.checkpoint_ns, rec.parent_id, blobs, put, known)
    put(ckey, record)
    for key in index:
        put(key, b"")
    if akey is not None:
        TH.touch(txn, rec.thread_id, now, known[akey])


def task_writes(
    codec: D.Codec,
    thread: str,
    ns: str,
    checkpoint_id: str,
    task_id: str,
    task_path: str,
    writes: Sequence[tuple[str, Any]],
    now: int,
) -> Callable[[Txn], None]:
    """``put_writes``: the function of its transaction, with the writes
    serialized before it: each a record under (task_id, idx), unless a
    regular write's (task_id, idx) is stored already (a batch of special
    channels replaces); the thread's activity at ``now`` (ms)."""
    # zstd with a dictionary, not kept in the cache of decompressed
    # values: a write is read only when its checkpoint is resumed.
    dumps = functools.partial(codec.dumps_small, remember=False)
    serialized = [
        (WRITES_IDX_MAP.get(channel, idx), channel, dumps(value))
        for idx, (channel, value) in enumerate(writes)
    ]
    replace = all(channel in WRITES_IDX_MAP for channel, _ in writes)
    akey = S.activity_key(thread)
    prefix = S.task_write_prefix(thread, ns, checkpoint_id, task_id)
    # A batch of special writes replaces: what is stored does not matter.
    probe = [] if replace else S.write_probe_keys(prefix, [w[0] for w in serialized])

    def write(txn: Txn) -> None:
        # The reads in one get_many (one round trip on a network store).
        *found, activity = txn.get_many([*probe, akey])
        new = serialized
        if not replace:
            stored = S.stored_idxs(found)
            new = []
            for w in serialized:
                if w[0] not in stored:  # a repeated idx in one batch: the first wins
                    stored.add(w[0])
                    new.append(w)
        # A batch of special writes replaces: the last of a repeated idx wins.
        for key, value in S.write_records(prefix, task_id, task_path, new):
            txn.put(key, value)
        TH.touch(txn, thread, now, activity)

    return write
