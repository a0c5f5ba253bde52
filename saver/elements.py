"""A message list's msgpack made element by element, reusing the bytes of the
elements a put already serialized, to save a put's CPU (the puts of a saver
with ``fast_paths=True``).

A graph's message history gains a message or two per step, and every put of
the channel serializes the whole list again: ``JsonPlusSerializer`` dumps each
message through pydantic (``model_dump``) and a Python hook, so most of a
put's CPU goes to messages it serialized at the previous step (InMemorySaver
pays the same). A msgpack array is its
header followed by its elements, each serialized on its own, so the list's
bytes are ``make_header(n) + b"".join(bytes of each element)``; this module
keeps, per (thread, namespace, channel), the list it serialized last, its
bytes and its elements' fingerprints, and serializes again only the
elements it cannot prove unchanged. A list it has not seen (the first put
after a read of the thread, whose messages are new objects) is serialized
in one call, its fingerprints taken in one call more (that put costs
somewhat more than the serialization alone); the puts after it extend it,
serializing only the elements they cannot reuse.

**When an element's bytes are reused.** The element must be the very object
serialized before (``is``: the cache holds a reference, so its id cannot be
reused by another object), of the same class, and its state must be
unchanged: the fingerprint, ormsgpack's bytes of its ``__dict__`` and
``__pydantic_extra__`` with a ``default`` that refuses every type ormsgpack
does not encode natively, must equal the one taken when its bytes were made.
Those bytes are exact (``1``, ``1.0`` and ``True`` differ; so does a key
order), so a message changed in place (its content edited, a key added to
``additional_kwargs``, an id set by ``add_messages``) is serialized again.
What the serializer makes of a pydantic model is ``model_dump()``'s output,
which is a function of those fields alone when the class leaves serializing
to pydantic: no computed fields, no model or field serializers, none in its
schema (an ``Annotated`` ``PlainSerializer``, an ``exclude_if``), and
``model_dump`` not overridden (``_plain_model``; LangChain's messages
qualify). An element whose fields hold a value ormsgpack does not encode
natively (a datetime, a nested model) has no fingerprint and is serialized
at every put; so is one that changed while it was serialized (the put of a
step under durability "async" runs beside the next step): its fingerprint is
taken again after its bytes, and it is kept only if both agree. A list with
an element of another kind (a dict, a str, a model that serializes by its
own code), or under a serializer other than ``JsonPlusSerializer``'s own
``dumps_typed``, is serialized whole.

A probe at import checks the assumptions about the serializer: that it has
the ``_msgpack_enc`` and ``_option`` this module uses, and that its bytes of
a list are the header followed by its bytes of each element. If a LangGraph
release ever breaks one, the module turns itself off (those names come from
``_upstream``, and ``tests/test_upstream.py`` fails then).

What is kept (at most ``max_bytes``: ``CACHE_BYTES`` by default, twice the
compression layer's ``cache_bytes`` in a saver's codec; least recently used
lists out) is counted roughly: the fingerprints and bytes, the elements it keeps alive
(about their bytes again), and the lists' own overhead. A list that alone
would cost over a quarter of it is made once, then left to the serializer
(``Elements.large``) until it shrinks to half its length, or for 64 puts.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any, NamedTuple

import ormsgpack
from pydantic import BaseModel

from . import _upstream as U
from ._lru import SizedLRU
from ._msgpack import make_header

__all__ = ["CACHE_BYTES", "Elements"]

CACHE_BYTES = 16 << 20  # what the kept lists hold alive, roughly (all channels)

_enc: Any = U.msgpack_enc  # the serializer's encoder (module globals: tests swap them)
_option: int | None = U.msgpack_option  # and its options


def _refuse(obj: Any) -> Any:
    raise TypeError("not plain data")  # a fingerprint holds only what ormsgpack encodes exactly


def _plain_bytes(value: Any) -> bytes | None:
    """ormsgpack's bytes of ``value``, None when it holds something ormsgpack
    does not encode natively."""
    try:
        return ormsgpack.packb(value, default=_refuse, option=_option)
    except (ormsgpack.MsgpackEncodeError, TypeError):
        return None


def _fingerprint(e: Any) -> bytes | None:
    """The bytes of the fields of ``e``, None when they hold a value that is
    not plain data (then ``e`` is serialized at every put)."""
    return _plain_bytes((e.__dict__, e.__pydantic_extra__))


_PLAIN: dict[type, bool] = {}
_PLAIN_MAX = 512  # classes made at run time are not kept alive for good
# Keys of a pydantic core schema under which serialization is the user's code
# (a PlainSerializer, WrapSerializer, an ``exclude_if`` predicate).
_SERIALIZED_BY_CODE = ("serialization", "serialization_exclude_if")


def _schema_plain(schema: Any) -> bool:
    """Whether no part of a pydantic core schema serializes by the user's code."""
    todo, seen = [schema], set()
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, dict):
            if any(k in node for k in _SERIALIZED_BY_CODE):
                return False
            todo.extend(node.values())
        elif isinstance(node, (list, tuple)):
            todo.extend(node)
    return True


