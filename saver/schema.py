"""The on-disk schema of KVSaver: every key and record format, and the format
versions. The keys are built in ``saver/keyspace.py``, the records in
``saver/records.py``, both named here too, as this table describes them.

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
store       ("s", "schema")                               {"format": 2}: KVStore's
schema                                                       items (``kvstore/``)
namespace   ("s", "n", *labels)                              [ns id, [labels], ttl]:
                                                             a KVStore namespace
                                                             (``kvstore/keyspace.py``;
                                                             ttl: an item of it was
                                                             ever put with a TTL)
ns id       ("s", "N", ns id)                                [labels]
item        ("s", "i", ns id, key)                           [key, seq, value
                                                             (msgpack), created us,
                                                             updated us, expires ms,
                                                             ttl minutes, has
                                                             vectors]: a get is one
                                                             lookup
order       ("s", "o", ns id, seq)                           the key element (packed)
                                                             of the item whose seq it
                                                             is: a namespace's items
                                                             in insertion order
expiry      ("s", "x", expires ms, ns id, seq)               the item's key element
                                                             (packed): items by
                                                             expiry (the TTL sweep's
                                                             index)
vector      ("s", "v", "e", *namespace, None, key, field)    [namespace, key, field,
                                                             float32 bytes]: a
                                                             KVStore item's vector
                                                             (``kvstore/vectors.py``)
vector      ("s", "v", "n")                                  [epoch, seq]: the count
counter                                                      of vector changes
vector log  ("s", "v", "l", seq)                             [namespace, key]: the
                                                             item whose vectors
                                                             change ``seq`` changed
                                                             (at least the last
                                                             ``vectors.LOG_KEEP``)
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

**KVStore** (``saver/kvstore/``, LangGraph's long-term memory) keeps its
items under ``("s", ...)``, which no KVSaver key starts with: a KVSaver and a
KVStore on one directory never see each other's keys (KVSaver's schema check
and ``stats`` step over the store keyspace). A namespace gets an id the
first time it holds an item and keeps it; seq counts up per namespace at each
new key, so a scan of the order entries returns items in insertion order, as
InMemoryStore does. KVStore's format (its own, in ``("s", "schema")``) is 2;
format 1 (``("s", "k", ns id, key)`` -> seq, ``("s", "i", ns id, seq)`` ->
record) was never released and is refused.
Labels and keys use the short-key rule below; a namespace whose labels take
more than ``kvstore.keyspace._NS_BUDGET`` bytes keeps its first labels and a
33-byte surrogate (``0xFF`` + SHA-256) of the rest.

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
exceeds ``keyspace._MAX_INLINE`` bytes is replaced in keys by a ``bytes``
element: its first 24 UTF-8 bytes and a 16-byte SHA-256 digest of the whole.
bytes and str elements have distinct type codes, so a surrogate never collides
with a real id, and the records keep the full strings. What is lost is only
the position of such over-long ids among short ones; ids that LangGraph
generates (uuid6 checkpoint ids, version strings) are far below the limit and
keep their exact order, which is what "latest = last key" relies on.

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

from typing import Any

import ormsgpack

# The saver keys and encodes through ``schema``; each mechanism has its module.
from .keyspace import (  # noqa: F401  (private ones: for tests)
    _CHANNEL_ELEMENTS,
    _K_CACHE,
    _TN_CACHE,
    _VERSION_ELEMENTS,
    ACTIVITY,
    BLOB,
    BY_ID,
    CHECKPOINT,
    HEAD,
    IDLE,
    META,
    RUN,
    SCHEMA_KEY,
    STORE,
    STORE_ITEM,
    SWEEP_KEY,
    WRITE,
    _str_key_element,
    _ver,
    activity_key,
    activity_key_from_element,
    blob_channel_range,
    blob_key,
    blob_keys,
    blob_prefix,
    blobs_range,
    by_id_key,
    by_id_range,
    by_id_stop,
    checkpoint_key,
    checkpoint_key_from_elements,
    checkpoints_range,
    head_key,
    heads_range,
    id_element,
    idle_key,
    idle_range,
    index_entry,
    k,
    key_thread,
    keyspace_range,
    meta_entries,
    meta_key,
    meta_range,
    meta_value,
    read_blob_keys,
    rethread,
    run_key,
    runs_range,
    sibling_blob_key,
    store_range,
    task_write_prefix,
    task_writes_range,
    thread_prefix,
    version_element,
    write_key,
    write_keys,
    writes_range,
)
from .records import (
    BLOB_PREFIX_MSGPACK,
    BLOB_PREFIX_MSGPACK_ZST,
    EMPTY_TYPE,
    SMALL_STR,
    CheckpointRecord,
    Typed,
    WriteRecord,
    bare_record,
    blob_versions,
    decode_activity,
    decode_blob,
    decode_checkpoint,
    decode_sweep,
    decode_thread,
    decode_write,
    decode_writes,
    encode_activity,
    encode_blob,
    encode_checkpoint,
    encode_sweep,
    encode_thread,
    encode_write,
    encode_write_fields,
    index_keys,
    is_small,
    make_checkpoint_record,
    stored_idxs,
    write_probe_keys,
    write_records,
)

__all__ = [
    "ACTIVITY",
    "BLOB",
    "BLOB_PREFIX_MSGPACK",
    "BLOB_PREFIX_MSGPACK_ZST",
    "BY_ID",
    "CHECKPOINT",
    "EMPTY_TYPE",
    "FORMAT_VERSION",
    "HEAD",
    "IDLE",
    "META",
    "RUN",
    "SCHEMA_KEY",
    "SMALL_STR",
    "SWEEP_KEY",
    "WRITE",
    "CheckpointRecord",
    "Typed",
    "WriteRecord",
    "activity_key",
    "activity_key_from_element",
    "bare_record",
    "blob_channel_range",
    "blob_key",
    "blob_keys",
    "blob_prefix",
    "blob_versions",
    "blobs_range",
    "by_id_key",
    "by_id_range",
    "by_id_stop",
    "checkpoint_key",
    "checkpoint_key_from_elements",
    "checkpoints_range",
    "decode_activity",
    "decode_blob",
    "decode_checkpoint",
    "decode_schema",
    "decode_schema_record",
    "decode_sweep",
    "decode_thread",
    "decode_write",
    "decode_writes",
    "encode_activity",
    "encode_blob",
    "encode_checkpoint",
    "encode_schema",
    "encode_sweep",
    "encode_thread",
    "encode_write",
    "encode_write_fields",
    "head_key",
    "heads_range",
    "id_element",
    "idle_key",
    "idle_range",
    "index_entry",
    "index_keys",
    "is_small",
    "k",
    "key_thread",
    "keyspace_range",
    "make_checkpoint_record",
    "meta_entries",
    "meta_key",
    "meta_range",
    "meta_value",
    "read_blob_keys",
    "rethread",
    "run_key",
    "runs_range",
    "sibling_blob_key",
    "stored_idxs",
    "task_write_prefix",
    "task_writes_range",
    "thread_prefix",
    "version_element",
    "write_key",
    "write_keys",
    "write_probe_keys",
    "write_records",
    "writes_range",
]

FORMAT_VERSION = 6  # 3: deltas; 4: ".zd1" values; 5: batches of writes; 6: small values inline


def encode_schema(upgrades: list[dict[str, Any]] | None = None) -> bytes:
    record: dict[str, Any] = {"format": FORMAT_VERSION}
    if upgrades:
        record["upgrades"] = upgrades
    return ormsgpack.packb(record)


def decode_schema(raw: bytes) -> int:
    return int(decode_schema_record(raw)["format"])


def decode_schema_record(raw: bytes) -> dict[str, Any]:
    return dict(ormsgpack.unpackb(raw))
