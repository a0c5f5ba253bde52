"""Thread-level operations inside one transaction: find a checkpoint record,
list a thread's namespaces, delete checkpoints, threads and unused blobs,
keep the latest checkpoints (DeltaChannel-safe), and the activity index.

``kvsaver.py``, ``retention.py`` and ``stats.py`` all build on these; this
module imports none of them, so the imports inside the package run one way
(``retention`` and ``stats`` need no private method of ``KVSaver``, whose
module imports them: no cycle).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kvsaver.kv import Txn
from kvsaver.kv.keys import unpack
from langgraph.checkpoint.serde.base import SerializerProtocol

from . import delta as D
from . import heads as H
from . import schema as S

TOUCH_RESOLUTION_MS = 1000  # activity is recorded at most once a second per thread
_UNREAD: Any = object()  # touch(): the activity record was not read by the caller


def find_record(txn: Txn, thread: str, ns: str, checkpoint_id: Any) -> bytes | None:
    """The stored record of a checkpoint id, or of the latest checkpoint of
    (thread, ns) when no id is given: one reverse step over its keys."""
    if checkpoint_id:
        return txn.get(S.checkpoint_key(thread, ns, str(checkpoint_id)))
    first = next(iter(txn.scan(*S.checkpoints_range(thread, ns), reverse=True, limit=1)), None)
    return first[1] if first else None


def versions(serde: SerializerProtocol, rec: S.CheckpointRecord) -> dict[str, Any]:
    """A stored checkpoint's channel_versions (decodes the checkpoint)."""
    return serde.loads_typed(rec.checkpoint)["channel_versions"]


def namespaces(txn: Txn, thread: str) -> list[str]:
    """Distinct namespaces of a thread, by skipping from one to the next."""
    out: list[str] = []
    start, stop = S.checkpoints_range(thread)
    while True:
        first = next(iter(txn.scan(start, stop, limit=1)), None)
        if first is None:
            return out
        rec = S.decode_checkpoint(first[1])
        out.append(rec.checkpoint_ns)
        start = S.checkpoints_range(thread, rec.checkpoint_ns)[1]


def stored_value(
    txn: Txn,
    thread: str,
    ns: str,
    checkpoint: Mapping[str, Any],
    channel: str,
    serde: SerializerProtocol,
) -> S.Typed | None:
    """The value a stored checkpoint (decoded) holds for ``channel``, in its
    record or its blob, or None when it holds none (no version, or the
    "empty" marker): what ends a DeltaChannel's walk back to its seed."""
    small = checkpoint.get("channel_values")
    if small and channel in small:
        return serde.dumps_typed(small[channel])
    channel_versions = checkpoint["channel_versions"]
    if channel not in channel_versions:
        return None
    key = S.blob_key(thread, ns, channel, channel_versions[channel])
    return D.codec(serde).typed(txn, key, txn.get(key))


def delete_checkpoint(txn: Txn, rec: S.CheckpointRecord) -> None:
    """Remove a checkpoint, its writes and its index entries (not blobs)."""
    t, ns, cid = rec.thread_id, rec.checkpoint_ns, rec.checkpoint_id
    txn.delete(S.checkpoint_key(t, ns, cid))
    for key in S.index_keys(rec):
        txn.delete(key)
    txn.delete_range(*S.writes_range(t, ns, cid))


def drop_stale_head(txn: Txn, thread: str, ns: str) -> None:
    """Delete the head record of (thread, ns) when the checkpoint it holds is
    gone (``delete_for_runs``; ``keep_latest`` keeps the latest, and reads
    never serve a head whose record is not theirs: this only frees it)."""
    hkey = S.head_key(thread, ns)
    head = txn.get(hkey)
    if head is None:
        return
    parsed = H.parse(head)  # None: damaged, freed as well
    if parsed is None or txn.get(S.checkpoint_key(thread, ns, parsed[0])) is None:
        txn.delete(hkey)


def delete_thread(txn: Txn, thread: str) -> None:
    """Remove every checkpoint, blob, write, index entry and head record of a thread."""
    for _, raw in list(txn.scan(*S.checkpoints_range(thread))):
        for key in S.index_keys(S.decode_checkpoint(raw)):
            txn.delete(key)
    txn.delete_range(*S.checkpoints_range(thread))
    txn.delete_range(*S.blobs_range(thread))
    txn.delete_range(*S.writes_range(thread))
    txn.delete_range(*S.heads_range(thread))
    forget(txn, thread)


def used_blobs(txn: Txn, serde: SerializerProtocol, thread: str) -> set[bytes]:
    """The blob keys the checkpoints of a thread (every namespace) name."""
    used: set[bytes] = set()
    for _, raw in txn.scan(*S.checkpoints_range(thread)):
        rec = S.decode_checkpoint(raw)
        used.update(key for _, key in S.blob_keys(thread, rec.checkpoint_ns, versions(serde, rec)))
    return used


def gc_blobs(txn: Txn, serde: SerializerProtocol, thread: str, ns: str) -> None:
    """Delete the blobs of (thread, ns) that no remaining checkpoint uses,
    nor any delta chain of a blob that one uses."""
    referenced: set[bytes] = set()
    for _, raw in txn.scan(*S.checkpoints_range(thread, ns)):
        vs = versions(serde, S.decode_checkpoint(raw))
        referenced.update(key for _, key in S.blob_keys(thread, ns, vs))
    blobs = list(txn.scan(*S.blobs_range(thread, ns)))
    referenced = D.chain_closure(blobs, referenced)
    stale = [key for key, _ in blobs if key not in referenced]
    for key in stale:
        txn.delete(key)


