"""The vectors of a ``KVStore``'s items: which texts of a value are embedded
(LangGraph's rules), the embedding calls, the vector records, kept in the
items' own write transactions, and the ranking of a search.

Keys (``saver/schema.py``'s table has them): one record per (namespace, key,
field path) under ``("s", "v", "e", *namespace, None, key, field)``; the None
ends the namespace, so a prefix of labels is a prefix range and namespace
``("a",)``, key ``"b"`` is not namespace ``("a", "b")``. Long strings take the
saver's short-key surrogates, and the namespace the items' budget and tail
surrogate (``keyspace.namespace_elements``), smaller by the key and field
that follow it; so a record holds its full namespace, key and field besides
the vector (float32 bytes, as the embedder gave it).

Every change of an item's vectors also bumps a counter and appends the item
to a change log, so that a process's cached matrix of the vectors can catch
up with any read transaction by replaying the log (``_Cache``). So every
change goes through ``write``/``delete``; removing the whole keyspace, the
counter with it, is seen too (a new counter has a new epoch).

Search is exact, a scan of the cached matrix: an ANN index was measured and
not taken (docs/performance.md, "Vector search"). On a store that keeps
vectors itself (``SupportsVectors``: PostgreSQL with pgvector) each record's
vector is also put there, in the same transaction, and the server ranks
them (``_server_ranked``), exactly by default; an HNSW index (approximate)
only when the config's ``ann_index_config`` asks for ``{"kind": "hnsw"}``.
The records stay what the change log, deletes and ``kvsaver sweep`` work on
(the server removes a vector with its record), and what a store without
pgvector reads; a store that gains pgvector is filled from them.

Scores are cosine similarities as InMemoryStore computes them (0 for a zero
vector); an item scores as its best field.
"""

from __future__ import annotations

import heapq
import math
import os
import struct
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, cast

import ormsgpack
from kvsaver.kv.keys import extensions, pack, prefix_range, unpack
from kvsaver.kv.store import MissingDependencyError, Store, SupportsVectors, Txn, VectorTxn
from langgraph.store.base import IndexConfig
from langgraph.store.base.embed import ensure_embeddings, get_text_at_path, tokenize_path

from ..keyspace import STORE, k
from .keyspace import namespace_elements

if TYPE_CHECKING:
    import numpy as np

__all__ = ["LOG_KEEP", "LOG_TRIM", "Vectors"]

VECTORS = "v"
_RECORD = "e"
_COUNTER = "n"
_LOG = "l"
COUNTER_KEY = pack((STORE, VECTORS, _COUNTER))
LOG_KEEP = 4096  # change-log entries kept at least: a cache further behind rebuilds
LOG_TRIM = 256  # entries trimmed at once: a put does not dirty the log's oldest page
COMPACT_DEAD = 1024  # dead rows a cache keeps before it compacts (if also half)
# Bytes of label elements in a record key: with the tail surrogate (<= 67
# packed), ("s", "v", "e") (9), None (1) and the key and field elements (<= 96
# each, ``saver/keyspace.k``), a record key stays within LMDB's 511 bytes.
_NS_BUDGET = 240

# The write transactions that changed vectors, by id (each held, so its id
# is not reused while it is here): (txn, its first seq, whether it made the
# counter). A search inside one knows what is not committed. The last few
# only: a search follows its own writes within one transaction.
_PENDING: dict[int, tuple[Txn, int, bool]] = {}
_PENDING_KEEP = 16
_PENDING_LOCK = threading.Lock()


def numpy() -> Any:
    """numpy, imported on first use: only an index needs it."""
    try:
        import numpy
    except ImportError as e:  # .ci/bare_install.py runs without the extra
        raise MissingDependencyError(
            "KVStore's vector search (index=...) needs numpy: pip install 'kvsaver[vector]'"
        ) from e
    return numpy


