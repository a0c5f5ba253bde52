"""A batch's operations inside one transaction: reads (get, search,
list_namespaces) and writes (puts, deletes, TTL refreshes), through the
``Txn`` protocol only, so a backend may rerun them (``Store.transact``).

``Run`` is one run of a batch: everything it learns lives in it (the
namespace ids it finds or makes, the seqs it hands out), so a rerun starts
afresh and the store's cache takes only what a committed run found.

An item is one lookup by its key (``keyspace.item_key``); a namespace's
items in insertion order are its order entries, each naming its record's
key, whose records are read a chunk at a time (``Txn.get_many``: one round
trip on PostgreSQL).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar, cast

import ormsgpack
from kvsaver.kv.keys import unpack
from kvsaver.kv.store import Txn
from langgraph.store.base import GetOp, Item, ListNamespacesOp, Op, SearchItem, SearchOp

from . import checks as CK
from . import keyspace as KS
from .vectors import delete_vectors

if TYPE_CHECKING:
    import numpy as np

    from .vectors import Vectors

__all__ = ["Plan", "Put", "Run"]

_Hit = tuple[int, bytes, KS.ItemRecord]  # ns id, key element, record
_Found = tuple[int, bytes, KS.ItemRecord, Any, "float | None"]  # a hit, its value, its score
_Space = tuple[int, tuple[str, ...], bool]  # ns id, labels, ttl (``KS.NamespaceRecord``)
_CHUNK = 256  # the most order entries whose records one get_many reads
# Scores this close are a tie (returned in insertion order, as InMemoryStore's
# stable sort returns equal scores): one vector stored twice can score a few
# float32 ulps apart, by where its rows sit in the matrix.
_TIE = 1e-6


_value = operator.itemgetter(1)


def when(us: int) -> datetime:
    """A stored time (microseconds since the epoch) as an aware UTC datetime:
    exact, since the float's error stays under half a microsecond for any
    time before the year 2200, and a third cheaper than epoch + timedelta."""
    return _from_timestamp(us / 1e6, timezone.utc)


_from_timestamp = datetime.fromtimestamp
_new = object.__new__
_I = TypeVar("_I", bound=Item)
# Items are built by setting their slots: their constructors only copy these
# arguments (a tuple and datetimes, as given here), at four times the cost.
# Through the constructors when LangGraph's Item has other slots.
_SLOTS_KNOWN = Item.__slots__ == ("value", "key", "namespace", "created_at", "updated_at") and (
    SearchItem.__slots__ == ("score",)
)


@dataclass
class Put:
    """A put or delete (``value`` None) as checked: the value packed, and
    the texts its vectors are made of (filled in by ``_embed``)."""

    namespace: tuple[str, ...]
    key: str
    value: bytes | None
    ttl: float | None
    texts: list[tuple[str, str]] = field(default_factory=list)
    vectors: list[tuple[str, bytes]] | None = None  # float32 bytes, checked


@dataclass
class Plan:
    ops: list[Op]
    puts: dict[tuple[tuple[str, ...], str], Put]
    queries: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def writes(self) -> bool:
        return bool(self.puts)


class Run:
    """One run of a batch in ``txn`` at ``now_us`` (a write run when ``write``)."""

    __slots__ = (
        "_made",
        "_next_ns",
        "_next_seq",
        "cache",
        "found",
        "now_ms",
        "now_us",
        "refresh",
        "results",
        "ttl_found",
        "ttl_ids",
        "txn",
        "vectors",
        "write",
    )

    def __init__(
        self,
        txn: Txn,
        now_us: int,
        cache: dict[tuple[str, ...], int],
        vectors: Vectors | None,
        write: bool,
        ttl_ids: set[int] | frozenset[int] = frozenset(),
    ) -> None:
        self.txn = txn
        self.now_us = now_us
        self.now_ms = now_us // 1000
        self.cache = cache  # the store's: committed namespace ids, read only here
        self.found: dict[tuple[str, ...], int] = {}  # ids this run read (or made)
        self.ttl_ids = ttl_ids  # the store's: committed ids whose namespace's ttl is set
        self.ttl_found: set[int] = set()  # ids whose ttl this run read set (or set)
        self.vectors = vectors
        self.write = write
        self.refresh: list[tuple[int, bytes]] = []  # (ns id, key element) read with a TTL
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
        got = stored_ns_id(self.txn, ns)
        if got is not None:
            self.found[ns] = got
        return got

    def live(self, rec: KS.ItemRecord) -> bool:
        return rec.expires_ms is None or rec.expires_ms > self.now_ms

    def namespaces(self, prefix: tuple[str, ...]) -> list[_Space]:
        """(id, labels, ttl) of every namespace under ``prefix``, in creation order."""
        start, stop, _ = KS.namespace_prefix_range(prefix)
        n = len(prefix)
        out: list[_Space] = []
        for _, raw in self.txn.scan(start, stop):
            rec = KS.decode_namespace(raw)
            if rec.labels[:n] == prefix:
                out.append(rec)
                self.found[rec.labels] = rec.ns_id
        out.sort()
        return out

    def entries(self, ns_id: int) -> Iterator[bytes]:
        """The key elements of a namespace's items, in insertion order."""
        return map(_value, self.txn.scan(*KS.order_range(ns_id)))

    def items(self, ns_id: int, entries: Iterator[bytes], first: int = _CHUNK) -> Iterator[_Hit]:
        """The live items of ``entries`` (of namespace ``ns_id``), in their
        order, their records read ``first`` at first, then twice as many at
        each chunk up to ``_CHUNK``: a search that stops early reads few
        more than it returns, a long one in few round trips."""
        get_many, head, now_ms = self.txn.get_many, KS.item_key(ns_id, b""), self.now_ms
        n = max(first, 1)
        while True:
            chunk = list(itertools.islice(entries, n))
            if not chunk:
                return
            for el, raw in zip(chunk, get_many([head + el for el in chunk])):
                if raw is None:
                    continue  # an order entry without its record: none is written so
                rec = KS.decode_item(raw)
                if rec.expires_ms is None or rec.expires_ms > now_ms:  # live
                    yield ns_id, el, rec
            n = min(2 * n, _CHUNK)

    def nonempty(self, ns_id: int, ttl: bool) -> bool:
        """Whether a namespace holds a live item: without a TTL ever put
        there, whether it has an order entry."""
        if not ttl:
            return next(iter(self.txn.scan(*KS.order_range(ns_id), limit=1)), None) is not None
        return next(self.items(ns_id, self.entries(ns_id), 1), None) is not None

    # -- reads --------------------------------------------------------------

    def get(self, namespace: tuple[str, ...], key: str, refresh_ttl: bool) -> Item | None:
        """A ``GetOp``'s item (its fields passed: a lone get makes no op)."""
        ns_id = self.ns_id(namespace)
        if ns_id is None:
            return None
        hit = live_lookup(self.txn, ns_id, key, self.now_ms)
        if hit is None:
            return None
        el, rec = hit
        if refresh_ttl and rec.ttl is not None:
            self.refresh.append((ns_id, el))
        return as_item(namespace, rec)

    def search(self, op: SearchOp, query: np.ndarray | None) -> list[SearchItem]:
        spaces = self.namespaces(op.namespace_prefix)
        if query is not None and self.vectors is not None:
            picked = self._ranked(op, query, spaces)
        elif not op.filter:
            return self._listed(spaces, op.offset, op.limit, op.refresh_ttl)
        else:
            picked = self._plain(op, spaces, op.offset, op.limit, None)
        labels = {ns_id: ns for ns_id, ns, _ in spaces}
        out = []
        refresh = self.refresh if op.refresh_ttl else None
        for ns_id, el, rec, value, score in picked:
            if refresh is not None and rec.ttl is not None:
                refresh.append((ns_id, el))
            out.append(as_search_item(labels[ns_id], rec, value, score))
        return out

    def _listed(
        self, spaces: list[_Space], offset: int, limit: int, refresh_ttl: bool
    ) -> list[SearchItem]:
        """A search without a query or filter: every live item counts, so
        ``offset`` is skipped undecoded (unread where no TTL was put, see
        ``_after``) and the next ``limit`` are built as read."""
        out: list[SearchItem] = []
        refresh = self.refresh if refresh_ttl else None
        unpackb = ormsgpack.unpackb
        for ns_id, labels, ttl in spaces:
            n = limit - len(out)  # still wanted, after the offset
            if n <= 0:
                break
            got = None if ttl else self._after(ns_id, offset, n)
            if got is None:  # expired items do not count: the first ones read live
                hits = list(
                    itertools.islice(self.items(ns_id, self.entries(ns_id), offset + n), offset + n)
                )
                got = min(offset, len(hits)), hits[offset:]
            skipped, hits = got
            offset -= skipped
            for _, el, rec in hits:
                if refresh is not None and rec.ttl is not None:
                    refresh.append((ns_id, el))
                out.append(as_search_item(labels, rec, unpackb(rec.value), None))
        return out

    def _after(self, ns_id: int, skip: int, n: int) -> tuple[int, list[_Hit]] | None:
        """In a namespace where no TTL was put (every entry a live item), how
        many of ``skip`` items it skips and the ``n`` after them: its first
        ``skip + n`` entries and the records of the last ``n``, read as lists
        (a generator left unfinished is closed by an exception). None if an
        entry has no record (none is written so): then read as with a TTL."""
        els = [el for _, el in self.txn.scan(*KS.order_range(ns_id), limit=skip + n)]
        if len(els) <= skip:
            return len(els), []
        els = els[skip:]
        head = KS.item_key(ns_id, b"")
        raws = self.txn.get_many([head + el for el in els])
        if None in raws:
            return None
        found = cast("list[bytes]", raws)
        return skip, [(ns_id, el, KS.decode_item(raw)) for el, raw in zip(els, found)]

    def _plain(
        self,
        op: SearchOp,
        spaces: list[_Space],
        offset: int,
        limit: int,
        vectors: bool | None,
    ) -> list[_Found]:
        """Items in order passing the filter (and, with ``vectors`` False,
        only those without vectors), ``offset`` skipped, ``limit`` kept."""
        out: list[_Found] = []
        if limit <= 0:
            return out
        for ns_id, _, _ in spaces:
            for _, el, rec in self.items(ns_id, self.entries(ns_id), offset + limit - len(out)):
                if vectors is False and rec.vectors:
                    continue
                value = ormsgpack.unpackb(rec.value)
                if op.filter and not CK.matches(value, op.filter):
                    continue
                if offset:
                    offset -= 1
                    continue
                out.append((ns_id, el, rec, value, None))
                if len(out) == limit:
                    return out
        return out

    def _ranked(self, op: SearchOp, query: np.ndarray, spaces: list[_Space]) -> list[_Found]:
        """InMemoryStore's order: items with vectors by their best score
        (ties, within ``_TIE``, in insertion order), ``offset`` skipped and ``limit`` kept;
        then, while fewer than ``limit``, items without vectors in order."""
        assert self.vectors is not None
        kept: list[_Found] = []
        skip, want = op.offset, op.limit
        group: list[_Found] = []
        group_score = 0.0  # the best score of the group

        def flush() -> bool:
            nonlocal skip
            group.sort(key=lambda h: (h[0], h[2].seq))
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
        ranked = self.vectors.ranked(self.txn, query, op.namespace_prefix)
        # candidates looked up at first, in one read: enough if they all match
        n = min(skip + want, _CHUNK)
        while not done:
            chunk = list(itertools.islice(ranked, n))
            if not chunk:
                break
            for (_, _, score), found in zip(chunk, self._lookups(chunk)):
                if group and abs(score - group_score) > _TIE:
                    if flush():
                        done = True
                        break
                if not group:
                    group_score = score
                if found is None:
                    continue
                ns_id, el, rec = found
                value = ormsgpack.unpackb(rec.value)
                if CK.matches(value, op.filter):
                    group.append((ns_id, el, rec, value, float(score)))
            n = min(2 * n, _CHUNK)
        if not done and group:
            flush()
        if len(kept) < want:
            kept.extend(self._plain(op, spaces, 0, want - len(kept), False))
        return kept

    def _lookups(self, ranked: list[tuple[tuple[str, ...], str, float]]) -> list[_Hit | None]:
        """The live item of each (namespace, key, score), in one ``get_many``
        (one round trip on PostgreSQL); None where there is none."""
        ids = [self.ns_id(ns) for ns, _, _ in ranked]
        els = [KS.key_element(key) for _, key, _ in ranked]
        wanted = [
            (i, ns_id, el) for i, (ns_id, el) in enumerate(zip(ids, els)) if ns_id is not None
        ]
        raws = self.txn.get_many([KS.item_key(ns_id, el) for _, ns_id, el in wanted])
        out: list[_Hit | None] = [None] * len(ranked)
        for (i, ns_id, el), raw in zip(wanted, raws):
            rec = record_of(raw, ranked[i][1])
            if rec is not None and self.live(rec):
                out[i] = (ns_id, el, rec)
        return out

    def list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        """The namespace records in key order, a chunk at a time; while every
        namespace found so far is keyed by its labels themselves
        (``KS.inline``), the ones after sort after them too, so the scan
        stops at ``offset + limit`` found. A namespace where no TTL was ever
        put holds a live item if its first item is still there: those of a
        chunk are looked up in one read, the others scanned."""
        conditions = op.match_conditions
        prefix = CK.literal_prefix(conditions)
        start, stop, _ = KS.namespace_prefix_range(prefix)
        n, depth, want = len(prefix), op.max_depth, op.offset + op.limit
        rest = CK.unmet(conditions, prefix)
        found: set[tuple[str, ...]] = set()
        ordered = True
        records = self.txn.scan(start, stop)
        size = min(max(want, 16), _CHUNK)
        while True:
            read = 0
            chunk: list[tuple[tuple[str, ...], KS.NamespaceRecord]] = []
            for _, raw in itertools.islice(records, size):
                read += 1
                rec = KS.decode_namespace(raw)
                labels = rec.labels
                if labels[:n] != prefix:
                    continue  # past the key budget: another prefix's
                self.found[labels] = rec.ns_id
                if rest and not CK.namespace_matches(rest, labels):
                    continue
                chunk.append((labels if depth is None else labels[:depth], rec))
            if not read:
                break
            asked: dict[tuple[str, ...], int] = {}  # got -> the ns id whose first item is read
            for got, rec in chunk:
                if not rec.ttl and got not in found and got not in asked:
                    asked[got] = rec.ns_id
            ids = list(asked.values())
            firsts = dict(zip(ids, self.txn.get_many([KS.order_key(i, 1) for i in ids])))
            for got, rec in chunk:
                if got in found:
                    continue  # counted already
                if firsts.get(rec.ns_id) is None and not self.nonempty(rec.ns_id, rec.ttl):
                    continue  # emptied, or only expired items
                found.add(got)
                ordered = ordered and KS.inline(rec.labels)
                if ordered and len(found) >= want:
                    return sorted(found)[op.offset : want]
            size = min(2 * size, _CHUNK)
        return sorted(found)[op.offset : want]

    # -- writes -------------------------------------------------------------

    def _new_ns(self, ns: tuple[str, ...], ttl: bool) -> int:
        if self._next_ns is None:
            last = next(iter(self.txn.scan(*KS.ns_ids_range(), reverse=True, limit=1)), None)
            self._next_ns = 1 if last is None else unpack(last[0])[2] + 1
        ns_id, self._next_ns = self._next_ns, self._next_ns + 1
        self.txn.put(KS.namespace_key(ns), KS.encode_namespace(ns_id, ns, ttl))
        self.txn.put(KS.ns_id_key(ns_id), KS.encode_labels(ns))
        self.found[ns] = ns_id
        # A new id is past every id ever recorded (namespace records are never
        # deleted), so nothing is keyed by it: its first seq is 1, unread.
        self._made.add(ns_id)
        self._next_seq[ns_id] = 1
        if ttl:
            self.ttl_found.add(ns_id)
        return ns_id

    def _mark_ttl(self, ns: tuple[str, ...], ns_id: int) -> None:
        """Set the namespace's ttl (an item of it is put with a TTL), once."""
        if ns_id in self.ttl_found or ns_id in self.ttl_ids:
            return
        key = KS.namespace_key(ns)
        raw = self.txn.get(key)
        if raw is not None:
            rec = KS.decode_namespace(raw)
            if rec.ns_id == ns_id and not rec.ttl:
                self.txn.put(key, KS.encode_namespace(ns_id, ns, True))
        self.ttl_found.add(ns_id)

    def _new_seq(self, ns_id: int) -> int:
        seq = self._next_seq.get(ns_id)
        if seq is None:
            start, stop = KS.order_range(ns_id)
            last = next(iter(self.txn.scan(start, stop, reverse=True, limit=1)), None)
            seq = 1 if last is None else KS.order_seq(last[0], len(start)) + 1
        self._next_seq[ns_id] = seq + 1
        return seq

    def _store(self, ns_id: int, el: bytes, rec: KS.ItemRecord, old: KS.ItemRecord | None) -> None:
        old_expires = None if old is None else old.expires_ms
        if old_expires is not None and old_expires != rec.expires_ms:
            self.txn.delete(KS.expiry_key(old_expires, ns_id, rec.seq))
        self.txn.put(KS.item_key(ns_id, el), KS.encode_item(rec))
        if rec.expires_ms is not None and rec.expires_ms != old_expires:
            self.txn.put(KS.expiry_key(rec.expires_ms, ns_id, rec.seq), el)

    def put(self, p: Put) -> None:
        ns_id = self.ns_id(p.namespace)
        if ns_id is None:
            if p.value is None:
                return
            ns_id = self._new_ns(p.namespace, p.ttl is not None)
        hit = None if ns_id in self._made else lookup(self.txn, ns_id, p.key)
        if hit is not None and (p.value is None or not self.live(hit[1])):
            remove_item(self.txn, p.namespace, ns_id, *hit)
            hit = None
        if p.value is None:
            return
        if p.ttl is None:
            expires = None
        else:
            expires = self.now_ms + round(p.ttl * 60_000)
            self._mark_ttl(p.namespace, ns_id)
        if hit is None:
            el, seq, created, old = KS.key_element(p.key), self._new_seq(ns_id), self.now_us, None
            self.txn.put(KS.order_key(ns_id, seq), el)
        else:
            el, old = hit
            seq, created = old.seq, old.created_us
        vecs = p.vectors or []
        rec = KS.ItemRecord(p.key, seq, p.value, created, self.now_us, expires, p.ttl, bool(vecs))
        self._store(ns_id, el, rec, old)
        had = old is not None and old.vectors
        if self.vectors is not None and (vecs or had):
            self.vectors.write(self.txn, p.namespace, p.key, vecs, stored=had)
        elif had:  # no index config here: the old ones go
            delete_vectors(self.txn, p.namespace, p.key)

    def refresh_ttls(self, wanted: list[tuple[int, bytes]]) -> int:
        """Push back the expiry of items read with a TTL (still there, still
        live), unless by less than a hundredth of their TTL."""
        n = 0
        ids = list(dict.fromkeys(wanted))
        raws = self.txn.get_many([KS.item_key(ns_id, el) for ns_id, el in ids])
        for (ns_id, el), raw in zip(ids, raws):
            if raw is None:
                continue
            rec = KS.decode_item(raw)
            if rec.ttl is None or rec.expires_ms is None or not self.live(rec):
                continue
            ttl_ms = round(rec.ttl * 60_000)
            expires = self.now_ms + ttl_ms
            if expires - rec.expires_ms <= ttl_ms // 100:
                continue
            self._store(ns_id, el, rec._replace(expires_ms=expires), rec)
            n += 1
        return n

    def execute(self, plan: Plan) -> list[Any]:
        """The batch: its reads first (they see the store as it was before
        the batch, as in InMemoryStore), then, in a write run, its puts."""
        results: list[Any] = [None] * len(plan.ops)
        for i, op in enumerate(plan.ops):
            if isinstance(op, GetOp):
                results[i] = self.get(op.namespace, op.key, op.refresh_ttl)
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


