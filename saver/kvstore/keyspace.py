"""The keys and records of KVStore, as ``saver/schema.py``'s table lays them
out under the store keyspace ``("s", ...)``, which KVSaver never uses.

A namespace gets an id (an int, in order of creation) the first time it
holds an item, and keeps it. An item's record is keyed by ``(namespace id,
key)``, so a get is one lookup; its seq (counting up within the namespace at
each new key) keys its entry in the namespace's order index, which holds the
record's key element, so a scan of the index returns a namespace's items in
insertion order, and namespaces come in creation order, as InMemoryStore
returns them. Labels and keys longer than a key holds become the saver's
surrogates (``saver/keyspace.k``); a namespace whose labels take more than
``_NS_BUDGET`` bytes keeps its first labels and one surrogate of the rest.
Records hold the full strings.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import ormsgpack
from kvsaver.kv.keys import INT_ZERO, extensions, pack, prefix_range, unpack
from kvsaver.kv.store import CorruptStoreError

from ..keyspace import STORE, _el, k, store_range
from ..keyspace import STORE_ITEM as ITEM

__all__ = [
    "EXPIRY",
    "ITEM",
    "NS",
    "NS_ID",
    "ORDER",
    "SCHEMA_KEY",
    "STORE",
    "ItemRecord",
    "NamespaceRecord",
    "decode_item",
    "encode_item",
    "expiry_key",
    "expiry_range",
    "inline",
    "item_key",
    "items_range",
    "key_element",
    "namespace_elements",
    "namespace_key",
    "namespace_prefix_range",
    "ns_id_key",
    "ns_ids_range",
    "order_key",
    "order_range",
    "order_seq",
    "store_range",
]

SCHEMA_KEY = pack((STORE, "schema"))
NS = "n"  # ("s", "n", *label elements) -> [ns id, [labels], ttl]
NS_ID = "N"  # ("s", "N", ns id) -> [labels]
# ITEM (saver/keyspace.STORE_ITEM): ("s", "i", ns id, key element) -> ItemRecord
ORDER = "o"  # ("s", "o", ns id, seq) -> the item's key element (packed)
EXPIRY = "x"  # ("s", "x", expires ms, ns id, seq) -> the item's key element (packed)
# 1: ("s", "k", ns id, key) -> seq and ("s", "i", ns id, seq) -> record, a get
# two lookups; never released, so no upgrade: such a store is refused.
FORMAT = 2

_NS_BUDGET = 400  # bytes of label elements in a namespace key (LMDB keys: 511)


def namespace_elements(labels: Sequence[str], budget: int = _NS_BUDGET) -> tuple[list[Any], bool]:
    """The key elements of a namespace's labels, and whether they are exact
    (no tail surrogate): an element of label i depends only on labels 0..i,
    so a namespace's elements start with those of each of its prefixes.
    For any key that holds a namespace: it stays under LMDB's limit (a key
    holding more than the namespace passes a smaller ``budget``)."""
    out: list[Any] = []
    size = 0
    for i, label in enumerate(labels):
        el = k(label)
        n = len(pack((el,)))
        if size + n > budget:
            rest = pack(tuple(labels[i:]))
            out.append(b"\xff" + hashlib.sha256(rest).digest())  # 33 bytes: not a k() surrogate
            return out, False
        out.append(el)
        size += n
    return out, True


def inline(labels: Sequence[str]) -> bool:
    """Whether a namespace's key holds its labels themselves (no surrogate):
    such keys sort as their labels do (str elements sort by code point, a
    shorter tuple before its extensions), and after any key that differs
    from them first by holding a surrogate there."""
    if len(labels) <= 4 and max(map(len, labels), default=0) <= 23:
        return True  # 4 labels of <= 23 characters pack to <= 376 bytes
    elements, exact = namespace_elements(labels)
    return exact and all(isinstance(el, str) for el in elements)


def namespace_key(labels: Sequence[str]) -> bytes:
    return pack((STORE, NS, *namespace_elements(labels)[0]))


_RANGES: dict[tuple[str, ...], tuple[bytes, bytes, bool]] = {}


def namespace_prefix_range(prefix: tuple[str, ...]) -> tuple[bytes, bytes, bool]:
    """``(start, stop, exact)``: the namespace keys of ``prefix`` and every
    namespace under it (start inclusive). Not exact: the range holds more
    (the prefix runs past the key budget), filter by the records' labels.
    Kept for the prefixes searched lately (a search packs it otherwise)."""
    got = _RANGES.get(prefix)
    if got is None:
        elements, exact = namespace_elements(prefix)
        if not exact:
            elements = elements[:-1]
        p = pack((STORE, NS, *elements))
        got = (p, p + b"\xff", exact)
        if len(_RANGES) >= _HEADS_MAX:
            _RANGES.clear()
        _RANGES[prefix] = got
    return got


def ns_id_key(ns_id: int) -> bytes:
    return pack((STORE, NS_ID, ns_id))


def ns_ids_range() -> tuple[bytes, bytes]:
    return prefix_range((STORE, NS_ID))


# Packed tuples concatenate their elements' encodings: the heads of a
# namespace's order and item keys are packed once and kept.
_ORDER_HEAD = pack((STORE, ORDER))
_ITEM_HEAD = pack((STORE, ITEM))
_HEADS: dict[int, tuple[bytes, bytes]] = {}
_HEADS_MAX = 16384


def _heads(ns_id: int) -> tuple[bytes, bytes]:
    got = _HEADS.get(ns_id)
    if got is None:
        el = pack((ns_id,))
        got = (_ORDER_HEAD + el, _ITEM_HEAD + el)
        if len(_HEADS) >= _HEADS_MAX:
            _HEADS.clear()
        _HEADS[ns_id] = got
    return got


def _seq_el(seq: int) -> bytes:
    """``pack((seq,))`` of a seq >= 0: a size byte, then the big-endian bytes."""
    n = (seq.bit_length() + 7) // 8
    return bytes((INT_ZERO + n,)) + seq.to_bytes(n, "big")


def key_element(key: str) -> bytes:
    """An item key's packed element: what follows the namespace in its
    record's key, and what its order and expiry entries hold."""
    return _el(key)