_HEADS: dict[tuple[str, ...], bytes] = {}  # namespaces' record heads, packed
_HEADS_MAX = 4096


def item_prefix(ns: tuple[str, ...], key: str) -> bytes:
    """The packed key of an item's records without their field; the
    namespace's part kept for the namespaces used lately."""
    head = _HEADS.get(ns)
    if head is None:
        head = pack((STORE, VECTORS, _RECORD, *namespace_elements(ns, _NS_BUDGET)[0], None))
        if len(_HEADS) >= _HEADS_MAX:
            _HEADS.clear()
        _HEADS[ns] = head
    return head + pack((k(key),))


def item_range(ns: tuple[str, ...], key: str) -> tuple[bytes, bytes]:
    """The keys of an item's records."""
    return extensions(item_prefix(ns, key))


def namespace_range(ns_prefix: tuple[str, ...]) -> tuple[bytes, bytes, bool]:
    """``(start, stop, exact)``: the records of every namespace that starts
    with these labels. Not exact: the range holds more (the prefix runs past
    the budget), filter by the records' namespaces."""
    elements, exact = namespace_elements(ns_prefix, _NS_BUDGET)
    if not exact:
        elements = elements[:-1]
    return (*prefix_range((STORE, VECTORS, _RECORD, *elements)), exact)


_LOG_HEAD = pack((STORE, VECTORS, _LOG))


def log_key(seq: int) -> bytes:
    return _LOG_HEAD + pack((seq,))


def log_range(after: int, upto: int) -> tuple[bytes, bytes]:
    """The log entries ``after < seq <= upto``."""
    return log_key(after + 1), log_key(upto + 1)


def read_counter(txn: Txn) -> tuple[bytes | None, int]:
    """(epoch, seq): the epoch is made with the counter, so a cache of a store
    that was emptied and written again does not take it for the old one."""
    raw = txn.get(COUNTER_KEY)
    if raw is None:
        return None, 0
    epoch, seq = ormsgpack.unpackb(raw)
    return epoch, seq


