"""The read path: a stored checkpoint record -> ``CheckpointTuple``, the one
conversion ``get_tuple`` and ``list`` share (blobs and writes read in the
record's transaction), and the pending writes of a checkpoint in the order
reads return them. The reads a tuple needs are said together
(``Txn.prefetch``), so that a network store sends them in one round trip; on a
store that pipelines reads (``Store.pipelines_reads``) a get_tuple also guesses
them from this saver's last put, before it has read the record.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from kvsaver.kv import ScanArgs, Txn
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    SerializerProtocol,
)

from . import compression as C
from . import delta as D
from . import schema as S
from . import threads as TH
from . import upgrade as U
from ._compat import DeltaChannelHistory, writes_sort_key
from .ids import config_of

__all__ = ["Reads"]


class Reads:
    """How one saver's serializer reads its store: ``loads`` (``C.loader``),
    the codec's values and the fast readers, found once per serializer
    object (``with_allowlist`` clones have their own: ``for_codec``)."""

    # a format-1 store opened read-only: its write keys may repeat an identity
    legacy_writes = False

    def __init__(
        self, serde: SerializerProtocol, codec: D.Codec, pipelined: bool, fast_paths: bool
    ) -> None:
        self.serde = serde
        # ``fast_paths``: the loaders that take private names of LangGraph's
        # and pydantic's (``_upstream``); else only public calls.
        self.fast_paths = fast_paths
        self.loads: Callable[[S.Typed], Any] = C.loader(serde, fast_paths)
        self.values = codec.values
        self.fast = C.value_readers(serde, fast_paths)
        # a head record's payload -> its value (None: no heads read)
        self.plain = C.msgpack_loader(serde, fast_paths)
        self.pipelined = pipelined
        # (thread, ns) -> (id, channel_versions) of the last put here, on a
        # store that pipelines reads (``guess`` reads it).
        self.last_put: OrderedDict[tuple[str, str], tuple[str, Any]] | None = (
            OrderedDict() if pipelined else None
        )

    def for_codec(self, serde: SerializerProtocol, codec: D.Codec) -> Reads:
        """These reads for a ``with_allowlist`` clone's serializer (the same
        memo of the last puts)."""
        clone = Reads(serde, codec, self.pipelined, self.fast_paths)
        clone.legacy_writes, clone.last_put = self.legacy_writes, self.last_put
        return clone

    def load_writes(
        self, txn: Txn, thread: str, ns: str, checkpoint_id: str
    ) -> list[S.WriteRecord]:
        # One scan, no probe first: most checkpoints have no writes (every
        # latest one between supersteps) and an empty LMDB scan costs what a
        # probe does, while a probe would cost a checkpoint with writes a
        # second positioning (on a memory store a probe is the scan, sliced).
        return self.writes_in(txn, *S.writes_range(thread, ns, checkpoint_id))

    def writes_in(self, txn: Txn, start: bytes, stop: bytes) -> list[S.WriteRecord]:
        """``load_writes`` of the checkpoint whose writes range is ``start``-``stop``."""
        return self.in_read_order([w for _, v in txn.scan(start, stop) for w in S.decode_writes(v)])

    def in_read_order(self, recs: list[S.WriteRecord]) -> list[S.WriteRecord]:
        """One checkpoint's stored writes (in key order) in the order reads return them."""
        if not recs:
            return recs
        # Keys are (task_id, idx), the identity; reads are in task_path order.
        # The writes of one put_writes (the common case) come in idx order,
        # which is writes_sort_key's order within a task; a later call's
        # record may fill a gap below a batch's last idx, so that is checked.
        p, t, i = recs[0].task_path, recs[0].task_id, recs[0].idx - 1
        for w in recs:
            if w.task_path != p or w.task_id != t or w.idx <= i:
                recs.sort(key=lambda w: writes_sort_key(w.task_path, w.task_id, w.idx))
                break
            i = w.idx
        if self.legacy_writes:  # a format-1 store opened read-only
            return U.first_per_identity(recs)
        return recs

    def page_writes(
        self, txn: Txn, found: list[tuple[S.CheckpointRecord, Any]]
    ) -> dict[str, list[S.WriteRecord]] | None:
        """checkpoint id -> ``load_writes`` of each checkpoint of a ``list``
        page of consecutive checkpoints of one (thread, ns), by one scan over
        their writes, instead of a scan per checkpoint; None
        when the page is not one such run (``load_writes`` then, each)."""
        t, ns = found[0][0].thread_id, found[0][0].checkpoint_ns
        bounds: list[tuple[bytes, bytes, str]] = []
        for rec, _ in found:
            if rec.thread_id != t or rec.checkpoint_ns != ns:
                return None
            bounds.append((*S.writes_range(t, ns, rec.checkpoint_id), rec.checkpoint_id))
        # Each checkpoint's writes are one key range, and distinct ids' ranges
        # are disjoint: in key order, a key of the scan is in the range at
        # hand or in a later one (or in none: a checkpoint not on the page).
        bounds.sort()
        out: dict[str, list[S.WriteRecord]] = {}
        it = iter(bounds)
        start, stop, cid = next(it)
        for key, raw in txn.scan(bounds[0][0], bounds[-1][1]):
            while key >= stop:  # below the last range's stop: never past the end
                start, stop, cid = next(it)
            if key >= start:
                out.setdefault(cid, []).extend(S.decode_writes(raw))
        return {cid: self.in_read_order(recs) for cid, recs in out.items()}

    def load_tuple(
        self,
        txn: Txn,
        rec: S.CheckpointRecord,
        config: RunnableConfig | None = None,
        metadata: CheckpointMetadata | None = None,
        checkpoint: Checkpoint | None = None,
        stored_writes: list[S.WriteRecord] | None = None,
        whole: bool = False,
    ) -> CheckpointTuple:
        """A stored checkpoint record -> CheckpointTuple (blobs and writes
        read in the same transaction). Used by get_tuple and list alike.
        ``checkpoint``: ``rec.checkpoint`` already decoded (``load_page``),
        with its channel_values when ``whole`` (a head record's:
        ``whole.Heads.read``); ``stored_writes``: its ``load_writes``, already
        read (``page_writes``)."""
        loads, load_values, fast = self.loads, self.values, self.fast
        thread, ns, cid = rec.thread_id, rec.checkpoint_ns, rec.checkpoint_id
        if checkpoint is None:
            checkpoint = loads(rec.checkpoint)
        wrange = S.writes_range(thread, ns, cid) if stored_writes is None else None
        if not whole:
            versions = S.blob_versions(checkpoint)
            keys = S.read_blob_keys(thread, ns, versions)
            # The writes scan queued, then sent with the blobs' lookup (one
            # round trip on a network store; the scan below finds its first
            # chunk read).
            if wrange is not None:
                txn.prefetch((), ((wrange[0], wrange[1], False, None),))
            # Whole or delta values, loaded in one loop, and the small
            # values the record holds.
            values = load_values(txn, versions, keys, txn.get_many(keys), loads, fast)
            small = checkpoint.get("channel_values")
            if small:
                values.update(small)
            checkpoint["channel_values"] = values
        if wrange is not None:
            stored_writes = self.writes_in(txn, *wrange)
        assert stored_writes is not None
        writes: list[PendingWrite] = [(w.task_id, w.channel, loads(w.value)) for w in stored_writes]
        # Positional: cheaper than keywords (a NamedTuple's __new__).
        return CheckpointTuple(
            config if config is not None else config_of(thread, ns, cid),  # config
            checkpoint,
            metadata if metadata is not None else loads(rec.metadata),  # metadata
            config_of(thread, ns, rec.parent_id) if rec.parent_id else None,  # parent_config
            writes,  # pending_writes
        )

    def load_page(
        self,
        txn: Txn,
        found: list[tuple[S.CheckpointRecord, Any]],
        consecutive: bool = False,
    ) -> list[CheckpointTuple]:
        """``load_tuple`` of each (record, metadata) of a ``list`` page. On a
        store that pipelines reads, the page's writes scans and
        blobs go first, all in one round trip (a constant number per page,
        not one per checkpoint); ``load_tuple`` then finds them read.
        ``consecutive``: the page holds every checkpoint between its first
        and its last (no filter skipped any): their writes are one scan."""
        if len(found) < 2:
            return [self.load_tuple(txn, rec, metadata=m) for rec, m in found]
        # Two plans: locally, one scan over the page's writes (when the page
        # is consecutive), each checkpoint's blobs read as it is loaded; on a
        # network store, every checkpoint's writes scan and the blobs of all
        # read together (one round trip), where a scan over the page could
        # take more (it fetches in chunks).
        if not self.pipelined:
            page = self.page_writes(txn, found) if consecutive else None
            if page is None:
                return [self.load_tuple(txn, rec, metadata=m) for rec, m in found]
            of = page.get
            return [
                self.load_tuple(txn, rec, metadata=m, stored_writes=of(rec.checkpoint_id) or [])
                for rec, m in found
            ]
        loads = self.loads
        checkpoints = [loads(rec.checkpoint) for rec, _ in found]
        keys: list[bytes] = []
        scans: list[ScanArgs] = []
        for (rec, _), cp in zip(found, checkpoints):
            t, ns = rec.thread_id, rec.checkpoint_ns
            scans.append((*S.writes_range(t, ns, rec.checkpoint_id), False, None))
            keys.extend(key for _, key in S.blob_keys(t, ns, S.blob_versions(cp)))
        txn.prefetch(keys, scans)
        return [
            self.load_tuple(txn, rec, metadata=m, checkpoint=cp)
            for (rec, m), cp in zip(found, checkpoints)
        ]

    def guess(self, txn: Txn, thread: str, ns: str, checkpoint_id: Any) -> None:
        """On a store that pipelines reads (the only one with a memo of
        puts: elsewhere guessing would cost CPU for nothing): when this saver wrote
        the checkpoint asked for (the thread's latest, as far as it knows),
        queue the record's read, its writes scan and its blobs together, so
        ``get_tuple`` is one round trip when the guess holds (what it then
        reads is found read); a wrong guess costs bytes, not a round trip."""
        memo = self.last_put
        if memo is None:  # a local store: nothing to gain
            return
        guess = memo.get((thread, ns))
        if guess is None or (checkpoint_id and str(checkpoint_id) != guess[0]):
            return
        cid, versions = guess
        keys = [key for _, key in S.blob_keys(thread, ns, versions)]
        scans: list[ScanArgs] = []
        if checkpoint_id:
            keys.append(S.checkpoint_key(thread, ns, cid))
        else:
            scans.append((*S.checkpoints_range(thread, ns), True, 1))
        scans.append((*S.writes_range(thread, ns, cid), False, None))
        txn.prefetch(keys, scans)

    def remember_put(self, thread: str, ns: str, cid: str, versions: Any, small: Any) -> None:
        """A put's id and blob versions, for ``guess`` (a store that pipelines
        reads only)."""
        memo = self.last_put
        if memo is None:
            return
        at = (thread, ns)
        latest = memo.get(at)
        if latest is None or latest[0] <= cid:  # ids grow: a put of an older one is no latest
            vs = S.blob_versions({"channel_versions": versions, "channel_values": small})
            memo[at] = (cid, dict(vs or {}))
            try:  # puts from several threads: a guess, no need for a lock
                memo.move_to_end(at)
                while len(memo) > 4096:
                    memo.popitem(last=False)
            except KeyError:
                pass

    def delta_history(
        self, txn: Txn, thread: str, ns: str, checkpoint_id: Any, channels: Sequence[str]
    ) -> dict[str, DeltaChannelHistory]:
        """``get_delta_channel_history``: the parent chain of the target
        checkpoint walked in ``txn``, each channel's writes (oldest first)
        collected back to the nearest ancestor with a stored value (its
        ``seed``)."""
        loads = self.serde.loads_typed
        collected: dict[str, list[PendingWrite]] = {c: [] for c in channels}
        seeds: dict[str, Any] = {}
        remaining = set(channels)
        raw = TH.find_record(txn, thread, ns, checkpoint_id)
        cursor = S.decode_checkpoint(raw).parent_id if raw is not None else None
        while cursor is not None and remaining:
            raw = txn.get(S.checkpoint_key(thread, ns, cursor))
            if raw is None:
                break
            rec = S.decode_checkpoint(raw)
            cp = loads(rec.checkpoint)
            found: dict[str, Any] = {}
            for ch in remaining:
                typed = TH.stored_value(txn, thread, ns, cp, ch, self.serde)
                if typed is not None:
                    found[ch] = loads(typed)
            for w in reversed(self.load_writes(txn, thread, ns, cursor)):
                if w.channel in remaining:
                    collected[w.channel].append((w.task_id, w.channel, loads(w.value)))
            for ch, value in found.items():
                seeds[ch] = value
                remaining.discard(ch)
            cursor = rec.parent_id
        result: dict[str, DeltaChannelHistory] = {}
        for ch in channels:
            entry: DeltaChannelHistory = {"writes": list(reversed(collected[ch]))}
            if ch in seeds:
                entry["seed"] = seeds[ch]
            result[ch] = entry
        return result
