"""``migrate_from_sqlite``: a SqliteSaver database's checkpoints and writes
copied into a KVSaver store as ``put``/``put_writes`` store them
(``writes.write_checkpoint``), one write transaction per batch."""

from __future__ import annotations

import functools
import json
import math
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from typing import Any

import ormsgpack
from kvsaver.kv import KVError, Txn
from kvsaver.kv.postgres import is_postgres_url
from langgraph.checkpoint.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from .. import delta as D
from .. import schema as S
from ..compression import CompressingSerializer
from ..kvsaver import KVSaver, OptionError
from ..writes import write_checkpoint
from .common import (
    DEFAULT_BATCH,
    MigrationError,
    MigrationStats,
    ProgressFn,
    _describe,
    _interrupts,
    _refuse,
    _strict_pair,
)
from .source import _file_bytes, _Source, open_sqlite_saver
from .verify import verify as _verify

# -- destination helpers ----------------------------------------------------------


class _NoDest(Txn):
    """Stands in for the destination's transaction in a dry run without one,
    which only reads."""

    def put(self, key: bytes, value: bytes) -> None:
        raise AssertionError("a dry run writes nothing")

    def delete(self, key: bytes) -> bool:
        raise AssertionError("a dry run writes nothing")

    def delete_range(self, start: bytes | None, stop: bytes | None) -> int:
        raise AssertionError("a dry run writes nothing")

    def get(self, key: bytes) -> bytes | None:
        return None

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return [None] * len(keys)

    def scan(
        self,
        start: bytes | None = None,
        stop: bytes | None = None,
        *,
        reverse: bool = False,
        limit: int | None = None,
    ) -> Iterator[tuple[bytes, bytes]]:
        return iter(())


def _raw_copy_limit(src: SerializerProtocol, dst: SerializerProtocol) -> float:
    """Up to what size serde-typed bytes made by ``src`` can be stored as they
    are for ``dst``: where ``dst`` would make the very same bytes from the
    decoded value. 0: never (decode and re-encode everything)."""
    if src is dst:
        return math.inf
    if type(src) is not JsonPlusSerializer:
        return 0  # an encryption key or a wrapper's settings cannot be compared
    if type(dst) is JsonPlusSerializer:
        return math.inf
    if isinstance(dst, CompressingSerializer) and type(dst.serde) is JsonPlusSerializer:
        # KVSaver's default: values below the threshold are stored uncompressed,
        # exactly as JsonPlusSerializer made them; larger ones get compressed.
        return math.inf if dst.threshold is None else dst.threshold
    return 0


def _check_pickled(src: _Source, source: SerializerProtocol, dest: SerializerProtocol) -> None:
    """Refuse up front, before anything is copied, a source whose pickled
    values (type "pickle", from a serializer's ``pickle_fallback``) cannot be
    read with ``source`` or encoded by ``dest``. Those that pass are decoded
    and re-encoded by the copy, never copied as they are (the destination
    could not read them back)."""
    for kind, where, typed in src.pickled():
        try:
            value = source.loads_typed(typed)
        except Exception as e:
            raise MigrationError(
                f"{where}: the {kind} was stored pickled (type 'pickle', a serializer's "
                f"pickle_fallback) and the source serializer does not read pickles ({e!r}). "
                "If you trust this database, pass "
                "source_serde=JsonPlusSerializer(pickle_fallback=True); nothing was copied"
            ) from None
        try:
            if kind == "checkpoint" and isinstance(value, dict):
                for channel_value in (value.pop("channel_values", None) or {}).values():
                    dest.dumps_typed(channel_value)
            dest.dumps_typed(value)
        except Exception as e:
            raise MigrationError(
                f"{where}: the {kind} was stored pickled (type 'pickle', a serializer's "
                f"pickle_fallback) and the destination's serializer cannot encode it ({e!r}); "
                "KVSaver's default serializer never pickles. Make the value serializable, "
                "or give the destination a serializer that can store it; nothing was copied"
            ) from None


def _first_foreign(store: Any, is_ours: Callable[[str, str, str], bool]) -> str | None:
    """The first checkpoint in the store that ``is_ours`` does not claim, as text."""
    with store.read() as txn:
        for _, raw in txn.scan(*S.keyspace_range(S.CHECKPOINT)):
            rec = S.decode_checkpoint(raw)
            if not is_ours(rec.thread_id, rec.checkpoint_ns, rec.checkpoint_id):
                return _describe(rec.thread_id, rec.checkpoint_ns, rec.checkpoint_id)
    return None


