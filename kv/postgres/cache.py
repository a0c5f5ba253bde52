"""The speculation cache: what this process's committed write transactions
last wrote and read, from which ``transact`` answers a function's first reads
without a round trip. Only ever a guess, which the transaction verifies with a
guard statement in its committing round trip (txn.py); it knows nothing of SQL.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from sortedcontainers import SortedList

_CACHE_BYTES = 8 << 20  # the cache of committed values that transact speculates from
_CACHE_ENTRY = 256 << 10  # a longer value is not cached (a read of it is not speculated)
_BIG = object()  # a key whose value is too long to cache: never guessed
_MISSING = object()


class _Cache:
    """What this process last knew each key to hold (written or read by its
    committed write transactions; ``None``: absent), least recently used
    out, at most ``max_bytes``. Only ever a guess: ``transact`` verifies
    every value it takes from here in the same transaction (a guard
    statement), so a stale entry costs a rerun, never a wrong write."""

    def __init__(self, max_bytes: int = _CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.items: OrderedDict[bytes, Any] = OrderedDict()
        # The keys in key order, so that a range's entries are found by
        # bisection, not by a walk over every entry. Keys that left the cache
        # stay here until the list is rebuilt (twice as long as the cache):
        # a put's learning pays one insertion a new key, nothing per eviction.
        self.order = SortedList()
        self.lock = threading.Lock()

    @staticmethod
    def _cost(k: bytes, v: Any) -> int:
        return 64 + len(k) + (len(v) if isinstance(v, bytes) else 0)

    def guess(self, keys: Sequence[bytes]) -> list[bytes | None] | None:
        """The cached values (a key without an entry: assumed absent, which
        a new checkpoint's keys are); None when one cannot be guessed."""
        out: list[bytes | None] = []
        with self.lock:
            for k in keys:
                v = self.items.get(k)
                if v is _BIG:
                    return None
                out.append(v)
        return out

    def learn(self, known: dict[bytes, bytes | None], ranges: Sequence[Any]) -> None:
        with self.lock:
            items, order = self.items, self.order
            for a, b in ranges:
                i = 0 if a is None else order.bisect_left(a)
                j = len(order) if b is None else order.bisect_left(b)
                for k in order[i:j]:
                    gone = items.pop(k, _MISSING)
                    if gone is not _MISSING:
                        self.size -= self._cost(k, gone)
                del order[i:j]
            size = self.size
            pop = items.pop
            for k, value in known.items():  # _cost, inline: a put learns a dozen keys
                v: Any = value
                if v is not None and len(v) > _CACHE_ENTRY:
                    v = _BIG
                old = pop(k, _MISSING)
                if old is _MISSING:
                    size += 64 + len(k)
                    order.add(k)
                elif type(old) is bytes:
                    size -= len(old)
                items[k] = v
                if type(v) is bytes:
                    size += len(v)
            self.size = size
            while self.size > self.max_bytes and items:
                k, v = items.popitem(last=False)
                self.size -= self._cost(k, v)
            if len(order) > 2 * len(items) + 1024:
                self.order = SortedList(items)

    def forget(self, keys: Sequence[bytes]) -> None:
        with self.lock:
            for k in keys:
                if k in self.items:
                    self.size -= self._cost(k, self.items.pop(k))


def _inside(k: bytes, start: bytes | None, stop: bytes | None) -> bool:
    return (start is None or k >= start) and (stop is None or k < stop)
