"""Move checkpoints into (and out of) KVSaver.

Two ways in, one check:

* ``migrate_from_sqlite(source, dest)`` reads a ``SqliteSaver`` database's
  tables directly (opened read-only, ``mode=ro``) and writes every
  checkpoint, with its id, parent, namespace, metadata and pending writes,
  into a KVSaver store through ``saver.schema``: one write transaction per
  batch of checkpoints, each checkpoint complete (record, new blobs, writes)
  within its batch. The whole checkpoint is in SqliteSaver's one blob; its
  ``channel_values`` are split into per-(channel, version) blobs, and a
  value is decoded and serialized only when its (channel, version) is not
  stored yet (see ``_Splitter``). Pending writes keep ``task_id``, ``idx``
  (special negative ones included), ``channel`` and ``task_path`` (``""``
  for databases made before that column existed); their serde-typed bytes
  are copied as they are where the destination's serializer would make the
  same bytes, else decoded and re-encoded (e.g. for an
  ``EncryptedSerializer``). Metadata (JSON text in SQLite) is decoded and
  stored through the destination's serde exactly as read: no config value
  is merged in, as ``put`` would. The result is byte for byte what
  ``KVSaver.put``/``put_writes`` store for the same checkpoints (a test pins
  this), except the thread activity stamps of ``saver.retention``: a
  migrated thread was not active at migration time, and retention dates a
  thread without a stamp by its latest checkpoint's ``ts``.

  Safe to re-run and to interrupt: every key is made of the source's ids, a
  checkpoint already in the destination is not decoded again, a write or
  blob already there is not written again, and a batch commits atomically.
  A destination that holds checkpoints not in the source is refused unless
  ``merge=True``. ``dry_run=True`` counts what would be copied and writes
  nothing (a missing destination is not created).

* ``copy_all(source_saver, dest_saver)`` copies every thread between any two
  ``BaseCheckpointSaver`` objects through their public methods (``list``,
  ``get_tuple``, ``put``, ``put_writes``), e.g. KVSaver -> PostgresSaver.
  What public methods cannot carry: ``get_tuple``'s pending writes have no
  ``task_path`` and no ``idx``. From a KVSaver source both are read from its
  store, so nothing is lost; from any other source every write gets
  ``task_path=""`` and the indexes ``0..n-1`` in its task's order (special
  channels keep their fixed negative indexes). Writes are then ordered by
  task id within a checkpoint instead of by task path, and verification
  compares each task's writes in order instead of the whole list. Each
  ``put`` passes the checkpoint's full ``channel_versions`` as
  ``new_versions`` (the destination may store some values more than once;
  savers keyed by (channel, version), as Postgres and KVSaver are, keep one).

* ``verify(source, dest, namespaces)`` compares ``list()`` and
  ``get_tuple()`` of both, per (thread, namespace), and raises
  ``VerificationError`` naming the first difference. The verification that
  ``migrate_from_sqlite`` and ``copy_all`` run reads both sides in
  LangGraph's strict msgpack mode when both use a ``JsonPlusSerializer``
  without an allowlist (``_strict_pair``). The copy itself decodes values
  with the source's serializer: migrate only from a source you trust.

Only ``kv``'s ``Store`` protocol and ``saver``'s own modules are used; the
``SqliteSaver`` used for verification is imported when needed (the
``langgraph-checkpoint-sqlite`` package).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import reprlib
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ormsgpack
from kvsaver.kv import KVError
from kvsaver.kv.keys import prefix_range
from kvsaver.kv.postgres import is_postgres_url
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    CheckpointTuple,
    SerializerProtocol,
)
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from . import delta as D
from . import schema as S
from .compression import CompressingSerializer
from .kvsaver import KVSaver, OptionError
from .records import write_checkpoint

if TYPE_CHECKING:
    from langgraph.checkpoint.sqlite import SqliteSaver

__all__ = [
    "MigrationError",
    "MigrationStats",
    "ProgressFn",
    "VerificationError",
    "copy_all",
    "migrate_from_sqlite",
    "open_sqlite_saver",
    "verify",
]

ProgressFn = Callable[[str, int, int], None]
"""``progress(phase, done, total)``: phase is ``"copy"`` or ``"verify"``;
done and total count checkpoints (total 0: not known)."""

DEFAULT_BATCH = 256
_BATCH_BYTES = 32 << 20  # a batch also ends after this much source data

_CHECKPOINT_COLUMNS = {
    "thread_id",
    "checkpoint_ns",
    "checkpoint_id",
    "parent_checkpoint_id",
    "type",
    "checkpoint",
    "metadata",
}
_WRITE_COLUMNS = {
    "thread_id",
    "checkpoint_ns",
    "checkpoint_id",
    "task_id",
    "idx",
    "channel",
    "type",
    "value",
}


class MigrationError(Exception):
    """The migration cannot start or go on: a bad source, a refused destination,
    a checkpoint that cannot be represented. The message says which.
    ``stats`` holds what was done before the error, when anything was."""

    stats: MigrationStats | None = None


class VerificationError(MigrationError):
    """Source and destination differ; ``difference`` names the first place."""

    def __init__(self, difference: str) -> None:
        super().__init__(f"verification failed: {difference}")
        self.difference = difference


@dataclass
class MigrationStats:
    """What a migration found, did (or, with ``dry_run``, would do) and took."""

    source: str = ""
    dest: str = ""
    dry_run: bool = False
    threads: int = 0
    namespaces: int = 0
    checkpoints: int = 0
    """Checkpoints in the source."""
    checkpoints_copied: int = 0
    checkpoints_present: int = 0
    """Already in the destination (an earlier run): not decoded again."""
    writes: int = 0
    """Pending writes of the source's checkpoints."""
    writes_copied: int = 0
    writes_present: int = 0
    orphan_writes: int = 0
    """Writes in the source whose checkpoint does not exist (never readable
    through SqliteSaver either): not copied."""
    blobs_written: int = 0
    bytes_written: int = 0
    """Keys and values put into the destination store."""
    source_bytes: int = 0
    """The SQLite file (and its -wal), on disk."""
    seconds: float = 0.0
    verified: int | None = None
    """Checkpoints compared by verification (None: not verified)."""
    verify_seconds: float = 0.0
    namespace_list: list[tuple[str, str]] = field(default_factory=list, repr=False)

    @property
    def rate(self) -> float:
        """Checkpoints copied per second."""
        return self.checkpoints_copied / self.seconds if self.seconds > 0 else 0.0