def _plain_model(cls: type) -> bool:
    """Whether ``model_dump()`` of ``cls`` is pydantic's own, a function of
    the fields' values alone: a pydantic v2 model with no computed fields, no
    model or field serializers, none in its schema (``Annotated``
    serializers, ``exclude_if``), and ``model_dump`` not overridden."""
    known = _PLAIN.get(cls)
    if known is None:
        known = False
        if issubclass(cls, BaseModel):
            decorators = U.decorators(cls)
            known = (
                decorators is not None
                and cls.model_dump is BaseModel.model_dump
                and not U.computed_fields(cls)
                and not decorators.model_serializers
                and not decorators.field_serializers
                and _schema_plain(U.core_schema(cls))
            )
        if len(_PLAIN) >= _PLAIN_MAX:
            _PLAIN.clear()
        _PLAIN[cls] = known
    return known


class _Probe(BaseModel):
    text: str
    meta: dict[str, Any]


def _probe() -> bool:
    if _enc is None or _option is None:
        return False
    items = [_Probe(text="a", meta={"k": [1, 2.5, True]}), _Probe(text="b" * 40, meta={})]
    try:
        return make_header(2) + b"".join(_enc(e) for e in items) == _enc(items)
    except Exception:
        return False


ENABLED = _probe()
_PER_ELEMENT = 128  # bytes: an element's slots in the kept lists, two bytes objects' headers
_PER_LIST = 1024  # bytes: a kept list's record, lists and cache entry
_LARGE_MAX = 1024  # lists remembered as too large to keep (see Elements.large)
_LARGE_RETRY = 64  # puts of such a list left to the serializer before one more try


def _fingerprints(items: list[Any]) -> bytes | None:
    """``_fingerprint`` of each of ``items`` as one msgpack array (one call),
    None when one is not plain data."""
    return _plain_bytes([(e.__dict__, e.__pydantic_extra__) for e in items])


def _joined(fps: list[bytes | None]) -> bytes | None:
    """The fingerprints joined (what ``_extend`` compares in one slice), None
    when one is None."""
    plain = [f for f in fps if f is not None]
    return b"".join(plain) if len(plain) == len(fps) else None


def _made(e: Any, fp: bytes | None) -> tuple[bytes | None, bytes]:
    """The fingerprint and bytes of an element not kept, ``fp`` its
    fingerprint taken first. One changed by another thread while it was
    serialized gets no fingerprint (its bytes may be of either state): it is
    serialized again at the next put."""
    data = _enc(e)
    return (fp if fp is None or _fingerprint(e) == fp else None), data


class _Held(NamedTuple):
    """What ``Elements`` keeps of the list it serialized last for a key."""

    objs: list[Any]  # the elements (references: their ids stay theirs)
    types: list[type]  # their classes (a class assigned in place is another element)
    # each element's fingerprint (None: not plain data) and bytes; None: not
    # known one by one (``Elements._first``)
    fps: list[bytes | None] | None
    encs: list[bytes] | None
    # the fingerprints joined (a prefix's one compare); None: one is None
    fp_body: bytes | None
    enc_body: bytes  # the elements' bytes joined
    size: int


