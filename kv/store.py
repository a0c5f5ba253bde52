"""The ``Store`` protocol: the whole surface that ``saver/`` may use.

A store hands out transactions::

    with store.read() as txn:      # a consistent snapshot
        txn.get(k); txn.scan(a, b, reverse=True)
        txn.get_many([k1, k2]); txn.scan(a, b, reverse=True, limit=1)
    with store.write() as txn:     # atomic: commits on success,
        txn.put(k, v)              # rolls back on any exception
        txn.delete(k); txn.delete_range(a, b)
    store.transact(fn)             # fn(txn) atomically; concurrent callers
                                   # may share one commit (group commit)

Keys and values are ``bytes``. ``scan(start, stop)`` yields ``(key, value)``
pairs with ``start <= key < stop`` in byte order (``reverse=True``: reverse
byte order); ``None`` for a bound means "unbounded"; ``limit`` caps how many
pairs it yields. Iterators are valid only inside their transaction.
``get_many(keys)`` is ``[get(k) for k in keys]``. Both exist for stores on a
network (``PostgresStore``), where each call is a round trip and a scan
fetches in chunks: a caller that knows it wants one key of a range, or many
keys at once, says so. On the local stores they cost what the loop does.
``prefetch(keys, scans)`` reads keys and scans' first chunks together (one
round trip on a network store; nothing on a local one).
A read transaction's snapshot is taken no later than its first read.

Capabilities: attributes every store has, declared on ``Store`` with the
defaults of a store that has none of them (every backend derives from
``Store`` and sets its own), so a caller reads them directly:

* ``pipelines_reads``: a round trip costs what a whole local read does
  (``PostgresStore``): a caller says what it will read together with
  ``Txn.prefetch`` (which does nothing on a local store) wherever it can; the
  capability is for what else a caller decides by it (guessing reads from its
  own last writes, threads for async calls).
* ``write_conflicts``: its write transactions can fail on a conflict with a
  concurrent writer (``StoreConflictError``; ``PostgresStore``,
  SERIALIZABLE): a caller that cannot rerun a ``write()`` block by itself
  uses ``transact``, which reruns its function.
* ``nonblocking_reads``: its reads never wait for a lock, a writer, a network
  or a file read (a memory map, memory: ``LMDBStore``, ``MemoryStore``); an
  async caller may then read on its event loop instead of hopping to a
  worker thread.
* ``max_size``: a cap on its size in bytes (``LMDBStore``'s), None for none;
  ``used_bytes()``: its live bytes, cheaply (None: it cannot tell).
* ``directory``: a directory that holds its files and nothing else's, where a
  caller may keep files of its own named ``kvsaver.*`` (``LMDBStore``'s);
  None for none. ``path``: where it is (a directory or a file), None for a
  store in memory or on a server.

Optional capabilities, as protocols a store may implement:
``SupportsDiskUsage``; ``SupportsVectors`` (``PostgresStore`` on a server with
pgvector), float32 vectors attached to keys, written and searched in the
store's own transactions (``VectorTxn``).

Errors form one family rooted at ``KVError``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Protocol, TypeVar, runtime_checkable

__all__ = [
    "CorruptStoreError",
    "FormatVersionError",
    "KVError",
    "KeyTooLongError",
    "MissingDependencyError",
    "ReadOnlyError",
    "ScanArgs",
    "Store",
    "StoreBusyError",
    "StoreClosedError",
    "StoreFullError",
    "SupportsDiskUsage",
    "SupportsVectors",
    "Txn",
    "VectorTxn",
]

T = TypeVar("T")
# One scan, as ``Txn.prefetch`` takes it: (start, stop, reverse, limit).
ScanArgs = tuple[bytes | None, bytes | None, bool, int | None]


class KVError(Exception):
    """Base class of every error raised by ``kv``."""


class ReadOnlyError(KVError):
    """A write was attempted on a read-only store or inside a read transaction."""


class KeyTooLongError(KVError, ValueError):
    """A key is longer than the backend accepts."""


class StoreClosedError(KVError):
    """The store was used after ``close()``."""


class CorruptStoreError(KVError):
    """The files at the path are not a store of this kind, or are damaged."""


class FormatVersionError(KVError):
    """The store was written by a newer format than this code understands."""


class StoreFullError(KVError):
    """A write does not fit: the store reached its size cap, or the disk is full."""


class StoreBusyError(KVError):
    """The store is held exclusively by another process."""


class MissingDependencyError(KVError, ImportError):
    """A backend needs a package that is not installed (an optional extra); the
    message names the ``pip install`` that brings it."""


@runtime_checkable
class Txn(Protocol):
    """One transaction. Write methods raise ``ReadOnlyError`` in a read transaction."""

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> bool: ...

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]: ...

    def scan(
        self,
        start: bytes | None = None,
        stop: bytes | None = None,
        *,
        reverse: bool = False,
        limit: int | None = None,
    ) -> Iterator[tuple[bytes, bytes]]: ...

    def delete_range(self, start: bytes | None, stop: bytes | None) -> int: ...

    def prefetch(self, keys: Sequence[bytes] = (), scans: Sequence[ScanArgs] = ()) -> None:
        """Read ``keys`` and the first chunk of each scan of ``scans``
        together: this transaction's ``get``/``get_many`` of those keys and
        its identical ``scan`` calls that follow find them read. A store on a
        network (``PostgresStore``) sends the scans with the keys' lookup in
        one round trip (with no keys, the scans wait for the next one); a
        local store does nothing, its reads cost no more later."""
        return None


@runtime_checkable
class Store(Protocol):
    """An ordered byte-key store with snapshot reads and atomic writes."""

    readonly: bool
    # Capabilities (see the module docstring), as a store that has none.
    nonblocking_reads: bool = False
    pipelines_reads: bool = False
    write_conflicts: bool = False
    max_size: int | None = None
    directory: str | None = None
    path: str | None = None

    def used_bytes(self) -> int | None:
        """Live bytes, without a system call where the store can; None when
        it cannot tell."""
        return None

    def read(self) -> AbstractContextManager[Txn]: ...

    def write(self) -> AbstractContextManager[Txn]: ...

    def transact(self, fn: Callable[[Txn], T]) -> T:
        """Run ``fn(txn)`` atomically in a write transaction; return its result.
        A backend may commit several callers' functions together (one sync);
        an exception in ``fn`` undoes only ``fn``'s changes. ``fn`` may be
        rerun, so it must act only through ``txn``."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Store: ...

    def __exit__(self, *exc: object) -> None: ...


