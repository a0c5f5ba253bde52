"""``MemoryStore``: a sorted in-memory store, for tests and throwaway runs.

Built on ``sortedcontainers.SortedDict``. Writers are serialized by one lock
and buffer their changes in an overlay until commit, so a rollback is just
dropping the overlay. Readers pin the current version of the data; a commit
that finds readers on that version copies it first (copy-on-write), so a
read transaction is a true snapshot and a lazy scan never sees a later commit.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, TypeVar

from sortedcontainers import SortedDict

from .store import ReadOnlyError, ScanArgs, Store, StoreClosedError

__all__ = ["MemoryStore"]

T = TypeVar("T")

_TOMB = object()


class _Version:
    __slots__ = ("data", "readers")

    def __init__(self, data: SortedDict) -> None:
        self.data = data
        self.readers = 0


def _irange(d: SortedDict, start: bytes | None, stop: bytes | None, reverse: bool) -> Any:
    return d.irange(start, stop, inclusive=(True, False), reverse=reverse)


class _MemTxn:
    """A transaction over one version; ``overlay`` is None for readers.

    The overlay is a plain dict (a write of a checkpoint puts a dozen keys and
    rarely scans): its keys are sorted only when a scan needs them, and that
    order is kept until the next new key."""

    def __init__(self, data: SortedDict, overlay: dict[bytes, Any] | None) -> None:
        self._data = data
        self._overlay = overlay
        self._open = True
        self._order: list[bytes] | None = None  # sorted overlay keys, see _sorted()

    def _sorted(self) -> list[bytes]:
        if self._order is None:
            assert self._overlay is not None
            self._order = sorted(self._overlay)
        return self._order

    def _set(self, key: bytes, value: Any) -> None:
        overlay = self._overlay
        assert overlay is not None
        if self._order is not None and key not in overlay:
            self._order = None
        overlay[key] = value

    def _check(self, write: bool = False) -> None:
        if not self._open:
            raise StoreClosedError("transaction is finished")
        if write and self._overlay is None:
            raise ReadOnlyError("cannot write in a read transaction")

    def get(self, key: bytes) -> bytes | None:
        self._check()
        if self._overlay is not None and key in self._overlay:
            v = self._overlay[key]
            return None if v is _TOMB else v
        return self._data.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        if not self._open or self._overlay is None:
            self._check(write=True)  # raises the error that applies
        # bytes(x) of a bytes object is x itself; a bytearray or memoryview is
        # copied, so the caller may reuse its buffer.
        if type(key) is not bytes:
            key = bytes(key)
        if type(value) is not bytes:
            value = bytes(value)
        overlay = self._overlay
        assert overlay is not None  # checked above
        if self._order is not None and key not in overlay:
            self._order = None
        overlay[key] = value

    def delete(self, key: bytes) -> bool:
        self._check(write=True)
        existed = self.get(key) is not None
        if existed:
            self._set(bytes(key), _TOMB)
        return existed

    def prefetch(self, keys: Sequence[bytes] = (), scans: Sequence[ScanArgs] = ()) -> None:
        """Nothing: a read in memory costs no more later (``Txn.prefetch``)."""

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        if self._overlay:
            return [self.get(k) for k in keys]
        # A reader, or a writer that wrote nothing yet (a put's reads come
        # first): one check, then plain lookups.
        self._check()
        get = self._data.get
        return [get(k) for k in keys]

    def scan(
        self,
        start: bytes | None = None,
        stop: bytes | None = None,
        *,
        reverse: bool = False,
        limit: int | None = None,
    ) -> Iterator[tuple[bytes, bytes]]:
        if limit is not None:
            return itertools.islice(self._scan(start, stop, reverse), max(limit, 0))
        return self._scan(start, stop, reverse)

    def _scan(
        self, start: bytes | None, stop: bytes | None, reverse: bool
    ) -> Iterator[tuple[bytes, bytes]]:
        self._check()
        data = self._data
        if self._overlay is None:
            for k in _irange(data, start, stop, reverse):
                if not self._open:
                    raise StoreClosedError("transaction is finished")
                yield k, data[k]
            return
        yield from self._merged(start, stop, reverse)

    def _merged(
        self, start: bytes | None, stop: bytes | None, reverse: bool
    ) -> Iterator[tuple[bytes, bytes]]:
        # Merge base and overlay key streams; the overlay wins on equal keys.
        overlay = self._overlay
        assert overlay is not None
        data = self._data
        base_it = iter(_irange(data, start, stop, reverse))
        order = self._sorted()
        lo = 0 if start is None else bisect.bisect_left(order, start)
        hi = len(order) if stop is None else bisect.bisect_left(order, stop)
        # A snapshot of the keys: the caller may write while it iterates.
        over_it = iter(order[lo:hi][::-1] if reverse else order[lo:hi])
        b = next(base_it, None)
        o = next(over_it, None)
        while b is not None or o is not None:
            if b is not None and (o is None or ((b > o) if reverse else (b < o))):
                yield b, data[b]
                b = next(base_it, None)
                continue
            assert o is not None  # o is None only while b is not: the branch above
            if b == o:
                b = next(base_it, None)
            v = overlay[o]
            if v is not _TOMB:
                yield o, v
            o = next(over_it, None)

    def delete_range(self, start: bytes | None, stop: bytes | None) -> int:
        self._check(write=True)
        keys = [k for k, _ in self.scan(start, stop)]
        for k in keys:
            self._set(k, _TOMB)
        return len(keys)


class MemoryStore(Store):
    """A sorted in-memory ``Store``. Nothing survives the process."""

    nonblocking_reads = True  # see kv.store

    def __init__(self, *, readonly: bool = False) -> None:
        self.readonly = readonly
        self._current = _Version(SortedDict())
        self._lock = threading.Lock()  # guards _current and reader counts
        self._write_lock = threading.Lock()  # one writer at a time
        self._writer: int | None = None
        self._closed = False

    # -- hooks for FileStore ---------------------------------------------
    def _persist(self, items: Iterator[tuple[bytes, bytes]]) -> None:
        """Called with every (key, value) of the state about to be committed,
        before it is published; an exception aborts the commit."""

    def _refresh(self) -> None:
        """Called before a read transaction begins: adopt newer data, if any."""

    def _writing(self) -> AbstractContextManager[None]:
        """Held around a whole write transaction, after the in-process lock
        (FileStore: the cross-process lock, and a refresh under it)."""
        return nullcontext()

    # -- protocol ---------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"{type(self).__name__} is closed")

    @contextmanager
    def read(self) -> Iterator[_MemTxn]:
        self._check_open()
        self._refresh()
        with self._lock:
            version = self._current
            version.readers += 1
        txn = _MemTxn(version.data, None)
        try:
            yield txn
        finally:
            txn._open = False
            with self._lock:
                version.readers -= 1

    def _check_writable(self) -> None:
        self._check_open()
        if self.readonly:
            raise ReadOnlyError(f"{type(self).__name__} was opened read-only")
        if self._writer == threading.get_ident():
            raise RuntimeError("a write transaction is already open in this thread")

    @contextmanager
    def write(self) -> Iterator[_MemTxn]:
        self._check_writable()
        with self._write_lock:
            self._writer = threading.get_ident()
            try:
                with self._writing():
                    overlay: dict[bytes, Any] = {}
                    txn = _MemTxn(self._current.data, overlay)
                    try:
                        yield txn
                    finally:
                        txn._open = False
                    if overlay:
                        self._commit(txn, overlay)
            finally:
                self._writer = None

    def _commit(self, txn: _MemTxn, overlay: dict[bytes, Any]) -> None:
        if type(self)._persist is not MemoryStore._persist:  # FileStore: the file
            self._persist(txn._merged(None, None, False))
        with self._lock:
            version = self._current
            if version.readers:
                # Readers hold this version: publish a modified copy.
                version = _Version(version.data.copy())
            data = version.data
            for k, v in overlay.items():
                if v is _TOMB:
                    data.pop(k, None)
                else:
                    data[k] = v
            self._current = version

    def transact(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(txn)`` in a write transaction and return its result
        (no group commit here: a commit costs no sync). ``write()``'s steps
        without its generator, because every put and put_writes of a
        ``KVSaver(":memory:")`` comes here."""
        self._check_writable()
        with self._write_lock:
            self._writer = threading.get_ident()
            try:
                with self._writing():
                    overlay: dict[bytes, Any] = {}
                    txn = _MemTxn(self._current.data, overlay)
                    try:
                        result = fn(txn)
                    finally:
                        txn._open = False
                    if overlay:
                        self._commit(txn, overlay)
                    return result
            finally:
                self._writer = None

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        with self._lock:
            return len(self._current.data)

    def disk_usage(self) -> int:
        """Nothing is on disk: the live bytes (keys + values) instead."""
        self._check_open()
        with self._lock:
            data = self._current.data
            return sum(len(k) + len(v) for k, v in data.items())
