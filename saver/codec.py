"""The saver's value codec: channel values, checkpoints and pending writes
through one serializer stack (``compression.Stack``: serialize once, then
compress and encrypt), with the delta layer on top (``saver/delta.py`` says
what deltas are and why; their records are ``saver/delta_records.py``'s).
``codec(serde)`` gives the codec of a serializer object."""

from __future__ import annotations

import functools
import hashlib
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from kvsaver.kv import CorruptStoreError
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from . import compression as C
from . import elements as E
from . import heads as H
from . import schema as S
from ._lru import SizedLRU, split
from ._msgpack import header, make_header
from .delta_records import (
    _DIGEST,
    _LIMIT,
    MARK,
    MAX_CHAIN,
    MIN_BYTES,
    STRIDE,
    DeltaRecord,
    Pending,
    _Entry,
    _Pairs,
    base_key,
    chain_closure,
    decode,
    encode,
)

__all__ = ["START", "Codec", "Pending", "codec"]

# The graph's input channel, langgraph.constants.START: named here since the
# langgraph package is not a dependency (tests/test_install.py checks the two agree).
START = "__start__"
_EMPTY = S.encode_blob(None)


class _Recent(SizedLRU[bytes, _Entry]):
    """Rebuilt values by blob key, least recently used out, at most
    ``max_bytes``. A hit counts only if the stored record is byte-equal to
    the one the value was rebuilt from, and a record's bytes name its content
    (a whole record is its content; a delta carries its content's digest), so
    it can never serve a stale value."""

    def cost(self, key: bytes, value: _Entry) -> int:
        return len(value.raw) + len(value.plain)

    def get(self, key: bytes, raw: bytes) -> _Entry | None:
        e = self.items.get(key)
        if e is None or e.raw != raw:
            return None
        self.touch(key)
        return e


_VERSIONS = 4096  # checkpoints whose versions a codec remembers


class _Versions(SizedLRU[tuple[str, str, str], Mapping[str, Any]]):
    """(thread, ns, checkpoint id) -> channel_versions of the checkpoints
    this process wrote, counted one per entry, oldest put out first (a hit
    does not touch: the next put's parent is nearly always the last put)."""

    def cost(self, key: tuple[str, str, str], value: Mapping[str, Any]) -> int:
        return 1


