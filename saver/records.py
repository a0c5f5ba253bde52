"""The write of a checkpoint's records, made before its transaction: what
``KVSaver.put`` and the migration from SQLite store for a checkpoint, the
same bytes both ways."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from kvsaver.kv import Txn

from . import delta as D
from . import schema as S
from . import threads as TH

__all__ = ["write_checkpoint"]


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