class Elements(SizedLRU[Hashable, _Held]):
    """The elements' bytes of the list last serialized per key, least
    recently used keys out past ``max_bytes``. Thread-safe: what is kept is
    checked on use (objects, fingerprints), whoever stored it."""

    def __init__(self, max_bytes: int = CACHE_BYTES) -> None:
        super().__init__(max_bytes)
        # key -> [length, puts since] of a list found too large to keep
        # (over a quarter of ``max_bytes``): it is left to the serializer,
        # instead of paying ``_first``'s fingerprints at every put for
        # nothing (for a list that large they cost more than its plain
        # serialization), until it shrinks to half that length or
        # for ``_LARGE_RETRY`` puts (its elements may have shrunk instead).
        self.large: dict[Hashable, list[int]] = {}

    @property
    def lists(self) -> OrderedDict[Hashable, _Held]:
        return self.items

    def cost(self, key: Hashable, value: _Held) -> int:
        return value.size

    def dumps(self, key: Hashable, value: list[Any]) -> bytes | None:
        """The serializer's msgpack of ``value`` (``_msgpack_enc(value)``),
        or None when this module does not make it (the caller serializes the
        list whole: the serializer's own errors and fallbacks then apply)."""
        if not ENABLED or not value:
            return None
        mark = self.large.get(key)
        if mark is not None:
            if len(value) > mark[0] >> 1 and mark[1] < _LARGE_RETRY:
                mark[1] += 1
                return None
            self.large.pop(key, None)
        types = list(map(type, value))
        if not all(map(_plain_model, set(types))):
            return None
        held = self.items.get(key)
        try:
            if held is not None:
                if len(held.objs) <= len(value):
                    made = self._extend(held, key, value, types)
                    if made is not None:
                        return made
                if held.fp_body is None or held.encs is not None:
                    return self._whole(held, key, value, types)
            return self._first(key, value, types)
        except Exception:  # the serializer's own error: it meets it again
            self.discard(key)
            return None

    def _first(self, key: Hashable, value: list[Any], types: list[type]) -> bytes:
        """A list none of whose elements is kept (the first put after a read
        of the thread: its messages are new objects): serialized in one call,
        as the serializer does, and kept with the fingerprints of all its
        elements, taken before and after (an element another thread changed
        meanwhile leaves the list not kept). What ``_extend`` needs, not each
        element's bytes: a list that later reorders its elements goes
        through ``_whole``, which keeps those."""
        before = _fingerprints(value)
        data = _enc(value)
        hdr = len(make_header(len(value)))
        after = _fingerprints(value) if before is not None else None
        fp_body = before[hdr:] if before is not None and before == after else None
        self._keep(key, value, types, None, None, fp_body, data[hdr:])
        return data

    def _extend(
        self, held: _Held, key: Hashable, value: list[Any], types: list[type]
    ) -> bytes | None:
        """The common case: ``value`` starts with the very elements of the
        list kept, unchanged (one fingerprint of them all); None otherwise."""
        k = len(held.objs)
        if (
            held.fp_body is None
            or not all(map(operator.is_, value, held.objs))
            or not all(map(operator.is_, types, held.types))
        ):
            return None
        fp = _fingerprints(value[:k])
        # ``fp`` is make_header(k) + the k fingerprints (msgpack concatenates)
        hdr = make_header(k)
        if fp is None or not fp.startswith(hdr) or fp[len(hdr) :] != held.fp_body:
            return None
        new = value[k:]
        if not new:
            self._keep(key, value, types, held.fps, held.encs, held.fp_body, held.enc_body)
            return make_header(len(value)) + held.enc_body
        made = [_made(e, _fingerprint(e)) for e in new]
        fps = [f for f, _ in made]
        encs = [d for _, d in made]
        joined = _joined(fps)
        fp_body = held.fp_body + joined if joined is not None else None
        body = held.enc_body + b"".join(encs)
        self._keep(
            key,
            value,
            types,
            held.fps + fps if held.fps is not None else None,
            held.encs + encs if held.encs is not None else None,
            fp_body,
            body,
        )
        return make_header(len(value)) + body

    def _whole(self, held: _Held, key: Hashable, value: list[Any], types: list[type]) -> bytes:
        """Element by element: an element kept and unchanged reuses its bytes;
        one whose fields are not plain data is serialized every time."""
        hfps: list[bytes | None] = []
        hencs: list[bytes] = []
        at: dict[int, int] = {}
        if held.fps is not None and held.encs is not None:  # known one by one
            hfps, hencs = held.fps, held.encs
            at = {id(o): i for i, o in enumerate(held.objs)}
        fps: list[bytes | None] = []
        encs: list[bytes] = []
        for e, t in zip(value, types):
            fp = _fingerprint(e)
            i = at.get(id(e))
            if (
                i is not None
                and fp is not None
                and held.objs[i] is e
                and held.types[i] is t
                and hfps[i] == fp
            ):
                data = hencs[i]
            else:
                fp, data = _made(e, fp)
            fps.append(fp)
            encs.append(data)
        body = b"".join(encs)
        self._keep(key, value, types, fps, encs, _joined(fps), body)
        return make_header(len(value)) + body

    def _keep(
        self,
        key: Hashable,
        value: list[Any],
        types: list[type],
        fps: list[bytes | None] | None,
        encs: list[bytes] | None,
        fp_body: bytes | None,
        body: bytes,
    ) -> None:
        if fp_body is not None:
            fp_bytes = len(fp_body)
        else:
            fp_bytes = sum(len(f) for f in fps if f) if fps is not None else 0
        # Roughly what is kept alive: the fingerprints and bytes, each twice
        # (the lists and their joins), the elements themselves (about their
        # bytes again), and the lists' and records' own overhead.
        size = 2 * fp_bytes + 3 * len(body) + _PER_ELEMENT * len(value) + _PER_LIST
        if self.put(key, _Held(list(value), types, fps, encs, fp_body, body, size)):
            return
        # Too large to keep: not tried again soon (``large``).
        if len(self.large) >= _LARGE_MAX:
            try:  # the oldest mark out (dicts keep insertion order)
                del self.large[next(iter(self.large))]
            except (KeyError, RuntimeError, StopIteration):  # another thread's change
                pass
        self.large[key] = [len(value), 0]