# -- verification reads in strict msgpack mode ---------------------------------------


def _strict_serde(serde: SerializerProtocol) -> SerializerProtocol | None:
    """``serde`` in LangGraph's strict msgpack mode, when it is a
    ``JsonPlusSerializer`` (bare or inside KVSaver's compression) without an
    allowlist or ext hook of its own; else None (an allowlist, encryption, a
    serializer of the user's: used as they are). Strict mode rebuilds only LangGraph's
    safe types; any other class or function named in stored data comes back
    as its raw arguments instead of being imported and called."""
    comp = serde if isinstance(serde, CompressingSerializer) else None
    inner = comp.serde if comp is not None else serde
    if type(inner) is not JsonPlusSerializer or getattr(inner, "_custom_unpack_ext_hook", True):
        return None  # not LangGraph's own decoding: the user's to decide
    # LangGraph keeps the policy here: True = permissive (the default unless
    # LANGGRAPH_STRICT_MSGPACK is set), None = strict, a set = an allowlist.
    policy = getattr(inner, "_allowed_msgpack_modules", False)
    if policy is None:
        return serde
    if policy is not True:
        return None
    strict = JsonPlusSerializer(pickle_fallback=inner.pickle_fallback, allowed_msgpack_modules=None)
    return comp.with_inner(strict) if comp is not None else strict


