"""``saver.stats()``: what a store holds and what it costs on disk.

One pass over every key, in short read transactions of a few thousand
records (a long stats run never pins old pages of a store that is being
written). Bytes are key plus value lengths: what the records themselves take,
before the backend's page and file overhead, which ``disk_bytes`` shows. A
KVStore's keyspace on the same directory is counted apart (its items and
bytes) and in the live bytes: they take the file's pages too.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kvsaver.kv import CorruptStoreError, Store, SupportsDiskUsage
from kvsaver.kv.keys import pack, unpack

from . import schema as S
from .upgrade import LEGACY_WRITE_KEY_LEN

__all__ = ["StoreStats", "ThreadStats"]

_CHUNK = 2048
# Keyspaces whose keys name a thread; the index keyspaces (id, meta, run,
# idle) only add to live bytes, so their keys are not unpacked (most keys of
# a store are index keys, and `kvsaver threads` runs this pass too).
_PER_THREAD = tuple(pack((kind,)) for kind in (S.CHECKPOINT, S.WRITE, S.BLOB, S.ACTIVITY, S.HEAD))
_STORE_ITEM = pack((S.STORE, S.STORE_ITEM))  # a KVStore item's record: one per item


@dataclass(frozen=True)
class ThreadStats:
    """One thread: its records in every namespace."""

    thread_id: str
    checkpoints: int
    writes: int
    blobs: int
    bytes: int  # keys + values of its checkpoints, writes, blobs and head records
    last_activity: float | None  # seconds, the saver's clock; None: not recorded


@dataclass(frozen=True)
class StoreStats:
    """The whole store; ``threads`` is sorted largest first."""

    disk_bytes: int  # files on disk (LMDBStore, FileStore); live bytes in memory
    live_bytes: int  # keys + values of every record, indexes and store_bytes included
    checkpoints: int
    writes: int
    blobs: int
    store_items: int  # a KVStore's items on the same store (not checkpoints)
    store_bytes: int  # keys + values of the KVStore's records (items, indexes, vectors)
    threads: list[ThreadStats] = field(default_factory=list)

    def format(self, top: int | None = 20) -> str:
        """A plain-text report (what ``kvsaver stats`` prints)."""
        ratio = f"{self.disk_bytes / self.live_bytes:.2f}x live" if self.live_bytes else "-"
        lines = [
            f"disk bytes   {self.disk_bytes:>14,}  ({ratio})",
            f"live bytes   {self.live_bytes:>14,}",
            f"threads      {len(self.threads):>14,}",
            f"checkpoints  {self.checkpoints:>14,}",
            f"writes       {self.writes:>14,}",
            f"blobs        {self.blobs:>14,}",
        ]
        if self.store_bytes:
            lines.append(
                f"store items  {self.store_items:>14,}  (KVStore, {self.store_bytes:,} bytes)"
            )
        shown = self.threads if top is None else self.threads[:top]
        if shown:
            lines.append("")
            lines.append(f"{'bytes':>12}  {'checkpoints':>11}  {'writes':>7}  {'blobs':>7}  thread")
            for t in shown:
                lines.append(
                    f"{t.bytes:>12,}  {t.checkpoints:>11,}  {t.writes:>7,}  {t.blobs:>7,}  "
                    f"{t.thread_id}"
                )
            if len(shown) < len(self.threads):
                lines.append(f"... and {len(self.threads) - len(shown):,} more threads")
        return "\n".join(lines)


def _scan_all(store: Store) -> Iterator[tuple[bytes, bytes]]:
    """Every record, in chunks of short read transactions."""
    start: bytes | None = None
    while True:
        with store.read() as txn:
            n = 0
            resume = None
            for key, value in txn.scan(start, None):
                yield key, value
                n += 1
                if n == _CHUNK:
                    resume = key + b"\x00"  # the smallest key after the last one read
                    break
            if resume is None:
                return
        start = resume


def disk_usage(store: Store) -> int | None:
    """The store's size on disk, if the backend can tell."""
    return store.disk_usage() if isinstance(store, SupportsDiskUsage) else None


def collect(store: Store) -> StoreStats:
    counts: dict[Any, list[int]] = {}  # thread element -> [checkpoints, writes, blobs, bytes]
    names: dict[Any, str] = {}  # surrogate thread element -> thread id
    activity: dict[Any, int] = {}
    slot = {S.CHECKPOINT: 0, S.WRITE: 1, S.BLOB: 2}
    live = store_items = store_bytes = 0
    store_lo, store_hi = S.store_range()
    # (task_id, idx) seen in format-1 write keys of one checkpoint (the keys
    # of a checkpoint are contiguous, so one checkpoint's set at a time)
    legacy: set[tuple[Any, ...]] = set()
    legacy_at: tuple[Any, ...] = ()
    for key, value in _scan_all(store):
        size = len(key) + len(value)
        live += size
        if not key.startswith(_PER_THREAD):
            if store_lo <= key < store_hi:  # a KVStore's: items, not the saver's threads
                store_bytes += size
                store_items += key.startswith(_STORE_ITEM)
            continue
        elements = unpack(key)
        kind = elements[0]
        if kind in slot:
            kt = elements[1]
            c = counts.setdefault(kt, [0, 0, 0, 0])
            if kind == S.WRITE and len(elements) == LEGACY_WRITE_KEY_LEN:
                # A format-1 store read as it is: count writes by identity
                # (thread, ns, checkpoint, task_id, idx), as reads return them.
                if elements[1:4] != legacy_at:
                    legacy_at, legacy = elements[1:4], set()
                if elements[5:] in legacy:
                    c[3] += size
                    continue
                legacy.add(elements[5:])
            elif kind == S.WRITE:  # a record holds one write or a batch
                try:
                    c[1] += len(S.decode_writes(value)) - 1
                except CorruptStoreError:
                    pass  # counted as one: stats read past a damaged record
            c[slot[kind]] += 1
            c[3] += size
            if kind == S.CHECKPOINT and isinstance(kt, bytes) and kt not in names:
                names[kt] = S.decode_checkpoint(value).thread_id
        elif kind == S.HEAD:  # a copy of the thread's newest checkpoint
            counts.setdefault(elements[1], [0, 0, 0, 0])[3] += size
        elif kind == S.ACTIVITY:
            ms, thread = S.decode_activity(value)
            activity[elements[1]] = ms
            names[elements[1]] = thread
    threads = [
        ThreadStats(
            thread_id=kt if isinstance(kt, str) else names.get(kt, repr(kt)),
            checkpoints=c[0],
            writes=c[1],
            blobs=c[2],
            bytes=c[3],
            last_activity=activity[kt] / 1000 if kt in activity else None,
        )
        for kt, c in counts.items()
    ]
    threads.sort(key=lambda t: (-t.bytes, t.thread_id))
    disk = disk_usage(store)
    return StoreStats(
        disk_bytes=live if disk is None else disk,
        live_bytes=live,
        checkpoints=sum(t.checkpoints for t in threads),
        writes=sum(t.writes for t in threads),
        blobs=sum(t.blobs for t in threads),
        store_items=store_items,
        store_bytes=store_bytes,
        threads=threads,
    )