class Codec(C.Stack):
    """The value codec of one serializer stack (``codec(serde)``): its layers
    (``compression.Stack``) and the delta layer on them, with its caches."""

    def __init__(self, serde: SerializerProtocol) -> None:
        super().__init__(serde)
        self.enabled = isinstance(self.inner, JsonPlusSerializer)
        # Lists serialized element by element, reusing the bytes of the
        # elements unchanged since the previous put (``elements``): only
        # under JsonPlusSerializer's own ``dumps_typed``, and used only by
        # the puts of a saver with ``fast_paths`` (``prepare``'s ``reuse``).
        # The caches' memory follows the compression layer's ``cache_bytes``,
        # split among them in one place (``_lru.split``); 0 keeps none.
        budget = split(self.comp.cache_bytes if self.comp is not None else C.DEFAULT_CACHE_BYTES)
        self.elements = (
            E.Elements(budget.elements)
            if budget.elements
            and E.ENABLED
            and type(self.inner).dumps_typed is JsonPlusSerializer.dumps_typed
            else None
        )
        # Whether head records can be made (``heads``): of the
        # inner serializer's msgpack, never in the clear when values are encrypted.
        self.heads = self.enabled and self.enc is None and not self.custom
        self.max_chain = MAX_CHAIN
        self.stride = STRIDE
        self.min_bytes = MIN_BYTES
        self.recent = _Recent(budget.rebuilt)
        # (thread, ns, checkpoint id) -> channel_versions of checkpoints this
        # process wrote: the parent of the next put is nearly always one.
        self._versions = _Versions(_VERSIONS)
        self._serde = serde

    @property
    def serde(self) -> SerializerProtocol:
        """The serializer this codec is of."""
        return self._serde

    # -- the checkpoint record (the layers' wrapping: ``compression.Stack``) -----

    def dumps_checkpoint(
        self, cp: Mapping[str, Any], small: Mapping[str, Any], heads: bool
    ) -> tuple[S.Typed, bytes | Literal[False]]:
        """(the stored checkpoint: ``cp`` with ``small`` as its
        channel_values, ``dumps_small``'d; with ``heads``, the msgpack of
        ``cp`` alone for the head, which holds the values apart, else False),
        from one serialization."""
        if not heads:
            return self.dumps_small({**cp, "channel_values": small} if small else cp), False
        typ, data = self.inner.dumps_typed(cp)
        plain = H.plain_of(typ, data)
        if small:
            spliced = H.with_values(data, small) if typ == "msgpack" else None
            if spliced is None:
                return self.dumps_small({**cp, "channel_values": small}), plain
            data = spliced
        return self.wrap_small(typ, data), plain

    # -- reads --------------------------------------------------------------------

    def typed(self, txn: Any, key: bytes, raw: bytes | None) -> S.Typed | None:
        """The serde-typed value of a stored blob (None: no value): what every
        read of a channel value goes through. A delta comes back rebuilt, as
        plain ``("msgpack", bytes)``, which any of our serializer stacks loads."""
        if raw is None or raw[:1] != MARK:
            return S.decode_blob(raw)
        e = self.resolve(txn, key, raw)
        if e is None:
            raise CorruptStoreError(f"the delta value at {key!r} does not rebuild to a list")
        return "msgpack", e.plain

    def head_value(self, txn: Any, key: bytes, raw: bytes | None) -> bytes | Literal[False] | None:
        """What a head record holds for a stored blob (``heads.build``'s
        ``stored``): ``heads.plain_of`` of its value, None when it holds none."""
        typed = self.typed(txn, key, raw)
        return None if typed is None else H.plain_of(*self.unwrap(*typed))

    def values(
        self,
        txn: Any,
        channels: Iterable[str],
        keys: Iterable[bytes],
        raws: Iterable[bytes | None],
        loads: Callable[[S.Typed], Any],
        fast: C.ValueReaders | None,
    ) -> dict[str, Any]:
        """{channel: ``loads(typed(txn, key, raw))``} of a checkpoint's stored
        blobs, skipping those with no value, in one loop: a read loads every
        channel. ``fast``: ``compression.value_readers``, which
        load the two common records (plain and zstd msgpack) without a
        (type, bytes) pair or a call of ours first; None: ``loads`` alone."""
        out: dict[str, Any] = {}
        if fast is None:
            for ch, key, raw in zip(channels, keys, raws):
                if (typed := self.typed(txn, key, raw)) is not None:
                    out[ch] = loads(typed)
            return out
        unpackb, hook, option, inflate = fast
        plain, packed = S.BLOB_PREFIX_MSGPACK, S.BLOB_PREFIX_MSGPACK_ZST
        n, m = len(plain), len(packed)
        for ch, key, raw in zip(channels, keys, raws):
            if raw is None:
                continue
            if raw.startswith(plain):
                out[ch] = unpackb(raw[n:], ext_hook=hook, option=option)
            elif raw.startswith(packed):
                out[ch] = unpackb(inflate(raw[m:]), ext_hook=hook, option=option)
            elif (typed := self.typed(txn, key, raw)) is not None:
                out[ch] = loads(typed)
        return out

    def resolve(self, txn: Any, key: bytes, raw: bytes) -> _Entry | None:
        """The whole value of a stored list (whole or delta), or None when the
        record holds no list (another type, or the empty marker)."""
        hit = self.recent.get(key, raw)
        if hit is not None:
            return hit
        chain: list[DeltaRecord] = []
        k, r = key, raw
        prefix = b""  # the chain's (thread, ns, channel) key elements
        # The pieces below are earlier versions of the same channel, next to
        # each other in key order: one reverse scan fetches them (one round
        # trip on a network store instead of one per piece); a piece the scan
        # does not hold (a fork's versions interleave) is read by itself.
        below: dict[bytes, bytes] = {}
        depth = decode(raw).depth if raw[:1] == MARK else 0
        if depth > 1:
            below = dict(txn.scan(S.blob_channel_range(key)[0], key, reverse=True, limit=depth))
        while True:
            if r is None:
                raise CorruptStoreError(f"the base {k!r} of a stored delta value is missing")
            if chain:
                hit = self.recent.get(k, r)
                if hit is not None:
                    base = hit.plain
                    break
            if r[:1] == MARK:
                if len(chain) > _LIMIT:
                    raise CorruptStoreError(f"the delta chain of {key!r} does not end")
                rec = decode(r)
                chain.append(rec)
                prefix = prefix or S.blob_prefix(k)
                k = prefix + S.version_element(rec.ref)
                r = below[k] if k in below else txn.get(k)
                continue
            typed = S.decode_blob(r)
            base = b""
            if typed is not None:
                typ, base = self.unwrap(*typed)
                if typ != "msgpack":
                    base = b""
            if header(base) is None:
                if chain:
                    raise CorruptStoreError(f"the base {k!r} of a stored delta is not a list")
                return None
            if not chain:
                e = _Entry(raw, None, 0, base)
                self.recent.put(key, e)
                return e
            break
        hb = header(base)
        assert hb is not None
        top = chain[0]
        parts: list[Any] = [make_header(top.n), memoryview(base)[hb[1] :]]
        piece = self.piece_reader()
        parts.extend(piece(rec.typ, rec.piece) for rec in reversed(chain))
        e = _Entry(raw, top.digest, top.depth, b"".join(parts))
        self.recent.put(key, e)
        return e

    def _try_resolve(self, txn: Any, key: bytes, raw: bytes) -> _Entry | None:
        try:
            return self.resolve(txn, key, raw)
        except Exception:
            return None  # unreadable as a list here: the new value is stored whole

    # -- put ------------------------------------------------------------------------

    def prepare(
        self,
        thread: str,
        ns: str,
        new_versions: Mapping[str, Any],
        values: Mapping[str, Any],
        dumps: Any,
        parent_id: Any = None,
        heads: bool = False,
        reuse: bool = True,
    ) -> list[Pending]:
        """Serialize a put's changed channels (before its transaction): a list
        of at least ``min_bytes`` becomes plain msgpack, the rest records.
        ``parent_id``: a list that extends the version this process cached at
        the put of that checkpoint gets its delta made here too (``_speculate``).
        ``heads``: the put makes a head record: each value's ``Pending.head``.
        ``reuse``: a message list goes through ``self.elements`` (False: values
        read from elsewhere, as a migration's, whose objects never recur)."""
        out = []
        heads = heads and self.heads
        elements = self.elements if reuse else None
        for ch, key in S.blob_keys(thread, ns, new_versions, new=True):
            if ch not in values:
                out.append(Pending(ch, key, S.encode_blob(None), None, None, None))
                continue
            v = values[ch]
            if not self.enabled or (self.custom and type(v) is not list):
                # a serializer whose bytes are not known msgpack, or a layer's own
                typed = self.dumps_small(v) if ch == START else dumps(v)
                out.append(Pending(ch, key, S.encode_blob(typed), None))
                continue
            # Serialized once, for the blob and, with ``heads``, the head
            # (the stack is [encryption](compression(JsonPlusSerializer)):
            # ``wrap`` of the inner bytes is ``dumps``).
            data = None
            if elements is not None and type(v) is list:
                data = elements.dumps((thread, ns, ch), v)
            typ, data = ("msgpack", data) if data is not None else self.inner.dumps_typed(v)
            hb = H.plain_of(typ, data) if heads else False
            if type(v) is list:
                if typ == "msgpack" and len(data) >= self.min_bytes and header(data):
                    spec = self._speculate(thread, ns, parent_id, ch, key, data)
                    out.append(Pending(ch, key, None, data, spec, hb))
                    continue
                typed = self.wrap(typ, data)
            else:
                # The graph's input: read by the next step only, never by a
                # read of a step's checkpoint (consumed, it is stored empty),
                # so its small values cost no read a decompression.
                typed = self.wrap_small(typ, data) if ch == START else self.wrap(typ, data)
            out.append(Pending(ch, key, S.encode_blob(typed), None, None, hb))
        return out

    def write(
        self,
        txn: Any,
        thread: str,
        ns: str,
        parent_id: Any,
        pending: Iterable[Pending],
        put: Callable[[bytes, bytes], None] | None = None,
        known: Mapping[bytes, bytes | None] | None = None,
    ) -> None:
        """Write a put's blobs in its transaction: a list as a delta on the
        parent checkpoint's version of its channel when it extends it (and
        the chain is short enough), else whole. A version already stored with
        other content is first cut loose from the chains built on it.
        ``put`` writes a record (default ``txn.put``; the migration counts).
        ``known``: records already read in this transaction (``read_keys``'s,
        fetched with one ``get_many``: one round trip on a network store)."""
        put = put or txn.put
        known = known or {}

        def get(key: bytes) -> bytes | None:
            return known[key] if key in known else txn.get(key)

        parent: Mapping[str, Any] | None = None
        for p in pending:
            old = get(p.key)
            if p.plain is None:
                assert p.raw is not None  # stored whole: raw is the value
                if old == p.raw:
                    continue
                if old is not None:
                    self.detach(txn, {p.key}, *S.blob_channel_range(p.key))
                if p.raw == _EMPTY:
                    # No record reads as the "empty" marker does, so none is
                    # written: a graph's consumed input and triggers
                    # (__start__, branch:to:*) are a quarter of a chat's
                    # records, and small ones among long keys fill LMDB
                    # pages badly (older stores keep their markers,
                    # which read the same).
                    if old is not None:
                        txn.delete(p.key)
                    continue
                put(p.key, p.raw)
                continue
            if old is not None:
                e = self._try_resolve(txn, p.key, old)
                if e is not None and e.plain == p.plain:
                    continue  # the same value again: keep the record as it is
                self.detach(txn, {p.key}, *S.blob_channel_range(p.key))
            if parent is None:
                parent = self._parent_versions(get, thread, ns, parent_id)
            ref = parent.get(p.channel)
            raw = None
            if ref is not None:
                bkey = S.blob_key(thread, ns, p.channel, ref)
                if p.spec is not None and p.spec[0] == bkey and get(bkey) == p.spec[1]:
                    raw = p.spec[2]  # made on this very base record: the same bytes
                else:
                    raw = self._delta(txn, p, bkey, ref, get, known)
            if raw is None:
                raw = S.encode_blob(self.wrap("msgpack", p.plain))
                self.recent.put(p.key, _Entry(raw, None, 0, p.plain))
            put(p.key, raw)

    def _delta(
        self,
        txn: Any,
        p: Pending,
        bkey: bytes,
        ref: Any,
        get: Callable[[bytes], bytes | None],
        known: Mapping[bytes, bytes | None],
    ) -> bytes | None:
        """The delta record of ``p`` on the value at ``bkey``, or None."""
        assert p.plain is not None
        if bkey == p.key:
            return None
        braw = get(bkey)
        if braw is None:
            return None
        base = self._try_resolve(txn, bkey, braw)
        if base is None:
            return None
        return self._make_delta(p, bkey, ref, base, (txn, braw, get, known))

    def _speculate(
        self, thread: str, ns: str, parent_id: Any, ch: str, key: bytes, plain: bytes
    ) -> tuple[bytes, bytes, bytes] | None:
        """The delta of a put's list on the version of its channel
        at the parent checkpoint, made before the transaction from what this
        process cached (the parent's versions at its put, the base's rebuilt
        value), so its zstd call is made beside the checkpoint record's and
        not inside the transaction. None when anything is not in memory."""
        if not parent_id:
            return None
        parent = self._versions.items.get((thread, ns, str(parent_id)))
        ref = parent.get(ch) if parent is not None else None
        if ref is None:
            return None
        bkey = S.blob_key(thread, ns, ch, ref)
        base = self.recent.items.get(bkey)
        if base is None or bkey == key:
            return None
        raw = self._make_delta(Pending(ch, key, None, plain), bkey, ref, base)
        return None if raw is None else (bkey, base.raw, raw)

    def _make_delta(
        self,
        p: Pending,
        bkey: bytes,
        ref: Any,
        base: _Entry,
        store: tuple[Any, bytes, Callable[[bytes], bytes | None], Mapping[bytes, Any]]
        | None = None,
    ) -> bytes | None:
        """The delta record of ``p`` on ``base``, the value at ``bkey``, or
        None. ``store``: (txn, the base's stored record, get, the records
        read already) in the transaction; without it (``_speculate``) a long step, whose base is
        read from the store, is left to the transaction (None)."""
        assert p.plain is not None
        if base.depth + 1 >= self.max_chain:
            return None
        depth = base.depth + 1
        if self.stride > 1 and depth % self.stride == 0:
            if store is None:
                return None
            txn, braw, get, known = store
            # A long step: on the version ``stride`` back, so a read of any
            # version joins at most stride - 1 short steps and then
            # max_chain / stride long ones ("Chains" in the module docstring).
            jump = self._ancestor(txn, bkey, braw, depth - self.stride, get, known)
            if jump is not None:
                bkey, ref, base = jump
        new, old = header(p.plain), header(base.plain)
        if new is None or old is None or old[0] > new[0]:
            return None
        elems = memoryview(base.plain)[old[1] :]
        if not p.plain.startswith(elems, new[1]):
            return None
        digest = base.digest
        if digest is None:  # a whole base: named by its stored bytes
            digest = hashlib.blake2b(base.raw, digest_size=_DIGEST).digest()
            self.recent.put(bkey, base._replace(digest=digest))
        # A piece is a message or two: worth compressing from PIECE_THRESHOLD,
        # with the dictionary of message bytes (compression.SMALL_DICT), which
        # shrinks a chat message's msgpack much more than zstd alone does.
        # remember=False: pieces are read by _piece_reader, never via that cache.
        typ, piece = self.wrap_small("msgpack", p.plain[new[1] + len(elems) :], remember=False)
        h = hashlib.blake2b(digest, digest_size=_DIGEST)
        h.update(typ.encode())
        h.update(b"\x00")
        h.update(piece)
        rec = DeltaRecord(ref, new[0], depth, h.digest(), typ, piece)
        raw = encode(rec)
        self.recent.put(p.key, _Entry(raw, rec.digest, rec.depth, p.plain))
        return raw

    def _ancestor(
        self,
        txn: Any,
        key: bytes,
        raw: bytes,
        depth: int,
        get: Callable[[bytes], bytes | None],
        known: Mapping[bytes, Any],
    ) -> tuple[bytes, Any, _Entry] | None:
        """The version at ``depth`` of the chain through ``key`` (a delta of
        greater depth): its key, version and value, or None when the chain
        does not pass through that depth (then the parent stays the base).
        The versions between are the channel's previous keys: read already
        (``known``: ``read_keys`` names them when this process wrote them),
        or else one reverse scan reads them (one round trip on a network
        store, not one per version)."""
        steps = self.stride
        below: dict[bytes, bytes] | None = None
        prefix = S.blob_prefix(key)
        r: bytes | None = raw
        for _ in range(steps):
            if r is None or r[:1] != MARK:
                return None
            ref = decode(r).ref
            k = prefix + S.version_element(ref)
            if below is None and k not in known:
                below = dict(txn.scan(S.blob_channel_range(key)[0], key, reverse=True, limit=steps))
            r = below[k] if below is not None and k in below else get(k)
            if r is None:
                return None
            d = decode(r).depth if r[:1] == MARK else 0
            if d < depth:
                return None
            if d == depth:
                e = self._try_resolve(txn, k, r)
                return (k, ref, e) if e is not None and e.depth == depth else None
        return None

    def read_keys(
        self, thread: str, ns: str, parent_id: Any, pending: Iterable[Pending]
    ) -> list[bytes]:
        """The records ``write`` will read, as far as known before it reads
        any: each blob's own key, and the parent's record (versions not in
        memory) or the blobs a delta would extend. The caller reads them with
        one ``get_many`` and passes them in as ``known``, so a put is one
        round trip of reads on PostgreSQL."""
        pending = list(pending)
        keys = [p.key for p in pending]
        lists = [p for p in pending if p.plain is not None]
        if not lists or not parent_id:
            return keys
        parent = self._versions.items.get((thread, ns, str(parent_id)))
        if parent is None:
            keys.append(S.checkpoint_key(thread, ns, str(parent_id)))
            return keys
        for p in lists:
            ref = parent.get(p.channel)
            if ref is not None:
                bkey = S.blob_key(thread, ns, p.channel, ref)
                keys.append(bkey)
                keys.extend(self._long_step_keys(bkey))
        return keys

    def _long_step_keys(self, bkey: bytes) -> list[bytes]:
        """When a delta on ``bkey`` is a long step: the versions ``_ancestor``
        walks back through, as far as this process wrote them (``recent``)."""
        e = self.recent.items.get(bkey)
        stride = self.stride
        if e is None or stride <= 1 or (e.depth + 1) % stride or e.depth + 1 >= self.max_chain:
            return []
        target = e.depth + 1 - stride
        prefix = S.blob_prefix(bkey)
        out: list[bytes] = []
        r = e.raw
        for _ in range(stride):
            if r[:1] != MARK:
                break
            k = prefix + S.version_element(decode(r).ref)
            out.append(k)
            e = self.recent.items.get(k)
            if e is None or e.depth <= target:
                break
            r = e.raw
        return out

    def _parent_versions(
        self, get: Callable[[bytes], bytes | None], thread: str, ns: str, parent_id: Any
    ) -> Mapping[str, Any]:
        if not parent_id:
            return {}
        hit = self._versions.items.get((thread, ns, str(parent_id)))
        if hit is not None:
            return hit
        raw = get(S.checkpoint_key(thread, ns, str(parent_id)))
        if raw is None:
            return {}
        try:
            versions = self.top.loads_typed(S.decode_checkpoint(raw).checkpoint)
            return dict(versions.get("channel_versions") or {})
        except Exception:
            return {}

    def remember(self, thread: str, ns: str, checkpoint_id: str, versions: Any) -> None:
        """After a put: its checkpoint's versions, for the put that follows it."""
        if not self.enabled or not isinstance(versions, Mapping):
            return
        self._versions.put((thread, ns, checkpoint_id), dict(versions))

    # -- keeping chains whole ----------------------------------------------------------

    def plan_copy(
        self,
        txn: Any,
        moved: list[tuple[bytes, bytes]],
        used: set[bytes],
        lo: bytes,
        hi: bytes,
    ) -> list[tuple[bytes, bytes]]:
        """``copy_thread``'s blobs, keyed for the target [lo, hi): those the
        source's checkpoints use, with the bases of their delta chains. A base
        no source checkpoint uses does not replace a target blob of the same
        key (the target's checkpoints may use it): the deltas built on it are
        copied whole instead. Target deltas built on a blob the copy replaces
        are rewritten whole first (``detach``)."""
        src = dict(moved)
        needed = chain_closure(src.items(), used & src.keys())
        out: dict[bytes, bytes] = {}
        clash = set()
        for k in needed:
            v, old = src[k], txn.get(k)
            if k in used or old is None or old == v:
                out[k] = v
            else:
                clash.add(k)
        if clash:
            view = _Pairs(src)
            for k, v in list(out.items()):
                cur, steps = k, 0
                while src.get(cur, b"")[:1] == MARK and steps <= len(src):
                    cur, steps = base_key(cur, src[cur]), steps + 1
                    if cur in clash:
                        e = self.resolve(view, k, v)
                        assert e is not None
                        out[k] = S.encode_blob(self.wrap("msgpack", e.plain))
                        break
        replaced = {k for k, v in out.items() if txn.get(k) not in (None, v)}
        if replaced:
            self.detach(txn, replaced, lo, hi, keep=out.keys())
        return list(out.items())

    def detach(
        self,
        txn: Any,
        overwritten: set[bytes],
        lo: bytes,
        hi: bytes,
        keep: Iterable[bytes] = (),
    ) -> int:
        """Before the blobs ``overwritten`` get other bytes: rewrite whole
        every delta in [lo, hi) whose chain goes through one of them (except
        those in ``keep``, which are about to be replaced too). Returns how
        many were rewritten."""
        refs = {k: base_key(k, r) for k, r in txn.scan(lo, hi) if r[:1] == MARK}
        skip = set(keep) | overwritten
        victims = []
        for k in refs:
            if k in skip:
                continue
            cur, steps = k, 0
            while cur in refs and steps <= len(refs):
                cur, steps = refs[cur], steps + 1
                if cur in overwritten:
                    victims.append(k)
                    break
        rebuilt = []
        for k in victims:
            e = self.resolve(txn, k, txn.get(k))
            assert e is not None
            rebuilt.append((k, e.plain))
        for k, plain in rebuilt:  # all rebuilt before any is rewritten
            raw = S.encode_blob(self.wrap("msgpack", plain))
            txn.put(k, raw)
            self.recent.put(k, _Entry(raw, None, 0, plain))
        return len(rebuilt)