def _strict_pair(
    source: BaseCheckpointSaver, dest: BaseCheckpointSaver
) -> tuple[BaseCheckpointSaver, BaseCheckpointSaver]:
    """The two savers as verification reads them: both in strict msgpack mode
    when both can be (verification decodes every stored value, and
    in the default mode a crafted one can name any importable callable for the
    decoder to run); else both as they are, so both sides decode alike."""
    strict = [_strict_serde(source.serde), _strict_serde(dest.serde)]
    if None in strict:
        return source, dest
    views = []
    for saver, serde in zip((source, dest), strict):
        if serde is not saver.serde:
            saver = copy.copy(saver)
            saver.serde = serde  # type: ignore[assignment]
        views.append(saver)
    return views[0], views[1]


# -- Ctrl-C ----------------------------------------------------------------------------


@contextmanager
def _interrupts() -> Iterator[Callable[[], bool]]:
    """Yields ``interrupted()``: whether Ctrl-C (SIGINT) came meanwhile.

    Decoding can swallow a KeyboardInterrupt: LangGraph's msgpack
    ``ext_hook`` (and ours, ``_keep_ext``) runs inside ormsgpack, which
    replaces any exception raised in a hook, KeyboardInterrupt included, by
    ``ValueError('ext_hook failed')``; LangGraph's hook may then catch that
    in a nested value and decode it to a fallback value. So while a migration
    runs, SIGINT is also recorded here (in the main thread; the previous
    handler still runs), a batch commits only if none came, and an exception
    that ends the migration after one is raised as the KeyboardInterrupt it
    was, as is a migration that finished anyway.
    """
    hits: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None
    if not callable(previous):  # another thread, or SIGINT ignored or not from Python
        yield lambda: False
        return

    def record(signum: int, frame: Any) -> None:
        hits.append(signum)
        previous(signum, frame)

    signal.signal(signal.SIGINT, record)
    try:
        yield lambda: bool(hits)
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        if hits:
            raise KeyboardInterrupt() from e
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
    if hits:
        raise KeyboardInterrupt()


# -- the SQLite source ------------------------------------------------------------


def _sqlite_uri(path: str | os.PathLike[str]) -> str:
    return Path(os.fspath(path)).absolute().as_uri() + "?mode=ro"


def _file_bytes(path: str) -> int:
    total = 0
    for suffix in ("", "-wal"):
        try:
            total += os.path.getsize(path + suffix)
        except OSError:
            pass
    return total


