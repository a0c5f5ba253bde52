"""Head records: a thread's newest checkpoint, whole and uncompressed, in one
record.

A read of a thread's latest checkpoint (every ``invoke``, every
``get_state``) otherwise gets the record, keys and gets one blob per
channel, rebuilds delta'd lists and decompresses zstd frames, then unpacks
each value, where SqliteSaver, which stores each checkpoint whole, reads one
record. Storing every checkpoint whole would give up what deltas and
compression save on disk, so only the
newest checkpoint of each (thread, namespace) is kept whole, here, in one
record that ``put`` rewrites in the same transaction as the checkpoint:

    key   ("~h", thread, ns)   -- ``schema.head_key``; "~" sorts after every
                                  other keyspace, so heads never land in the
                                  middle of another keyspace's pages
    value 0x01 | u32 n | the checkpoint's stored record (n bytes)
               | u16 m | msgpack [checkpoint id, values_at,
                                  [[channel, version, start, end], ...]]
               | payload: msgpack [parent id, metadata, checkpoint with channel_values]

The payload is spliced from bytes the put made anyway (the serializer's
msgpack of each changed value, of the checkpoint and of the metadata; an
unchanged channel's value from the previous head, found by its version), so
a read unpacks it in one call. ``start``/``end`` locate each value after
``values_at`` in the payload, for the next put (equal: a version with no
value).

**Never stale.** A read uses a head only when the record it holds is, byte
for byte, the record the read found (the latest by its key, or the one named
by id); anything else (a head another kvsaver version did not update, a
pruned or replaced checkpoint, a head of a fork) falls back to the blobs. A
put writes no head for a checkpoint older than the head's, and deletes the
head when it cannot make one (a value that is not msgpack, a value too large:
``MAX_BYTES``), so the record bytes it holds are always its own.

**When there are none.** Values encrypted (a head would hold them in the
clear), a serializer other than ``JsonPlusSerializer`` (its bytes are not
known to be msgpack), or a network store (each put would send the whole
checkpoint again).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import ormsgpack

from ._msgpack import make_map_header, map_header

__all__ = [
    "MAX_BYTES",
    "build",
    "parse",
    "payload",
    "plain_of",
    "split_values",
    "version_key",
    "versions_of",
    "with_values",
]

# A head is written while the checkpoint's values fit in this: a long chat's
# message list outgrows it (its reads are served by deltas and the cache), and
# a put then writes no head (not an uncompressed copy of what deltas keep small).
MAX_BYTES = 32 * 1024
_VERSION = b"\x01"
_NIL = b"\xc0"


def plain_of(typ: str, data: bytes) -> bytes | Literal[False]:
    """The msgpack a head stores for a value the serializer made as (typ,
    data), or False when msgpack cannot say it with the same result."""
    if typ == "msgpack":
        return data
    if typ == "null":
        return _NIL
    if typ == "bytes":
        return ormsgpack.packb(bytes(data))  # a bytes subclass as its bytes, as a read
    return False


def version_key(channel: str, version: Any) -> tuple[str, type, Any]:
    """What names one stored value of ``channel``: its version with the
    version's type, as blob keys tell them apart (``1``, ``1.0`` and ``True``
    are equal in Python, and one dict key, but three blobs)."""
    return channel, type(version), version


def _frame(head: bytes | None) -> tuple[int, int] | None:
    """(where the stored record ends, where the payload starts) of a head."""
    if head is None or head[:1] != _VERSION:
        return None
    at = 5 + int.from_bytes(head[1:5], "big")
    return at, at + 2 + int.from_bytes(head[at : at + 2], "big")


def payload(head: bytes | None, record: bytes) -> memoryview | None:
    """The payload of ``head`` when it is the head of ``record`` (the stored
    bytes of the checkpoint found), else None."""
    frame = _frame(head)
    if frame is None or head is None or head[5 : frame[0]] != record:
        return None
    return memoryview(head)[frame[1] :]


def parse(head: bytes | None) -> tuple[Any, int, list[list[Any]], int] | None:
    """(checkpoint id, where the values start in the payload, [[channel,
    version, start, end], ...], where the payload starts) of a stored head;
    None for none, or a damaged one (only a copy, which the put replaces)."""
    frame = _frame(head)
    if frame is None or head is None:
        return None
    try:
        cid, values_at, entries = ormsgpack.unpackb(head[frame[0] + 2 : frame[1]])
    except (ValueError, TypeError):
        return None
    if type(cid) is not str or type(values_at) is not int or type(entries) is not list:
        return None  # damaged: the shape build() writes, or nothing
    return cid, values_at, entries, frame[1]


def _previous(head: bytes | None, parsed: Any) -> dict[tuple[str, type, Any], Any]:
    """{``version_key``: its value's bytes in ``head``, or None: no value}.
    Empty for a damaged head: the entries must locate, in order, each value
    right after its channel's key and each "no value" where the last value
    ended, up to the head's last byte, as ``build`` wrote them, so that no
    bytes from a damaged head are copied into the next (whose record would
    then make them trusted)."""
    if head is None or parsed is None:
        return {}
    view, base = memoryview(head), parsed[3] + parsed[1]
    out: dict[tuple[str, type, Any], Any] = {}
    end = 0
    try:
        for c, w, a, b in parsed[2]:
            if a != b:
                key = _key(c)
                if not end + len(key) == a < b or view[base + end : base + a] != key:
                    return {}
                end = b
            elif a != end:  # "no value" sits where the last value ended
                return {}
            out[version_key(c, w)] = view[base + a : base + b] if a != b else None
    except (ValueError, TypeError):  # an entry of another shape
        return {}
    return out if base + end == len(head) else {}  # cut short or trailing: nothing taken


def _map_body(data: bytes) -> tuple[int, memoryview] | None:
    """(entry count, entries) of a msgpack map, else None."""
    found = map_header(data)
    return None if found is None else (found[0], memoryview(data)[found[1] :])


def build(
    record: bytes,
    checkpoint_id: str,
    parent_id: str | None,
    checkpoint_plain: bytes,
    metadata_plain: bytes,
    versions: Mapping[str, Any],
    mine: Mapping[str, tuple[Any, bytes | Literal[False] | None]],
    previous: bytes | None,
    parsed: tuple[Any, int, list[list[Any]], int] | None,
    stored: Any,
    sizes: dict[tuple[str, type, Any], int],
) -> bytes | None:
    """The head of a checkpoint being put, or None when it cannot have one.

    ``versions``: its channel_versions; ``mine``: channel -> (version, head
    bytes, None: no value, or False: not one a head can hold) of the values
    this put writes; an other channel's value comes from ``previous`` (the
    stored head, ``parsed`` by ``parse``) when it holds that version, else
    from ``stored(channel, version)``: what ``mine`` would say of the stored
    blob. A put whose values outgrow ``MAX_BYTES`` (a long chat's message
    list) stops there. ``sizes``: ``version_key`` -> the length
    of a stored value this put's process found before (a hint, kept while
    a thread has no head: a value that stays too large is not read from its
    blob again at every put); the values read from ``stored`` are added."""
    cp = _map_body(checkpoint_plain)
    if cp is None:
        return None
    # Each value from this put or the previous head first; those neither has
    # are read from their blobs only if the rest (with ``sizes``' hint for
    # them) leaves room: a long chat's list, changed by this put or known too
    # large, costs no blob read.
    prev: dict[tuple[str, type, Any], Any] | None = None
    values: dict[str, Any] = {}
    unread: list[tuple[str, Any, tuple[str, type, Any]]] = []
    size = hinted = 0
    for ch, v in versions.items():
        got = mine.get(ch)
        if got is not None and type(got[0]) is type(v) and got[0] == v:  # see version_key
            value = got[1]
        else:
            if prev is None:
                prev = _previous(previous, parsed)
            vk = version_key(ch, v)
            value = prev.get(vk, _MISSING)
            if value is _MISSING:
                unread.append((ch, v, vk))
                hinted += sizes.get(vk, 0)
                continue
        if value is False:
            return None
        values[ch] = value
        size += len(value) if value else 0
    if size + hinted > MAX_BYTES:
        return None
    for ch, v, vk in unread:
        value = values[ch] = stored(ch, v)
        if value is False:
            return None
        if value:
            sizes[vk] = len(value)
            size += len(value)
            if size > MAX_BYTES:
                return None
    parts: list[Any] = []
    entries: list[tuple[str, Any, int, int]] = []
    at = 0  # offsets from the first value's key
    for ch, v in versions.items():
        value = values[ch]
        if value is None:  # no value: recorded, so the next put need not look
            entries.append((ch, v, at, at))
            continue
        key = _key(ch)
        at += len(key)
        entries.append((ch, v, at, at + len(value)))
        at += len(value)
        parts.append(key)
        parts.append(value)
    values_header = make_map_header(len(parts) // 2)
    start: list[bytes | memoryview] = [
        b"\x93",
        ormsgpack.packb(parent_id),
        metadata_plain,
        make_map_header(cp[0] + 1),
        cp[1],
        _VALUES_KEY,
        values_header,
    ]
    hdr = ormsgpack.packb((checkpoint_id, sum(map(len, start)), entries))
    if len(hdr) > 0xFFFF:  # thousands of channels: more than its u16 length says
        return None
    return b"".join(
        [
            _VERSION,
            len(record).to_bytes(4, "big"),
            record,
            len(hdr).to_bytes(2, "big"),
            hdr,
            *start,
            *parts,
        ]
    )


def with_values(checkpoint_plain: bytes, small: Mapping[str, Any]) -> bytes | None:
    """A checkpoint's msgpack with ``small`` as its channel_values (the
    record's, ``saver/small.py``), spliced onto the msgpack made for the
    head, which holds the values apart; None when it is not a map."""
    cp = _map_body(checkpoint_plain)
    if cp is None:
        return None
    return b"".join([make_map_header(cp[0] + 1), cp[1], _VALUES_KEY, ormsgpack.packb(dict(small))])


def split_values(checkpoint_plain: bytes) -> tuple[bytes, dict[str, Any]] | None:
    """(a stored checkpoint's msgpack without its channel_values, those
    values): the first is what ``build`` takes. None when the checkpoint
    holds a type msgpack's extensions name, which it could not write again
    as it was."""
    if _VALUES_KEY not in checkpoint_plain:
        return checkpoint_plain, {}
    named: list[int] = []
    try:
        cp = ormsgpack.unpackb(
            checkpoint_plain,
            ext_hook=lambda code, data: named.append(code),
            option=ormsgpack.OPT_NON_STR_KEYS,
        )
    except (ValueError, TypeError):
        return None
    if named or type(cp) is not dict:
        return None
    small = cp.pop("channel_values", None)
    if small is None:
        return checkpoint_plain, {}
    if type(small) is not dict or any(type(ch) is not str for ch in small):
        return None
    return ormsgpack.packb(cp, option=ormsgpack.OPT_NON_STR_KEYS), small


def _no_ext(code: int, data: bytes) -> None:
    return None  # no type the stored data names is looked up, nor called


def versions_of(checkpoint_plain: bytes) -> dict[str, Any] | None:
    """The channel_versions of a checkpoint's msgpack (``plain_of`` of the
    stored checkpoint), read without the serializer's hooks: nothing the
    stored data names is imported or called (a head made in the background
    runs no such code). None unless each is a str, int or float (every
    version LangGraph makes), the types it can be read back as exactly."""
    try:
        cp = ormsgpack.unpackb(
            checkpoint_plain, ext_hook=_no_ext, option=ormsgpack.OPT_NON_STR_KEYS
        )
    except (ValueError, TypeError):
        return None
    versions = cp.get("channel_versions") if type(cp) is dict else None
    if type(versions) is not dict:
        return None
    for ch, v in versions.items():
        if type(ch) is not str or type(v) not in (str, int, float):
            return None
    return versions


def _key(ch: str) -> bytes:
    """A channel name's msgpack, as a key of channel_values."""
    key = _KEYS.get(ch)
    if key is None:
        if len(_KEYS) > 4096:
            _KEYS.clear()
        key = _KEYS[ch] = ormsgpack.packb(ch)
    return key


_MISSING: Any = object()
_KEYS: dict[str, bytes] = {}  # channel name -> its msgpack (a graph has a few)
_VALUES_KEY = ormsgpack.packb("channel_values")
