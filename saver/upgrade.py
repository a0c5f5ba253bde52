"""Stores of older formats (``saver/schema.py``'s format table): upgraded in
place when opened writable, read as they are when opened read-only.

``upgrade(txn, version)`` runs, inside the caller's one write transaction,
every step from ``version`` to ``schema.FORMAT_VERSION`` and returns what
each did, for the schema record. A step is a function of the transaction, in
``UPGRADES`` under the format it upgrades from (as LangGraph's savers keep
their ``MIGRATIONS``: an ordered list, never edited once released).

Format 1 -> 2: write keys lose their task_path element, so a
pending write is identified by (thread, ns, checkpoint, task_id, idx) as in
SqliteSaver. 0.1.0 kept one write per (task_path, task_id, idx); where two
task paths hold the same (task_id, idx), SqliteSaver would have kept one of
them: the first written for regular writes, the last for special channels
(a batch of special channels replaces). The 0.1.0 store does not record
which came first, so the choice is deterministic instead: **the write with
the smallest task_path** (the one 0.1.0's ``get_tuple`` listed first) is
kept, the others are dropped and counted. A read-only saver on a format-1
store makes the same choice when it reads (``first_per_identity``), so a
store reads the same before and after its upgrade.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvsaver.kv import CorruptStoreError, FormatVersionError, Store, Txn
from kvsaver.kv.keys import pack, unpack

from . import schema as S

_CHUNK = 4096  # keys per scan while rewriting: the scan never holds a whole keyspace

LEGACY_WRITE_KEY_LEN = 7  # format 1: ("w", thread, ns, checkpoint_id, task_path, task_id, idx)


def _writes_by_task_id(txn: Txn) -> dict[str, int]:
    """Format 1 -> 2: every write key without its task_path element."""
    moved = dropped = 0
    start, stop = S.keyspace_range(S.WRITE)
    while True:
        chunk = []
        for key, value in txn.scan(start, stop):
            chunk.append((key, value))
            if len(chunk) == _CHUNK:
                break
        if not chunk:
            break
        for key, value in chunk:
            elements = unpack(key)
            if len(elements) != LEGACY_WRITE_KEY_LEN:
                continue  # already rewritten (new keys sort among the old ones)
            kind, kt, kns, kcid, _path, ktask, idx = elements
            new_key = pack((kind, kt, kns, kcid, ktask, idx))
            txn.delete(key)
            moved += 1
            held = txn.get(new_key)
            if held is not None:
                dropped += 1
                if S.decode_write(held).task_path <= S.decode_write(value).task_path:
                    continue
            txn.put(new_key, value)
        start = chunk[-1][0] + b"\x00"  # the smallest key after the last one read
    return {"writes": moved, "writes_dropped": dropped}


def _deltas_allowed(txn: Txn) -> dict[str, int]:
    """Format 2 -> 3: blobs may now be delta records
    (``saver/delta.py``). Nothing to rewrite: whole values read as they are;
    the new number makes an older kvsaver refuse the store rather than fail
    on the first delta record it meets."""
    return {}


def _small_dictionary_allowed(txn: Txn) -> dict[str, int]:
    """Format 3 -> 4: checkpoints, pending writes and small values may now
    be zstd-compressed with ``compression.SMALL_DICT`` (type ``"....zd1"``),
    and a channel version without a value has no record (format 3 gives it
    the "empty" marker, which reads the same). Nothing to rewrite;
    the number makes an older kvsaver refuse the store rather than fail on a
    ``.zd1`` value."""
    return {}


def _write_batches_allowed(txn: Txn) -> dict[str, int]:
    """Format 4 -> 5: the regular writes of one ``put_writes`` may now be one
    record (``schema.write_records``). Nothing to rewrite: a record of one
    write reads as it is; the number makes an older kvsaver refuse the
    store rather than read a batch as a damaged write."""
    return {}


def _small_values_inline(txn: Txn) -> dict[str, int]:
    """Format 5 -> 6: a checkpoint record may now hold its small values
    (``schema.is_small``) instead of blobs. Nothing to rewrite: a record
    without them reads every value from its blobs; the number makes an older
    kvsaver refuse the store rather than read those channels as empty."""
    return {}


UPGRADES: dict[int, Callable[[Any], dict[str, int]]] = {
    1: _writes_by_task_id,
    2: _deltas_allowed,
    3: _small_dictionary_allowed,
    4: _write_batches_allowed,
    5: _small_values_inline,
}


def upgrade(txn: Txn, version: int) -> list[dict[str, Any]]:
    """Upgrade a store of format ``version`` to ``schema.FORMAT_VERSION``
    inside ``txn``; one record per step: {"from", "to", counts...}."""
    done = []
    for old in range(version, S.FORMAT_VERSION):
        counts = UPGRADES[old](txn)
        done.append({"from": old, "to": old + 1, **counts})
    return done


def first_per_identity(recs: list[S.WriteRecord]) -> list[S.WriteRecord]:
    """Writes in ``writes_sort_key`` order, keeping of each (task_id, idx)
    only the first, i.e. the one with the smallest task_path: what the
    upgrade keeps, for reading a format-1 store that is not upgraded."""
    seen: set[tuple[str, int]] = set()
    out = []
    for w in recs:
        if (w.task_id, w.idx) not in seen:
            seen.add((w.task_id, w.idx))
            out.append(w)
    return out


def check_schema(store: Store) -> bool:
    """Write the schema record of a new store; refuse a foreign store or a
    newer format; upgrade an older format (writable) or read it as it is
    (read-only). Whether its write keys are format 1's (a read-only store:
    ``reads.Reads.legacy_writes``)."""
    with store.read() as txn:
        raw = txn.get(S.SCHEMA_KEY)
        # A KVStore's keys (its own keyspace, on a shared directory) are not
        # KVSaver data: a directory holding only those is a new KVSaver store.
        lo, hi = S.store_range()
        empty = raw is None and not any(
            next(iter(txn.scan(a, b, limit=1)), None) for a, b in ((None, lo), (hi, None))
        )
    if raw is None:
        if not empty:
            raise CorruptStoreError(
                f"{store!r} holds data but no kvsaver schema record: it is not a KVSaver store"
            )
        if not store.readonly:
            with store.write() as txn:
                if txn.get(S.SCHEMA_KEY) is None:
                    txn.put(S.SCHEMA_KEY, S.encode_schema())
        return False
    version = S.decode_schema(raw)
    if version > S.FORMAT_VERSION:
        raise FormatVersionError(
            f"this store was written by kvsaver format {version}; this version of "
            f"kvsaver reads format {S.FORMAT_VERSION} and older. Upgrade kvsaver."
        )
    if version < S.FORMAT_VERSION:
        if store.readonly:
            # Read as it is (this module); another process may
            # upgrade it meanwhile, which reads the same.
            return version < 2  # format 1 write keys
        with store.write() as txn:  # one transaction: all of it or none
            raw = txn.get(S.SCHEMA_KEY)
            record = S.decode_schema_record(raw) if raw is not None else {}
            version = int(record.get("format", S.FORMAT_VERSION))
            if version < S.FORMAT_VERSION:
                done = list(record.get("upgrades") or []) + upgrade(txn, version)
                txn.put(S.SCHEMA_KEY, S.encode_schema(done))
    return False
