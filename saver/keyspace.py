"""The keys of KVSaver's schema: keyspace names, key elements and the keys
and ranges of every keyspace, as ``saver/schema.py``'s table lays them out
(that table is the schema; this module builds what it says). Strings longer
than a key holds become surrogates ("Short keys" there); the elements and
prefixes every read keys again are memoized here."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from kvsaver.kv.keys import pack, prefix_range, split, unpack

SCHEMA_KEY = pack(("meta", "schema"))
SWEEP_KEY = pack(("meta", "sweep"))
_MAX_INLINE = 94  # escaped UTF-8 bytes; 5 inline strings + codes stay < 511

CHECKPOINT = "c"
BLOB = "b"
WRITE = "w"
RUN = "r"
BY_ID = "g"
META = "m"
ACTIVITY = "a"
IDLE = "i"
HEAD = "~h"  # after every other keyspace: heads never split another's pages
# KVStore's keyspace (laid out in ``saver/kvstore/keyspace.py``): KVSaver's
# schema check and ``stats`` step over it.
STORE = "s"
STORE_ITEM = "i"  # ("s", "i", ns id, key element): a KVStore item's record, one per item

_K = TypeVar("_K")
_V = TypeVar("_V")
_K_CACHE: dict[str, str | bytes] = {}


def k(s: str) -> str | bytes:
    """The key element for a string: itself, or a surrogate when too long."""
    if len(s) <= 23:
        return s  # <= 23 chars: at most 92 bytes UTF-8, escaping included
    # Checkpoint ids and version strings are longer than that and are keyed
    # over and over (every read of a checkpoint keys all its channels).
    elem = _K_CACHE.get(s)
    if elem is None:
        raw = s.encode("utf-8", "surrogatepass")
        elem = (
            s
            if len(raw) + raw.count(0) <= _MAX_INLINE
            else (raw[:24] + hashlib.sha256(raw).digest()[:16])
        )
        _memo(_K_CACHE, s, elem)
    return elem


def _ver(v: str | int | float) -> str | bytes | int | float:
    return k(v) if isinstance(v, str) else v


def _el(s: str) -> bytes:
    """``pack((k(s),))``. A plain ASCII string short enough to stay inline
    (every id and version LangGraph makes) is encoded directly: cheaper than
    the memo lookups, and a put's new ids and versions would only miss them
    and push older entries out. ``encode()``, not
    ``encode("ascii")``: the same bytes for ASCII, without looking the codec
    up by name (half the cost of the encoding)."""
    if type(s) is str and len(s) <= _MAX_INLINE and s.isascii() and "\x00" not in s:
        return b"\x02" + s.encode() + b"\x00"
    return _str_key_element(s) if type(s) is str else pack((k(s),))


# -- keys -------------------------------------------------------------------


def _thread_ns_prefix(kind: str, thread: str, ns: str) -> bytes:
    """``pack((kind, k(thread), k(ns)))``, memoized: every read of a thread's
    checkpoint packs it for the checkpoint and blob keyspaces (a packed
    tuple is its elements' encodings, concatenated)."""
    mark = (kind, thread, ns)
    prefix = _TN_CACHE.get(mark)
    if prefix is None:  # a thread not read lately: each element by _el, no pack
        prefix = _memo(_TN_CACHE, mark, _el(kind) + _el(thread) + _el(ns))
    return prefix


_TN_CACHE: dict[tuple[str, str, str], bytes] = {}


def checkpoint_key(thread: str, ns: str, checkpoint_id: str) -> bytes:
    return _thread_ns_prefix(CHECKPOINT, thread, ns) + _el(checkpoint_id)


def checkpoint_key_from_elements(kt: Any, kns: Any, kcid: Any) -> bytes:
    return pack((CHECKPOINT, kt, kns, kcid))


_CHECKPOINT_PREFIX = pack((CHECKPOINT,))


def id_element(checkpoint_id: str) -> bytes:
    """A checkpoint id's packed key element: what orders the checkpoints of
    a thread (``list``'s positions compare these bytes as the keys do)."""
    return _el(checkpoint_id)


def index_entry(key: bytes, index_start: bytes) -> tuple[bytes, bytes]:
    """(the checkpoint id's packed element, the checkpoint key) of an entry
    of the id or meta index, ``key``, found in the range that starts at
    ``index_start`` (``by_id_range``'s, ``meta_range``'s): the entry's last
    three elements (id, thread, ns), split undecoded and reordered."""
    kcid, kt, kns = split(key, len(index_start) - 1)[-3:]  # as prefix_range: prefix + 0x00
    return kcid, _CHECKPOINT_PREFIX + kt + kns + kcid


def checkpoints_range(thread: str, ns: str | None = None) -> tuple[bytes, bytes]:
    if ns is None:
        return prefix_range((CHECKPOINT, k(thread)))
    prefix = _thread_ns_prefix(CHECKPOINT, thread, ns)
    return prefix + b"\x00", prefix + b"\xff"  # as prefix_range


def blob_key(thread: str, ns: str, channel: str, version: str | int | float) -> bytes:
    """``pack((BLOB, k(thread), k(ns), k(channel), _ver(version)))``, from the
    memoized parts ``blob_keys`` uses (a put keys its channels' bases too)."""
    return _thread_ns_prefix(BLOB, thread, ns) + _blob_suffix(channel, version)


def _blob_suffix(ch: str, v: Any) -> bytes:
    """``pack((k(ch), _ver(v)))``, each element memoized by its string: a
    thread's latest checkpoint is read at every step, with the same channel
    versions each time. Keyed by the strings themselves, not a tuple holding
    ``type(v)``: such a tuple stays tracked by the garbage collector (a type
    is a container), so up to 16,384 of them would be traversed by every
    collection, slowing every read that misses the memo."""
    if type(v) is not str:
        return pack((k(ch), _ver(v)))  # int/float versions (1 == 1.0 == True): not memoized
    ce = _CHANNEL_ELEMENTS.get(ch)
    if ce is None:
        ce = _memo(_CHANNEL_ELEMENTS, ch, _el(ch))
    ve = _VERSION_ELEMENTS.get(v)
    if ve is None:
        ve = _memo(_VERSION_ELEMENTS, v, _el(v))
    return ce + ve


def _memo(cache: dict[_K, _V], key: _K, value: _V) -> _V:
    """``cache[key] = value``, the cache emptied first when it holds 16,384
    entries (the memos of key elements and prefixes here)."""
    if len(cache) >= 16384:
        cache.clear()
    cache[key] = value
    return value


def _new_blob_suffix(ch: str, v: Any) -> bytes:
    return _el(ch) + _el(v) if type(v) is str else pack((k(ch), _ver(v)))


def blob_keys(
    thread: str, ns: str, versions: Mapping[str, Any], *, new: bool = False
) -> list[tuple[str, bytes]]:
    """(channel, blob key) for every channel of a checkpoint's versions: the
    (thread, ns) prefix is packed once (packing is concatenation, element by
    element), since every read of a checkpoint keys all its channels.
    ``new=True`` (a put's new versions, never keyed before): not memoized,
    which would only cost a miss and an insert each."""
    if new:
        prefix = _thread_ns_prefix(BLOB, thread, ns)
        return [(ch, prefix + _new_blob_suffix(ch, v)) for ch, v in versions.items()]
    return list(zip(versions, read_blob_keys(thread, ns, versions)))


def read_blob_keys(thread: str, ns: str, versions: Mapping[str, Any]) -> list[bytes]:
    """The keys of ``blob_keys``, in ``versions``' order, built inline: every
    read of a checkpoint keys all its channels. The channel's element from
    its memo (a graph has a few channels), the version's encoded here as
    ``_el`` does, not memoized: a read of a checkpoint not read lately
    (another process's, a cold store) would miss that memo for each channel
    and pay a miss, the encoding and an insert, several times what encoding
    alone costs, while a hit saves little. Versions are checked
    together (all ASCII strings without NUL, short enough to stay inline:
    every version LangGraph makes), not one by one; otherwise each goes
    through ``_blob_suffix``."""
    prefix = _thread_ns_prefix(BLOB, thread, ns)
    vs = versions.values()
    try:
        joined = "".join(vs)
    except TypeError:  # a version that is not a str (an int, a float)
        joined = None
    if (
        joined is None
        or not joined.isascii()
        or "\x00" in joined
        or max(map(len, vs), default=0) > _MAX_INLINE
    ):
        return [prefix + _blob_suffix(ch, v) for ch, v in versions.items()]
    ce = _CHANNEL_ELEMENTS.get
    return [
        prefix + (ce(ch) or _channel_element(ch)) + b"\x02" + v.encode() + b"\x00"
        for ch, v in versions.items()
    ]


def _channel_element(ch: str) -> bytes:
    return _memo(_CHANNEL_ELEMENTS, ch, _el(ch))


def _str_key_element(s: str) -> bytes:
    """``pack((k(s),))`` in one step, through no cache: what a read of a
    checkpoint nobody read lately (another process's, a cold store) pays for
    each channel and version string it keys."""
    raw = s.encode("utf-8", "surrogatepass")
    if len(raw) + raw.count(0) > _MAX_INLINE:
        return pack((k(s),))
    return b"\x02" + raw.replace(b"\x00", b"\x00\xff") + b"\x00"


# channel / version string -> its packed key element (see _blob_suffix)
_CHANNEL_ELEMENTS: dict[str, bytes] = {}
_VERSION_ELEMENTS: dict[str, bytes] = {}


def sibling_blob_key(key: bytes, version: str | int | float) -> bytes:
    """The key of another version of a blob key's (thread, ns, channel):
    a delta record's base. Works on key elements, surrogates included."""
    return pack((*unpack(key)[:-1], _ver(version)))


def blob_prefix(key: bytes) -> bytes:
    """A blob key without its version: ``blob_prefix(k) + version_element(v)``
    is the key of version v of the same (thread, ns, channel)."""
    return pack(unpack(key)[:-1])


def version_element(version: str | int | float) -> bytes:
    return pack((_ver(version),))


def blob_channel_range(key: bytes) -> tuple[bytes, bytes]:
    """Every version of a blob key's (thread, ns, channel)."""
    return prefix_range(unpack(key)[:-1])


def blobs_range(thread: str, ns: str | None = None) -> tuple[bytes, bytes]:
    if ns is None:
        return prefix_range((BLOB, k(thread)))
    return prefix_range((BLOB, k(thread), k(ns)))


def write_key(thread: str, ns: str, checkpoint_id: str, task_id: str, idx: int) -> bytes:
    return pack((WRITE, k(thread), k(ns), k(checkpoint_id), k(task_id), idx))


def task_write_prefix(thread: str, ns: str, checkpoint_id: str, task_id: str) -> bytes:
    """The write keys of one task of one checkpoint without their idx: the
    shared elements packed once (a packed tuple is its elements' encodings,
    concatenated)."""
    return _thread_ns_prefix(WRITE, thread, ns) + _el(checkpoint_id) + _el(task_id)


def write_keys(prefix: bytes, idxs: Iterable[int]) -> list[bytes]:
    """``write_key`` of each idx, under a ``task_write_prefix``."""
    return [prefix + _idx_element(idx) for idx in idxs]


def _idx_element(idx: int) -> bytes:
    packed = _IDX.get(idx) if type(idx) is int else None  # not a bool: True == 1
    return packed if packed is not None else pack((idx,))


_IDX = {i: pack((i,)) for i in range(-8, 64)}  # a task's write indexes, packed


def task_writes_range(prefix: bytes) -> tuple[bytes, bytes]:
    """Every write record under a ``task_write_prefix``."""
    return prefix + b"\x00", prefix + b"\xff"  # as prefix_range


def writes_range(
    thread: str, ns: str | None = None, checkpoint_id: str | None = None
) -> tuple[bytes, bytes]:
    if ns is None:
        return prefix_range((WRITE, k(thread)))
    if checkpoint_id is None:
        return prefix_range((WRITE, k(thread), k(ns)))
    # Every read of a checkpoint comes here: the (thread, ns) prefix is packed
    # once (as checkpoint_key), the checkpoint id's element each time.
    p = _thread_ns_prefix(WRITE, thread, ns) + _el(checkpoint_id)
    return p + b"\x00", p + b"\xff"  # as prefix_range


def run_key(run_id: str, thread: str, ns: str, checkpoint_id: str) -> bytes:
    return pack((RUN, k(run_id), k(thread), k(ns), k(checkpoint_id)))


def runs_range(run_id: str) -> tuple[bytes, bytes]:
    return prefix_range((RUN, k(run_id)))


def by_id_key(checkpoint_id: str, thread: str, ns: str) -> bytes:
    return pack((BY_ID, k(checkpoint_id), k(thread), k(ns)))


def by_id_range() -> tuple[bytes, bytes]:
    return prefix_range((BY_ID,))


def by_id_stop(before_checkpoint_id: str) -> bytes:
    """Exclusive upper bound of the id index for ids < before_checkpoint_id."""
    return pack((BY_ID, k(before_checkpoint_id)))


def meta_value(value: Any) -> tuple[bool, Any]:
    """(indexable, normalized key element) for a metadata or filter value.

    None is not indexable (a filter on None also matches a missing key), nor
    are containers, NaN, or ints beyond 64 bits."""
    if isinstance(value, bool):
        return True, int(value)
    if isinstance(value, int):
        return (-(2**63) <= value < 2**64), value
    if isinstance(value, float):
        if value != value:
            return False, None
        if value.is_integer() and -(2**63) <= value < 2**64:
            return True, int(value)
        return True, value
    if isinstance(value, str):
        return True, k(value)
    return False, None


def meta_entries(metadata: Any) -> list[list[Any]]:
    """The [key element, value element] pairs a checkpoint's metadata indexes."""
    out = []
    for key, value in (metadata or {}).items():
        ok, norm = meta_value(value)
        if ok and isinstance(key, str):
            out.append([k(key), norm])
    return out


def meta_key(entry: list[Any], checkpoint_id: str, thread: str, ns: str) -> bytes:
    return pack((META, entry[0], entry[1], k(checkpoint_id), k(thread), k(ns)))


def meta_range(key: str, norm: Any, before_checkpoint_id: str | None = None) -> tuple[bytes, bytes]:
    start, stop = prefix_range((META, k(key), norm))
    if before_checkpoint_id is not None:
        stop = pack((META, k(key), norm, k(before_checkpoint_id)))
    return start, stop


def rethread(key: bytes, src_prefix_len: int, dst_prefix: bytes) -> bytes:
    """Move a key from one thread's prefix to another's; elements are
    self-delimiting, so everything after the thread element is kept verbatim."""
    return dst_prefix + key[src_prefix_len:]


def thread_prefix(kind: str, thread: str) -> bytes:
    return pack((kind, k(thread)))


def keyspace_range(kind: str) -> tuple[bytes, bytes]:
    """Every key of one keyspace (CHECKPOINT, BLOB, WRITE, ...)."""
    return prefix_range((kind,))


def store_range() -> tuple[bytes, bytes]:
    """Every key of the store keyspace (what KVSaver skips)."""
    return prefix_range((STORE,))


def key_thread(key: bytes) -> Any:
    """The thread element of a checkpoint, blob, write or activity key (the
    thread id, or its surrogate when the id is too long for a key)."""
    return unpack(key)[1]


def head_key(thread: str, ns: str) -> bytes:
    """The head record of (thread, ns) (``saver/heads.py``)."""
    return _thread_ns_prefix(HEAD, thread, ns)


def heads_range(thread: str | None = None) -> tuple[bytes, bytes]:
    """Every head record (of one thread)."""
    return prefix_range((HEAD,) if thread is None else (HEAD, k(thread)))


def activity_key(thread: str) -> bytes:
    return _ACTIVITY_PREFIX + _el(thread)  # = pack((ACTIVITY, k(thread)))


_ACTIVITY_PREFIX = pack((ACTIVITY,))


def activity_key_from_element(kt: Any) -> bytes:
    return pack((ACTIVITY, kt))


def idle_key(ms: int, thread: str) -> bytes:
    return pack((IDLE, ms, k(thread)))


def idle_range(start_ms: int | None = None, stop_ms: int | None = None) -> tuple[bytes, bytes]:
    """Idle-index keys with ``start_ms <= ms < stop_ms`` (None: unbounded)."""
    lo, hi = prefix_range((IDLE,))
    if start_ms is not None:
        lo = pack((IDLE, start_ms))
    if stop_ms is not None:
        hi = pack((IDLE, stop_ms))
    return lo, hi