_CODECS_LOCK = threading.RLock()  # the callback below may run inside codec(), during a collection
# id(serializer) -> a weak reference to its codec: one codec per serializer
# object while something (a saver, its heads) holds that codec, and nothing
# stored on the user's object. The codec holds its serializer, so while the
# codec lives the id names that serializer alone; the reference's callback
# drops the entry when the codec goes.
_CODECS: dict[int, weakref.ref[Codec]] = {}


def codec(serde: SerializerProtocol) -> Codec:
    """The codec of a serializer stack, one per serializer object (so a clone
    with another allowlist, or another cipher, has its own caches), for as
    long as a holder of it (the saver) keeps it. A serializer that cannot be
    weakly referenced (``__slots__``) gets a new codec at each call, which
    makes no deltas (no cache to find a base in: values are stored whole)."""
    try:
        weakref.ref(serde)
    except TypeError:
        alone = Codec(serde)
        alone.enabled = False
        return alone
    ref = _CODECS.get(id(serde))
    hit = ref() if ref is not None else None
    if hit is not None and hit.serde is serde:
        return hit
    with _CODECS_LOCK:
        ref = _CODECS.get(id(serde))
        hit = ref() if ref is not None else None
        if hit is not None and hit.serde is serde:
            return hit
        c = Codec(serde)
        key = id(serde)
        _CODECS[key] = weakref.ref(c, functools.partial(_forget, key))
    return c


def _forget(key: int, ref: weakref.ref[Codec]) -> None:
    with _CODECS_LOCK:
        if _CODECS.get(key) is ref:
            del _CODECS[key]
