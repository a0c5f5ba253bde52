"""The on-disk schema of KVSaver: every key and record format lives here.

All keys are ``kv.keys.pack``-ed tuples; the first element names the keyspace.

==========  ===============================================  ==========================
keyspace    key                                              value
==========  ===============================================  ==========================
checkpoint  ("c", thread, ns, checkpoint_id)                 CheckpointRecord (its
                                                             checkpoint's
                                                             channel_values: the
                                                             small values, format 6)
blob        ("b", thread, ns, channel, version)              type NUL bytes (no
                                                             record, or type "empty"
                                                             before format 4: no
                                                             value), or
                                                             a delta record: 0xD1
                                                             [ref, n, depth, digest,
                                                             type, piece] (format 3)
write       ("w", thread, ns, checkpoint_id, task_id, idx)   WriteRecord (task_path
                                                             in the record only), or
                                                             a batch: [task_id,
                                                             task_path, [channel,
                                                             type, bytes, idx, ...]]
                                                             under its first idx
                                                             (format 5)
run index   ("r", run_id, thread, ns, checkpoint_id)         b""
id index    ("g", checkpoint_id, thread, ns)                 b""
meta index  ("m", key, value, checkpoint_id, thread, ns)     b""
activity    ("a", thread)                                    [last activity ms, thread]
idle index  ("i", last activity ms, thread)                  thread
schema      ("meta", "schema")                               {"format": FORMAT_VERSION,
                                                             "upgrades": [...]}
sweep       ("meta", "sweep")                                {"started": ms,
                                                             "completed": ms, "full": bool}
head        ("~h", thread, ns)                               0x01, the newest
                                                             checkpoint's record and
                                                             its values, whole
                                                             (``saver/heads.py``)
==========  ===============================================  ==========================

A pending write's identity is (thread, ns, checkpoint, task_id, idx), as in
SqliteSaver's primary key, with idx = ``WRITES_IDX_MAP.get(channel,
position)``: ``task_path`` is stored in the record and used only to order
reads (``writes_sort_key``: task_path, task_id, idx), so the key order is not
the read order and reads sort.

**Format versions** (``FORMAT_VERSION``; a store records its own in the
schema record, and a newer one than this code's is refused):

=======  =========  ==========================================================
format   written    difference from the next
=======  =========  ==========================================================
1        0.1.0      write key ("w", thread, ns, checkpoint_id, task_path,
                    task_id, idx): one task id under two task paths was two
                    writes
2        after      no delta records among the blobs
         0.1.0
3        after      no checkpoint or pending write value compressed with
         0.1.0      a dictionary (type suffix ".zd1"); a version
                    without a value has an "empty" record (format 4: none)
4        after      every pending write a record of its own (format 5: the
         0.1.0      regular writes of one ``put_writes`` in one record)
5        after      every value in a blob (format 6: small values in the
         0.1.0      checkpoint record)
6        after      (current)
         0.1.0
=======  =========  ==========================================================

A store of an older format is upgraded when it is opened writable, in one
write transaction that also rewrites the schema record, appending
``{"from": old, "to": new, ...counts}`` to its ``"upgrades"`` list (see
``saver/upgrade.py``). Opened read-only, it is read as it is: format 1 write
keys are read through the same prefix, and of two writes with the same
(task_id, idx) the one the upgrade keeps is returned.

The id index is not in DESIGN.md's first table: it lets ``list(None)`` return
checkpoints of all threads newest-first by checkpoint id, as SqliteSaver does,
with one reverse scan instead of a merge over every thread. The meta index
holds one entry per top-level metadata key with a scalar value (str, int,
float, bool; numbers normalized so that ``1 == 1.0 == True`` as in Python and
SQLite), so ``list(None, filter={"key": value})`` visits only the checkpoints
that carry that value, newest first, instead of decoding every checkpoint's
metadata. Each checkpoint record lists its meta entries, so deleting a
checkpoint never needs to decode its metadata.

Activity (``saver/retention.py``): ``put`` and ``put_writes`` record when a
thread was last written, in milliseconds of the saver's clock, at most once a
second per thread; the idle index orders threads by that time, so a TTL sweep
reads only the threads idle past the cutoff, and an incremental keep-last
sweep only those written since the last sweep. The sweep record coordinates
sweeps between processes. Threads written before these keyspaces existed get
an activity record at the first full sweep (from the latest checkpoint's
``ts``).

**Short keys.** LMDB keys are limited to 511 bytes. A string element (thread,
namespace, checkpoint id, channel, task path, task id, run id) whose encoding
exceeds ``_MAX_INLINE`` bytes is replaced in keys by a ``bytes`` element: its
first 24 UTF-8 bytes and a 16-byte SHA-256 digest of the whole. bytes and str
elements have distinct type codes, so a surrogate never collides with a real
id, and the records keep the full strings. What is lost is only the position
of such over-long ids among short ones; ids that LangGraph generates (uuid6
checkpoint ids, version strings) are far below the limit and keep their exact
order, which is what "latest = last key" relies on.

**Small values** (format 6): a channel value ``is_small`` says is small
(None, a number, a short str: a graph's triggers and counters) is kept in
the checkpoint's ``channel_values``, serialized and compressed with the
checkpoint, and has no blob. The record holds every small value of the
checkpoint, changed or not (an unchanged one the put is given no value for
comes from its parent's record, when that holds the version), so a read
finds them without knowing where each version was first written; a channel
not in the record's
``channel_values`` is read from its blob (``blob_versions``). Records
without it (older formats, a writer that keeps every value in blobs) read
the same way.

**Delta values** (format 3, ``saver/delta.py``): a list channel's version that
extends, element for element and byte for byte, the version stored at the
put's parent checkpoint is stored as the appended elements' bytes plus a
reference (``ref``) to that version of the same (thread, ns, channel) (every
``delta.STRIDE``-th delta of a chain: to the version ``STRIDE`` back on its
chain, a long step); ``n`` is the whole value's element count, ``depth`` the
number of versions since the chain's whole copy (below
``delta.MAX_CHAIN``), ``digest`` names the content, and
``type``/``piece`` are the appended bytes after compression and encryption.
A whole record never starts with byte 0xD1 (its type name is ASCII), so both
kinds live side by side in one store. Invariant: the base of every stored
delta is stored (deletes keep bases of what they keep; overwrites first
rewrite dependents whole). Older stores hold no delta records and read as
they are; their upgrade to format 3 rewrites nothing (it only records that
deltas may now be written, so that an older kvsaver refuses the store instead
of failing on a delta record).

**Head records** (``saver/heads.py``): the newest checkpoint of a
(thread, ns), its metadata and every channel value as the serializer's
msgpack, uncompressed, in one record that each ``put`` rewrites, so a read of
the latest checkpoint is one get and one unpack. A copy: a read uses it only
when the record it holds equals the checkpoint record it found, so a store
without heads, or with heads that another writer left behind, reads the
same; no format change (kvsavers that know no heads ignore the keyspace).

Records are ormsgpack arrays; serde-typed payloads are stored as
``(type, bytes)`` pairs exactly as ``serde.dumps_typed`` returns them, so
``EncryptedSerializer`` and the msgpack allowlist keep working.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple, TypeVar

import ormsgpack
from kvsaver.kv import CorruptStoreError
from kvsaver.kv.keys import pack, prefix_range, unpack

FORMAT_VERSION = 6  # 3: deltas; 4: ".zd1" values; 5: batches of writes; 6: small values inline
SCHEMA_KEY = pack(("meta", "schema"))
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
EMPTY_TYPE = "empty"

Typed = tuple[str, bytes]


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


# -- records ----------------------------------------------------------------


# -- small values ----------------------------------------------------------

SMALL_STR = 32  # characters of a str value kept in the checkpoint record
_INT64 = (-(1 << 63), (1 << 64) - 1)  # ints msgpack holds as one of its own


def is_small(value: Any) -> bool:
    """Whether a channel value is kept in its checkpoint's record instead of
    a blob of its own: None, a bool, a float, an int msgpack holds, a short
    str (exact types: an enum or a subclass goes to a blob). A graph's
    triggers and counters are most of its values and a few bytes each; a
    blob of its own would cost a row, its key twice and a get per read.
    Decided by the value alone, so every writer decides alike."""
    t = type(value)
    if value is None or t is bool or t is float:
        return True
    if t is int:
        return _INT64[0] <= value <= _INT64[1]
    return t is str and len(value) <= SMALL_STR


def blob_versions(checkpoint: Mapping[str, Any]) -> Mapping[str, Any]:
    """The channel_versions of a stored checkpoint whose values are in blobs:
    those not in its record's ``channel_values`` (format 6 keeps the small
    values there; an older record has none, and every value is a blob)."""
    versions = checkpoint["channel_versions"]
    small = checkpoint.get("channel_values")
    if not small:
        return versions
    return {ch: v for ch, v in versions.items() if ch not in small}


class CheckpointRecord(NamedTuple):
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_id: str | None
    checkpoint: Typed  # the checkpoint, its channel_values only the small ones
    metadata: Typed
    run_id: str | None
    meta: list[list[Any]]  # meta index entries (see meta_entries)


def make_checkpoint_record(
    thread: str,
    ns: str,
    checkpoint_id: str,
    parent_id: Any,
    checkpoint: Typed,
    metadata: Mapping[str, Any],
    dumps: Callable[[Any], Typed],
) -> CheckpointRecord:
    """The record of a checkpoint (serialized with only its small
    channel_values), with the run id and meta index entries its metadata
    implies."""
    run_id = metadata.get("run_id")
    return CheckpointRecord(
        thread_id=thread,
        checkpoint_ns=ns,
        checkpoint_id=checkpoint_id,
        parent_id=str(parent_id) if parent_id else None,
        checkpoint=checkpoint,
        metadata=dumps(metadata),
        run_id=None if run_id is None else str(run_id),
        meta=meta_entries(metadata),
    )


def index_keys(rec: CheckpointRecord) -> list[bytes]:
    """Every index key pointing at this checkpoint (id, run, metadata): the
    same bytes as by_id_key, run_key and meta_key, with the (checkpoint id,
    thread, ns) elements they share packed once (put and every delete of a
    checkpoint come here)."""
    t, ns, cid = rec.thread_id, rec.checkpoint_ns, rec.checkpoint_id
    tail = _el(cid) + _el(t) + _el(ns)
    keys = [_BY_ID_PREFIX + tail]
    if rec.run_id is not None:
        keys.append(run_key(rec.run_id, t, ns, cid))
    for e in rec.meta:
        # 1 == 1.0, but their encodings differ; the type's name, not the type:
        # a tuple holding a type stays tracked by the garbage collector.
        mark = (e[0], type(e[1]).__name__, e[1])
        prefix = _META_PREFIXES.get(mark)
        if prefix is None:
            prefix = _memo(_META_PREFIXES, mark, pack((META, e[0], e[1])))
        keys.append(prefix + tail)
    return keys


_BY_ID_PREFIX = pack((BY_ID,))
# (key, type name, value) -> packed (META, key, value): the same few metadata
# values ("source": "loop", small "step"s) are indexed at every put.
_META_PREFIXES: dict[tuple[Any, str, Any], bytes] = {}


def encode_checkpoint(rec: CheckpointRecord) -> bytes:
    return ormsgpack.packb(
        [
            rec.thread_id,
            rec.checkpoint_ns,
            rec.checkpoint_id,
            rec.parent_id,
            rec.checkpoint[0],
            rec.checkpoint[1],
            rec.metadata[0],
            rec.metadata[1],
            rec.run_id,
            rec.meta,
        ]
    )


def _damaged(kind: str, e: Exception) -> CorruptStoreError:
    """A record of ours that does not decode: the store is damaged."""
    error = CorruptStoreError(f"a damaged {kind} record in the store ({e})")
    error.__cause__ = e
    return error


def decode_checkpoint(raw: bytes) -> CheckpointRecord:
    try:
        t, ns, cid, parent, ctype, cbytes, mtype, mbytes, run_id, meta = ormsgpack.unpackb(raw)
    except (ValueError, TypeError) as e:
        raise _damaged("checkpoint", e) from e
    # tuple.__new__: a NamedTuple's own __new__ is a Python frame (every read).
    return _new_tuple(
        CheckpointRecord, (t, ns, cid, parent, (ctype, cbytes), (mtype, mbytes), run_id, meta)
    )


_new_tuple = tuple.__new__


def bare_record(
    thread: str, ns: str, checkpoint_id: str, parent_id: str | None
) -> CheckpointRecord:
    """A CheckpointRecord with only its identity (a head record's read, which
    has the checkpoint and metadata decoded already: ``heads``)."""
    return _new_tuple(
        CheckpointRecord, (thread, ns, checkpoint_id, parent_id, None, None, None, [])
    )


def encode_blob(typed: Typed | None) -> bytes:
    """``type`` (ASCII, never containing NUL), ``\x00``, then the serialized
    bytes: no envelope to decode on the read path, which loads every channel."""
    if typed is None:
        return b"empty\x00"
    return typed[0].encode("ascii") + b"\x00" + typed[1]


BLOB_PREFIX_MSGPACK = b"msgpack\x00"  # encode_blob of a ("msgpack", ...) value
BLOB_PREFIX_MSGPACK_ZST = b"msgpack.zst\x00"  # of a ("msgpack.zst", ...) value


def decode_blob(raw: bytes | None) -> Typed | None:
    """The serde-typed value, or None for the "empty" marker or no blob."""
    if raw is None:
        return None
    if raw.startswith(BLOB_PREFIX_MSGPACK):  # the common case: every read of a value
        return "msgpack", raw[len(BLOB_PREFIX_MSGPACK) :]
    head, sep, body = raw.partition(b"\x00")
    if not sep:
        raise CorruptStoreError("a damaged channel value record in the store (no type)")
    try:
        type_ = _TYPE_NAMES.get(head) or head.decode("ascii")
    except UnicodeDecodeError as e:
        raise _damaged("channel value", e) from e
    return None if type_ == EMPTY_TYPE else (type_, body)


# The serde types every read meets, decoded once (each channel of each read).
_TYPE_NAMES = {
    t.encode(): t for t in ("msgpack", "msgpack.zst", "null", "bytes", "bytearray", "json")
}


class WriteRecord(NamedTuple):
    task_id: str
    channel: str
    value: Typed
    task_path: str
    idx: int


def encode_write(rec: WriteRecord) -> bytes:
    return encode_write_fields(rec.task_id, rec.channel, rec.value, rec.task_path, rec.idx)


def encode_write_fields(
    task_id: str, channel: str, value: Typed, task_path: str, idx: int
) -> bytes:
    """``encode_write`` of a record not built first (put_writes' path)."""
    return ormsgpack.packb([task_id, channel, value[0], value[1], task_path, idx])


def _one_write(fields: Any) -> WriteRecord:
    task_id, channel, vtype, vbytes, task_path, idx = fields
    return _new_tuple(WriteRecord, (task_id, channel, (vtype, vbytes), task_path, idx))


def decode_write(raw: bytes) -> WriteRecord:
    """A record of one write (every write record of a store before format 5)."""
    try:
        return _one_write(ormsgpack.unpackb(raw))
    except (ValueError, TypeError) as e:
        raise _damaged("write", e) from e


def decode_writes(raw: bytes) -> list[WriteRecord]:
    """The writes of a write record: one, or a batch's, in idx order."""
    try:
        fields = ormsgpack.unpackb(raw)
        if len(fields) == 6:
            return [_one_write(fields)]
        task_id, task_path, flat = fields
        return [
            _new_tuple(
                WriteRecord, (task_id, flat[i], (flat[i + 1], flat[i + 2]), task_path, flat[i + 3])
            )
            for i in range(0, len(flat), 4)
        ]
    except (ValueError, TypeError, IndexError) as e:
        raise _damaged("write", e) from e


def write_probe_keys(prefix: bytes, idxs: Iterable[int]) -> list[bytes]:
    """The keys that may hold a stored write of one of ``idxs`` for this task:
    each special idx's, and every regular idx's up to the largest of them (a
    batch is keyed at its first idx, at or below each one it holds). A get
    of them, not a scan: a network store answers the gets with the writes."""
    special, top = [], -1
    for i in idxs:
        if i < 0:
            special.append(i)
        elif i > top:
            top = i
    return write_keys(prefix, (*special, *range(top + 1)))


def stored_idxs(records: Iterable[bytes | None]) -> set[int]:
    """The idx of every write in ``records`` (None: no record)."""
    return {w.idx for raw in records if raw is not None for w in decode_writes(raw)}


def write_records(
    prefix: bytes, task_id: str, task_path: str, writes: list[tuple[int, str, Typed]]
) -> list[tuple[bytes, bytes]]:
    """(key, record) pairs storing one task's ``writes`` ((idx, channel,
    value), regular ones in ascending idx) under its ``task_write_prefix``:
    the regular writes (idx >= 0) in one record under the first one's key,
    since most are a few bytes and a record costs a key and a row; each
    special write (negative idx) in a record of its own, which a later batch
    of special writes replaces."""
    out = []
    flat: list[Any] = []  # the regular writes: channel, type, bytes, idx, ...
    for idx, channel, value in writes:
        if idx < 0:
            record = encode_write_fields(task_id, channel, value, task_path, idx)
            out.append((prefix + _idx_element(idx), record))
        else:
            flat += (channel, value[0], value[1], idx)
    if len(flat) == 4:  # one: a record of its own
        record = encode_write_fields(task_id, flat[0], (flat[1], flat[2]), task_path, flat[3])
        out.append((prefix + _idx_element(flat[3]), record))
    elif flat:
        out.append((prefix + _idx_element(flat[3]), ormsgpack.packb([task_id, task_path, flat])))
    return out


def encode_activity(ms: int, thread: str) -> bytes:
    return ormsgpack.packb([ms, thread])


def decode_activity(raw: bytes) -> tuple[int, str]:
    try:
        ms, thread = ormsgpack.unpackb(raw)
        return int(ms), thread
    except (ValueError, TypeError) as e:
        raise _damaged("activity", e) from e


def encode_thread(thread: str) -> bytes:
    return ormsgpack.packb(thread)


def decode_thread(raw: bytes) -> str:
    return ormsgpack.unpackb(raw)


SWEEP_KEY = pack(("meta", "sweep"))


def encode_sweep(state: dict[str, Any]) -> bytes:
    return ormsgpack.packb(state)


def decode_sweep(raw: bytes | None) -> dict[str, Any]:
    return {} if raw is None else dict(ormsgpack.unpackb(raw))


def encode_schema(upgrades: list[dict[str, Any]] | None = None) -> bytes:
    record: dict[str, Any] = {"format": FORMAT_VERSION}
    if upgrades:
        record["upgrades"] = upgrades
    return ormsgpack.packb(record)


def decode_schema(raw: bytes) -> int:
    return int(decode_schema_record(raw)["format"])


def decode_schema_record(raw: bytes) -> dict[str, Any]:
    return dict(ormsgpack.unpackb(raw))
