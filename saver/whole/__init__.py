"""``whole_latest``: when a thread's newest checkpoint is kept whole in its
head record (``saver.heads``: the record's format), and when a read uses it.

One object, ``Heads``, per saver (its ``with_allowlist`` clones share its
state through ``for_codec``):

* ``read(txn, thread, ns, checkpoint_id, raw)``: the head's checkpoint when
  it holds the record ``raw`` (one lookup, one unpack), else None; a read of
  the latest that finds none counts towards a "wanted" mark (below);
* ``plan(thread, ns)`` before a put's transaction (whether it writes the
  head), ``on_put(txn, ...)`` in it (the head written, or a stale one
  deleted), ``after_put(thread, ns)`` after its commit (the idle heads);
* ``close()``: the idle heads still waiting written, the hints closed.

Heads come three ways. ``whole_latest=True``: every put writes its head.
``"idle"`` (the default): a background thread (``idle.IdleWork``, with
``build.IdleHeads``) writes a thread's head once no put of this saver came
for it for ``IDLE_SECONDS``; and a reader that finds a thread's latest
without its head ``WANT_AFTER`` times within ``MARK_SECONDS`` marks it in
the store directory's hint table (``hints``), so that every put of it, in
any process, writes its head for ``WANTED_SECONDS`` after. ``False``: none
written, none read (a put still removes one another saver made). None on a
network store, none with encrypted values.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

from kvsaver.kv import Store, Txn

from .. import delta as D
from .. import heads as H
from .. import schema as S
from ..ids import as_id
from .build import IdleHeads, bounded_put, build_head, near_cap
from .hints import Hints
from .idle import IdleWork

__all__ = ["IDLE_SECONDS", "MARK_SECONDS", "WANTED_SECONDS", "WANT_AFTER", "Heads"]

# whole_latest="idle": a thread's head is written once no put came for this long
IDLE_SECONDS = 1.0
# ... and by each put while a reader elsewhere wants it: marked (``hints``)
# within this many seconds; a reader marks a thread when it found it without
# its head WANT_AFTER times within MARK_SECONDS (once per such window).
WANTED_SECONDS = 10
MARK_SECONDS = 2.0
WANT_AFTER = 4
_monotonic = time.monotonic  # the clock of those windows (tests replace it)

_Mine = Mapping[str, tuple[Any, bytes | Literal[False] | None]]


class Heads:
    """The head records of one saver's store (see the module docstring)."""

    idle: IdleWork | None = None
    idle_heads: IdleHeads | None = None
    hints: Hints | None = None

    def __init__(
        self,
        store: Store,
        codec: D.Codec,
        plain: Callable[[bytes | memoryview], Any] | None,
        whole_latest: bool | Literal["idle"],
        pipelined: bool,
    ) -> None:
        self.store = store
        self.always = whole_latest is True
        self.pipelined = pipelined
        self._enabled = whole_latest is not False and not pipelined
        self._set_codec(codec, plain)
        # (thread, ns) -> the checkpoint id its head record held when this
        # saver last wrote or read it: a read by id looks at the head only
        # for that id (another id is rarely the newest; the look costs a get).
        self.ids: dict[tuple[str, str], str] = {}
        # (thread, ns) -> sizes of stored values found while making no head
        self.sizes: dict[tuple[str, str], dict[tuple[str, type, Any], int]] = {}
        # the reads here that found no head: (thread, ns) -> (monotonic time
        # of the first of its window, how many)
        self.misses: dict[tuple[str, str], tuple[float, int]] = {}
        if whole_latest == "idle" and not store.readonly and not pipelined:
            # What its thread works on, held by this saver and its clones
            # (with_allowlist), weakly by the thread: a saver never closed
            # is still freed, and its thread ends.
            self.idle_heads = IdleHeads(store, codec, self.ids, self.sizes)
            self.idle = IdleWork(IDLE_SECONDS, IdleHeads.write, self.idle_heads)
        if whole_latest == "idle" and not pipelined:
            # The heads other processes' readers want: a table beside the
            # store's files (a store in a directory of its own only).
            if store.directory is not None:
                self.hints = Hints(store.directory)

    def _set_codec(self, codec: D.Codec, plain: Callable[[bytes | memoryview], Any] | None) -> None:
        self.codec = codec
        self.plain = plain  # a head's payload -> its value (``Reads.plain``)
        # heads read and written: unless whole_latest=False, on local stores
        # whose head payloads ``plain`` loads
        self.readable = bool(self._enabled and plain is not None and codec.heads)

    def for_codec(self, codec: D.Codec, plain: Callable[[bytes | memoryview], Any] | None) -> Heads:
        """This object for a ``with_allowlist`` clone's serializer: the same
        idle heads, hints and memos, its own codec and loader."""
        clone = copy.copy(self)
        clone._set_codec(codec, plain)
        return clone

    # -- reads ----------------------------------------------------------------

    def read(
        self, txn: Txn, thread: str, ns: str, checkpoint_id: Any, raw: bytes
    ) -> tuple[str, Any, Any, Any] | None:
        """(checkpoint id as stored, parent id, metadata, checkpoint with its
        channel_values) from the head record of (thread, ns) when it holds the
        checkpoint whose stored record is ``raw`` (the latest, or the one
        ``checkpoint_id`` names), one unpack (``heads``); else None."""
        if not self.readable:
            return None
        if checkpoint_id and self.ids.get((thread, ns)) != checkpoint_id:
            return None
        found = self._payload(txn, thread, ns, raw)
        if found is None and not checkpoint_id and self.hints is not None:
            self._missed(thread, ns)
        return found

    def _payload(
        self, txn: Txn, thread: str, ns: str, raw: bytes
    ) -> tuple[str, Any, Any, Any] | None:
        body = H.payload(txn.get(S.head_key(thread, ns)), raw)
        if body is None:
            return None
        assert self.plain is not None  # readable
        try:
            parent, metadata, checkpoint = self.plain(body)
            # The id as stored (put takes an int or UUID and stores its text).
            cid = as_id(checkpoint["id"], "checkpoint['id']")
            if type(metadata) is not dict or type(checkpoint["channel_values"]) is not dict:
                raise TypeError("not a head's payload")
        except (ValueError, TypeError, LookupError):
            return None  # a damaged head: only a copy, read the blobs (the next put mends it)
        bounded_put(self.ids, (thread, ns), cid)
        return cid, parent, metadata, checkpoint

    def _missed(self, thread: str, ns: str) -> None:
        """A read of the latest of (thread, ns) found no head: the
        ``WANT_AFTER``-th such read within ``MARK_SECONDS`` marks it wanted
        (``hints``), so that the puts of the process writing it write its
        head: a thread read far more often than it is written (heads slow
        the writer's puts), not one polled now and then. Not one this
        saver's idle thread still has to write (it put the thread lately)."""
        key = (thread, ns)
        if self.idle is not None and self.idle.waiting(key):
            return  # the head is ours to write
        now = _monotonic()
        first, n = self.misses.get(key, (now, 0))
        if now - first > MARK_SECONDS:
            first, n = now, 0
        bounded_put(self.misses, key, (first, n + 1))
        if n + 1 == WANT_AFTER and self.hints is not None:
            self.hints.mark(S.head_key(thread, ns))

    # -- puts -----------------------------------------------------------------

    def plan(self, thread: str, ns: str) -> tuple[bytes | None, bool]:
        """(the head key a put reads in its transaction, None on a network
        store; whether the put writes the head). Without whole_latest a put
        still removes a head another saver made (it would go stale), so a
        local store always looks it up."""
        hkey = None if self.pipelined else S.head_key(thread, ns)
        return hkey, self.readable and (self.always or self._wanted(hkey))

    def _wanted(self, hkey: bytes | None) -> bool:
        """Whether a put writes the head keyed ``hkey`` because a reader of
        another process wants it (``hints``; whole_latest="idle"), unless
        the store is within a quarter of its ``max_size`` (as the idle
        heads)."""
        hints = self.hints
        return (
            hints is not None
            and hkey is not None
            and hints.recent(hkey, WANTED_SECONDS)
            and not near_cap(self.store)
        )

    def on_put(
        self,
        txn: Txn,
        hkey: bytes | None,
        previous: bytes | None,
        write: bool,
        rec: S.CheckpointRecord,
        record: bytes,
        cp_plain: bytes | Literal[False],
        versions: Mapping[str, Any],
        mine: _Mine | None,
    ) -> None:
        """In a put's transaction: with ``write`` (``plan``'s), write the head
        of (thread, ns), left alone when it holds a newer checkpoint than this
        one; else delete a head stored (``previous``, read at ``hkey``).
        ``versions``: the checkpoint's channel_versions; ``mine``: channel ->
        (version, ``Pending.head``) of the values this put writes and of
        the record's small values."""
        if not write:
            if hkey is not None and previous is not None:
                txn.delete(hkey)
            return
        assert hkey is not None and mine is not None  # write: a local store
        parsed = H.parse(previous)
        if parsed is not None and parsed[0] > rec.checkpoint_id:
            # A newer checkpoint's head stays, unless this put rewrote a
            # version it holds (versions that are not unique, as in tests).
            held = {H.version_key(e[0], e[1]) for e in parsed[2]}
            if any(H.version_key(ch, v) in held for ch, (v, _) in mine.items()):
                txn.delete(hkey)
            return
        head = build_head(
            txn, self.codec, rec, record, cp_plain, versions, mine, previous, parsed, self.sizes
        )
        if head is not None:
            txn.put(hkey, head)
            bounded_put(self.ids, (rec.thread_id, rec.checkpoint_ns), rec.checkpoint_id)
        elif previous is not None:
            txn.delete(hkey)

    def after_put(self, thread: str, ns: str) -> None:
        """After a put's commit: its head is the idle thread's to write."""
        if self.idle is not None and self.readable:
            self.idle.note((thread, ns))

    def close(self) -> None:
        """The heads still waiting written (those the store can take, within
        a few seconds), the idle thread stopped, the hints closed."""
        idle, self.idle = self.idle, None
        try:
            if idle is not None:
                idle.close(flush=True)
        finally:
            if self.hints is not None:
                self.hints.close()