def item_key(ns_id: int, el: bytes) -> bytes:
    """The key of an item's record, ``el`` its ``key_element``."""
    return _heads(ns_id)[1] + el


def items_range(ns_id: int) -> tuple[bytes, bytes]:
    """The records of a namespace's items, in key order."""
    return extensions(_heads(ns_id)[1])


def order_key(ns_id: int, seq: int) -> bytes:
    return _heads(ns_id)[0] + _seq_el(seq)


def order_range(ns_id: int) -> tuple[bytes, bytes]:
    """A namespace's order entries, in insertion order. Its start is as long
    as an order key before the seq's bytes (``order_seq``)."""
    return extensions(_heads(ns_id)[0])


def order_seq(key: bytes, skip: int) -> int:
    """The seq of an order key, ``skip`` the length of its ``order_range``
    start: a seq (>= 1) packs as one size byte then its big-endian bytes."""
    return int.from_bytes(key[skip:], "big")


def expiry_key(expires_ms: int, ns_id: int, seq: int) -> bytes:
    return pack((STORE, EXPIRY, expires_ms, ns_id, seq))


def expiry_range(before_ms: int) -> tuple[bytes, bytes]:
    """The expiry entries of items expired at ``before_ms`` (expires <= it)."""
    start, _ = prefix_range((STORE, EXPIRY))
    return start, pack((STORE, EXPIRY, before_ms + 1))


def expiry_ids(key: bytes) -> tuple[int, int, int]:
    _, _, expires, ns_id, seq = unpack(key)
    return expires, ns_id, seq


# -- records -----------------------------------------------------------------


class ItemRecord(NamedTuple):
    key: str
    seq: int  # its order entry's
    value: bytes  # the value dict, msgpack
    created_us: int
    updated_us: int
    expires_ms: int | None
    ttl: float | None  # minutes
    vectors: bool  # the item has vectors (``vectors.Vectors``)


def encode_item(rec: ItemRecord) -> bytes:
    return ormsgpack.packb(list(rec))


def decode_item(raw: bytes) -> ItemRecord:
    # tuple.__new__ takes the unpacked list as it is: ItemRecord(*fields) is a
    # Python call of eight arguments, on every item a read decodes.
    rec = _new_tuple(ItemRecord, ormsgpack.unpackb(raw))
    if len(rec) != _ITEM_FIELDS:
        raise CorruptStoreError(f"a store item's record has {len(rec)} fields, not {_ITEM_FIELDS}")
    return rec


_new_tuple = tuple.__new__
_ITEM_FIELDS = len(ItemRecord._fields)


class NamespaceRecord(NamedTuple):
    ns_id: int
    labels: tuple[str, ...]
    # An item of the namespace was ever put with a TTL (never unset): while
    # not, every item in its order index is live, read or not.
    ttl: bool


def encode_namespace(ns_id: int, labels: Sequence[str], ttl: bool = False) -> bytes:
    return ormsgpack.packb([ns_id, list(labels), ttl])


def decode_namespace(raw: bytes) -> NamespaceRecord:
    ns_id, labels, ttl = ormsgpack.unpackb(raw)
    return NamespaceRecord(ns_id, tuple(labels), ttl)


def encode_labels(labels: Sequence[str]) -> bytes:
    return ormsgpack.packb(list(labels))


def decode_labels(raw: bytes) -> tuple[str, ...]:
    return tuple(ormsgpack.unpackb(raw))


def encode_schema() -> bytes:
    return ormsgpack.packb({"format": FORMAT})


def decode_schema(raw: bytes) -> int:
    return int(ormsgpack.unpackb(raw)["format"])