def stored_ns_id(txn: Txn, ns: tuple[str, ...]) -> int | None:
    """The namespace's id as its record in ``txn`` says (None: no record)."""
    raw = txn.get(KS.namespace_key(ns))
    if raw is None:
        return None
    rec = KS.decode_namespace(raw)
    return rec.ns_id if rec.labels == ns else None  # else a tail surrogate's other namespace


def lookup(txn: Txn, ns_id: int, key: str) -> tuple[bytes, KS.ItemRecord] | None:
    """The item's key element and record (live or not): one read."""
    el = KS.key_element(key)
    rec = record_of(txn.get(KS.item_key(ns_id, el)), key)
    return None if rec is None else (el, rec)


def record_of(raw: bytes | None, key: str) -> KS.ItemRecord | None:
    """The record read at an item key's place, if it is that key's (a long
    key's element is a surrogate that another key may share)."""
    if raw is None:
        return None
    rec = KS.decode_item(raw)
    return rec if rec.key == key else None


def live_lookup(txn: Txn, ns_id: int, key: str, now_ms: int) -> tuple[bytes, KS.ItemRecord] | None:
    """``lookup``, of a live item only: what a read returns."""
    hit = lookup(txn, ns_id, key)
    if hit is None or (hit[1].expires_ms is not None and hit[1].expires_ms <= now_ms):
        return None
    return hit