class Vectors:
    """Vectors of items, kept in the items' own write transactions."""

    def __init__(self, config: IndexConfig) -> None:
        self._np = numpy()
        dims = config.get("dims")
        if not isinstance(dims, int) or isinstance(dims, bool) or dims <= 0:
            raise ValueError(f"index config: dims must be a positive int, not {dims!r}")
        self.dims = dims
        self._f32 = struct.Struct(f"={dims}f")
        # PostgresStore's index config names its pgvector operator; the scores
        # here are cosine similarities only, so another is refused, not ignored.
        distance = config.get("distance_type", "cosine")  # type: ignore[misc]
        if distance != "cosine":
            raise ValueError(
                f"index config: distance_type {distance!r} is not supported: "
                "KVStore scores by cosine similarity ('cosine')"
            )
        self.hnsw = ann_index(config)
        self.server = False  # the store ranks the vectors (attach)
        # How far the server's cosine may be from numpy's (float32 sums of
        # ``dims`` terms, both): a generous bound, only ever costing rows read.
        self._margin = max(1e-5, dims * 2.0**-21)
        self.embeddings = ensure_embeddings(config.get("embed"))
        self.fields: list[tuple[str, str | list[str]]] = [
            (p, p) if p == "$" else (p, tokenize_path(p)) for p in (config.get("fields") or ["$"])
        ]
        self._lock = threading.Lock()
        self._cache: _Cache | None = None

    def attach(self, store: Store) -> None:
        """Rank on the store's server when it keeps vectors (``SupportsVectors``
        and pgvector there); its vectors filled from the records when it makes
        their table."""
        if isinstance(store, SupportsVectors):
            self.server = store.open_vectors(self.dims, self.hnsw, self._fill)

    def _fill(self, txn: Txn) -> None:
        vtxn = cast(VectorTxn, txn)
        for rkey, raw in txn.scan(*namespace_range(())[:2]):
            vtxn.put_vector(rkey, self.decode(raw)[3])

    # -- texts and embeddings ------------------------------------------------

    def texts(
        self, value: dict[str, Any], index: Literal[False] | list[str] | None
    ) -> list[tuple[str, str]]:
        """(field path, text) to embed for one put, as InMemoryStore picks
        them: the config's fields, or the put's own list (each path tokenized,
        so a "$" there names a field "$"); several texts at one path are
        "path.0", "path.1", ..."""
        if index is False:
            return []
        paths = self.fields if index is None else [(p, tokenize_path(p)) for p in index]
        out: list[tuple[str, str]] = []
        for path, tokens in paths:
            found = get_text_at_path(value, tokens)
            if len(found) > 1:
                out.extend((f"{path}.{i}", text) for i, text in enumerate(found))
            elif found:
                out.append((path, found[0]))
        return out

    def embed_texts(self, texts: list[str]) -> list[bytes]:
        if not texts:
            return []
        return self._checked(self.embeddings.embed_documents(texts), len(texts))

    async def aembed_texts(self, texts: list[str]) -> list[bytes]:
        if not texts:
            return []
        return self._checked(await self.embeddings.aembed_documents(texts), len(texts))

    def embed_query(self, query: str) -> np.ndarray:
        return self._vector(self.embeddings.embed_query(query))

    async def aembed_query(self, query: str) -> np.ndarray:
        return self._vector(await self.embeddings.aembed_query(query))

    def _checked(self, vectors: Sequence[Sequence[float]], n: int) -> list[bytes]:
        """The embedder's vectors, checked, as the float32 bytes stored:
        converted once here."""
        if len(vectors) != n:
            raise ValueError(f"the embedder returned {len(vectors)} vectors for {n} texts")
        return [self.vector_bytes(v) for v in vectors]

    def vector_bytes(self, v: Sequence[float] | np.ndarray | bytes) -> bytes:
        """``v`` as float32 bytes, checked (see ``_vector``). A list of floats,
        what embedders return, is packed by struct, which rounds as numpy
        does: a put then makes no numpy call, each of which costs more than
        the packing. Bytes are taken as float32 bytes already."""
        if type(v) is bytes:
            if len(v) != 4 * self.dims:
                raise ValueError(
                    f"a vector of {len(v) // 4} dims; the index config says dims={self.dims}"
                )
            return v
        if type(v) is list and len(v) == self.dims:
            try:
                raw = self._f32.pack(*v)
            except (struct.error, OverflowError):
                pass  # not floats, or past float32's range: _vector says which
            else:
                # float32-range values cannot overflow a float64 sum: only a NaN
                # or an infinity in ``v`` makes it one
                if math.isfinite(sum(v)):
                    return raw
        return self._vector(v).tobytes()

    def _vector(self, v: Sequence[float] | np.ndarray) -> np.ndarray:
        """``v`` as float32, checked: dims as configured, finite."""
        np = self._np
        arr = np.asarray(v, dtype=np.float32)
        if arr.shape != (self.dims,):
            raise ValueError(
                f"the embedder returned a vector of {arr.size} dims; the index config says "
                f"dims={self.dims}"
            )
        if not np.isfinite(arr).all():
            raise ValueError("the embedder returned a vector with a NaN or infinite value")
        return arr

    # -- records ---------------------------------------------------------------

    def write(
        self,
        txn: Txn,
        ns: tuple[str, ...],
        key: str,
        vectors: Sequence[tuple[str, Sequence[float] | np.ndarray | bytes]],
        stored: bool,
    ) -> None:
        """Replaces the item's vectors with these ([] removes them);
        ``stored`` False: the item has none stored (new, or put without),
        so there are none to remove (on PostgreSQL a range delete is a
        round trip of its own)."""
        prefix = item_prefix(ns, key)
        records = [
            (prefix + pack((k(field),)), self.vector_bytes(vec), field) for field, vec in vectors
        ]
        removed = txn.delete_range(*item_range(ns, key)) if stored else 0
        if not removed and not records:
            return
        nsl = list(ns)
        for rkey, vec, field in records:
            txn.put(rkey, ormsgpack.packb([nsl, key, field, vec]))
            if self.server:
                cast(VectorTxn, txn).put_vector(rkey, vec)
        _logged(txn, ns, key)

    # -- search ----------------------------------------------------------------

    def decode(self, raw: bytes) -> tuple[tuple[str, ...], str, str, bytes]:
        ns, key, field, vec = ormsgpack.unpackb(raw)
        if len(vec) != 4 * self.dims:
            raise ValueError(
                f"a stored vector of {ns!r}/{key!r} has {len(vec) // 4} dims; the index "
                f"config says dims={self.dims}"
            )
        return tuple(ns), key, field, vec

    def query_vector(self, query: Sequence[float] | np.ndarray) -> np.ndarray:
        """The query as a unit float32 vector (zero stays zero: every score 0)."""
        q = self._vector(query)
        norm = float(self._np.linalg.norm(q))
        return q / norm if norm else q

    def rows(
        self, txn: Txn, start: bytes, stop: bytes, ns_prefix: tuple[str, ...] | None = None
    ) -> _Rows:
        """The records in ``[start, stop)``, as unit rows; those of namespaces
        that start with ``ns_prefix`` only, if given."""
        return self.rows_of(txn.scan(start, stop), ns_prefix)

    def rows_of(
        self, records: Iterable[tuple[bytes, bytes]], ns_prefix: tuple[str, ...] | None = None
    ) -> _Rows:
        """Vector records (key, value) as unit rows, ties and items."""
        ties: list[bytes] = []
        items: list[Item] = []
        blobs: list[bytes] = []
        for rkey, raw in records:
            ns, key, _field, vec = self.decode(raw)
            if ns_prefix is not None and ns[: len(ns_prefix)] != ns_prefix:
                continue
            ties.append(rkey)
            items.append((ns, key))
            blobs.append(vec)
        np = self._np
        # bytearray: one copy of the bytes, and a writable matrix over it
        matrix = np.frombuffer(bytearray().join(blobs), dtype=np.float32)
        return _Rows(unit_rows(np, matrix.reshape(len(blobs), self.dims)), ties, items)

    def ranked(
        self, txn: Txn, query: Sequence[float] | np.ndarray, ns_prefix: tuple[str, ...]
    ) -> Iterator[tuple[tuple[str, ...], str, float]]:
        """(namespace, key, score) of every item under ``ns_prefix`` that has a
        vector, best first; ties in key order. Scored on this process's
        matrix of the vectors, brought to ``txn``'s snapshot first (``_Cache``);
        the items the matrix cannot hold as ``txn`` sees them (its own
        uncommitted writes, or changes the matrix is ahead by) are read from
        ``txn`` and merged in."""
        q = self.query_vector(query)
        if self.server:
            yield from self._server_ranked(cast(VectorTxn, txn), q, ns_prefix)
            return
        overlay: set[Item] = set()
        with self._lock:
            plan = self._plan(txn)
            if plan is not None:
                cache, overlay = plan
                matrix, rows, ties, items = cache.candidates(ns_prefix, overlay)
        if plan is None:  # the matrix cannot stand for txn: read it all
            start, stop, exact = namespace_range(ns_prefix)
            every = self.rows(txn, start, stop, None if exact else ns_prefix)
            streams = [_best_first(self._np, dot(every.matrix, q), None, every.ties, every.items)]
        else:  # scored outside the lock: those rows do not change (see _Cache)
            if rows.size * 3 < len(matrix):  # few rows: gather them rather than score all
                scores = dot(matrix[rows], q)
            else:
                scores = dot(matrix, q)[rows]
            streams = [_best_first(self._np, scores, rows, ties, items)]
        for ns, key in sorted(overlay):
            if ns[: len(ns_prefix)] == ns_prefix:
                own = self.rows(txn, *item_range(ns, key))
                scores = dot(own.matrix, q)
                streams.append(_best_first(self._np, scores, None, own.ties, own.items))
        merged = streams[0] if len(streams) == 1 else heapq.merge(*streams, key=_order)
        seen: set[Item] = set()
        for score, _tie, item in merged:
            if item not in seen:
                seen.add(item)
                yield item[0], item[1], score

    def _server_ranked(
        self, txn: VectorTxn, q: np.ndarray, ns_prefix: tuple[str, ...]
    ) -> Iterator[tuple[tuple[str, ...], str, float]]:
        """``ranked`` by the server: pages of records nearest first, each
        scored here as the numpy path scores it (the same float32 bytes, the
        same arithmetic), and yielded in that order once no record not read
        yet can come before it: the server's order is by its own cosine, at
        most ``_margin`` from ours. With HNSW (approximate), each page as it
        comes, scored here."""
        start, stop, exact = namespace_range(ns_prefix)
        query = q.tobytes()
        waiting: list[Scored] = []  # read, not yet yielded: a heap by _order
        seen: set[Item] = set()
        offset, page = 0, 64
        approximate = self.hnsw is not None
        while True:
            got = txn.search_vectors(start, stop, query, page, offset, exact=not approximate)
            offset += len(got)
            rows = self.rows_of(got, None if exact else ns_prefix)
            scores = dot(rows.matrix, q).tolist()
            for score, tie, item in zip(scores, rows.ties, rows.items):
                heapq.heappush(waiting, (-score, tie, item))  # type: ignore[arg-type]
            last = len(got) < page
            if approximate or last or not got:
                bound = float("inf")  # yield all read
            else:  # what a record not read yet may score at most
                bound = -(self._score(got[-1][1], q) + 2 * self._margin)
            while waiting and waiting[0][0] < bound:
                neg, _tie, item = heapq.heappop(waiting)
                if item not in seen:
                    seen.add(item)
                    yield item[0], item[1], -neg
            if last and approximate:
                # The index's nearest ran out (a narrow prefix keeps few of
                # them): the rest in exact order, a scan of the prefix's range.
                approximate, offset, page = False, 0, 64
                continue
            if last:
                return
            page = min(page * 4, 4096)

    def _score(self, raw: bytes, q: np.ndarray) -> float:
        return float(dot(self.rows_of([(b"", raw)]).matrix, q)[0])

    def _plan(self, txn: Txn) -> tuple[_Cache, set[Item]] | None:
        """The cache, at a committed state, and the items whose vectors in
        ``txn`` may differ from the cache's; None when no such pair is known
        (the caller reads every vector from ``txn``)."""
        epoch, seq = read_counter(txn)
        pending = _PENDING.get(id(txn))
        if pending is not None:  # txn holds writes of ours: committed up to its first
            committed, created = pending[1] - 1, pending[2]
            if created:  # the counter is txn's own: nothing committed to cache
                return None
        else:
            committed = seq
        cache = self._cache
        if cache is None or cache.epoch != epoch or committed - cache.seq > LOG_KEEP:
            if pending is not None:
                return None
            cache = self._cache = self._built(txn, epoch, seq)
        elif cache.seq < committed and not cache.replay(txn, self, committed):
            if pending is not None:
                return None
            cache = self._cache = self._built(txn, epoch, seq)
        overlay: set[Item] = set()
        if cache.seq > committed:  # another reader brought it past txn's snapshot
            changed = cache.changed_since(committed)
            if changed is None:
                return None
            overlay |= changed
        if seq > committed:
            own = log_entries(txn, committed, seq)
            if len(own) != seq - committed:
                return None
            overlay |= {item for _, item in own}
        return cache, overlay

    def _built(self, txn: Txn, epoch: bytes | None, seq: int) -> _Cache:
        return _Cache(self._np, self.dims, epoch, seq, self.rows(txn, *namespace_range(())[:2]))


