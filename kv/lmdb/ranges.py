"""Range reads and deletes on an LMDB cursor, for the store's transactions.

Bounds may be longer than LMDB's key limit (no stored key is, so a bound cut
to the limit positions at or before the true place); the bounds every scan of
ours uses take one cursor call.
"""

from __future__ import annotations

from collections.abc import Iterator

import lmdb


def _position(cur: lmdb.Cursor, bound: bytes, max_key: int) -> bool:
    """set_range that accepts bounds longer than a key can be: no stored key
    is longer than max_key, so positioning on the truncated bound lands at or
    before the true position (callers then skip keys below the bound)."""
    return bool(cur.set_range(bound[:max_key]))


def _seek(
    cur: lmdb.Cursor, max_key: int, start: bytes | None, stop: bytes | None, reverse: bool
) -> bool:
    """Put ``cur`` on the first key a scan yields, unless it is out of the
    range at the other end: forward, the first key >= start; reverse, the
    last key < stop. False when there is no such key."""
    # A bound LMDB takes as it is (every scan of ours, every get_tuple of a
    # latest checkpoint and every pending-writes read): one call.
    if not reverse:
        if start is not None and 0 < len(start) <= max_key:
            return bool(cur.set_range(start))
    elif stop is not None and 0 < len(stop) <= max_key:
        # The key before the first key >= stop, else the last key.
        return bool(cur.prev() if cur.set_range(stop) else cur.last())
    if not reverse:
        ok = cur.first() if start is None else _position(cur, start, max_key)
        while ok and start is not None and cur.key() < start:  # a truncated bound
            ok = cur.next()
        return bool(ok)
    # set_range lands on the first key >= stop (step back one), or past the
    # end (start from the last key).
    if stop is None or not _position(cur, stop, max_key):
        return bool(cur.last())
    ok = True
    while ok and cur.key() >= stop:
        ok = cur.prev()
    return bool(ok)


def _beyond(key: bytes, start: bytes | None, stop: bytes | None, reverse: bool) -> bool:
    """Past the far end of a scan's range (a scan's keys come in order)."""
    return (start is not None and key < start) if reverse else (stop is not None and key >= stop)


def _scan(
    txn: lmdb.Transaction,
    max_key: int,
    start: bytes | None,
    stop: bytes | None,
    reverse: bool,
    limit: int | None = None,
) -> Iterator[tuple[bytes, bytes]]:
    """The pairs of a range, at most ``limit``. A scan with a limit returns
    once it has them: a generator a caller leaves unfinished is closed by an
    exception thrown into it, which costs more than the scan of a few keys."""
    if limit is not None and limit <= 0:
        return
    n = 0
    with txn.cursor() as cur:
        if not _seek(cur, max_key, start, stop, reverse):
            return
        # py-lmdb's own iterators (the current pair first, then a pair per C
        # call), checked against the far bound only: a checkpoint's pending
        # writes are read this way, as a list.
        if reverse:
            for key, value in cur.iterprev():
                if start is not None and key < start:
                    return
                yield key, value
                n += 1
                if n == limit:
                    return
        else:
            for key, value in cur.iternext():
                if stop is not None and key >= stop:
                    return
                yield key, value
                n += 1
                if n == limit:
                    return


def _one(
    txn: lmdb.Transaction, max_key: int, start: bytes | None, stop: bytes | None, reverse: bool
) -> list[tuple[bytes, bytes]]:
    """``list(islice(_scan(...), 1))`` without a generator."""
    with txn.cursor() as cur:
        if not _seek(cur, max_key, start, stop, reverse):
            return []
        key = cur.key()
        return [] if _beyond(key, start, stop, reverse) else [(key, cur.value())]


def _delete_range(
    txn: lmdb.Transaction, start: bytes | None, stop: bytes | None, max_key: int
) -> int:
    n = 0
    with txn.cursor() as cur:
        ok = cur.first() if start is None else _position(cur, start, max_key)
        while ok:
            key = cur.key()
            if not key:  # deleted the last key: the cursor is past the end
                break
            if stop is not None and key >= stop:
                break
            if start is not None and key < start:
                ok = cur.next()
                continue
            ok = cur.delete()  # moves to the next item
            n += 1
    return n