@runtime_checkable
class SupportsDiskUsage(Protocol):
    """An optional capability: a store that can tell its size on disk."""

    def disk_usage(self) -> int:
        """Bytes the store's files take (an in-memory store: its live bytes)."""
        ...


@runtime_checkable
class SupportsVectors(Protocol):
    """An optional capability: a vector of float32 attached to a key, kept by
    the store beside its records (``PostgresStore``: a pgvector table) and
    searched there, by cosine distance. Once ``open_vectors`` returned True,
    the store's transactions are ``VectorTxn``s."""

    def open_vectors(
        self,
        dims: int,
        hnsw: dict[str, int] | None = None,
        fill: Callable[[Txn], None] | None = None,
    ) -> bool:
        """Make the vectors of ``dims`` float32 ready; False when the store
        cannot have them (the server has no pgvector, or a read-only store
        finds none made). ``hnsw``: search through an approximate HNSW index
        (its ``m``, ``ef_construction``), made if missing; None: exact search.
        ``fill(txn)`` runs in the transaction that creates the vectors'
        storage, to put the vectors of records written before it."""
        ...


@runtime_checkable
class VectorTxn(Protocol):
    """A transaction of a store that has ``SupportsVectors``. A key's vector
    is removed with the key (any ``delete`` or ``delete_range`` of it, in the
    same transaction); a ``put`` of the key leaves its vector as it was."""

    def put_vector(self, key: bytes, vector: bytes) -> None:
        """Attach ``vector`` (float32, little-endian, the dims opened) to
        ``key``, which this transaction has put or the store holds."""
        ...

    def search_vectors(
        self,
        start: bytes,
        stop: bytes,
        query: bytes,
        limit: int,
        offset: int = 0,
        exact: bool = False,
    ) -> list[tuple[bytes, bytes]]:
        """The records (key, value) of the keys in ``[start, stop)`` that have
        a vector, by their vector's cosine distance to ``query`` (float32,
        little-endian), nearest first, ties (and zero vectors, at distance 1)
        in key order; ``offset`` skipped, at most ``limit``. With an HNSW
        index (and not ``exact``) the order is the index's, approximate, and
        may return fewer than ``limit`` before the range's end."""
        ...
