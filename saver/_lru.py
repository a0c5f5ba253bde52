"""A byte-bounded least-recently-used map, the one shape of the saver's
in-process caches of values it can check on use (``delta._Recent``: rebuilt
list values; ``elements.Elements``: a list's elements' bytes)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["SizedLRU"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SizedLRU(Generic[K, V]):
    """Values by key, least recently used out once their ``cost`` adds up to
    more than ``max_bytes``; a value costing over a quarter of it is not kept
    (and drops what its key held). ``put`` and ``discard`` take the lock;
    readers use ``items`` directly and ``touch`` on a hit."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.items: OrderedDict[K, V] = OrderedDict()
        self.lock = threading.Lock()

    def cost(self, value: V) -> int:
        raise NotImplementedError

    def touch(self, key: K) -> None:
        """Mark ``key`` as just used."""
        try:
            self.items.move_to_end(key)
        except KeyError:  # evicted by another thread meanwhile
            pass

    def put(self, key: K, value: V) -> bool:
        """Keep ``value`` for ``key``; False when it costs too much to keep
        (what ``key`` held is dropped either way)."""
        cost = self.cost(value)
        with self.lock:
            old = self.items.pop(key, None)
            if old is not None:
                self.size -= self.cost(old)
            if cost > self.max_bytes >> 2:
                return False  # one value that would crowd out the others
            self.items[key] = value
            self.size += cost
            while self.size > self.max_bytes:
                _, gone = self.items.popitem(last=False)
                self.size -= self.cost(gone)
            return True

    def discard(self, key: K) -> None:
        with self.lock:
            old = self.items.pop(key, None)
            if old is not None:
                self.size -= self.cost(old)