def ann_index(config: IndexConfig) -> dict[str, int] | None:
    """The config's ``ann_index_config`` as PostgresStore names it: None for
    exact search (none, no kind, or ``{"kind": "flat"}``), HNSW's options for
    ``{"kind": "hnsw", "m": ..., "ef_construction": ...}``; anything else
    refused. Only a store with pgvector has an index; elsewhere search is
    exact whatever the config says."""
    ann = config.get("ann_index_config")  # type: ignore[misc]
    if ann is None:
        return None
    if not isinstance(ann, dict):
        raise ValueError(f"index config: ann_index_config must be a dict, not {ann!r}")
    ann = dict(ann)
    # Exact unless an index is asked for by name (PostgresStore's default
    # kind is hnsw). Vectors are kept as float32 whatever the vector_type.
    kind = ann.pop("kind", "flat")
    vector_type = ann.pop("vector_type", "vector")
    if vector_type not in ("vector", "halfvec"):
        raise ValueError(
            f"index config: ann_index_config's vector_type {vector_type!r} is not "
            "'vector' or 'halfvec'"
        )
    allowed = {"flat": set(), "hnsw": {"m", "ef_construction"}}
    if kind not in allowed:
        raise ValueError(
            f"index config: ann_index_config kind {kind!r} is not supported: "
            "'hnsw' (an approximate index, on PostgreSQL with pgvector) or 'flat' (exact)"
        )
    unknown = set(ann) - allowed[kind]
    if unknown:
        raise ValueError(
            f"index config: ann_index_config of kind {kind!r} takes no {sorted(unknown)}"
        )
    for name, value in ann.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"index config: ann_index_config {name} must be a positive int")
    return ann if kind == "hnsw" else None


