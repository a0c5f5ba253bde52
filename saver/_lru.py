"""The saver's one cache type and the one split of its memory budget.

``SizedLRU`` is a bounded least-recently-used map, each entry costing what
its subclass says: every cache a serializer stack keeps is one
(``compression._Inflated``: decompressed values, twice; ``codec._Recent``:
rebuilt list values; ``elements.Elements``: a list's elements' bytes;
``codec._Versions``: the versions of the checkpoints a codec wrote, one per
entry).

``split`` is where a serializer's ``cache_bytes`` is divided among them.
``KVSaver(cache_bytes=N)`` gives its ``CompressingSerializer`` ``N // 4``
(``saver/kvsaver.py``), and about 4x that is then held in all.

Not here: the memos of key elements (``keyspace``, ``records``,
``kv/keys.py``): process-wide, counted in entries and emptied when full, on
the read path, where a lock and an ordered map per miss would cost more
than they bound."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, NamedTuple, TypeVar

__all__ = ["Budget", "SizedLRU", "split"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Budget(NamedTuple):
    """What each cache of one serializer stack may hold, in bytes."""

    inflated: int  # compression: decompressed values by their zstd frame
    inflated_small: int  # compression: the same for frames with SMALL_DICT
    rebuilt: int  # codec: whole list values rebuilt from deltas
    elements: int  # elements: the element bytes of the lists last put


def split(cache_bytes: int) -> Budget:
    """A serializer's ``cache_bytes`` among its caches: decompressed values
    as much, small ones an eighth, rebuilt lists as much again, the lists'
    element bytes twice as much (what they keep alive is larger than what
    they save: see ``elements``); 0 keeps none."""
    return Budget(cache_bytes, cache_bytes >> 3, cache_bytes, 2 * cache_bytes)


class SizedLRU(Generic[K, V]):
    """Values by key, least recently used out once their ``cost`` adds up to
    more than ``max_bytes``; a value costing over ``max_bytes >> share``
    (a quarter by default) is not kept (and drops what its key held).
    ``put`` and ``discard`` take the lock; readers use ``items`` directly
    and ``touch`` on a hit."""

    def __init__(self, max_bytes: int, share: int = 2) -> None:
        self.max_bytes = max_bytes
        self.share = share
        self.size = 0
        self.items: OrderedDict[K, V] = OrderedDict()
        self.lock = threading.Lock()

    def cost(self, key: K, value: V) -> int:
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
        cost = self.cost(key, value)
        with self.lock:
            old = self.items.pop(key, None)
            if old is not None:
                self.size -= self.cost(key, old)
            if cost > self.max_bytes >> self.share:
                return False  # one value that would crowd out the others
            self.items[key] = value
            self.size += cost
            while self.size > self.max_bytes:
                gone_key, gone = self.items.popitem(last=False)
                self.size -= self.cost(gone_key, gone)
            return True

    def discard(self, key: K) -> None:
        with self.lock:
            old = self.items.pop(key, None)
            if old is not None:
                self.size -= self.cost(key, old)