def as_item(namespace: tuple[str, ...], rec: KS.ItemRecord) -> Item:
    """A stored item as a get returns it."""
    return _built(Item, namespace, rec, ormsgpack.unpackb(rec.value))


def as_search_item(
    namespace: tuple[str, ...], rec: KS.ItemRecord, value: Any, score: float | None
) -> SearchItem:
    """A stored item, its value decoded, as a search returns it."""
    item = _built(SearchItem, namespace, rec, value)
    item.score = score
    return item


def _built(cls: type[_I], namespace: tuple[str, ...], rec: KS.ItemRecord, value: Any) -> _I:
    created = when(rec.created_us)
    updated = created if rec.updated_us == rec.created_us else when(rec.updated_us)
    if not _SLOTS_KNOWN:
        return cls(
            value=value, key=rec.key, namespace=namespace, created_at=created, updated_at=updated
        )
    item = _new(cls)
    item.value, item.key, item.namespace = value, rec.key, namespace
    item.created_at, item.updated_at = created, updated
    return item


def remove_item(
    txn: Txn,
    ns: tuple[str, ...] | None,
    ns_id: int,
    el: bytes,
    rec: KS.ItemRecord,
) -> None:
    """An item's record, index entries and vectors (``ns`` None: its
    labels read from the store where its vectors need them)."""
    txn.delete(KS.item_key(ns_id, el))
    txn.delete(KS.order_key(ns_id, rec.seq))
    if rec.expires_ms is not None:
        txn.delete(KS.expiry_key(rec.expires_ms, ns_id, rec.seq))
    if rec.vectors:  # with or without the index config: no stale vectors
        if ns is None:
            raw = txn.get(KS.ns_id_key(ns_id))
            if raw is None:
                return
            ns = KS.decode_labels(raw)
        delete_vectors(txn, ns, rec.key)
