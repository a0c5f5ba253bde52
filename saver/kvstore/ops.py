"""A batch's operations inside one transaction: reads (get, search,
list_namespaces) and writes (puts, deletes, TTL refreshes), through the
``Txn`` protocol only, so a backend may rerun them (``Store.transact``).

``Run`` is one run of a batch: everything it learns lives in it (the
namespace ids it finds or makes, the seqs it hands out), so a rerun starts
afresh and the store's cache takes only what a committed run found.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import ormsgpack
from kvsaver.kv.keys import unpack
from kvsaver.kv.store import Txn
from langgraph.store.base import GetOp, Item, ListNamespacesOp, SearchItem, SearchOp

from . import checks as CK
from . import keyspace as KS
from .vectors import delete_vectors

if TYPE_CHECKING:
    from .store import Plan, Put
    from .vectors import Vectors

__all__ = ["Run"]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_Hit = tuple[int, int, KS.ItemRecord]  # ns id, seq, record
# Scores this close are a tie (returned in insertion order, as InMemoryStore's
# stable sort returns equal scores): one vector stored twice can score a few
# float32 ulps apart, by where its rows sit in the matrix.
_TIE = 1e-6


def when(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


class Run:
    """One run of a batch in ``txn`` at ``now_us`` (a write run when ``write``)."""

    def __init__(
        self,
        txn: Txn,
        now_us: int,
        cache: dict[tuple[str, ...], int],
        vectors: Vectors | None,
        write: bool,
    ) -> None:
        self.txn = txn
        self.now_us = now_us
        self.now_ms = now_us // 1000
        self.cache = cache  # the store's: committed namespace ids, read only here
        self.found: dict[tuple[str, ...], int] = {}  # ids this run read (or made)
        self.vectors = vectors
        self.write = write
        self.refresh: list[tuple[int, int]] = []  # (ns id, seq) read with a TTL to refresh
        self._next_seq: dict[int, int] = {}
        self._next_ns: int | None = None
        self._made: set[int] = set()  # ids of namespaces this run made: no items yet
        self.results: list[Any] = []  # a read run's (``KVStore._read``)

    # -- lookups ------------------------------------------------------------

    def ns_id(self, ns: tuple[str, ...]) -> int | None:
        got = self.found.get(ns)
        if got is None:
            got = self.cache.get(ns)
        if got is not None:
            return got
        raw = self.txn.get(KS.namespace_key(ns))
        if raw is None:
            return None
        ns_id, labels = KS.decode_namespace(raw)
        if labels != ns:  # a tail surrogate shared by two namespaces: not this one
            return None
        self.found[ns] = ns_id
        return ns_id

    def lookup(self, ns_id: int, key: str) -> tuple[int, KS.ItemRecord] | None:
        raw = self.txn.get(KS.key_key(ns_id, key))
        if raw is None:
            return None
        seq = KS.decode_seq(raw)
        rec = self.txn.get(KS.item_key(ns_id, seq))
        if rec is None:
            return None
        item = KS.decode_item(rec)
        return (seq, item) if item.key == key else None

    def live(self, rec: KS.ItemRecord) -> bool:
        return rec.expires_ms is None or rec.expires_ms > self.now_ms

    def namespaces(self, prefix: tuple[str, ...]) -> list[tuple[int, tuple[str, ...]]]:
        """(id, labels) of every namespace under ``prefix``, in creation order."""
        start, stop, _ = KS.namespace_prefix_range(prefix)
        n = len(prefix)
        out = []
        for _, raw in self.txn.scan(start, stop):
            ns_id, labels = KS.decode_namespace(raw)
            if labels[:n] == prefix:
                out.append((ns_id, labels))
                self.found[labels] = ns_id
        out.sort()
        return out

    def items(self, ns_id: int) -> Iterator[_Hit]:
        """A namespace's live items in insertion order."""
        start, stop = KS.items_range(ns_id)
        skip = len(start)
        for key, raw in self.txn.scan(start, stop):
            rec = KS.decode_item(raw)
            if self.live(rec):
                yield ns_id, KS.item_seq(key, skip), rec

    def nonempty(self, ns_id: int) -> bool:
        """Whether a namespace holds a live item."""
        for _, raw in self.txn.scan(*KS.items_range(ns_id)):
            if self.live(KS.decode_item(raw)):
                return True
        return False

    # -- reads --------------------------------------------------------------

    def _returned(self, ns_id: int, seq: int, rec: KS.ItemRecord, refresh: bool) -> None:
        if refresh and rec.ttl is not None:
            self.refresh.append((ns_id, seq))

    def get(self, op: GetOp) -> Item | None:
        ns_id = self.ns_id(op.namespace)
        hit = None if ns_id is None else self.lookup(ns_id, op.key)
        if hit is None or not self.live(hit[1]):
            return None
        assert ns_id is not None
        self._returned(ns_id, hit[0], hit[1], op.refresh_ttl)
        rec = hit[1]
        created = when(rec.created_us)
        return Item(
            value=ormsgpack.unpackb(rec.value),
            key=rec.key,
            namespace=op.namespace,
            created_at=created,
            updated_at=created if rec.updated_us == rec.created_us else when(rec.updated_us),
        )

    def search(self, op: SearchOp, query: list[float] | None) -> list[SearchItem]:
        spaces = self.namespaces(op.namespace_prefix)
        labels = dict(spaces)
        if query is not None and self.vectors is not None:
            picked = self._ranked(op, query, labels)
        else:
            picked = self._plain(op, spaces, op.offset, op.limit, None)
        out = []
        for ns_id, seq, rec, value, score in picked:
            self._returned(ns_id, seq, rec, op.refresh_ttl)
            created = when(rec.created_us)
            out.append(
                SearchItem(
                    namespace=labels[ns_id],
                    key=rec.key,
                    value=value,
                    created_at=created,
                    updated_at=(
                        created if rec.updated_us == rec.created_us else when(rec.updated_us)
                    ),
                    score=score,
                )
            )
        return out

    def _plain(
        self,
        op: SearchOp,
        spaces: list[tuple[int, tuple[str, ...]]],
        offset: int,
        limit: int,
        vectors: bool | None,
    ) -> list[tuple[int, int, KS.ItemRecord, Any, float | None]]:
        """Items in order passing the filter (and, with ``vectors`` False,
        only those without vectors), ``offset`` skipped, ``limit`` kept."""
        out: list[tuple[int, int, KS.ItemRecord, Any, float | None]] = []
        if limit <= 0:
            return out
        for ns_id, _ in spaces:
            for _, seq, rec in self.items(ns_id):
                if vectors is False and rec.vectors:
                    continue
                if offset and not op.filter:  # skipped unread
                    offset -= 1
                    continue
                value = ormsgpack.unpackb(rec.value)
                if not CK.matches(value, op.filter):
                    continue
                if offset:
                    offset -= 1
                    continue
                out.append((ns_id, seq, rec, value, None))
                if len(out) == limit:
                    return out
        return out

    def _ranked(
        self, op: SearchOp, query: list[float], labels: dict[int, tuple[str, ...]]
    ) -> list[tuple[int, int, KS.ItemRecord, Any, float | None]]:
        """InMemoryStore's order: items with vectors by their best score
        (ties, within ``_TIE``, in insertion order), ``offset`` skipped and ``limit`` kept;
        then, while fewer than ``limit``, items without vectors in order."""
        assert self.vectors is not None
        kept: list[tuple[int, int, KS.ItemRecord, Any, float | None]] = []
        skip, want = op.offset, op.limit
        group: list[tuple[int, int, KS.ItemRecord, Any, float | None]] = []
        group_score = 0.0  # the best score of the group

        def flush() -> bool:
            nonlocal skip
            group.sort(key=lambda h: (h[0], h[1]))
            for hit in group:
                if skip:
                    skip -= 1
                    continue
                kept.append(hit)
                if len(kept) == want:
                    return True
            group.clear()
            return False

        done = want == 0
        if not done:
            for ns, key, score in self.vectors.ranked(self.txn, query, op.namespace_prefix):
                if group and abs(score - group_score) > _TIE:
                    if flush():
                        done = True
                        break
                if not group:
                    group_score = score
                ns_id = self.ns_id(ns)
                hit = None if ns_id is None else self.lookup(ns_id, key)
                if ns_id is None or hit is None or not self.live(hit[1]):
                    continue
                value = ormsgpack.unpackb(hit[1].value)
                if CK.matches(value, op.filter):
                    group.append((ns_id, hit[0], hit[1], value, float(score)))
            if not done and group:
                flush()
        if len(kept) < want:
            spaces = sorted(labels.items())
            kept.extend(self._plain(op, spaces, 0, want - len(kept), False))
        return kept

    def list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        """The namespace records in key order; while every namespace found so
        far is keyed by its labels themselves (``KS.inline``), the ones after
        sort after them too, so the scan stops at ``offset + limit`` found."""
        conditions = op.match_conditions
        prefix = CK.literal_prefix(conditions)
        start, stop, _ = KS.namespace_prefix_range(prefix)
        n, depth, want = len(prefix), op.max_depth, op.offset + op.limit
        found: set[tuple[str, ...]] = set()
        ordered = True
        for _, raw in self.txn.scan(start, stop):
            ns_id, labels = KS.decode_namespace(raw)
            if labels[:n] != prefix:
                continue  # past the key budget: another prefix's
            self.found[labels] = ns_id
            if not CK.namespace_matches(conditions, labels):
                continue
            got = labels if depth is None else labels[:depth]
            if got in found or not self.nonempty(ns_id):
                continue  # counted already; emptied, or only expired items
            found.add(got)
            ordered = ordered and KS.inline(labels)
            if ordered and len(found) >= want:
                break
        return sorted(found)[op.offset : want]

    # -- writes -------------------------------------------------------------

    def _new_ns(self, ns: tuple[str, ...]) -> int:
        if self._next_ns is None:
            last = next(iter(self.txn.scan(*KS.ns_ids_range(), reverse=True, limit=1)), None)
            self._next_ns = 1 if last is None else unpack(last[0])[2] + 1
        ns_id, self._next_ns = self._next_ns, self._next_ns + 1
        self.txn.put(KS.namespace_key(ns), KS.encode_namespace(ns_id, ns))
        self.txn.put(KS.ns_id_key(ns_id), KS.encode_labels(ns))
        self.found[ns] = ns_id
        # A new id is past every id ever recorded (namespace records are never
        # deleted), so nothing is keyed by it: its first seq is 1, unread.
        self._made.add(ns_id)
        self._next_seq[ns_id] = 1
        return ns_id

    def _new_seq(self, ns_id: int) -> int:
        seq = self._next_seq.get(ns_id)
        if seq is None:
            start, stop = KS.items_range(ns_id)
            last = next(iter(self.txn.scan(start, stop, reverse=True, limit=1)), None)
            seq = 1 if last is None else KS.item_seq(last[0], len(start)) + 1
        self._next_seq[ns_id] = seq + 1
        return seq

    def remove(self, ns: tuple[str, ...], ns_id: int, seq: int, rec: KS.ItemRecord) -> None:
        remove_item(self.txn, self.vectors, ns, ns_id, seq, rec)

    def _store(self, ns_id: int, seq: int, rec: KS.ItemRecord, old: KS.ItemRecord | None) -> None:
        if old is not None and old.expires_ms is not None and old.expires_ms != rec.expires_ms:
            self.txn.delete(KS.expiry_key(old.expires_ms, ns_id, seq))
        self.txn.put(KS.item_key(ns_id, seq), KS.encode_item(rec))
        if rec.expires_ms is not None:
            self.txn.put(KS.expiry_key(rec.expires_ms, ns_id, seq), b"")

    def put(self, p: Put) -> None:
        ns_id = self.ns_id(p.namespace)
        if ns_id is None:
            if p.value is None:
                return
            ns_id = self._new_ns(p.namespace)
        hit = None if ns_id in self._made else self.lookup(ns_id, p.key)
        if hit is not None and (p.value is None or not self.live(hit[1])):
            self.remove(p.namespace, ns_id, *hit)
            hit = None
        if p.value is None:
            return
        expires = None if p.ttl is None else self.now_ms + round(p.ttl * 60_000)
        if hit is None:
            seq, created, old = self._new_seq(ns_id), self.now_us, None
            self.txn.put(KS.key_key(ns_id, p.key), KS.encode_seq(seq))
        else:
            seq, old = hit
            created = old.created_us
        vecs = p.vectors or []
        rec = KS.ItemRecord(p.key, p.value, created, self.now_us, expires, p.ttl, bool(vecs))
        self._store(ns_id, seq, rec, old)
        had = old is not None and old.vectors
        if self.vectors is not None and (vecs or had):
            self.vectors.write(self.txn, p.namespace, p.key, vecs, stored=had)
        elif had:  # no index config here: the old ones go
            delete_vectors(self.txn, p.namespace, p.key)

    def refresh_ttls(self, wanted: list[tuple[int, int]]) -> int:
        """Push back the expiry of items read with a TTL (still there, still
        live), unless by less than a hundredth of their TTL."""
        n = 0
        ids = list(dict.fromkeys(wanted))
        raws = self.txn.get_many([KS.item_key(ns_id, seq) for ns_id, seq in ids])
        for (ns_id, seq), raw in zip(ids, raws):
            if raw is None:
                continue
            rec = KS.decode_item(raw)
            if rec.ttl is None or rec.expires_ms is None or not self.live(rec):
                continue
            ttl_ms = round(rec.ttl * 60_000)
            expires = self.now_ms + ttl_ms
            if expires - rec.expires_ms <= ttl_ms // 100:
                continue
            self._store(ns_id, seq, rec._replace(expires_ms=expires), rec)
            n += 1
        return n

    def execute(self, plan: Plan) -> list[Any]:
        """The batch: its reads first (they see the store as it was before
        the batch, as in InMemoryStore), then, in a write run, its puts."""
        results: list[Any] = [None] * len(plan.ops)
        for i, op in enumerate(plan.ops):
            if isinstance(op, GetOp):
                results[i] = self.get(op)
            elif isinstance(op, SearchOp):
                results[i] = self.search(op, plan.queries.get(op.query or ""))
            elif isinstance(op, ListNamespacesOp):
                results[i] = self.list_namespaces(op)
        if self.write:
            if self.refresh:
                self.refresh_ttls(self.refresh)
                self.refresh = []
            for p in plan.puts.values():
                self.put(p)
        return results


def remove_item(
    txn: Txn,
    vectors: Vectors | None,
    ns: tuple[str, ...] | None,
    ns_id: int,
    seq: int,
    rec: KS.ItemRecord,
) -> None:
    """An item's records, index entries and vectors (``ns`` None: its
    labels read from the store where its vectors need them)."""
    txn.delete(KS.item_key(ns_id, seq))
    txn.delete(KS.key_key(ns_id, rec.key))
    if rec.expires_ms is not None:
        txn.delete(KS.expiry_key(rec.expires_ms, ns_id, seq))
    if rec.vectors:  # with or without the index config: no stale vectors
        if ns is None:
            raw = txn.get(KS.ns_id_key(ns_id))
            if raw is None:
                return
            ns = KS.decode_labels(raw)
        delete_vectors(txn, ns, rec.key)
