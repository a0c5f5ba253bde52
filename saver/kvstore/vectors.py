"""The vectors of a ``KVStore``'s items: which texts of a value are embedded
(LangGraph's rules), the embedding calls, the vector records, kept in the
items' own write transactions, and the ranking of a search.

Keys (``saver/schema.py``'s table has them): one record per (namespace, key,
field path) under ``("s", "v", "e", *namespace, None, key, field)``; the None
ends the namespace, so a prefix of labels is a prefix range and namespace
``("a",)``, key ``"b"`` is not namespace ``("a", "b")``. Long strings take the
saver's short-key surrogates, so a record holds its full namespace, key and
field besides the vector (float32 bytes, as the embedder gave it).

Every change of an item's vectors also bumps a counter and appends the item
to a change log, so that a process's cached matrix of the vectors can catch
up with any read transaction by replaying the log.

Scores are cosine similarities as InMemoryStore computes them (0 for a zero
vector); an item scores as its best field.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

import ormsgpack
from kvsaver.kv.keys import pack, prefix_range, unpack
from kvsaver.kv.store import MissingDependencyError, Txn
from langgraph.store.base import IndexConfig
from langgraph.store.base.embed import ensure_embeddings, get_text_at_path, tokenize_path

from ..keyspace import k

if TYPE_CHECKING:
    import numpy as np

__all__ = ["LOG_KEEP", "Vectors"]

STORE = "s"
VECTORS = "v"
_RECORD = "e"
_COUNTER = "n"
_LOG = "l"
COUNTER_KEY = pack((STORE, VECTORS, _COUNTER))
LOG_KEEP = 4096  # change-log entries kept: a cache further behind rebuilds


def numpy() -> Any:
    """numpy, imported on first use: only an index needs it."""
    try:
        import numpy
    except ImportError as e:  # .ci/bare_install.py runs without the extra
        raise MissingDependencyError(
            "KVStore's vector search (index=...) needs numpy: pip install 'kvsaver[vector]'"
        ) from e
    return numpy


def item_prefix(ns: tuple[str, ...], key: str) -> tuple[Any, ...]:
    return (STORE, VECTORS, _RECORD, *map(k, ns), None, k(key))


def namespace_range(ns_prefix: tuple[str, ...]) -> tuple[bytes, bytes]:
    """The records of every namespace that starts with these labels."""
    return prefix_range((STORE, VECTORS, _RECORD, *map(k, ns_prefix)))


def log_key(seq: int) -> bytes:
    return pack((STORE, VECTORS, _LOG, seq))


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
        self.embeddings = ensure_embeddings(config.get("embed"))
        self.fields: list[tuple[str, str | list[str]]] = [
            (p, p) if p == "$" else (p, tokenize_path(p)) for p in (config.get("fields") or ["$"])
        ]

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

    def embed_texts(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        return self._checked(self.embeddings.embed_documents(texts), len(texts))

    async def aembed_texts(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        return self._checked(await self.embeddings.aembed_documents(texts), len(texts))

    def embed_query(self, query: str) -> list[float]:
        return self._checked([self.embeddings.embed_query(query)], 1)[0]

    async def aembed_query(self, query: str) -> list[float]:
        return self._checked([await self.embeddings.aembed_query(query)], 1)[0]

    def _checked(self, vectors: Sequence[Sequence[float]], n: int) -> list[list[float]]:
        if len(vectors) != n:
            raise ValueError(f"the embedder returned {len(vectors)} vectors for {n} texts")
        out = [list(v) for v in vectors]
        for v in out:
            self._vector(v)
        return out

    def _vector(self, v: Sequence[float]) -> np.ndarray:
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
        vectors: list[tuple[str, list[float]]],
    ) -> None:
        """Replaces the item's vectors with these ([] removes them)."""
        prefix = item_prefix(ns, key)
        records = [
            (pack((*prefix, k(field))), self._vector(vec).tobytes(), field)
            for field, vec in vectors
        ]
        removed = txn.delete_range(*prefix_range(prefix))
        if not removed and not records:
            return
        nsl = list(ns)
        for rkey, vec, field in records:
            txn.put(rkey, ormsgpack.packb([nsl, key, field, vec]))
        self._logged(txn, ns, key)

    def delete(self, txn: Txn, ns: tuple[str, ...], key: str) -> None:
        if txn.delete_range(*prefix_range(item_prefix(ns, key))):
            self._logged(txn, ns, key)

    def _logged(self, txn: Txn, ns: tuple[str, ...], key: str) -> None:
        """Bumps the counter and logs the item; the entry that falls out of
        the last ``LOG_KEEP`` goes, so the log stays that long."""
        epoch, seq = read_counter(txn)
        if epoch is None:
            epoch = os.urandom(8)
        seq += 1
        txn.put(COUNTER_KEY, ormsgpack.packb([epoch, seq]))
        txn.put(log_key(seq), ormsgpack.packb([list(ns), key]))
        if seq > LOG_KEEP:
            txn.delete(log_key(seq - LOG_KEEP))

    # -- search ----------------------------------------------------------------

    def decode(self, raw: bytes) -> tuple[tuple[str, ...], str, str, bytes]:
        ns, key, field, vec = ormsgpack.unpackb(raw)
        if len(vec) != 4 * self.dims:
            raise ValueError(
                f"a stored vector of {ns!r}/{key!r} has {len(vec) // 4} dims; the index "
                f"config says dims={self.dims}"
            )
        return tuple(ns), key, field, vec

    def query_vector(self, query: Sequence[float]) -> np.ndarray:
        """The query as a unit float32 vector (zero stays zero: every score 0)."""
        q = self._vector(query)
        norm = float(self._np.linalg.norm(q))
        return q / norm if norm else q

    def unit_rows(self, matrix: np.ndarray) -> np.ndarray:
        """Each row over its norm, in place (a zero row stays zero)."""
        np = self._np
        norms = np.linalg.norm(matrix, axis=1)
        norms[norms == 0] = 1
        matrix /= norms[:, None]
        return matrix

    def ranked(
        self, txn: Txn, query: list[float], ns_prefix: tuple[str, ...]
    ) -> Iterator[tuple[tuple[str, ...], str, float]]:
        """(namespace, key, score) of every item under ``ns_prefix`` that has a
        vector, best first; ties in key order."""
        np = self._np
        q = self.query_vector(query)
        idents: list[tuple[tuple[str, ...], str]] = []
        blobs: list[bytes] = []
        for _, raw in txn.scan(*namespace_range(ns_prefix)):
            ns, key, _field, vec = self.decode(raw)
            idents.append((ns, key))
            blobs.append(vec)
        if not blobs:
            return
        matrix = np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(blobs), self.dims)
        scores = self.unit_rows(matrix.copy()) @ q
        order = np.argsort(-scores, kind="stable")
        seen: set[tuple[tuple[str, ...], str]] = set()
        for i in order.tolist():
            ident = idents[i]
            if ident not in seen:
                seen.add(ident)
                yield ident[0], ident[1], float(scores[i])


def unpack_key(key: bytes) -> tuple[Any, ...]:
    """A key of this sub-keyspace as its tuple (for tests and tools)."""
    return unpack(key)