def _open_dest(
    dest: KVSaver | str | os.PathLike[str], dry_run: bool, options: Mapping[str, Any]
) -> tuple[KVSaver | None, bool]:
    """(the destination saver or None for a dry run without one, whether we opened it)."""
    if isinstance(dest, KVSaver):
        return dest, False
    path = os.fspath(dest)
    try:
        if dry_run:
            if is_postgres_url(path):
                return KVSaver(path, readonly=True, **options), True
            if not os.path.exists(path) or (os.path.isdir(path) and not os.listdir(path)):
                return None, False
            return KVSaver(path, readonly=True, **options), True
        # No heads of idle threads (whole_latest="idle"): each thread copied
        # would be read back for one, during the copy and at its close.
        return KVSaver(path, **{"whole_latest": False, **options}), True
    except (KVError, OSError, OptionError) as e:
        # OptionError: an option this destination's backend does not take
        # (``--durability`` with a PostgreSQL URL), refused before opening.
        raise MigrationError(f"cannot open the destination {path}: {e}") from None


# -- migrate_from_sqlite ------------------------------------------------------------


def migrate_from_sqlite(
    source: str | os.PathLike[str],
    dest: KVSaver | str | os.PathLike[str],
    *,
    merge: bool = False,
    dry_run: bool = False,
    verify: bool = True,
    batch_size: int = DEFAULT_BATCH,
    source_serde: SerializerProtocol | None = None,
    check_source: bool = True,
    progress: ProgressFn | None = None,
    dest_options: Mapping[str, Any] | None = None,
) -> MigrationStats:
    """Copy a ``SqliteSaver`` database into a KVSaver store.

    Args:
        source: the SQLite file; opened read-only and checked (``PRAGMA
            quick_check`` unless ``check_source=False``) before the
            destination is opened, so a bad source writes nothing.
        dest: a ``KVSaver``, or a directory for ``KVSaver(dest,
            **dest_options)`` (created if missing).
        merge: allow a destination that already holds other checkpoints.
        dry_run: count what would be copied; write nothing, create nothing.
        verify: compare ``list``/``get_tuple`` of a read-only ``SqliteSaver``
            on the source with the destination afterwards; a difference
            raises ``VerificationError``.
        batch_size: checkpoints per write transaction.
        source_serde: the serializer the source was written with (default
            ``JsonPlusSerializer``).
        progress: ``progress(phase, done, total)``, called after each batch.

    Returns the counts, sizes and times as ``MigrationStats``. Raises
    ``MigrationError`` (with a message fit for a user) when the source is not a
    readable SqliteSaver database, the destination is refused, or a checkpoint
    cannot be represented.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    with _interrupts() as interrupted:
        return _migrate_from_sqlite(
            source,
            dest,
            merge=merge,
            dry_run=dry_run,
            verify=verify,
            batch_size=batch_size,
            source_serde=source_serde,
            check_source=check_source,
            progress=progress,
            dest_options=dest_options,
            interrupted=interrupted,
        )


def _migrate_from_sqlite(
    source: str | os.PathLike[str],
    dest: KVSaver | str | os.PathLike[str],
    *,
    merge: bool,
    dry_run: bool,
    verify: bool,
    batch_size: int,
    source_serde: SerializerProtocol | None,
    check_source: bool,
    progress: ProgressFn | None,
    dest_options: Mapping[str, Any] | None,
    interrupted: Callable[[], bool],
) -> MigrationStats:
    src = _Source(source, check=check_source)
    stats = MigrationStats(
        source=src.path,
        dest=str(dest if not isinstance(dest, KVSaver) else dest.store),
        dry_run=dry_run,
        threads=src.threads,
        namespaces=len(src.namespace_list),
        checkpoints=src.checkpoints,
        writes=src.writes,
        orphan_writes=src.orphan_writes,
        source_bytes=_file_bytes(src.path),
        namespace_list=src.namespace_list,
    )
    try:
        saver, owned = _open_dest(dest, dry_run, dest_options or {})
        try:
            if saver is not None and not merge:
                foreign = _first_foreign(saver.store, src.has_checkpoint)
                if foreign is not None:
                    raise _refuse(stats.dest, src.path, foreign)
            _check_pickled(
                src,
                source_serde or JsonPlusSerializer(),
                saver.serde if saver is not None else JsonPlusSerializer(),
            )
            started = time.perf_counter()
            try:
                _copy_sqlite(
                    src, saver, stats, dry_run, batch_size, source_serde, progress, interrupted
                )
            except sqlite3.DatabaseError as e:
                raise MigrationError(
                    f"reading {src.path} failed: {e}. The batches committed before this "
                    "are kept; a re-run goes on from there"
                ) from e
            except KVError as e:
                raise MigrationError(
                    f"writing {stats.dest} failed: {e}. The batches committed before this "
                    "are kept; a re-run goes on from there"
                ) from e
            finally:
                stats.seconds = time.perf_counter() - started
            if verify and not dry_run:
                assert saver is not None
                started = time.perf_counter()
                sqlite_saver = open_sqlite_saver(src.path, serde=source_serde)
                try:
                    stats.verified = _verify(
                        *_strict_pair(sqlite_saver, saver),
                        src.namespace_list,
                        exact=not merge,
                        progress=progress,
                        total=src.checkpoints,
                    )
                finally:
                    sqlite_saver.conn.close()
                    stats.verify_seconds = time.perf_counter() - started
        finally:
            if owned and saver is not None:
                saver.close()
    except MigrationError as e:
        e.stats = stats
        raise
    finally:
        src.close()
    return stats


def _copy_sqlite(
    src: _Source,
    saver: KVSaver | None,
    stats: MigrationStats,
    dry_run: bool,
    batch_size: int,
    source_serde: SerializerProtocol | None,
    progress: ProgressFn | None,
    interrupted: Callable[[], bool],
) -> None:
    serde = saver.serde if saver is not None else JsonPlusSerializer()
    loads = (source_serde or JsonPlusSerializer()).loads_typed
    split = _Splitter(loads, lazy=type(source_serde or JsonPlusSerializer()) is JsonPlusSerializer)
    raw_limit = _raw_copy_limit(source_serde or JsonPlusSerializer(), serde)
    dumps = serde.dumps_typed
    # Checkpoints and writes as put/put_writes store them: small ones
    # compressed with the dictionary. Bytes copied as they are
    # are the inner serializer's, except when the source's serializer is the
    # destination's very object: then they are stored bytes already.
    small = saver._codec if saver is not None else D.codec(serde)
    stored_form = (source_serde or JsonPlusSerializer()) is serde
    # (channel, version) pairs of the current (thread, ns) already handled:
    # most of a checkpoint's channels are unchanged since its parent.
    seen: set[tuple[str, Any, type]] = set()
    current: tuple[Any, Any] | None = None
    done = 0
    if progress is not None:
        progress("copy", 0, src.checkpoints)
    for rows in src.rows(batch_size):
        # A batch may be rerun (through KVSaver._maintain: a conflict on
        # PostgreSQL): each attempt starts from the counts and
        # the (channel, version) pairs as they were before the batch, so a
        # rerun counts nothing twice.
        before = (_counts(stats), set(seen), current)

        def batch(txn: Txn, rows: Any = rows, before: Any = before) -> None:
            nonlocal current
            _restore(stats, before[0])
            seen.clear()
            seen.update(before[1])
            current = before[2]
            put = _Putter(txn, stats)
            for thread_v, ns_v, cid_v, parent, ctype, cbytes, meta_raw in rows:
                if (thread_v, ns_v) != current:
                    current = (thread_v, ns_v)
                    seen.clear()
                thread, ns, cid = str(thread_v), str(ns_v or ""), str(cid_v)
                where = f"thread {thread!r} namespace {ns!r} checkpoint {cid!r}"
                ckey = S.checkpoint_key(thread, ns, cid)
                if txn.get(ckey) is not None:
                    stats.checkpoints_present += 1
                else:
                    stats.checkpoints_copied += 1
                    if not dry_run:
                        _put_checkpoint(
                            put,
                            seen,
                            (thread, ns, cid),
                            parent,
                            (ctype, cbytes),
                            meta_raw,
                            split,
                            dumps,
                            where,
                            small,
                        )
                # A task's writes as put_writes stores them (schema.write_records),
                # less those already there (a re-run, or --merge): found by gets,
                # as put_writes finds them (a scan would send this batch's
                # buffered writes to a network store ahead of its commit).
                tasks: dict[str, list[tuple[int, str, str, Any, Any]]] = {}
                for task_id, task_path, idx, channel, wtype, wvalue in src.writes_of(
                    thread_v, ns_v, cid_v
                ):
                    row = (int(idx), str(task_path or ""), str(channel), wtype, wvalue)
                    tasks.setdefault(str(task_id), []).append(row)
                for task_id, rows in tasks.items():
                    prefix = S.task_write_prefix(thread, ns, cid, task_id)
                    idxs = [r[0] for r in rows]
                    if max(idxs) <= 4 * len(idxs) + 64:  # positions, as LangGraph's
                        found = txn.get_many(S.write_probe_keys(prefix, idxs))
                    else:  # indexes far apart: a scan, not a get of each below
                        found = [raw for _, raw in txn.scan(*S.task_writes_range(prefix))]
                    stored = S.stored_idxs(found)
                    paths: dict[str, list[tuple[int, str, S.Typed]]] = {}
                    for idx, task_path, channel, wtype, wvalue in sorted(rows, key=lambda r: r[0]):
                        if idx in stored:
                            stats.writes_present += 1
                            continue
                        stats.writes_copied += 1
                        if dry_run:
                            continue
                        if wvalue is not None and len(wvalue) < raw_limit and wtype != "pickle":
                            # the bytes the inner serializer would make again
                            value = (wtype, wvalue)
                            if not stored_form:
                                value = small.wrap_small(wtype, wvalue)
                        else:
                            value = small.dumps_small(loads((wtype, wvalue)))
                        paths.setdefault(task_path, []).append((idx, channel, value))
                    for task_path, writes in paths.items():
                        for key, record in S.write_records(prefix, task_id, task_path, writes):
                            put(key, record)
            if interrupted():  # a value of this batch may be a swallowed Ctrl-C's fallback
                raise KeyboardInterrupt()

        if saver is None:
            with nullcontext(_NoDest()) as nothing:
                batch(nothing)
        elif dry_run:
            with saver.store.read() as txn:
                batch(txn)
        else:
            saver._maintain(batch)
        done += len(rows)
        if progress is not None:
            progress("copy", done, src.checkpoints)


def _keep_ext(code: int, data: bytes) -> ormsgpack.Ext:
    return ormsgpack.Ext(code, data)


class _Splitter:
    """A SqliteSaver checkpoint -> (the checkpoint without channel_values,
    {channel: a function returning its value}, {channel: its value} of the
    small values (``schema.is_small``), which go in the record).

    SqliteSaver keeps every channel value inside the checkpoint's one blob,
    but only the values of (channel, version) pairs not stored yet are
    needed: in a chat, about half the checkpoints change the message list.
    For JsonPlusSerializer's msgpack the blob is first unpacked with its
    extension objects (messages, models) left as opaque ``Ext`` values, which
    costs little; a value is decoded by the serializer itself, from its own
    re-packed bytes, only when it is needed. Anything else is decoded whole.
    """

    def __init__(self, loads: Callable[[tuple[str, bytes]], Any], *, lazy: bool) -> None:
        self.loads = loads
        self.lazy = lazy

    def _decode(self, raw: Any) -> Any:
        return self.loads(("msgpack", ormsgpack.packb(raw, option=ormsgpack.OPT_NON_STR_KEYS)))

    def __call__(
        self, typed: tuple[str, bytes]
    ) -> tuple[dict[str, Any], dict[str, Callable[[], Any]], dict[str, Any]]:
        if self.lazy and typed[0] == "msgpack":
            raw = ormsgpack.unpackb(typed[1], ext_hook=_keep_ext, option=ormsgpack.OPT_NON_STR_KEYS)
            if isinstance(raw, dict) and isinstance(raw.get("channel_values", {}), dict):
                raw_values = raw.pop("channel_values", None) or {}
                checkpoint = self._decode(raw)
                # a scalar unpacks as the serializer would load it (an
                # extension object stays opaque, and is not small)
                return (
                    checkpoint,
                    {ch: functools.partial(self._decode, v) for ch, v in raw_values.items()},
                    {ch: v for ch, v in raw_values.items() if S.is_small(v)},
                )
        checkpoint = self.loads(typed)
        values = checkpoint.pop("channel_values", None) or {}
        return (
            checkpoint,
            {ch: functools.partial(_same, v) for ch, v in values.items()},
            {ch: v for ch, v in values.items() if S.is_small(v)},
        )


def _same(value: Any) -> Any:
    return value


_COUNTED = ("checkpoints_copied", "checkpoints_present", "writes_copied", "writes_present",
            "blobs_written", "bytes_written")  # fmt: skip


def _counts(stats: MigrationStats) -> tuple[int, ...]:
    """What a batch of ``_copy_sqlite`` adds to (see ``_restore``)."""
    return tuple(getattr(stats, name) for name in _COUNTED)


def _restore(stats: MigrationStats, counts: tuple[int, ...]) -> None:
    for name, value in zip(_COUNTED, counts):
        setattr(stats, name, value)


class _Putter:
    """``txn.put`` that counts what it writes."""

    def __init__(self, txn: Txn, stats: MigrationStats) -> None:
        self.txn, self.stats = txn, stats

    def __call__(self, key: bytes, value: bytes) -> None:
        self.txn.put(key, value)
        self.stats.bytes_written += len(key) + len(value)


def _put_checkpoint(
    put: _Putter,
    seen: set[tuple[str, Any, type]],
    ids: tuple[str, str, str],
    parent: Any,
    typed: tuple[str, bytes],
    meta_raw: Any,
    split: Callable[
        [tuple[str, bytes]],
        tuple[dict[str, Any], dict[str, Callable[[], Any]], dict[str, Any]],
    ],
    dumps: Callable[[Any], tuple[str, bytes]],
    where: str,
    codec: D.Codec,
) -> None:
    """One checkpoint as ``KVSaver.put`` stores it (``writes.write_checkpoint``):
    a blob per (channel, version) not stored yet (through ``codec``: a list
    that extends its parent's is a delta), the record with its small values
    as channel_values, and every index key (``schema.index_keys``)."""
    thread, ns, cid = ids
    txn = put.txn
    try:
        checkpoint, values, small = split(typed)
        metadata = json.loads(meta_raw) if meta_raw is not None else {}
    except Exception as e:
        raise MigrationError(f"{where}: cannot decode it: {e!r}") from e
    versions = checkpoint.get("channel_versions") or {}
    unversioned = sorted(set(values) - set(versions))
    if unversioned:
        # KVSaver finds a channel's value through its version; a value without
        # one would silently disappear.
        raise MigrationError(
            f"{where}: channel_values {unversioned} have no entry in channel_versions; "
            "KVSaver cannot store a value without a version"
        )
    try:
        to_write: dict[str, Any] = {}
        for channel, version in versions.items():
            if channel in small:
                continue  # in the record
            mark = (channel, version, type(version))  # 1 == 1.0, but their keys differ
            if mark in seen:
                continue
            seen.add(mark)
            if channel not in values:
                continue  # no value: no record (put writes none either)
            if txn.get(S.blob_key(thread, ns, channel, version)) is None:
                to_write[channel] = version
        # reuse=False: each value is a fresh object, never seen again
        blobs = codec.prepare(
            thread, ns, to_write, {ch: values[ch]() for ch in to_write}, dumps, reuse=False
        )
        if not isinstance(metadata, dict):
            raise MigrationError(f"{where}: metadata is not a JSON object: {metadata!r}")
        record = S.make_checkpoint_record(
            thread, ns, cid, parent, codec.dumps_checkpoint(checkpoint, small, False)[0],
            metadata, dumps,
        )  # fmt: skip
        # As put writes them (no activity: a migrated thread was not active).
        ckey = S.checkpoint_key(thread, ns, cid)
        encoded, index = S.encode_checkpoint(record), S.index_keys(record)
        write_checkpoint(txn, codec, record, ckey, encoded, index, blobs, {}, put)
    except (MigrationError, KVError):
        raise
    except Exception as e:
        raise MigrationError(
            f"{where}: cannot decode a value or encode it for the destination: {e!r}"
        ) from e
    put.stats.blobs_written += len(blobs)
    codec.remember(thread, ns, cid, versions)
