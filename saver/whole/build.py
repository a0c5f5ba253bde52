"""Head records made from the store: the idle heads' writer (``IdleHeads``,
run by ``IdleWork``'s thread) and ``build_head``, which a put's head and an
idle head are both made by, with the bounded hint dicts they keep."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from kvsaver.kv import CorruptStoreError, KVError, Store, Txn

from .. import delta as D
from .. import heads as H
from .. import schema as S
from .. import small as SV
from .. import threads as TH

__all__ = ["IdleHeads", "bounded_put", "build_head", "near_cap"]


class IdleHeads:
    """The heads of threads gone idle (``whole_latest="idle"``): what
    ``IdleWork``'s thread calls, with what it needs of the saver (its store,
    codec and head hints), held by the saver and its ``with_allowlist``
    clones, so that the thread runs while any of them is alive and holds none.
    """

    def __init__(
        self,
        store: Store,
        codec: D.Codec,
        head_ids: dict[tuple[str, str], str],
        head_sizes: dict[tuple[str, str], dict[tuple[str, type, Any], int]],
    ) -> None:
        self.store = store
        self.codec = codec
        self.head_ids = head_ids
        self.head_sizes = head_sizes

    def write(self, keys: list[tuple[str, str]]) -> None:
        """Write the heads of these (thread, ns), left alone since their last
        put, in one transaction of their own: each is made from the store in
        a read transaction (no writer waits meanwhile), then written only if
        nothing it was made from changed since (the latest record, the head
        record, the values' blobs, compared byte for byte). Not in a put's
        group commit, so a head the store cannot take fails no put; and none
        on a store within a quarter of its ``max_size``, whose room is for
        checkpoints. Whatever goes wrong leaves heads unwritten: they are only
        copies. Runs in ``IdleWork``'s thread, and in ``close()``."""
        try:
            if near_cap(self.store):
                return
            with self.store.read() as txn:
                made = [m for key in keys if (m := self._make_or_none(txn, *key)) is not None]
            if not made:
                return
            with self.store.write() as txn:
                for thread, ns, hkey, seen, raw, blobs, head, _ in made:
                    if (
                        TH.find_record(txn, thread, ns, None) == raw
                        and txn.get(hkey) == seen
                        and txn.get_many(list(blobs)) == list(blobs.values())
                    ):
                        txn.put(hkey, head)
            for thread, ns, *_, cid in made:
                bounded_put(self.head_ids, (thread, ns), cid)
        except Exception:  # a closed or full store, another process's lock...: no heads
            return

    def _make_or_none(self, txn: Txn, thread: str, ns: str) -> Any:
        try:
            return self.make(txn, thread, ns)
        except Exception:  # a record it cannot read: no head for it, the others go on
            return None

    def make(
        self, txn: Txn, thread: str, ns: str
    ) -> tuple[str, str, bytes, bytes | None, bytes, dict[bytes, bytes | None], bytes, str] | None:
        """(thread, ns, head key, the head record seen, the latest record,
        {blob key: raw} read, the new head, checkpoint id) for the latest
        checkpoint of (thread, ns), or None when it has no head to write (none
        stored, its head already current, values a head cannot hold)."""
        raw = TH.find_record(txn, thread, ns, None)
        if raw is None:
            return None
        hkey = S.head_key(thread, ns)
        seen = txn.get(hkey)
        if H.payload(seen, raw) is not None:
            return None  # already this checkpoint's
        codec = self.codec
        rec = S.decode_checkpoint(raw)
        plain = H.plain_of(*codec.unwrap(*rec.checkpoint))
        split = H.split_values(plain) if plain is not False else None
        if split is None:
            return None
        cp_plain, small = split
        versions = H.versions_of(cp_plain)
        if versions is None:  # (read without decoding a value: no stored code runs)
            return None
        mine = SV.for_head(versions, small)
        blobs: dict[bytes, bytes | None] = {}
        head = build_head(
            txn, codec, rec, raw, cp_plain, versions, mine, None, None, self.head_sizes, blobs
        )
        if head is None:
            return None
        return thread, ns, hkey, seen, raw, blobs, head, rec.checkpoint_id


def near_cap(store: Store) -> bool:
    """Whether ``store`` is within a quarter of its ``max_size`` (LMDB's
    cap), whose room is for checkpoints, not heads; True when it cannot
    tell (a head is only a copy: none is better than a failed put)."""
    cap = store.max_size
    if cap is None:
        return False
    try:
        used = store.used_bytes()  # LMDBStore's: no system call
    except Exception:
        return True
    return used is None or used > cap - cap // 4


def build_head(
    txn: Txn,
    codec: D.Codec,
    rec: S.CheckpointRecord,
    record: bytes,
    cp_plain: bytes | Literal[False],
    versions: Mapping[str, Any],
    mine: Mapping[str, tuple[Any, bytes | Literal[False] | None]],
    previous: bytes | None,
    parsed: Any,
    head_sizes: dict[tuple[str, str], dict[tuple[str, type, Any], int]],
    blobs: dict[bytes, bytes | None] | None = None,
) -> bytes | None:
    """``heads.build`` for the checkpoint ``rec`` (stored as ``record``):
    the values neither ``mine`` nor ``previous`` holds are read from their
    blobs (their raw bytes noted in ``blobs`` when given). ``head_sizes``:
    the saver's sizes of values found too large, per (thread, ns), taken
    for this build and kept for the next when it makes no head. None when the
    checkpoint can have none (a value a head cannot hold, a damaged or
    foreign blob: a read of it says so); the store's own errors raise."""
    thread, ns = rec.thread_id, rec.checkpoint_ns

    def stored(ch: str, v: Any) -> bytes | Literal[False] | None:
        key = S.blob_key(thread, ns, ch, v)
        raw = txn.get(key)
        if blobs is not None:
            blobs[key] = raw
        return codec.head_value(txn, key, raw)

    md_plain = H.plain_of(*rec.metadata)
    head = None
    sizes = head_sizes.pop((thread, ns), {})
    if cp_plain is not False and md_plain is not False:
        try:
            head = H.build(
                record,
                rec.checkpoint_id,
                rec.parent_id,
                cp_plain,
                md_plain,
                versions,
                mine,
                previous,
                parsed,
                stored,
                sizes,
            )
        except CorruptStoreError:
            pass  # a damaged blob
        except KVError:
            raise  # the store's own trouble (full, closed...)
        except (ValueError, TypeError, LookupError, OverflowError):
            pass  # a stored value it cannot read (a foreign blob, a damaged frame)
    if head is None and sizes:  # what it read, for the next try: see heads.build
        current = {H.version_key(ch, v) for ch, v in versions.items()}
        bounded_put(head_sizes, (thread, ns), {k: n for k, n in sizes.items() if k in current})
    return head


_HEAD_HINTS = 65_536  # entries of Heads.ids, Heads.sizes and Heads.misses at most


def bounded_put(hints: dict[Any, Any], key: Any, value: Any) -> None:
    """``hints[key] = value`` in a dict of hints (nothing is lost when it is
    emptied), emptied when it holds ``_HEAD_HINTS`` entries."""
    if len(hints) >= _HEAD_HINTS:
        hints.clear()
    hints[key] = value