Item = tuple[tuple[str, ...], str]
Scored = tuple[float, bytes, Item]


def _order(row: Scored) -> tuple[float, bytes]:
    return -row[0], row[1]


class _Rows(NamedTuple):
    matrix: np.ndarray  # unit float32 rows
    ties: list[bytes]  # each row's record key: the order of equal scores
    items: list[Item]


def dot(matrix: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Each row's dot product with ``q``: numpy's own single-threaded SIMD
    loop (``vecdot``, numpy 2), not BLAS's matrix-vector product, whose
    threads wait on each other on a busy machine (docs/performance.md)."""
    np = numpy()
    vecdot = getattr(np, "vecdot", None)
    if vecdot is not None:
        return vecdot(matrix, q)
    return np.einsum("ij,j->i", matrix, q)


def dot_rows(np: Any, matrix: np.ndarray) -> np.ndarray:
    """Each row's dot product with itself."""
    vecdot = getattr(np, "vecdot", None)
    if vecdot is not None:
        return vecdot(matrix, matrix)
    return np.einsum("ij,ij->i", matrix, matrix)


def unit_rows(np: Any, matrix: np.ndarray) -> np.ndarray:
    """Each row over its norm, in place (a zero row stays zero); the norms
    without a squared copy of the matrix."""
    norms = np.sqrt(dot_rows(np, matrix))
    norms[norms == 0] = 1
    matrix /= norms[:, None]
    return matrix


def log_entries(txn: Txn, after: int, upto: int) -> list[tuple[int, Item]]:
    out = []
    for lkey, raw in txn.scan(*log_range(after, upto)):
        ns, key = ormsgpack.unpackb(raw)
        out.append((unpack(lkey)[3], (tuple(ns), key)))
    return out


def _best_first(
    np: Any, scores: np.ndarray, rows: np.ndarray | None, ties: list[bytes], items: list[Item]
) -> Iterator[Scored]:
    """(score, tie, item) of each row, best first, equal scores in tie order;
    sorted a chunk at a time (the top few first), since a search mostly
    wants only those. ``rows``: the row of each score (None: its position)."""
    idx = np.arange(scores.size) if rows is None else rows
    want = 16
    while scores.size:
        if scores.size > want:
            kth = np.partition(scores, scores.size - want)[scores.size - want]
            take = scores >= kth
            top, top_rows = scores[take], idx[take]
            scores, idx = scores[~take], idx[~take]
        else:
            top, top_rows, scores = scores, idx, scores[:0]
        order = np.argsort(-top, kind="stable")
        top, top_rows = top[order], top_rows[order]
        chunk = [(s, ties[r], items[r]) for s, r in zip(top.tolist(), top_rows.tolist())]
        if (top[1:] == top[:-1]).any():
            chunk.sort(key=_order)
        yield from chunk
        want *= 8


class _Cache:
    """One process's matrix of every stored vector, at one committed state
    (epoch, seq) of the counter. Rows are never moved while they live: a
    change marks the item's rows dead and appends its new ones, and a
    compaction builds new arrays, so a ranking under way keeps reading the
    arrays and lists it started with. ``history`` remembers the items of the
    changes it replayed, so a reader whose snapshot is behind the cache
    knows which items to read from its own snapshot instead."""

    def __init__(self, np: Any, dims: int, epoch: bytes | None, seq: int, rows: _Rows) -> None:
        self.np, self.dims, self.epoch, self.seq = np, dims, epoch, seq
        self.history: deque[tuple[int, Item]] = deque()
        self.history_base = seq  # history holds every change after this seq
        self.ns_ids: dict[tuple[str, ...], int] = {}
        self.ns_list: list[tuple[str, ...]] = []
        self.prefixes: dict[tuple[str, ...], tuple[int, np.ndarray]] = {}
        self._load(rows)

    def _load(self, rows: _Rows) -> None:
        np = self.np
        n = len(rows.items)
        self.matrix = rows.matrix  # as read: no copy; the first append grows it
        self.alive = np.ones(n, dtype=bool)
        self.row_ns = np.fromiter((self._ns_id(ns) for ns, _ in rows.items), np.int32, n)
        self.n, self.dead = n, 0
        self.ties, self.items = list(rows.ties), list(rows.items)
        self.item_rows: dict[Item, list[int]] = {}
        for i, item in enumerate(self.items):
            self.item_rows.setdefault(item, []).append(i)

    def _ns_id(self, ns: tuple[str, ...]) -> int:
        i = self.ns_ids.get(ns)
        if i is None:
            i = self.ns_ids[ns] = len(self.ns_list)
            self.ns_list.append(ns)
        return i

    def replay(self, txn: Txn, vectors: Vectors, upto: int) -> bool:
        """Brings the cache to ``upto`` from the log in ``txn``; False when the
        log no longer reaches back to the cache's seq."""
        entries = log_entries(txn, self.seq, upto)
        if len(entries) != upto - self.seq:
            return False
        for item in dict.fromkeys(item for _, item in entries):
            self._remove(item)
            self._append(vectors.rows(txn, *item_range(*item)))
        self.history.extend(entries)
        while len(self.history) > LOG_KEEP:
            self.history_base = self.history.popleft()[0]
        self.seq = upto
        if self.dead > max(COMPACT_DEAD, self.n - self.dead):
            self._compact()
        return True

    def changed_since(self, seq: int) -> set[Item] | None:
        """The items changed after ``seq`` up to the cache's; None when the
        history does not reach back that far."""
        if seq < self.history_base:
            return None
        return {item for s, item in self.history if s > seq}

    def _remove(self, item: Item) -> None:
        for r in self.item_rows.pop(item, ()):
            self.alive[r] = False
            self.dead += 1

    def _append(self, rows: _Rows) -> None:
        np = self.np
        m = len(rows.items)
        if not m:
            return
        if self.n + m > len(self.alive):  # new arrays: rankings under way keep the old
            cap = max(64, self.n + self.n // 4 + m)
            self.matrix = _grown(np, self.matrix, self.n, cap)
            self.alive = _grown(np, self.alive, self.n, cap)
            self.row_ns = _grown(np, self.row_ns, self.n, cap)
        lo, hi = self.n, self.n + m
        self.matrix[lo:hi] = rows.matrix
        self.alive[lo:hi] = True
        self.row_ns[lo:hi] = [self._ns_id(ns) for ns, _ in rows.items]
        self.ties.extend(rows.ties)
        self.items.extend(rows.items)
        for i, item in enumerate(rows.items, lo):
            self.item_rows.setdefault(item, []).append(i)
        self.n = hi

    def _compact(self) -> None:
        live = self.np.flatnonzero(self.alive[: self.n])
        rows = _Rows(self.matrix[live], [self.ties[i] for i in live], [self.items[i] for i in live])
        self._load(rows)

    def _in_prefix(self, prefix: tuple[str, ...]) -> np.ndarray:
        """For each namespace id, whether it starts with ``prefix``."""
        known = self.prefixes.get(prefix)
        if known is not None and known[0] == len(self.ns_list):
            return known[1]
        np = self.np
        p = len(prefix)
        lut = np.fromiter((ns[:p] == prefix for ns in self.ns_list), bool, len(self.ns_list))
        if len(self.prefixes) >= 256:
            self.prefixes.clear()
        self.prefixes[prefix] = (len(self.ns_list), lut)
        return lut

    def candidates(
        self, prefix: tuple[str, ...], leave_out: set[Item]
    ) -> tuple[np.ndarray, np.ndarray, list[bytes], list[Item]]:
        """The matrix's rows in use, the live ones under ``prefix`` except
        ``leave_out``'s, and the rows' ties and items: what a ranking reads,
        unchanged by later changes to the cache."""
        n = self.n
        mask = self.alive[:n].copy()
        if prefix:
            mask &= self._in_prefix(prefix)[self.row_ns[:n]]
        for item in leave_out:
            mask[self.item_rows.get(item, [])] = False
        return self.matrix[:n], self.np.flatnonzero(mask), self.ties, self.items


def _grown(np: Any, arr: np.ndarray, n: int, cap: int) -> np.ndarray:
    out = np.zeros((cap, *arr.shape[1:]), dtype=arr.dtype)
    out[:n] = arr[:n]
    return out


def delete_vectors(txn: Txn, ns: tuple[str, ...], key: str) -> None:
    """An item's vectors removed (needs no index config, no numpy: a store
    opened without its index, as ``kvsaver sweep`` opens it, still removes
    them)."""
    if txn.delete_range(*item_range(ns, key)):
        _logged(txn, ns, key)


def _logged(txn: Txn, ns: tuple[str, ...], key: str) -> None:
    """Bumps the counter and logs the item. Every ``LOG_TRIM`` entries, the
    entries older than the last ``LOG_KEEP`` go, in one range: trimmed one
    by one, each put would also rewrite the page of the log's oldest entry."""
    epoch, seq = read_counter(txn)
    created = epoch is None
    if epoch is None:
        epoch = os.urandom(8)
    seq += 1
    with _PENDING_LOCK:
        if id(txn) not in _PENDING:
            _PENDING[id(txn)] = (txn, seq, created)
            while len(_PENDING) > _PENDING_KEEP:
                del _PENDING[next(iter(_PENDING))]
    txn.put(COUNTER_KEY, ormsgpack.packb([epoch, seq]))
    txn.put(log_key(seq), ormsgpack.packb([list(ns), key]))
    if seq > LOG_KEEP and seq % LOG_TRIM == 0:
        txn.delete_range(*log_range(0, seq - LOG_KEEP))