def keep_latest(
    txn: Txn, serde: SerializerProtocol, thread: str, ns: str, keep_last: int = 1
) -> int:
    """Keep the newest ``keep_last`` checkpoints of (thread, ns) and, for
    each, the ancestors its DeltaChannels rebuild from; delete the other
    checkpoints with their writes, then the blobs nothing uses. Used by
    ``prune`` (N = 1) and by retention sweeps. Returns how many went."""
    records = {
        rec.checkpoint_id: rec
        for rec in (
            S.decode_checkpoint(raw) for _, raw in txn.scan(*S.checkpoints_range(thread, ns))
        )
    }
    if not records:
        return 0
    newest = sorted(
        records.values(),
        key=lambda r: S.checkpoint_key(thread, ns, r.checkpoint_id),
        reverse=True,
    )[:keep_last]
    keep: set[str] = set()
    for latest in newest:
        keep.add(latest.checkpoint_id)
        meta = serde.loads_typed(latest.metadata)
        delta = set((meta or {}).get("counters_since_delta_snapshot") or ())
        cursor = latest.parent_id
        while delta and cursor is not None and cursor in records:
            rec = records[cursor]
            keep.add(cursor)
            cp = serde.loads_typed(rec.checkpoint)
            for ch in list(delta):
                if stored_value(txn, thread, ns, cp, ch, serde) is not None:
                    delta.discard(ch)
            cursor = rec.parent_id
    deleted = 0
    for cid, rec in records.items():
        if cid not in keep:
            delete_checkpoint(txn, rec)
            deleted += 1
    gc_blobs(txn, serde, thread, ns)
    return deleted


# -- the activity index (retention's TTL) -----------------------------------------


def touch(txn: Txn, thread: str, ms: int, raw: Any = _UNREAD) -> None:
    """Record activity of ``thread`` at ``ms`` (skipped within a second of the
    stored time, so the puts of one graph run rewrite no index page).
    ``raw``: the activity record, when the caller read it in this transaction."""
    if raw is _UNREAD:
        raw = txn.get(S.activity_key(thread))
    if raw is not None:
        old, _ = S.decode_activity(raw)
        if 0 <= ms - old < TOUCH_RESOLUTION_MS:
            return
        txn.delete(S.idle_key(old, thread))
    txn.put(S.activity_key(thread), S.encode_activity(ms, thread))
    txn.put(S.idle_key(ms, thread), S.encode_thread(thread))


def forget(txn: Txn, thread: str) -> None:
    """Drop the activity record of a deleted thread."""
    akey = S.activity_key(thread)
    raw = txn.get(akey)
    if raw is not None:
        txn.delete(S.idle_key(S.decode_activity(raw)[0], thread))
        txn.delete(akey)


def delete_for_runs(txn: Txn, serde: SerializerProtocol, ids: list[str]) -> None:
    """Delete the checkpoints (and their writes) created by the runs ``ids``,
    then the blobs no remaining checkpoint of those threads uses."""
    touched: set[tuple[str, str]] = set()
    for run_id in ids:
        for key, _ in list(txn.scan(*S.runs_range(run_id))):
            _, _, kt, kns, kcid = unpack(key)
            raw = txn.get(S.checkpoint_key_from_elements(kt, kns, kcid))
            txn.delete(key)
            if raw is None:
                continue
            rec = S.decode_checkpoint(raw)
            delete_checkpoint(txn, rec)
            touched.add((rec.thread_id, rec.checkpoint_ns))
    for thread, ns in sorted(touched):
        gc_blobs(txn, serde, thread, ns)
        drop_stale_head(txn, thread, ns)


def copy_thread(
    txn: Txn,
    serde: SerializerProtocol,
    codec: D.Codec,
    src: str,
    dst: str,
    now: Callable[[], int],
) -> None:
    """Copy every checkpoint, blob and write of thread ``src`` to ``dst``
    (records already there with the same ids overwritten); ``dst``'s
    activity stamped at ``now()`` (ms)."""
    txn.delete_range(*S.heads_range(dst))  # its latest may change
    for kind in (S.BLOB, S.WRITE):
        sp, dp = S.thread_prefix(kind, src), S.thread_prefix(kind, dst)
        lo, hi = (S.blobs_range if kind == S.BLOB else S.writes_range)(src)
        moved = [(S.rethread(k, len(sp), dp), v) for k, v in list(txn.scan(lo, hi))]
        if kind == S.BLOB:  # what the source uses, and no delta chain broken
            used = {S.rethread(k, len(sp), dp) for k in used_blobs(txn, serde, src)}
            moved = codec.plan_copy(txn, moved, used, *S.blobs_range(dst))
        for key, value in moved:
            txn.put(key, value)
    for _, raw in list(txn.scan(*S.checkpoints_range(src))):
        rec = S.decode_checkpoint(raw)._replace(thread_id=dst)
        ns, cid = rec.checkpoint_ns, rec.checkpoint_id
        ckey = S.checkpoint_key(dst, ns, cid)
        old = txn.get(ckey)
        if old is not None:  # overwritten: drop its index entries, as put does,
            # or delete_for_runs(old run) would delete the copy
            for key in S.index_keys(S.decode_checkpoint(old)):
                txn.delete(key)
        txn.put(ckey, S.encode_checkpoint(rec))
        for key in S.index_keys(rec):
            txn.put(key, b"")
    touch(txn, dst, now())
