"""Delta records and their chains: the record format (``MARK`` then
``[ref, n, depth, digest, type, piece]``) and what follows the refs from
record to record without decoding any value (deletes, copies, the key of a
base), and the values the codec makes of them (a rebuilt list, a blob a put
will write). What the records mean and why: ``saver/delta.py``."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Literal, NamedTuple

import ormsgpack

from . import schema as S

MARK = b"\xd1"
MAX_CHAIN = 64
STRIDE = 8  # every STRIDE-th version of a chain extends the STRIDE-th before it
MIN_BYTES = 512  # a smaller list is stored whole: a chain would save too little
PIECE_THRESHOLD = 128  # pieces from here are compressed (zstd with its dictionary)
_DIGEST = 16
_LIMIT = 4096  # a chain longer than this is a cycle: a damaged store


class DeltaRecord(NamedTuple):
    ref: Any
    n: int
    depth: int
    digest: bytes
    typ: str
    piece: bytes


def is_delta(raw: bytes | None) -> bool:
    return raw is not None and raw[:1] == MARK


def decode(raw: bytes) -> DeltaRecord:
    ref, n, depth, digest, typ, piece = ormsgpack.unpackb(memoryview(raw)[1:])
    return DeltaRecord(ref, n, depth, digest, typ, piece)


def encode(rec: DeltaRecord) -> bytes:
    return MARK + ormsgpack.packb(list(rec))


def base_key(key: bytes, raw: bytes) -> bytes:
    """The key of a delta record's base."""
    return S.sibling_blob_key(key, decode(raw).ref)


# -- what the codec makes of them ------------------------------------------------


class _Entry(NamedTuple):
    """A list value rebuilt from its stored record (whole or a delta)."""

    raw: bytes  # the stored record this was rebuilt from (validates a hit)
    digest: bytes | None  # None: a whole record's, not computed yet
    depth: int
    plain: bytes  # the whole value's msgpack


class Pending(NamedTuple):
    """A blob ``put`` will write: ``raw`` ready, or ``plain`` (a list's
    msgpack) to store as a delta or whole, decided in the write transaction."""

    channel: str
    key: bytes
    raw: bytes | None
    plain: bytes | None
    # The delta made before the transaction on the base this
    # process cached at its previous put: (base key, base record as cached,
    # delta record). ``write`` takes it when the stored base is that record.
    spec: tuple[bytes, bytes, bytes] | None = None
    # What a head record holds for this value (``heads.plain_of``):
    # msgpack bytes, None (no value) or False (none a head can hold, or the
    # put makes no head).
    head: bytes | Literal[False] | None = False


# -- chains -------------------------------------------------------------------------


class _Pairs:
    """A read-only transaction over a dict (a copy's source records)."""

    def __init__(self, items: dict[bytes, bytes]) -> None:
        self.items = items

    def get(self, key: bytes) -> bytes | None:
        return self.items.get(key)

    def scan(
        self,
        start: bytes | None = None,
        stop: bytes | None = None,
        *,
        reverse: bool = False,
        limit: int | None = None,
    ) -> Iterator[tuple[bytes, bytes]]:
        """``Txn.scan`` over the dict (``resolve`` fetches a chain's pieces so)."""
        keys = sorted(
            k for k in self.items if (start is None or k >= start) and (stop is None or k < stop)
        )
        if reverse:
            keys.reverse()
        for key in keys[:limit]:
            yield key, self.items[key]


def chain_closure(blobs: Iterable[tuple[bytes, bytes]], referenced: set[bytes]) -> set[bytes]:
    """``referenced`` plus, transitively, the base of every delta in it."""
    deltas = {k: r for k, r in blobs if r[:1] == MARK}
    out = set(referenced)
    stack = [k for k in out if k in deltas]
    while stack:
        b = base_key(k := stack.pop(), deltas[k])
        if b not in out:
            out.add(b)
            if b in deltas:
                stack.append(b)
    return out