class _Source:
    """A SqliteSaver database opened read-only, checked before anything is written."""

    def __init__(self, path: str | os.PathLike[str], *, check: bool = True) -> None:
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise MigrationError(f"{self.path}: no such file")
        if not os.path.isfile(self.path):
            raise MigrationError(f"{self.path} is not a file (a SqliteSaver database is one)")
        try:
            # isolation_level=None: we open the one read transaction ourselves,
            # so every query of the migration sees the same snapshot.
            self.conn = sqlite3.connect(
                _sqlite_uri(self.path), uri=True, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as e:
            raise MigrationError(f"cannot open {self.path} read-only: {e}") from None
        try:
            self._check(check)
            self.conn.execute("BEGIN")
            self._count()
        except sqlite3.DatabaseError as e:
            self.conn.close()
            raise MigrationError(
                f"{self.path} is not a readable SQLite database ({e}); nothing was written"
            ) from None
        except BaseException:
            self.conn.close()
            raise

    def _columns(self, table: str) -> set[str]:
        return {row[1] for row in self.conn.execute(f"PRAGMA table_info({table})")}

    def _check(self, integrity: bool) -> None:
        tables = {
            row[0] for row in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        if "checkpoints" not in tables:
            raise MigrationError(
                f"{self.path} is an SQLite database without a 'checkpoints' table: "
                "not a SqliteSaver database"
            )
        missing = _CHECKPOINT_COLUMNS - self._columns("checkpoints")
        if missing:
            raise MigrationError(
                f"{self.path}: table 'checkpoints' lacks columns {sorted(missing)}: not a "
                "SqliteSaver database of a supported version (langgraph-checkpoint-sqlite >= 1.0)"
            )
        self.has_writes = "writes" in tables
        self.has_task_path = False
        if self.has_writes:
            columns = self._columns("writes")
            missing = _WRITE_COLUMNS - columns
            if missing:
                raise MigrationError(
                    f"{self.path}: table 'writes' lacks columns {sorted(missing)}: not a "
                    "SqliteSaver database of a supported version"
                )
            self.has_task_path = "task_path" in columns
        if integrity:
            # Reads every page once: a damaged file fails here, before the
            # destination exists, instead of halfway through the copy.
            problems = [row[0] for row in self.conn.execute("PRAGMA quick_check")]
            if problems != ["ok"]:
                raise MigrationError(
                    f"{self.path} is damaged (sqlite quick_check: {'; '.join(problems[:3])}); "
                    "nothing was written"
                )

    def _count(self) -> None:
        q = self.conn.execute
        self.checkpoints = q("SELECT COUNT(*) FROM checkpoints").fetchone()[0]
        self.namespace_list = [
            (str(t), str(ns or ""))
            for t, ns in q(
                "SELECT DISTINCT thread_id, checkpoint_ns FROM checkpoints "
                "ORDER BY thread_id, checkpoint_ns"
            )
        ]
        self.threads = len({t for t, _ in self.namespace_list})
        self.writes = self.orphan_writes = 0
        if self.has_writes:
            self.orphan_writes = q(
                "SELECT COUNT(*) FROM writes w WHERE NOT EXISTS (SELECT 1 FROM checkpoints c "
                "WHERE c.thread_id = w.thread_id AND c.checkpoint_ns = w.checkpoint_ns "
                "AND c.checkpoint_id = w.checkpoint_id)"
            ).fetchone()[0]
            self.writes = q("SELECT COUNT(*) FROM writes").fetchone()[0] - self.orphan_writes

    def rows(self, batch: int) -> Iterator[list[tuple[Any, ...]]]:
        """Checkpoint rows in key order, in batches of at most ``batch`` rows
        and about ``_BATCH_BYTES`` of data."""
        cur = self.conn.execute(
            "SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, "
            "checkpoint, metadata FROM checkpoints ORDER BY thread_id, checkpoint_ns, checkpoint_id"
        )
        out: list[tuple[Any, ...]] = []
        size = 0
        for row in cur:
            out.append(row)
            size += len(row[5] or b"") + len(row[6] or b"")
            if len(out) >= batch or size >= _BATCH_BYTES:
                yield out
                out, size = [], 0
        if out:
            yield out

    def writes_of(self, thread: Any, ns: Any, checkpoint_id: Any) -> list[tuple[Any, ...]]:
        """(task_id, task_path, idx, channel, type, value) rows of one checkpoint."""
        if not self.has_writes:
            return []
        task_path = "task_path" if self.has_task_path else "''"
        return self.conn.execute(
            f"SELECT task_id, {task_path}, idx, channel, type, value FROM writes "
            "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
            (thread, ns, checkpoint_id),
        ).fetchall()

    def pickled(self) -> Iterator[tuple[str, str, tuple[str, bytes]]]:
        """("checkpoint" or "write", where, typed value) of every value stored
        as type "pickle" (a serializer's ``pickle_fallback``)."""
        for t, ns, cid, ctype, cbytes in self.conn.execute(
            "SELECT thread_id, checkpoint_ns, checkpoint_id, type, checkpoint FROM checkpoints "
            "WHERE type = 'pickle'"
        ):
            yield "checkpoint", _describe(str(t), str(ns or ""), str(cid)), (ctype, cbytes)
        if not self.has_writes:
            return
        for t, ns, cid, task_id, channel, wtype, wvalue in self.conn.execute(
            "SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, channel, type, value "
            "FROM writes WHERE type = 'pickle'"
        ):
            where = _describe(str(t), str(ns or ""), str(cid))
            yield (
                "write",
                f"{where}, pending write of task {task_id!r} to {channel!r}",
                (
                    wtype,
                    wvalue,
                ),
            )

    def has_checkpoint(self, thread: str, ns: str, checkpoint_id: str) -> bool:
        return (
            self.conn.execute(
                "SELECT 1 FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? "
                "AND checkpoint_id = ?",
                (thread, ns, checkpoint_id),
            ).fetchone()
            is not None
        )

    def close(self) -> None:
        self.conn.close()


def open_sqlite_saver(
    path: str | os.PathLike[str], *, serde: SerializerProtocol | None = None
) -> SqliteSaver:
    """A real ``SqliteSaver`` on ``path`` opened read-only (``mode=ro``).

    ``SqliteSaver.setup()`` writes (``PRAGMA journal_mode=WAL``, ``CREATE
    TABLE IF NOT EXISTS``, an ``ALTER TABLE`` for ``task_path``), which a
    read-only connection refuses; the tables are already there, so setup is
    marked done and the ``task_path`` column is looked up instead. Close it
    with ``saver.conn.close()``.
    """
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
    except ImportError:  # pragma: no cover - depends on the environment
        raise MigrationError(
            "reading a SqliteSaver database back needs langgraph-checkpoint-sqlite: "
            "pip install 'kvsaver[tools]' (or skip verification)"
        ) from None
    conn = sqlite3.connect(_sqlite_uri(path), uri=True, check_same_thread=False)
    try:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(writes)")}
    except sqlite3.DatabaseError as e:
        conn.close()
        raise MigrationError(f"cannot read {os.fspath(path)}: {e}") from None
    saver = SqliteSaver(conn, serde=serde)
    saver.is_setup = True
    saver._has_task_path = "task_path" in columns
    return saver


# -- destination helpers ----------------------------------------------------------


class _NoDest:
    """Stands in for the destination's transaction in a dry run without one."""

    def get(self, key: bytes) -> bytes | None:
        return None

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return [None] * len(keys)

    def scan(self, start: bytes, stop: bytes) -> Iterator[tuple[bytes, bytes]]:
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
        for _, raw in txn.scan(*prefix_range((S.CHECKPOINT,))):
            rec = S.decode_checkpoint(raw)
            if not is_ours(rec.thread_id, rec.checkpoint_ns, rec.checkpoint_id):
                return _describe(rec.thread_id, rec.checkpoint_ns, rec.checkpoint_id)
    return None


def _describe(thread: str, ns: str, checkpoint_id: str) -> str:
    return f"thread {thread!r} namespace {ns!r} checkpoint {checkpoint_id!r}"


def _refuse(dest: str, source: str, first: str) -> MigrationError:
    return MigrationError(
        f"the destination {dest} already holds checkpoints that are not in {source} "
        f"(e.g. {first}); refusing to mix them. Pass --merge (merge=True) to add to it "
        "anyway, or choose an empty destination"
    )


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

        def batch(txn: Any, rows: Any = rows, before: Any = before) -> None:
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

    def __init__(self, txn: Any, stats: MigrationStats) -> None:
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
    """One checkpoint as ``KVSaver.put`` stores it (``records.write_checkpoint``):
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


# -- copy_all: any saver to any saver -------------------------------------------------


def _ids(config: RunnableConfig) -> tuple[str, str, str]:
    conf = config["configurable"]
    return str(conf["thread_id"]), str(conf.get("checkpoint_ns") or ""), str(conf["checkpoint_id"])


def _cfg(thread: str, ns: str, checkpoint_id: str | None = None) -> RunnableConfig:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if checkpoint_id:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def _write_groups(
    source: BaseCheckpointSaver, tup: CheckpointTuple
) -> list[tuple[str, str, list[tuple[str, Any]]]]:
    """The pending writes of a checkpoint as put_writes calls:
    (task_path, task_id, [(channel, value), ...]).

    A write is identified by (task_id, idx), and put_writes numbers a batch
    from 0, so a task's regular writes go in idx order, one call per run of
    one task_path (a task id may be written under several paths); a run that
    starts at idx s > 0 is preceded by the task's writes at 0..s-1, which
    the destination holds from the earlier calls and ignores, as every saver
    with SqliteSaver's semantics does. So each write keeps its idx and its
    task_path. Special channels go in calls of their
    own (they keep replace semantics, at their fixed negative indexes)."""
    thread, ns, cid = _ids(tup.config)
    pending = list(tup.pending_writes or [])
    if isinstance(source, KVSaver):
        # The records hold task_path and idx; get_tuple's list holds the
        # decoded values, in the same (writes_sort_key) order.
        with source.store.read() as txn:
            recs = source._reads.load_writes(txn, thread, ns, cid)
        if [(w.task_id, w.channel) for w in recs] == [(t, c) for t, c, _ in pending]:
            values = [v for _, _, v in pending]
        else:  # written to in between: decode the records themselves
            values = [source.serde.loads_typed(w.value) for w in recs]
        rows = [(w.task_path, w.task_id, w.idx, w.channel, v) for w, v in zip(recs, values)]
    else:
        # Public pending writes carry neither task_path nor idx: "" and each
        # task's regular writes numbered in order.
        counts: dict[str, int] = {}
        rows = []
        for task_id, channel, value in pending:
            idx = WRITES_IDX_MAP.get(channel, counts.get(task_id, 0))
            if channel not in WRITES_IDX_MAP:
                counts[task_id] = idx + 1
            rows.append(("", task_id, idx, channel, value))
    special: dict[tuple[str, str], list[tuple[str, Any]]] = {}
    regular: dict[str, list[tuple[int, str, str, Any]]] = {}
    for task_path, task_id, idx, channel, value in rows:
        if channel in WRITES_IDX_MAP:
            special.setdefault((task_path, task_id), []).append((channel, value))
        else:
            regular.setdefault(task_id, []).append((idx, task_path, channel, value))
    calls: list[tuple[str, str, list[tuple[str, Any]]]] = []
    for task_id, items in regular.items():
        items.sort(key=lambda x: x[0])
        at = {idx: (channel, value) for idx, _, channel, value in items}
        i = 0
        while i < len(items):
            j = i
            while j < len(items) and items[j][1] == items[i][1]:
                j += 1
            first = items[i][0]
            # Indexes below a run are all stored (put_writes fills 0..n-1);
            # were one missing, the run would be renumbered rather than pad
            # the destination with a write the source does not have.
            pad = [at[n] for n in range(first)] if all(n in at for n in range(first)) else []
            calls.append((items[i][1], task_id, pad + [(ch, v) for _, _, ch, v in items[i:j]]))
            i = j
    calls += [(task_path, task_id, group) for (task_path, task_id), group in special.items()]
    return calls


def copy_all(
    source: BaseCheckpointSaver,
    dest: BaseCheckpointSaver,
    *,
    merge: bool = False,
    verify: bool = True,
    progress: ProgressFn | None = None,
) -> MigrationStats:
    """Copy every checkpoint of every thread from ``source`` to ``dest`` through
    their public methods, e.g. a KVSaver store to a ``PostgresSaver`` (call
    its ``setup()`` first).

    Re-runnable: checkpoints already in ``dest`` are not put again (their
    missing pending writes are); a ``dest`` holding checkpoints that
    ``source`` does not have is refused unless ``merge=True``. With
    ``verify`` (default) both are compared afterwards (see ``verify``).
    See the module docstring for what public methods cannot carry.
    """
    with _interrupts() as interrupted:
        return _copy_all(source, dest, merge, verify, progress, interrupted)


def _copy_all(
    source: BaseCheckpointSaver,
    dest: BaseCheckpointSaver,
    merge: bool,
    verify: bool,
    progress: ProgressFn | None,
    interrupted: Callable[[], bool],
) -> MigrationStats:
    stats = MigrationStats(source=repr(source), dest=repr(dest))
    existing: dict[tuple[str, str, str], int] = {
        _ids(t.config): len(t.pending_writes or []) for t in dest.list(None)
    }
    if existing and not merge:
        for t, ns, cid in existing:
            if source.get_tuple(_cfg(t, ns, cid)) is None:
                raise _refuse(stats.dest, stats.source, _describe(t, ns, cid))
    started = time.perf_counter()
    namespaces: set[tuple[str, str]] = set()
    for tup in source.list(None):
        thread, ns, cid = _ids(tup.config)
        namespaces.add((thread, ns))
        stats.checkpoints += 1
        if progress is not None:
            progress("copy", stats.checkpoints, 0)  # the total is not known ahead
        writes = tup.pending_writes or []
        stats.writes += len(writes)
        key = (thread, ns, cid)
        if interrupted():  # a value of tup may be a swallowed Ctrl-C's fallback
            raise KeyboardInterrupt()
        if key in existing:
            stats.checkpoints_present += 1
            if existing[key] >= len(writes):
                stats.writes_present += len(writes)
                continue
        else:
            parent = (
                tup.parent_config["configurable"]["checkpoint_id"] if tup.parent_config else None
            )
            checkpoint: dict[str, Any] = dict(tup.checkpoint)
            checkpoint["channel_values"] = dict(checkpoint.get("channel_values") or {})
            dest.put(
                _cfg(thread, ns, parent),
                checkpoint,  # type: ignore[arg-type]
                dict(tup.metadata or {}),  # type: ignore[arg-type]
                dict(checkpoint.get("channel_versions") or {}),
            )
            stats.checkpoints_copied += 1
        for task_path, task_id, group in _write_groups(source, tup):
            if interrupted():
                raise KeyboardInterrupt()
            dest.put_writes(_cfg(thread, ns, cid), group, task_id, task_path)
        stats.writes_copied += len(writes)
    stats.seconds = time.perf_counter() - started
    stats.namespace_list = sorted(namespaces)
    stats.namespaces = len(namespaces)
    stats.threads = len({t for t, _ in namespaces})
    if verify:
        started = time.perf_counter()
        stats.verified = _verify(
            *_strict_pair(source, dest),
            stats.namespace_list,
            exact=not merge,
            writes_order=isinstance(source, KVSaver),
            progress=progress,
            total=stats.checkpoints,
        )
        stats.verify_seconds = time.perf_counter() - started
    return stats


# -- verification ---------------------------------------------------------------------

_repr = reprlib.Repr()
_repr.maxstring = 80
_repr.maxother = 80


def _short(value: Any) -> str:
    return _repr.repr(value)


def _diff(a: Any, b: Any, path: str) -> str | None:
    """The first place where a (source) and b (destination) differ, or None."""
    try:
        if type(a) is type(b) and a == b:
            return None
    except Exception:  # an __eq__ that raises: fall through to the structure
        pass
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return None
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in a:
            if key not in b:
                return f"{path}[{key!r}]: only on the source ({_short(a[key])})"
        for key in b:
            if key not in a:
                return f"{path}[{key!r}]: only on the destination ({_short(b[key])})"
        for key in a:
            if (d := _diff(a[key], b[key], f"{path}[{key!r}]")) is not None:
                return d
        if type(a) is not type(b):
            ta, tb = type(a).__name__, type(b).__name__
            return f"{path}: type {ta} on the source, {tb} on the destination"
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and type(a) is type(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if (d := _diff(x, y, f"{path}[{i}]")) is not None:
                return d
        if len(a) != len(b):
            return f"{path}: {len(a)} items on the source, {len(b)} on the destination"
        return None
    if type(a) is type(b) and type(a).__eq__ is object.__eq__ and hasattr(a, "__dict__"):
        return _diff(vars(a), vars(b), path)
    return f"{path}: source {_short(a)} != destination {_short(b)}"


def _by_task(writes: Sequence[Any]) -> dict[str, list[tuple[str, Any]]]:
    out: dict[str, list[tuple[str, Any]]] = {}
    for task_id, channel, value in writes:
        out.setdefault(task_id, []).append((channel, value))
    return out


def _diff_tuple(
    a: CheckpointTuple | None, b: CheckpointTuple | None, where: str, writes_order: bool
) -> str | None:
    if a is None or b is None:
        if a is b:
            return None
        side = "source" if b is None else "destination"
        return f"{where}: only the {side} has a checkpoint"
    for name in ("config", "parent_config", "metadata", "checkpoint"):
        if (d := _diff(getattr(a, name), getattr(b, name), f"{where}.{name}")) is not None:
            return d
    wa, wb = list(a.pending_writes or []), list(b.pending_writes or [])
    if not writes_order:
        return _diff(_by_task(wa), _by_task(wb), f"{where}.pending_writes(by task)")
    return _diff(wa, wb, f"{where}.pending_writes")


def verify(
    source: BaseCheckpointSaver,
    dest: BaseCheckpointSaver,
    namespaces: Iterable[tuple[str, str]],
    *,
    exact: bool = True,
    writes_order: bool = True,
    progress: ProgressFn | None = None,
    total: int = 0,
) -> int:
    """Compare ``list()`` and the latest ``get_tuple()`` of source and
    destination for every (thread, namespace); return the number of
    checkpoints compared, or raise ``VerificationError`` with the first
    difference.

    ``exact=False`` (after a merge) ignores destination checkpoints the source
    does not have. ``writes_order=False`` compares each task's pending writes
    in order rather than the whole list (for copies that lost ``task_path``).
    """
    compared = 0
    if progress is not None:
        progress("verify", 0, total)
    for thread, ns in namespaces:
        where = f"thread {thread!r} namespace {ns!r}"
        config = _cfg(thread, ns)
        latest_id = None
        # Both lists are streamed side by side (a long thread never sits in
        # memory whole) and closed before get_tuple: SqliteSaver.list holds
        # the saver's lock until its generator finishes.
        src_iter, dst_iter = source.list(config), dest.list(config)
        try:
            for i, a in enumerate(src_iter):
                a_id = _ids(a.config)[2]
                latest_id = latest_id or a_id
                b = next(dst_iter, None)
                while not exact and b is not None and _ids(b.config)[2] > a_id:
                    b = next(dst_iter, None)  # merged in from elsewhere: not ours to compare
                if b is None:
                    raise VerificationError(
                        f"{where}: list()[{i}] is checkpoint {a_id!r} on the source; the "
                        "destination's list() has ended"
                    )
                if (b_id := _ids(b.config)[2]) != a_id:
                    raise VerificationError(
                        f"{where}: list()[{i}] is checkpoint {a_id!r} on the source, {b_id!r} "
                        "on the destination"
                    )
                if (d := _diff_tuple(a, b, f"{where}: list()[{i}]", writes_order)) is not None:
                    raise VerificationError(d)
                compared += 1
            if exact and (extra := next(dst_iter, None)) is not None:
                raise VerificationError(
                    f"{where}: the destination's list() goes on after the source's ends, with "
                    f"checkpoint {_ids(extra.config)[2]!r}"
                )
        finally:
            for it in (src_iter, dst_iter):
                close = getattr(it, "close", None)
                if close is not None:
                    close()
        if latest_id is not None:
            latest = config if exact else _cfg(thread, ns, latest_id)
            label = "get_tuple()" if exact else f"get_tuple({latest_id!r})"
            got_a, got_b = source.get_tuple(latest), dest.get_tuple(latest)
            if (d := _diff_tuple(got_a, got_b, f"{where}: {label}", writes_order)) is not None:
                raise VerificationError(d)
        if progress is not None:
            progress("verify", compared, max(total, compared))
    return compared


_verify = verify  # the name the functions above use: their `verify` is a flag
