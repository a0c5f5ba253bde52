"""``KVSaver``: a LangGraph checkpoint saver over any ``kv.Store``.

Uses only the ``Store`` protocol and the key/record formats of
``saver.schema``. Async methods run the sync code in a worker thread, so a
disk sync never blocks the event loop and no method body is written twice;
``aget_tuple`` on an LMDB or memory store runs on the loop itself (its
reads never wait for a sync or a writer).
"""

from __future__ import annotations

import asyncio
import builtins
import copy
import difflib
import functools
import inspect
import os
import random
import threading
import time
from collections import OrderedDict
from collections.abc import (
    AsyncIterator,
    Callable,
    Collection,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Literal, TypeVar
from uuid import UUID

from kvsaver.kv import (
    CorruptStoreError,
    FileStore,
    FormatVersionError,
    KVError,
    LMDBStore,
    MemoryStore,
    PostgresStore,
    Store,
)
from kvsaver.kv.keys import pack, split, unpack
from kvsaver.kv.postgres import is_postgres_url
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    SerializerProtocol,
    get_checkpoint_metadata,
)

from . import compression as C
from . import delta as D
from . import heads as H
from . import retention as R
from . import schema as S
from . import small as SV
from . import stats as ST
from . import threads as TH
from . import upgrade as U
from ._compat import HAS_DELTA_CHANNELS, DeltaChannelHistory, writes_sort_key
from ._idle import IdleWork

__all__ = ["KVSaver", "OptionError"]

T = TypeVar("T")
_LIST_CHUNK = 32
# The threads of a saver's async calls on a local store (see _run).
_ASYNC_THREADS = 32
# whole_latest="idle": a thread's head is written once no put came for this long
IDLE_SECONDS = 1.0
# ... and by each put while a reader elsewhere wants it: marked (kv/hints.py)
# within this many seconds; a reader marks a thread when it found it without
# its head WANT_AFTER times within MARK_SECONDS (once per such window).
WANTED_SECONDS = 10
MARK_SECONDS = 2.0
WANT_AFTER = 4
_monotonic = time.monotonic  # the clock of those windows (tests replace it)
_ASYNC_THREAD_NAME = "kvsaver-async"


class OptionError(TypeError):
    """A keyword option KVSaver does not take, or not for this backend (a
    misspelling, ``durability=`` with a PostgreSQL URL): raised before
    anything is opened, so a caller such as the migration tool can report it
    as the refusal it is without mistaking any other TypeError for one."""


def _configurable(config: RunnableConfig | None, what: str) -> Mapping[str, Any]:
    """``config["configurable"]``, checked (read only: callers never change it)."""
    # type() first: the ABC check of isinstance(Mapping) costs more than a read.
    if type(config) is not dict and not isinstance(config, Mapping):
        raise TypeError(f"{what}: config must be a dict (RunnableConfig), got {config!r}")
    conf = config.get("configurable")
    if type(conf) is not dict and not isinstance(conf, Mapping):
        raise ValueError(
            f"{what}: config has no 'configurable' dict; pass "
            "{'configurable': {'thread_id': ...}}"
        )
    return conf


def _thread_ns(config: RunnableConfig, what: str) -> tuple[str, str, Mapping[str, Any]]:
    conf = _configurable(config, what)
    thread = conf.get("thread_id")
    if thread is None:
        raise ValueError(
            f"{what}: config['configurable']['thread_id'] is missing; every checkpoint "
            "belongs to a thread, e.g. {'configurable': {'thread_id': 'user-42'}}"
        )
    ns = conf.get("checkpoint_ns")
    # _id's common case first, inline: every read and write comes here, and
    # the labels are formatted only when _id is called, for an error.
    if type(thread) is not str or not thread.isascii():
        thread = _id(thread, f"{what}: config['configurable']['thread_id']")
    if ns is None:
        ns = ""
    elif type(ns) is not str or not ns.isascii():
        ns = _id(ns, f"{what}: checkpoint_ns")
    return thread, ns, conf


def _id(value: Any, what: str) -> str:
    """An id as stored: a str, or an int or UUID as its text (SqliteSaver
    str()s every id). Anything else is refused rather than stored as "None"
    or "<object at 0x...>", and so is a str that UTF-8 cannot encode (a lone
    surrogate: a ValueError naming it, not a bare TypeError from the encoder)."""
    if type(value) is str and value.isascii():  # the common case, checked on every call
        return value
    if not isinstance(value, (str, int, UUID)) or isinstance(value, bool):
        kind = type(value).__name__
        raise TypeError(f"{what} must be a str (or an int or UUID), not {kind}: {value!r}")
    text = str(value)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(
                f"{what} {text!r} is not a valid id: it contains a lone surrogate "
                f"({text[e.start]!r} at index {e.start}), which UTF-8 cannot encode"
            ) from None
    return text


def _id_list(value: Any, what: str) -> list[str]:
    if isinstance(value, (str, bytes)):
        raise TypeError(
            f"{what} takes a list of ids, not a single string {value!r}; "
            f"write {what.split('(')[0]}([{value!r}])"
        )
    return [_id(v, f"{what}: an id") for v in value]


def _config(thread: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


class KVSaver(BaseCheckpointSaver[str], AbstractContextManager, AbstractAsyncContextManager):
    """A durable, multi-process LangGraph checkpointer in one directory.

    ``KVSaver("./state")`` opens (or creates) an LMDB store in that directory;
    ``KVSaver(":memory:")`` keeps everything in memory; ``KVSaver(path,
    backend="file")`` uses a single-file ``FileStore``;
    ``KVSaver("postgresql://...")`` a table on a PostgreSQL server shared by
    many machines (``kv.PostgresStore``; options: ``_POSTGRES_OPTIONS``); any
    ``kv.Store`` can be passed in directly.

    Args:
        path_or_store: a directory, ``":memory:"``, or a ``kv.Store``.
        serde: the serializer (default: LangGraph's ``JsonPlusSerializer``).
        readonly: open read-only; every write raises ``kv.ReadOnlyError``.
        backend: ``"lmdb"`` (default) or ``"file"`` when a path is given.
        durability: LMDB only: ``"full"`` (default), ``"meta"`` or ``"none"``;
            see ``kv.lmdb`` for what each gives up.
        max_size: LMDB only: cap on the store's size in bytes; a write past it
            raises ``kv.StoreFullError``.
        compress: zstd-compress serialized values of at least
            ``compress_threshold`` bytes when that saves space (see
            ``saver.compression``; inside an ``EncryptedSerializer``, before
            encryption). ``False`` writes values uncompressed; compressed values
            already stored still read either way.
        compress_threshold: smallest value (bytes) worth compressing.
        retention: a ``saver.Retention`` (keep the last N checkpoints per thread
            and namespace, delete or prune threads idle past a TTL), or a
            LangGraph Platform ``ttl`` dict; swept by ``put`` every
            ``sweep_interval_minutes`` in bounded steps, or by ``sweep()``.
        clock: seconds since the epoch for thread activity (default
            ``time.time``); inject one to test TTLs without waiting.
        async_threads: the threads of this saver's async calls on a local
            store (default 32; ``None``: the event loop's default executor).
            Puts that wait for one commit share it, so more threads mean
            fewer flushes under concurrent ``ainvoke``s, and a longer worst
            wait of the event loop for the GIL (see ``_run``).
        whole_latest: keep each thread's newest checkpoint whole, in one
            uncompressed record (its head, ``saver.heads``), so that
            ``get_tuple`` of the latest is one lookup and one decode, not a
            blob per channel. ``"idle"`` (the default): a thread's head is
            written by a background thread once no put of this saver came
            for it for a second (``IDLE_SECONDS``), and by ``close()`` for
            those still waiting: a running graph pays nothing per superstep,
            and a thread read after it went quiet (the next ``invoke``,
            ``get_state`` polling, other processes) reads its head; on
            LMDB, a thread another process reads while this one writes it
            (finding no head: the put came less than a second ago)
            ``WANT_AFTER`` times within ``MARK_SECONDS`` has its head written
            by every put for ``WANTED_SECONDS`` after (the reader's mark,
            ``kv.hints``; so does another saver object of this process;
            none within a quarter of ``max_size``). ``True``:
            every ``put`` rewrites the head in its own transaction (reads
            right after a put are fast too, for a copy of the state written
            by every put).
            ``False``: no heads, none read. Local stores only; not with
            encrypted values.
        cache_bytes: memory for this saver's caches of values, about this
            many bytes in all (default ``None``: 32 MiB): decompressed values
            (a quarter, and an eighth of that for small ones), lists rebuilt
            from deltas (a quarter) and message lists' serialized elements
            (half). They make the reads that follow a put and the next put
            of a growing history cheaper; ``0`` (or under 4) keeps none
            (every read decompresses and rebuilds, every put serializes the
            whole history), and what is stored is the same. The bound is per
            serializer object: a ``with_allowlist`` copy has caches of its
            own. Not with a ``serde`` that has its own
            ``CompressingSerializer`` (set its ``cache_bytes`` to a quarter).
            A PostgreSQL store keeps up to 8 MiB of committed values besides.
        **store_options: options of the backend's store, checked against
            what that backend takes (``_BACKENDS``): for LMDB ``map_size``
            and ``max_readers`` (``kv.LMDBStore``), for a PostgreSQL URL
            those of ``_POSTGRES_OPTIONS``. A misspelled option, or
            one the backend does not take (``durability=`` with
            ``":memory:"``), raises ``TypeError`` naming it and the valid ones.
    """

    store: Store
    _legacy_writes = False  # format-1 write keys may be present (read-only open)
    _reader_cache: tuple[Any, ...] | None = None  # _readers()
    _pipelined = False  # set by __init__ from the store

    def __init__(
        self,
        path_or_store: str | os.PathLike[str] | Store = ":memory:",
        *,
        serde: SerializerProtocol | None = None,
        readonly: bool = False,
        backend: str | None = None,
        durability: Literal["full", "meta", "none"] | None = None,
        max_size: int | None = None,
        compress: bool = True,
        compress_threshold: int = C.DEFAULT_THRESHOLD,
        retention: R.Retention | Mapping[str, Any] | None = None,
        clock: Callable[[], float] | None = None,
        async_threads: int | None = _ASYNC_THREADS,
        whole_latest: bool | Literal["idle"] = "idle",
        cache_bytes: int | None = None,
        **store_options: Any,
    ) -> None:
        # Store options given explicitly (None is each backend's default).
        given = {
            **({} if durability is None else {"durability": durability}),
            **({} if max_size is None else {"max_size": max_size}),
            **store_options,
        }
        # Checked before anything is opened or built: a bad option costs nothing.
        if async_threads is not None and (
            type(async_threads) is not int or not 1 <= async_threads <= 1024
        ):
            raise ValueError(
                f"async_threads must be an int from 1 to 1024 or None, got {async_threads!r}"
            )
        self._async_threads = async_threads
        if type(whole_latest) is not bool and whole_latest != "idle":
            raise ValueError(f"whole_latest must be True, False or 'idle', got {whole_latest!r}")
        self._whole_latest = whole_latest
        # whole_latest="idle": the heads of (thread, ns) left alone for
        # ``IDLE_SECONDS``, written in a background thread (``_IdleHeads``)
        self._idle: IdleWork | None = None
        # and the heads other processes' readers want (kv/hints.py), with the
        # reads here that found no head: (thread, ns) -> (monotonic time of
        # the first of its window, how many)
        self._hints: Any = None
        self._misses: dict[tuple[str, str], tuple[float, int]] = {}
        if cache_bytes is not None and (type(cache_bytes) is not int or cache_bytes < 0):
            raise ValueError(f"cache_bytes must be an int >= 0 or None, got {cache_bytes!r}")
        self._backend = _choose_backend(path_or_store, backend, readonly, given)
        super().__init__(serde=serde)
        # Always wrapped, also with compress=False: values stored compressed
        # earlier must keep loading.
        self.serde = C.wrap(
            self.serde,
            compress_threshold if compress else None,
            None if cache_bytes is None else cache_bytes // 4,
        )
        self.retention: R.Retention | None = R.coerce(retention)
        self.clock: Callable[[], float] = time.time if clock is None else clock
        self._sweeper = R.Sweeper()
        self._owns_store = not isinstance(path_or_store, Store)
        # (pid, pool) of _run's threads, made at the first async call; None
        # after close() too (_pool_closed).
        self._pool: tuple[int, ThreadPoolExecutor] | None = None
        self._pool_lock = threading.Lock()
        self._pool_closed = False
        if isinstance(path_or_store, Store):
            self.store = path_or_store
        else:
            assert self._backend is not None  # None only for a given Store
            self.store = _BACKENDS[self._backend].open(path_or_store, readonly, given)
        # Reads that never wait on a disk sync, a lock or a writer (a memory-
        # mapped LMDB file, memory): aget_tuple runs them on the event loop.
        self._inline_reads = bool(getattr(self.store, "nonblocking_reads", False))
        # A network store that sends queued reads in one round trip: a read
        # queues what it will need next before it needs it.
        self._pipelined = bool(getattr(self.store, "pipelines_reads", False))
        # (thread, ns) -> (id, channel_versions) of the last put here,
        # on a store that pipelines reads (get_tuple guesses its reads from it).
        self._last_put: OrderedDict[tuple[str, str], tuple[str, Any]] | None = (
            OrderedDict() if self._pipelined else None
        )
        # (thread, ns) -> the checkpoint id its head record held when
        # this saver last wrote or read it: a read by id looks at the head only
        # for that id (another id is rarely the newest; the look costs a get).
        self._head_ids: dict[tuple[str, str], str] = {}
        # (thread, ns) -> sizes of stored values found while making no head
        self._head_sizes: dict[tuple[str, str], dict[tuple[str, type, Any], int]] = {}
        # the small values of this saver's last put per (thread, ns): the next put's parent
        self._small = SV.Memo()
        if whole_latest == "idle" and not self.store.readonly and not self._pipelined:
            # What its thread works on, held by this saver and its clones
            # (with_allowlist), weakly by the thread: a saver never closed
            # is still freed, and its thread ends.
            self._idle_heads = _IdleHeads(self.store, self.serde, self._head_ids, self._head_sizes)
            self._idle = IdleWork(IDLE_SECONDS, _IdleHeads.write, self._idle_heads)
        if whole_latest == "idle" and not self._pipelined:
            self._hints = getattr(self.store, "hints", None)
        try:
            self._check_schema()
        except BaseException:
            if self._owns_store:
                self.store.close()
            raise

    @classmethod
    def from_conn_string(cls, conn_string: str | os.PathLike[str], **options: Any) -> _Opening:
        """Open a KVSaver for a ``with`` or ``async with`` block and close it
        at the end, as ``SqliteSaver.from_conn_string`` and
        ``AsyncSqliteSaver.from_conn_string`` do::

            with KVSaver.from_conn_string("./state") as saver: ...
            async with KVSaver.from_conn_string("./state") as saver: ...

        ``conn_string`` is what ``KVSaver()`` takes (a directory,
        ``":memory:"``, a file with ``backend="file"``); ``options`` are
        KVSaver's keyword options. ``async with`` opens and closes the store
        in a worker thread."""
        return _Opening(functools.partial(cls, conn_string, **options))

    def setup(self) -> _Done:
        """Nothing to set up: the store is ready when KVSaver opens it (its
        schema record is written then). Here, as in SqliteSaver and
        PostgresSaver, so code that calls it runs unchanged; idempotent.
        Returns an already finished awaitable, so ``await saver.setup()``
        (AsyncSqliteSaver and AsyncPostgresSaver code) works too."""
        self._check_schema()
        return _DONE

    async def asetup(self) -> None:
        """Async ``setup()``: nothing to set up, idempotent."""
        await self._run(self.setup)

    def __repr__(self) -> str:
        if not self._owns_store:
            return f"KVSaver({self.store!r})"
        path = getattr(self.store, "path", ":memory:")
        return f"KVSaver({path!r}, backend={self._backend!r}, readonly={self.store.readonly})"

    # -- lifecycle ------------------------------------------------------------

    def _check_schema(self) -> None:
        """Write the schema record of a new store; refuse a foreign store or a
        newer format; upgrade an older format (writable) or note it (read-only)."""
        with self.store.read() as txn:
            raw = txn.get(S.SCHEMA_KEY)
            empty = raw is None and next(iter(txn.scan(None, None, limit=1)), None) is None
        if raw is None:
            if not empty:
                raise CorruptStoreError(
                    f"{self.store!r} holds data but no kvsaver schema record: "
                    "it is not a KVSaver store"
                )
            if not self.store.readonly:
                with self.store.write() as txn:
                    if txn.get(S.SCHEMA_KEY) is None:
                        txn.put(S.SCHEMA_KEY, S.encode_schema())
            return
        version = S.decode_schema(raw)
        if version > S.FORMAT_VERSION:
            raise FormatVersionError(
                f"this store was written by kvsaver format {version}; this version of "
                f"kvsaver reads format {S.FORMAT_VERSION} and older. Upgrade kvsaver."
            )
        if version < S.FORMAT_VERSION:
            if self.store.readonly:
                # Read as it is (saver/upgrade.py); another process may
                # upgrade it meanwhile, which reads the same.
                self._legacy_writes = version < 2  # format 1 write keys
                return
            with self.store.write() as txn:  # one transaction: all of it or none
                raw = txn.get(S.SCHEMA_KEY)
                record = S.decode_schema_record(raw) if raw is not None else {}
                version = int(record.get("format", S.FORMAT_VERSION))
                if version < S.FORMAT_VERSION:
                    done = list(record.get("upgrades") or []) + U.upgrade(txn, version)
                    txn.put(S.SCHEMA_KEY, S.encode_schema(done))

    def close(self) -> None:
        """Close the underlying store if this saver opened it, after the async
        calls in progress have ended (their threads, see ``_run``) and then
        the heads still waiting are written (``whole_latest="idle"``: those
        the store can take, within a few seconds)."""
        try:
            with self._pool_lock:
                pool, self._pool, self._pool_closed = self._pool, None, True
            if pool is not None and pool[0] == os.getpid():
                # Not from one of its own threads: a thread cannot wait for itself.
                ours = threading.current_thread().name.startswith(_ASYNC_THREAD_NAME)
                pool[1].shutdown(wait=not ours)
        finally:
            idle, self._idle = self._idle, None
            try:
                if idle is not None:
                    idle.close(flush=True)
            finally:
                if self._owns_store:
                    self.store.close()

    def __enter__(self) -> KVSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> KVSaver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    # -- the one record -> CheckpointTuple conversion ----------------------------

    def _load_writes(
        self, txn: Any, thread: str, ns: str, checkpoint_id: str
    ) -> list[S.WriteRecord]:
        # One scan, no probe first: most checkpoints have no writes (every
        # latest one between supersteps) and an empty LMDB scan costs what a
        # probe does, while a probe would cost a checkpoint with writes a
        # second positioning (on a memory store a probe is the scan, sliced).
        start, stop = S.writes_range(thread, ns, checkpoint_id)
        return self._in_read_order(
            [w for _, v in txn.scan(start, stop) for w in S.decode_writes(v)]
        )

    def _in_read_order(self, recs: builtins.list[S.WriteRecord]) -> builtins.list[S.WriteRecord]:
        """One checkpoint's stored writes (in key order) in the order reads return them."""
        if not recs:
            return recs
        # Keys are (task_id, idx), the identity; reads are in task_path order.
        # The writes of one put_writes (the common case) come in idx order,
        # which is writes_sort_key's order within a task; a later call's
        # record may fill a gap below a batch's last idx, so that is checked.
        p, t, i = recs[0].task_path, recs[0].task_id, recs[0].idx - 1
        for w in recs:
            if w.task_path != p or w.task_id != t or w.idx <= i:
                recs.sort(key=lambda w: writes_sort_key(w.task_path, w.task_id, w.idx))
                break
            i = w.idx
        if self._legacy_writes:  # a format-1 store opened read-only
            return U.first_per_identity(recs)
        return recs

    def _page_writes(
        self, txn: Any, found: builtins.list[tuple[S.CheckpointRecord, Any]]
    ) -> dict[str, builtins.list[S.WriteRecord]] | None:
        """checkpoint id -> ``_load_writes`` of each checkpoint of a ``list``
        page of consecutive checkpoints of one (thread, ns), by one scan over
        their writes, instead of a scan per checkpoint; None
        when the page is not one such run (``_load_writes`` then, each)."""
        t, ns = found[0][0].thread_id, found[0][0].checkpoint_ns
        starts: dict[bytes, str] = {}
        for rec, _ in found:
            if rec.thread_id != t or rec.checkpoint_ns != ns:
                return None
            starts[S.writes_range(t, ns, rec.checkpoint_id)[0][:-1]] = rec.checkpoint_id
        lo = S.writes_range(t, ns, found[-1][0].checkpoint_id)[0]  # found: newest first
        hi = S.writes_range(t, ns, found[0][0].checkpoint_id)[1]
        if lo >= hi:  # not newest first after all (ids out of key order): one by one
            return None
        lengths = sorted({len(p) for p in starts})
        out: dict[str, builtins.list[S.WriteRecord]] = {}
        for key, raw in txn.scan(lo, hi):
            for n in lengths:
                # The checkpoint id's element ends at n unless an escaped NUL
                # (0x00 0xff) continues it there: then it is a longer id's.
                cid = starts.get(key[:n])
                if cid is not None and key[n : n + 1] != b"\xff":
                    out.setdefault(cid, []).extend(S.decode_writes(raw))
                    break
        return {cid: self._in_read_order(recs) for cid, recs in out.items()}

    def _readers(self) -> tuple[Callable[[S.Typed], Any], Callable[..., S.Typed | None]]:
        """(loads, blob) for this saver's serializer: ``C.loader`` and the
        delta codec's ``typed``, found once per serializer object (a read
        needs both, and ``with_allowlist`` copies replace ``serde``)."""
        cached = self._reader_tuple()
        return cached[1], cached[2]

    def _reader_tuple(self) -> tuple[Any, ...]:
        """``_reader_cache``, (serde, loads, typed, codec's values,
        value_readers, whether head records are used), made again when
        ``serde`` is another object."""
        cached = self._reader_cache
        if cached is None or cached[0] is not self.serde:
            codec = D.codec(self.serde)
            fast = C.value_readers(self.serde)
            cached = self._reader_cache = (
                self.serde,
                C.loader(self.serde),
                codec.typed,
                codec.values,
                fast,
                # head records: read unless whole_latest=False
                # (written by each put when True, once a thread is idle when
                # "idle"), on local stores whose values the fast readers load
                self._whole_latest is not False
                and fast is not None
                and codec.heads
                and not self._pipelined,
            )
        return cached

    def _load_tuple(
        self,
        txn: Any,
        rec: S.CheckpointRecord,
        config: RunnableConfig | None = None,
        metadata: CheckpointMetadata | None = None,
        checkpoint: Checkpoint | None = None,
        stored_writes: builtins.list[S.WriteRecord] | None = None,
        whole: bool = False,
    ) -> CheckpointTuple:
        """A stored checkpoint record -> CheckpointTuple (blobs and writes
        read in the same transaction). Used by get_tuple and list alike.
        ``checkpoint``: ``rec.checkpoint`` already decoded (``_load_page``),
        with its channel_values when ``whole`` (a head record's: ``_head``);
        ``stored_writes``: its ``_load_writes``, already read (``_page_writes``)."""
        _, loads, _, load_values, fast, _ = self._reader_tuple()
        thread, ns, cid = rec.thread_id, rec.checkpoint_ns, rec.checkpoint_id
        if checkpoint is None:
            checkpoint = loads(rec.checkpoint)
        if not whole:
            versions = S.blob_versions(checkpoint)
            keys = S.read_blob_keys(thread, ns, versions)
            # On a network store the blobs are one get_many, and the
            # writes scan, called first (and taken over by _load_writes' identical
            # scan), travels in the same round trip. Local stores skip it.
            if self._pipelined:
                txn.scan(*S.writes_range(thread, ns, cid))
            # Whole or delta values, loaded in one loop, and the small
            # values the record holds.
            values = load_values(txn, versions, keys, txn.get_many(keys), loads, fast)
            small = checkpoint.get("channel_values")
            if small:
                values.update(small)
            checkpoint["channel_values"] = values
        if stored_writes is None:
            stored_writes = self._load_writes(txn, thread, ns, cid)
        writes: list[PendingWrite] = [(w.task_id, w.channel, loads(w.value)) for w in stored_writes]
        # Positional: cheaper than keywords (a NamedTuple's __new__).
        return CheckpointTuple(
            config if config is not None else _config(thread, ns, cid),  # config
            checkpoint,
            metadata if metadata is not None else loads(rec.metadata),  # metadata
            _config(thread, ns, rec.parent_id) if rec.parent_id else None,  # parent_config
            writes,  # pending_writes
        )

    def _load_page(
        self,
        txn: Any,
        found: builtins.list[tuple[S.CheckpointRecord, Any]],
        consecutive: bool = False,
    ) -> builtins.list[CheckpointTuple]:
        """``_load_tuple`` of each (record, metadata) of a ``list`` page. On a
        store that pipelines reads, the page's writes scans and
        blobs go first, all in one round trip (a constant number per page,
        not one per checkpoint); ``_load_tuple`` then finds them read.
        ``consecutive``: the page holds every checkpoint between its first
        and its last (no filter skipped any): their writes are one scan."""
        if len(found) < 2:
            return [self._load_tuple(txn, rec, metadata=m) for rec, m in found]
        if not self._pipelined:
            page = self._page_writes(txn, found) if consecutive else None
            if page is None:
                return [self._load_tuple(txn, rec, metadata=m) for rec, m in found]
            of = page.get
            return [
                self._load_tuple(txn, rec, metadata=m, stored_writes=of(rec.checkpoint_id) or [])
                for rec, m in found
            ]
        loads = self._readers()[0]
        checkpoints = [loads(rec.checkpoint) for rec, _ in found]
        keys: builtins.list[bytes] = []
        for (rec, _), cp in zip(found, checkpoints):
            t, ns = rec.thread_id, rec.checkpoint_ns
            txn.scan(*S.writes_range(t, ns, rec.checkpoint_id))
            keys.extend(key for _, key in S.blob_keys(t, ns, S.blob_versions(cp)))
        txn.get_many(keys)
        return [
            self._load_tuple(txn, rec, metadata=m, checkpoint=cp)
            for (rec, m), cp in zip(found, checkpoints)
        ]

    # -- reads --------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by ``checkpoint_id``, or the thread's latest
        in ``checkpoint_ns`` (found by one reverse scan), or None."""
        thread, ns, conf = _thread_ns(config, "get_tuple")
        checkpoint_id = conf.get("checkpoint_id")
        with self.store.read() as txn:
            if self._last_put is not None:
                self._guess_reads(txn, thread, ns, checkpoint_id)
            raw = TH.find_record(txn, thread, ns, checkpoint_id)
            if raw is None:
                return None
            found = None
            if not checkpoint_id or self._head_ids.get((thread, ns)) == checkpoint_id:
                found = self._head(txn, thread, ns, raw)
                if found is None and not checkpoint_id and self._hints is not None:
                    self._want_head(thread, ns)
            if found is not None:
                cid, parent, metadata, checkpoint = found
                return self._load_tuple(
                    txn,
                    S.bare_record(thread, ns, cid, parent),
                    config if checkpoint_id else None,
                    metadata,
                    checkpoint,
                    whole=True,
                )
            return self._load_tuple(
                txn, S.decode_checkpoint(raw), config if checkpoint_id else None
            )

    def _head(self, txn: Any, thread: str, ns: str, raw: bytes) -> tuple[str, Any, Any, Any] | None:
        """(checkpoint id as stored, parent id, metadata, checkpoint with its
        channel_values) from the head record of (thread, ns) when it holds the
        checkpoint whose stored record is ``raw``, one unpack (``heads``);
        else None."""
        cached = self._reader_tuple()
        if not cached[5]:
            return None
        body = H.payload(txn.get(S.head_key(thread, ns)), raw)
        if body is None:
            return None
        unpackb, hook, option, _ = cached[4]
        try:
            parent, metadata, checkpoint = unpackb(body, ext_hook=hook, option=option)
            # The id as stored (put takes an int or UUID and stores its text).
            cid = _id(checkpoint["id"], "checkpoint['id']")
            if type(metadata) is not dict or type(checkpoint["channel_values"]) is not dict:
                raise TypeError("not a head's payload")
        except (ValueError, TypeError, LookupError):
            return None  # a damaged head: only a copy, read the blobs (the next put mends it)
        self._remember_head(thread, ns, cid)
        return cid, parent, metadata, checkpoint

    def _remember_head(self, thread: str, ns: str, checkpoint_id: str) -> None:
        _bounded_put(self._head_ids, (thread, ns), checkpoint_id)

    def _guess_reads(self, txn: Any, thread: str, ns: str, checkpoint_id: Any) -> None:
        """On a store that pipelines reads: when this saver wrote
        the checkpoint asked for (the thread's latest, as far as it knows),
        queue the record's read, its writes scan and its blobs together, so
        ``get_tuple`` is one round trip when the guess holds (what it then
        reads is found read); a wrong guess costs bytes, not a round trip."""
        guess = self._last_put.get((thread, ns)) if self._last_put is not None else None
        if guess is None or (checkpoint_id and str(checkpoint_id) != guess[0]):
            return
        cid, versions = guess
        keys = [key for _, key in S.blob_keys(thread, ns, versions)]
        if checkpoint_id:
            keys.append(S.checkpoint_key(thread, ns, cid))
        else:
            txn.scan(*S.checkpoints_range(thread, ns), reverse=True, limit=1)
        txn.scan(*S.writes_range(thread, ns, cid))
        txn.get_many(keys)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first (by checkpoint id, as SqliteSaver orders them).

        ``config=None`` lists every thread; a config without ``checkpoint_ns``
        lists every namespace of the thread. ``filter`` compares metadata keys
        for equality (decoding only the metadata of each candidate),
        ``before`` keeps ids lower than its ``checkpoint_id``, ``limit`` stops
        the scan. Reads happen in short transactions of a few dozen
        checkpoints, so a long iteration never pins old pages of the store.
        """
        for chunk in self._list_chunks(config, filter=filter, before=before, limit=limit):
            yield from chunk

    def _list_chunks(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[builtins.list[CheckpointTuple]]:  # builtins: ``list`` is a method here
        if limit is not None and limit <= 0:
            return
        if filter is not None and not isinstance(filter, Mapping):
            raise TypeError(f"list: filter must be a dict of metadata values, got {filter!r}")
        before_id = None
        if before is not None:
            # None: no bound. "" is an id, below which none sorts (as
            # SqliteSaver's ``checkpoint_id < ''``): every bound below tests
            # ``is not None``, not truth
            before_id = _configurable(before, "list(before=...)").get("checkpoint_id")
        remaining = limit
        if config is None:
            sources = self._index_sources(filter, None if before_id is None else str(before_id))
        else:
            sources = self._thread_sources(config, before_id)
        # Each source is a function: (txn, resume_after) -> iterator of
        # (position, raw_record) in output order; position resumes a scan.
        resume: Any = None
        while True:
            found: list[tuple[S.CheckpointRecord, Any]] = []
            last_pos: Any = None
            exhausted = True
            with self.store.read() as txn:
                for pos, raw in sources(txn, resume):
                    if len(found) >= _LIST_CHUNK and not _same_id(pos, last_pos):
                        exhausted = False
                        break
                    last_pos = pos
                    rec = S.decode_checkpoint(raw)
                    metadata = None
                    if filter:
                        metadata = self._readers()[0](rec.metadata)
                        if not _matches(metadata, filter):
                            continue
                    found.append((rec, metadata))
                    if remaining is not None:
                        remaining -= 1
                        if remaining == 0:
                            break
                chunk = self._load_page(txn, found, consecutive=config is not None and not filter)
            if chunk:
                yield chunk
            if exhausted or remaining == 0:
                return
            resume = last_pos

    def _index_sources(
        self, filter: Mapping[str, Any] | None, before_id: str | None
    ) -> Callable[[Any, Any], Iterator[tuple[Any, bytes]]]:
        """All threads, newest first: the meta index of the most selective
        scalar filter value (only checkpoints carrying it are visited; the rest
        of the filter is checked on their metadata), else the id index."""
        candidates = []
        for key, value in (filter or {}).items():
            ok, norm = S.meta_value(value)
            if ok:
                candidates.append(S.meta_range(key, norm, before_id))
        default = S.by_id_range()
        if before_id is not None:
            default = (default[0], S.by_id_stop(before_id))
        chosen: list[tuple[bytes, bytes]] = []
        ckpt = pack((S.CHECKPOINT,))

        def source(txn: Any, resume: Any) -> Iterator[tuple[Any, bytes]]:
            if not chosen:
                chosen.append(_most_selective(txn, candidates) if candidates else default)
            start, stop = chosen[0]
            tail = len(start) - 1  # an index key: its range's prefix, then (id, thread, ns)
            for key, _ in txn.scan(start, resume[1] if resume else stop, reverse=True):
                kcid, kt, kns = split(key, tail)[-3:]
                raw = txn.get(ckpt + kt + kns + kcid)
                if raw is not None:
                    yield (kcid, key), raw

        return source

    def _thread_sources(
        self, config: RunnableConfig, before_id: Any
    ) -> Callable[[Any, Any], Iterator[tuple[Any, bytes]]]:
        thread, _, conf = _thread_ns(config, "list")
        ns = conf.get("checkpoint_ns")
        checkpoint_id = conf.get("checkpoint_id")
        if checkpoint_id:
            # One checkpoint at most, as SqliteSaver's "checkpoint_id = ?".
            def exact(txn: Any, resume: Any) -> Iterator[tuple[Any, bytes]]:
                if resume is not None:
                    return
                for one_ns in [str(ns)] if ns is not None else TH.namespaces(txn, thread):
                    if before_id is not None and not str(checkpoint_id) < str(before_id):
                        continue
                    raw = txn.get(S.checkpoint_key(thread, one_ns, str(checkpoint_id)))
                    if raw is not None:
                        yield (pack((S.k(str(checkpoint_id)),)), one_ns), raw

            return exact

        def source(txn: Any, resume: Any) -> Iterator[tuple[Any, bytes]]:
            namespaces = [str(ns)] if ns is not None else TH.namespaces(txn, thread)
            scans = []
            for one_ns in namespaces:
                start, stop = S.checkpoints_range(thread, one_ns)
                if before_id is not None:
                    stop = min(stop, S.checkpoint_key(thread, one_ns, str(before_id)))
                if resume is not None:  # ids below the last one returned
                    stop = min(stop, start[:-1] + resume[0])
                scans.append(_tagged(txn.scan(start, stop, reverse=True), start[:-1]))
            if len(scans) == 1:
                yield from scans[0]
            else:
                yield from _merge_desc(scans)

        return source

    # -- writes -------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint: one blob per channel in ``new_versions`` (unchanged
        channels are not serialized again) and the checkpoint record, in one
        write transaction. Everything is serialized before the transaction
        starts, so a value the serializer rejects leaves the store untouched."""
        thread, ns, conf = _thread_ns(config, "put")
        dumps = self.serde.dumps_typed
        cp: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = cp.pop("channel_values", None) or {}
        checkpoint_id = _id(cp["id"], "put: checkpoint['id']")
        # Lists as plain msgpack: stored as deltas where they extend.
        codec = D.codec(self.serde)  # kept on the serializer: one per serde
        parent_id = conf.get("checkpoint_id")
        # whole_latest: this checkpoint whole in a head record (``heads``),
        # made in the transaction from this put's bytes and the previous
        # head's.
        readable = self._reader_tuple()[5]  # heads possible for this serializer and store
        # Without whole_latest a put still removes a head another saver made
        # (it would go stale), so a local store always looks it up.
        hkey = None if self._pipelined else S.head_key(thread, ns)
        heads = readable and (self._whole_latest is True or self._wanted(hkey))
        idle = self._idle if readable else None
        versions = cp.get("channel_versions") or {}
        small, to_blobs = SV.split(
            lambda: self._parent_small(thread, ns, parent_id), versions, new_versions, values
        )
        blobs = codec.prepare(thread, ns, to_blobs, values, dumps, parent_id, heads)
        # A small record (zstd with a dictionary) holding the small values,
        # and with heads its msgpack without them, from one serialization.
        cp_typed, cp_plain = codec.dumps_checkpoint(cp, small, heads)
        rec = S.make_checkpoint_record(
            thread,
            ns,
            checkpoint_id,
            parent_id,
            cp_typed,
            get_checkpoint_metadata(config, metadata),
            dumps,
        )
        record = S.encode_checkpoint(rec)
        index = S.index_keys(rec)
        ckey = S.checkpoint_key(thread, ns, checkpoint_id)
        now = R.now_ms(self.clock)

        akey = S.activity_key(thread)
        if heads:
            mine = {p.channel: (new_versions[p.channel], p.head) for p in blobs}
            # and the record's small values: a head holds what the record does
            mine.update(SV.for_head(versions, small))

        def write(txn: Any) -> None:
            # The reads of this function (touch() reads akey, the codec its
            # blobs' keys and bases) in one get_many: one round trip on a
            # network store.
            keys = [ckey, akey, *codec.read_keys(thread, ns, parent_id, blobs)]
            if hkey is not None:
                keys.append(hkey)
            known = dict(zip(keys, txn.get_many(keys)))
            old = known[ckey]
            if old is not None:  # replaced: drop the old record's index entries
                for key in S.index_keys(S.decode_checkpoint(old)):
                    txn.delete(key)
            codec.write(txn, thread, ns, parent_id, blobs, known=known)
            txn.put(ckey, record)
            for key in index:
                txn.put(key, b"")
            TH.touch(txn, thread, now, known[akey])
            if heads:
                assert hkey is not None  # heads: a local store
                self._put_head(txn, codec, hkey, known[hkey], rec, record, cp_plain, versions, mine)
            elif hkey is not None and known[hkey] is not None:
                txn.delete(hkey)

        # transact(): concurrent puts share one commit and one sync.
        self.store.transact(write)
        codec.remember(thread, ns, checkpoint_id, cp.get("channel_versions"))
        self._small.put(thread, ns, checkpoint_id, SV.held(versions, small))
        if idle is not None:
            idle.note((thread, ns))
        if self._last_put is not None:
            blob_versions = S.blob_versions({"channel_versions": versions, "channel_values": small})
            _remember_put(self._last_put, (thread, ns), checkpoint_id, blob_versions)
        self._sweeper.maybe_step(self)  # retention: a bounded step when one is due
        return _config(thread, ns, checkpoint_id)

    def _parent_small(self, thread: str, ns: str, parent_id: Any) -> SV.Held:
        """The small values of a put's parent (``saver/small.py``): this
        process's last put of (thread, ns), or the parent's stored record."""
        if not parent_id:
            return {}
        pid = str(parent_id)
        found = self._small.get(thread, ns, pid)
        if found is None:
            with self.store.read() as txn:
                raw = txn.get(S.checkpoint_key(thread, ns, pid))
            found = SV.of_record(self._readers()[0], raw)
        return found

    def _wanted(self, hkey: bytes | None) -> bool:
        """Whether this put writes the head keyed ``hkey`` because a reader
        of another process wants it (``kv.hints``; whole_latest="idle"),
        unless the store is within a quarter of its ``max_size`` (as the
        idle heads)."""
        hints = self._hints
        return (
            hints is not None
            and hkey is not None
            and hints.recent(hkey, WANTED_SECONDS)
            and not _near_cap(self.store)
        )

    def _want_head(self, thread: str, ns: str) -> None:
        """A read of the latest of (thread, ns) found no head: the
        ``WANT_AFTER``-th such read within ``MARK_SECONDS`` marks it wanted
        (``kv.hints``), so that the puts of the process writing it write its
        head: a thread read far more often than it is written (heads slow
        the writer's puts), not one polled now and then. Not one this saver's idle thread still
        has to write (it put the thread lately)."""
        key = (thread, ns)
        if not self._reader_tuple()[5] or (self._idle is not None and self._idle.waiting(key)):
            return  # no heads read with this serializer, or the head is ours to write
        now = _monotonic()
        first, n = self._misses.get(key, (now, 0))
        if now - first > MARK_SECONDS:
            first, n = now, 0
        _bounded_put(self._misses, key, (first, n + 1))
        if n + 1 == WANT_AFTER:
            self._hints.mark(S.head_key(thread, ns))

    def _put_head(
        self,
        txn: Any,
        codec: D.Codec,
        hkey: bytes,
        previous: bytes | None,
        rec: S.CheckpointRecord,
        record: bytes,
        cp_plain: bytes | Literal[False],
        versions: Mapping[str, Any],
        mine: Mapping[str, tuple[Any, bytes | Literal[False] | None]],
    ) -> None:
        """Write (or delete) the head of (thread, ns) in a put's transaction:
        left alone when it holds a newer checkpoint than this one.
        ``versions``: the checkpoint's channel_versions; ``mine``: channel ->
        (version, ``Pending.head``) of the values this put writes and of
        the record's small values."""
        parsed = H.parse(previous)
        if parsed is not None and parsed[0] > rec.checkpoint_id:
            # A newer checkpoint's head stays, unless this put rewrote a
            # version it holds (versions that are not unique, as in tests).
            held = {H.version_key(e[0], e[1]) for e in parsed[2]}
            if any(H.version_key(ch, v) in held for ch, (v, _) in mine.items()):
                txn.delete(hkey)
            return
        head = _build_head(
            txn, codec, rec, record, cp_plain, versions, mine, previous, parsed, self._head_sizes
        )
        if head is not None:
            txn.put(hkey, head)
            self._remember_head(rec.thread_id, rec.checkpoint_ns, rec.checkpoint_id)
        elif previous is not None:
            txn.delete(hkey)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes for a checkpoint.

        As SqliteSaver: a batch made only of special channels (``ERROR``,
        ``INTERRUPT``, ... with negative indexes) replaces what is stored
        under the same (task_id, idx); any other batch ignores writes whose
        (task_id, idx) is already stored, so a retried task is not duplicated.
        ``task_path`` is not part of a write's identity (as in SqliteSaver):
        it is stored, and orders the writes that ``get_tuple`` returns.
        """
        thread, ns, conf = _thread_ns(config, "put_writes")
        checkpoint_id = conf.get("checkpoint_id")
        if checkpoint_id is None:  # "" is an id (SqliteSaver stores writes under it)
            raise ValueError(
                "put_writes: config['configurable']['checkpoint_id'] is missing; writes "
                "belong to a stored checkpoint"
            )
        checkpoint_id = _id(checkpoint_id, "put_writes: checkpoint_id")
        task_id = _id(task_id, "put_writes: task_id")
        task_path = _id(task_path, "put_writes: task_path")
        # zstd with a dictionary, not kept in the cache of decompressed
        # values: a write is read only when its checkpoint is resumed.
        dumps = functools.partial(D.codec(self.serde).dumps_small, remember=False)
        serialized = [
            (WRITES_IDX_MAP.get(channel, idx), channel, dumps(value))
            for idx, (channel, value) in enumerate(writes)
        ]
        replace = all(channel in WRITES_IDX_MAP for channel, _ in writes)
        now = R.now_ms(self.clock)
        akey = S.activity_key(thread)
        prefix = S.task_write_prefix(thread, ns, checkpoint_id, task_id)
        # A batch of special writes replaces: what is stored does not matter.
        probe = [] if replace else S.write_probe_keys(prefix, [w[0] for w in serialized])

        def write(txn: Any) -> None:
            # The reads in one get_many (one round trip on a network store).
            *found, activity = txn.get_many([*probe, akey])
            new = serialized
            if not replace:
                stored = S.stored_idxs(found)
                new = []
                for w in serialized:
                    if w[0] not in stored:  # a repeated idx in one batch: the first wins
                        stored.add(w[0])
                        new.append(w)
            # A batch of special writes replaces: the last of a repeated idx wins.
            for key, value in S.write_records(prefix, task_id, task_path, new):
                txn.put(key, value)
            TH.touch(txn, thread, now, activity)

        self.store.transact(write)

    # -- maintenance ------------------------------------------------------------

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, blob and write of a thread, in one transaction."""
        thread = _id(thread_id, "delete_thread: thread_id")
        self._maintain(lambda txn: TH.delete_thread(txn, thread))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) created by the given runs,
        then the blobs no remaining checkpoint of those threads uses."""
        ids = _id_list(run_ids, "delete_for_runs(run_ids)")

        def delete(txn: Any) -> None:  # may be rerun (transact): state lives in here
            touched: set[tuple[str, str]] = set()
            for run_id in ids:
                for key, _ in list(txn.scan(*S.runs_range(run_id))):
                    _, _, kt, kns, kcid = unpack(key)
                    raw = txn.get(S.checkpoint_key_from_elements(kt, kns, kcid))
                    txn.delete(key)
                    if raw is None:
                        continue
                    rec = S.decode_checkpoint(raw)
                    TH.delete_checkpoint(txn, rec)
                    touched.add((rec.thread_id, rec.checkpoint_ns))
            for thread, ns in sorted(touched):
                TH.gc_blobs(txn, self.serde, thread, ns)
                TH.drop_stale_head(txn, thread, ns)

        self._maintain(delete)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, blob and write (the complete parent chain) of
        one thread to another, in one transaction. Records already on the
        target with the same ids are overwritten; others are kept."""
        src = _id(source_thread_id, "copy_thread: source_thread_id")
        dst = _id(target_thread_id, "copy_thread: target_thread_id")
        if src == dst:
            return

        def copy(txn: Any) -> None:
            txn.delete_range(*S.heads_range(dst))  # its latest may change
            for kind in (S.BLOB, S.WRITE):
                sp, dp = S.thread_prefix(kind, src), S.thread_prefix(kind, dst)
                lo, hi = (S.blobs_range if kind == S.BLOB else S.writes_range)(src)
                moved = [(S.rethread(k, len(sp), dp), v) for k, v in list(txn.scan(lo, hi))]
                if kind == S.BLOB:  # what the source uses, and no delta chain broken
                    used = {S.rethread(k, len(sp), dp) for k in TH.used_blobs(txn, self.serde, src)}
                    moved = D.codec(self.serde).plan_copy(txn, moved, used, *S.blobs_range(dst))
                for key, value in moved:
                    txn.put(key, value)
            for _, raw in list(txn.scan(*S.checkpoints_range(src))):
                rec = S.decode_checkpoint(raw)._replace(thread_id=dst)
                ns, cid = rec.checkpoint_ns, rec.checkpoint_id
                ckey = S.checkpoint_key(dst, ns, cid)
                old = txn.get(ckey)
                if old is not None:  # overwritten: drop its index entries, as put does,
                    # or delete_for_runs(old run) would delete the copy
                    for key in S.index_keys(S.decode_checkpoint(old)):
                        txn.delete(key)
                txn.put(ckey, S.encode_checkpoint(rec))
                for key in S.index_keys(rec):
                    txn.put(key, b"")
            TH.touch(txn, dst, R.now_ms(self.clock))

        self._maintain(copy)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune threads: ``"keep_latest"`` keeps the latest checkpoint of each
        namespace with its writes and blobs; ``"delete"`` removes the threads.

        DeltaChannel-safe: when the latest checkpoint's metadata names delta
        channels (``counters_since_delta_snapshot``), its ancestors are kept,
        with their writes, back to the nearest one holding a stored value
        for every such channel, so ``get_delta_channel_history`` rebuilds the
        same state after the prune. One write transaction per thread.
        """
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"prune: unknown strategy {strategy!r}; use 'keep_latest' or 'delete'")

        def prune_one(thread: str, txn: Any) -> None:
            if strategy == "delete":
                TH.delete_thread(txn, thread)
                return
            for ns in TH.namespaces(txn, thread):
                TH.keep_latest(txn, self.serde, thread, ns)

        for thread in _id_list(thread_ids, "prune(thread_ids)"):
            self._maintain(functools.partial(prune_one, thread))

    def _maintain(self, fn: Callable[[Any], T]) -> T:
        """One maintenance transaction; ``fn``'s result. On a store whose write
        transactions can conflict (PostgreSQL: ``write_conflicts``) through
        ``transact()``, which reruns ``fn`` on a conflict instead of raising
        (so ``fn`` keeps its effects in ``txn`` and returns what it counted);
        elsewhere one ``write()`` (on LMDB, transact's nested transaction would
        need free pages that a full store, which a delete is there to
        relieve, lacks). Retention sweeps and the migration use it too."""
        if getattr(self.store, "write_conflicts", False):
            return self.store.transact(fn)
        with self.store.write() as txn:
            return fn(txn)

    # -- storage: retention, stats, allowlist --------------------------------------

    def sweep(
        self,
        retention: R.Retention | None = None,
        *,
        full: bool = True,
        progress: Callable[[int, int | None], None] | None = None,
    ) -> R.SweepReport:
        """Apply a retention policy now (default: the saver's ``retention``),
        one short write transaction per thread. ``full=True`` visits every
        thread; ``full=False`` only those idle past the TTL and those written
        since the last sweep. ``progress(threads_done, total)`` is called
        after each batch."""
        return self._sweeper.sweep(self, retention, full=full, progress=progress)

    def stats(self) -> ST.StoreStats:
        """Bytes on disk and live, and per thread its checkpoints, writes,
        blobs and bytes, largest threads first."""
        return ST.collect(self.store)

    def with_allowlist(self, extra_allowlist: Collection[tuple[str, ...]]) -> KVSaver:
        """A shallow clone whose serializer has a derived msgpack allowlist.
        LangGraph's own version recognizes only bare and encrypted
        ``JsonPlusSerializer``s; this one also looks through the compression
        wrapper, so strict msgpack stays enforced."""
        serde = C.with_msgpack_allowlist(self.serde, extra_allowlist)
        if serde is self.serde:
            return self
        clone = copy.copy(self)
        clone.serde = serde
        return clone

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Walk the parent chain of the target checkpoint in one read
        transaction, collecting each channel's writes (oldest first) back to
        the nearest ancestor with a stored value, returned as ``seed``."""
        if not channels:
            return {}
        thread, ns, conf = _thread_ns(config, "get_delta_channel_history")
        loads = self.serde.loads_typed
        collected: dict[str, list[PendingWrite]] = {c: [] for c in channels}
        seeds: dict[str, Any] = {}
        remaining = set(channels)
        with self.store.read() as txn:
            raw = TH.find_record(txn, thread, ns, conf.get("checkpoint_id"))
            cursor = S.decode_checkpoint(raw).parent_id if raw is not None else None
            while cursor is not None and remaining:
                raw = txn.get(S.checkpoint_key(thread, ns, cursor))
                if raw is None:
                    break
                rec = S.decode_checkpoint(raw)
                cp = loads(rec.checkpoint)
                found: dict[str, Any] = {}
                for ch in remaining:
                    typed = TH.stored_value(txn, thread, ns, cp, ch, self.serde)
                    if typed is not None:
                        found[ch] = loads(typed)
                for w in reversed(self._load_writes(txn, thread, ns, cursor)):
                    if w.channel in remaining:
                        collected[w.channel].append((w.task_id, w.channel, loads(w.value)))
                for ch, value in found.items():
                    seeds[ch] = value
                    remaining.discard(ch)
                cursor = rec.parent_id
        result: dict[str, DeltaChannelHistory] = {}
        for ch in channels:
            entry: DeltaChannelHistory = {"writes": list(reversed(collected[ch]))}
            if ch in seeds:
                entry["seed"] = seeds[ch]
            result[ch] = entry
        return result

    def get_next_version(self, current: str | int | None, channel: None) -> str:
        """Zero-padded string versions (as InMemorySaver's), which sort as text."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(str(current).split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    # -- async: the sync code in a worker thread ---------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn`` in a worker thread. On a local store, in this saver's own
        pool of ``async_threads`` threads (32 by default), not the loop's default
        executor (a few threads: ``min(32, cpus + 4)``, which a graph's
        sync nodes share): a commit waits for the disk, and every put that
        arrives meanwhile joins the next one (group commit), so the more
        callers can wait, the fewer flushes per checkpoint. The price is a
        longer worst wait of the event loop: more threads that want the GIL.
        ``async_threads`` sets the pool's size (fewer threads: a shorter
        wait, more flushes). A network store keeps the default executor:
        each of its calls holds a pooled connection."""
        loop = asyncio.get_running_loop()
        call = functools.partial(fn, *args, **kwargs)
        if self._pipelined:
            return await loop.run_in_executor(None, call)
        return await loop.run_in_executor(self._async_pool(), call)

    def _async_pool(self) -> ThreadPoolExecutor | None:
        """The pool of ``_run``, made at the first call (and again in a child
        process after a fork: the parent's threads are not there). None
        with ``async_threads=None``, and once closed: the default executor
        (where a call fails as any call on a closed saver does)."""
        pool = self._pool
        pid = os.getpid()
        if pool is not None and pool[0] == pid:
            return pool[1]
        with self._pool_lock:
            if self._pool_closed or self._async_threads is None:
                return None
            if self._pool is None or self._pool[0] != pid:
                executor = ThreadPoolExecutor(
                    self._async_threads, thread_name_prefix=_ASYNC_THREAD_NAME
                )
                self._pool = (pid, executor)
            return self._pool[1]

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """``get_tuple`` on the event loop when the store's reads cannot block
        it (LMDB, memory: a read never waits for a writer nor for the disk's
        syncs, and costs less than the hop to a worker thread and back, which
        under a busy GIL can take milliseconds); else in a worker thread."""
        if self._inline_reads:
            return self.get_tuple(config)
        return await self._run(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async ``list``: the same chunks, each read in a worker thread."""
        chunks = self._list_chunks(config, filter=filter, before=before, limit=limit)
        while True:
            chunk = await self._run(next, chunks, None)
            if chunk is None:
                return
            for item in chunk:
                yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Async ``put``."""
        return await self._run(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Async ``put_writes``."""
        await self._run(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """Async ``delete_thread``."""
        await self._run(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async ``delete_for_runs``."""
        await self._run(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async ``copy_thread``."""
        await self._run(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Async ``prune``."""
        await self._run(self.prune, thread_ids, strategy=strategy)

    async def asweep(
        self,
        retention: R.Retention | None = None,
        *,
        full: bool = True,
        progress: Callable[[int, int | None], None] | None = None,
    ) -> R.SweepReport:
        """Async ``sweep``."""
        return await self._run(self.sweep, retention, full=full, progress=progress)

    async def astats(self) -> ST.StoreStats:
        """Async ``stats``."""
        return await self._run(self.stats)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Async ``get_delta_channel_history``."""
        return await self._run(self.get_delta_channel_history, config=config, channels=channels)


# -- PostgreSQL: KVSaver("postgresql://...", **options) -------------------------
# The keyword options a PostgreSQL URL accepts, and the kv.PostgresStore
# argument each becomes (pool_*: the psycopg_pool.ConnectionPool's; LMDB's
# max_size, a byte cap, means nothing there).
_POSTGRES_OPTIONS = {
    "table": "table",
    "pool_min_size": "min_size",
    "pool_max_size": "max_size",
    "pool_timeout": "pool_timeout",
    "pool_options": "pool_options",
    "connect_timeout": "connect_timeout",
    "statement_timeout": "statement_timeout",
    "retries": "retries",
}


def _open_postgres(url: str, *, readonly: bool = False, **options: Any) -> Store:
    # Options were checked against _POSTGRES_OPTIONS by _choose_backend.
    return PostgresStore(
        url, readonly=readonly, **{_POSTGRES_OPTIONS[k]: v for k, v in options.items()}
    )


if not HAS_DELTA_CHANNELS:
    # langgraph-checkpoint < 4.1 has no DeltaChannel and no saver there has
    # these methods; KVSaver has them exactly where LangGraph can call them.
    del KVSaver.get_delta_channel_history, KVSaver.aget_delta_channel_history


# -- backends and their options -------------------------------------------------


class _Backend:
    """A store KVSaver can open: its options are its constructor's keyword
    parameters (besides ``readonly``), so a backend declares them by taking
    them, and KVSaver refuses any other before opening anything."""

    def __init__(
        self,
        factory: Callable[..., Store],
        options: Collection[str] | None = None,
        *,
        takes_path: bool = True,
    ) -> None:
        self.factory = factory
        self.takes_path = takes_path
        if options is None:
            params = inspect.signature(factory).parameters.values()
            options = [p.name for p in params if p.kind is p.KEYWORD_ONLY]
        self.options = frozenset(options) - {"readonly"}

    def open(
        self, path: str | os.PathLike[str], readonly: bool, options: Mapping[str, Any]
    ) -> Store:
        if self.takes_path:
            return self.factory(path, readonly=readonly, **options)
        return self.factory(readonly=readonly, **options)


# What KVSaver(path) opens: ":memory:" -> "memory", else ``backend=`` (default
# "lmdb"). A new backend is one entry here (and its constructor's options).
_BACKENDS: dict[str, _Backend] = {
    "lmdb": _Backend(LMDBStore),
    "file": _Backend(FileStore),
    "memory": _Backend(MemoryStore, takes_path=False),
    "postgres": _Backend(lambda url, **kw: _open_postgres(str(url), **kw), _POSTGRES_OPTIONS),
}


def _saver_options(chosen: str) -> list[str]:
    """KVSaver's own keyword options (read from its signature, so a new one
    is never missing from the "did you mean" of a misspelled one), without
    those it passes to a store (``_BACKENDS``: durability, max_size) and,
    for ':memory:' and a URL, without ``backend``, which they do not take."""
    params = inspect.signature(KVSaver.__init__).parameters.values()
    skip = {*_all_store_options(), *(["backend"] if chosen in ("memory", "postgres") else [])}
    return [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.name not in skip]


def _choose_backend(
    path_or_store: Any, backend: str | None, readonly: bool, options: Mapping[str, Any]
) -> str | None:
    """The backend KVSaver(path_or_store, ...) opens (None: a Store given),
    after checking every store option against it."""
    if isinstance(path_or_store, Store):
        if backend is not None or options:
            given = ", ".join(sorted({*options, *(["backend"] if backend else [])}))
            raise OptionError(
                f"KVSaver(store): {given} apply only when KVSaver opens the store itself; "
                "pass them to the store's constructor instead"
            )
        return None
    if is_postgres_url(path_or_store):
        if backend is not None:
            raise ValueError("a PostgreSQL URL is the postgres backend; pass no backend=")
        chosen = "postgres"
    elif path_or_store == ":memory:":
        if backend not in (None, "memory"):
            raise ValueError(f"':memory:' is the in-memory store; backend={backend!r} needs a path")
        chosen = "memory"
    else:
        chosen = "lmdb" if backend is None else backend
        if chosen not in _BACKENDS or chosen in ("memory", "postgres"):
            raise ValueError(
                f"unknown backend {backend!r}; choose 'lmdb' or 'file' "
                "(':memory:' as the path is the in-memory store)"
            )
    valid = _BACKENDS[chosen].options
    for name in options:
        if name in valid:
            continue
        owners = sorted(b for b, spec in _BACKENDS.items() if name in spec.options)
        where = {"memory": "':memory:'", "postgres": "a PostgreSQL URL"}.get(
            chosen, f"backend={chosen!r}"
        )
        if owners:
            theirs = (
                f"its store options are {', '.join(sorted(valid))}"
                if valid
                else "it takes no store options"
            )
            raise OptionError(
                f"KVSaver option {name!r} applies only to the {' and '.join(owners)} "
                f"backend, not to {where}: {theirs}"
            )
        known = sorted({*_saver_options(chosen), *valid})
        close = difflib.get_close_matches(name, [*known, *_all_store_options()], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "."
        raise OptionError(
            f"KVSaver got an unexpected keyword argument {name!r}{hint} "
            f"Valid options for {where}: {', '.join(known)}"
        )
    return chosen


def _all_store_options() -> list[str]:
    return sorted({name for spec in _BACKENDS.values() for name in spec.options})


class _Done:
    """What ``setup()`` returns: nothing to wait for, but awaitable."""

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield


_DONE = _Done()


class _Opening(AbstractContextManager, AbstractAsyncContextManager):
    """What ``KVSaver.from_conn_string`` returns: a saver opened on entering a
    ``with`` or ``async with`` block and closed on leaving it."""

    def __init__(self, open_saver: Callable[[], KVSaver]) -> None:
        self._open = open_saver
        self._saver: KVSaver | None = None

    def __enter__(self) -> KVSaver:
        self._saver = self._open()
        return self._saver

    def __exit__(self, *exc: object) -> None:
        if self._saver is not None:
            self._saver.close()
            self._saver = None

    async def __aenter__(self) -> KVSaver:
        self._saver = await asyncio.to_thread(self._open)
        return self._saver

    async def __aexit__(self, *exc: object) -> None:
        if self._saver is not None:
            saver, self._saver = self._saver, None
            await asyncio.to_thread(saver.close)


class _IdleHeads:
    """The heads of threads gone idle (``whole_latest="idle"``): what
    ``IdleWork``'s thread calls, with what it needs of the saver (its store,
    serializer and head hints), held by the saver and its ``with_allowlist``
    clones, so that the thread runs while any of them is alive and holds none.
    """

    def __init__(
        self,
        store: Store,
        serde: SerializerProtocol,
        head_ids: dict[tuple[str, str], str],
        head_sizes: dict[tuple[str, str], dict[tuple[str, type, Any], int]],
    ) -> None:
        self.store = store
        self.serde = serde
        self.head_ids = head_ids
        self.head_sizes = head_sizes

    def write(self, keys: builtins.list[tuple[str, str]]) -> None:
        """Write the heads of these (thread, ns), left alone since their last
        put, in one transaction of their own: each is made from the store in
        a read transaction (no writer waits meanwhile), then written only if
        nothing it was made from changed since (the latest record, the head
        record, the values' blobs, compared byte for byte). Not in a put's
        group commit, so a head the store cannot take fails no put; and none
        on a store within a quarter of its ``max_size``, whose room is for
        checkpoints. Whatever goes wrong leaves heads unwritten: they are only
        copies. Runs in ``IdleWork``'s thread, and in ``close()``."""
        try:
            if _near_cap(self.store):
                return
            with self.store.read() as txn:
                made = [m for key in keys if (m := self._make_or_none(txn, *key)) is not None]
            if not made:
                return
            with self.store.write() as txn:
                for thread, ns, hkey, seen, raw, blobs, head, _ in made:
                    if (
                        TH.find_record(txn, thread, ns, None) == raw
                        and txn.get(hkey) == seen
                        and txn.get_many(list(blobs)) == list(blobs.values())
                    ):
                        txn.put(hkey, head)
            for thread, ns, *_, cid in made:
                _bounded_put(self.head_ids, (thread, ns), cid)
        except Exception:  # a closed or full store, another process's lock...: no heads
            return

    def _make_or_none(self, txn: Any, thread: str, ns: str) -> Any:
        try:
            return self.make(txn, thread, ns)
        except Exception:  # a record it cannot read: no head for it, the others go on
            return None

    def make(
        self, txn: Any, thread: str, ns: str
    ) -> tuple[str, str, bytes, bytes | None, bytes, dict[bytes, bytes | None], bytes, str] | None:
        """(thread, ns, head key, the head record seen, the latest record,
        {blob key: raw} read, the new head, checkpoint id) for the latest
        checkpoint of (thread, ns), or None when it has no head to write (none
        stored, its head already current, values a head cannot hold)."""
        raw = TH.find_record(txn, thread, ns, None)
        if raw is None:
            return None
        hkey = S.head_key(thread, ns)
        seen = txn.get(hkey)
        if H.payload(seen, raw) is not None:
            return None  # already this checkpoint's
        codec = D.codec(self.serde)
        rec = S.decode_checkpoint(raw)
        plain = H.plain_of(*codec.unwrap(*rec.checkpoint))
        split = H.split_values(plain) if plain is not False else None
        if split is None:
            return None
        cp_plain, small = split
        versions = H.versions_of(cp_plain)
        if versions is None:  # (read without decoding a value: no stored code runs)
            return None
        mine = SV.for_head(versions, small)
        blobs: dict[bytes, bytes | None] = {}
        head = _build_head(
            txn, codec, rec, raw, cp_plain, versions, mine, None, None, self.head_sizes, blobs
        )
        if head is None:
            return None
        return thread, ns, hkey, seen, raw, blobs, head, rec.checkpoint_id


def _near_cap(store: Store) -> bool:
    """Whether ``store`` is within a quarter of its ``max_size`` (LMDB's
    cap), whose room is for checkpoints, not heads; True when it cannot
    tell (a head is only a copy: none is better than a failed put)."""
    cap = getattr(store, "max_size", None)
    if cap is None:
        return False
    cheap = getattr(store, "used_bytes", None)  # LMDBStore's: no system call
    try:
        used = cheap() if cheap is not None else store.info()["used_bytes"]  # type: ignore[attr-defined]
    except Exception:
        return True
    return bool(used > cap - cap // 4)


def _build_head(
    txn: Any,
    codec: D.Codec,
    rec: S.CheckpointRecord,
    record: bytes,
    cp_plain: bytes | Literal[False],
    versions: Mapping[str, Any],
    mine: Mapping[str, tuple[Any, bytes | Literal[False] | None]],
    previous: bytes | None,
    parsed: Any,
    head_sizes: dict[tuple[str, str], dict[tuple[str, type, Any], int]],
    blobs: dict[bytes, bytes | None] | None = None,
) -> bytes | None:
    """``heads.build`` for the checkpoint ``rec`` (stored as ``record``):
    the values neither ``mine`` nor ``previous`` holds are read from their
    blobs (their raw bytes noted in ``blobs`` when given). ``head_sizes``:
    the saver's sizes of values found too large, per (thread, ns), taken
    for this build and kept for the next when it makes no head. None when the
    checkpoint can have none (a value a head cannot hold, a damaged or
    foreign blob: a read of it says so); the store's own errors raise."""
    thread, ns = rec.thread_id, rec.checkpoint_ns

    def stored(ch: str, v: Any) -> bytes | Literal[False] | None:
        key = S.blob_key(thread, ns, ch, v)
        raw = txn.get(key)
        if blobs is not None:
            blobs[key] = raw
        return codec.head_value(txn, key, raw)

    md_plain = H.plain_of(*rec.metadata)
    head = None
    sizes = head_sizes.pop((thread, ns), {})
    if cp_plain is not False and md_plain is not False:
        try:
            head = H.build(
                record,
                rec.checkpoint_id,
                rec.parent_id,
                cp_plain,
                md_plain,
                versions,
                mine,
                previous,
                parsed,
                stored,
                sizes,
            )
        except CorruptStoreError:
            pass  # a damaged blob
        except KVError:
            raise  # the store's own trouble (full, closed...)
        except (ValueError, TypeError, LookupError, OverflowError):
            pass  # a stored value it cannot read (a foreign blob, a damaged frame)
    if head is None and sizes:  # what it read, for the next try: see heads.build
        current = {H.version_key(ch, v) for ch, v in versions.items()}
        _bounded_put(head_sizes, (thread, ns), {k: n for k, n in sizes.items() if k in current})
    return head


# -- list helpers ---------------------------------------------------------------


_HEAD_HINTS = 65_536  # entries of KVSaver._head_ids and _head_sizes at most


def _bounded_put(hints: dict[Any, Any], key: Any, value: Any) -> None:
    """``hints[key] = value`` in a dict of hints (nothing is lost when it is
    emptied), emptied when it holds ``_HEAD_HINTS`` entries."""
    if len(hints) >= _HEAD_HINTS:
        hints.clear()
    hints[key] = value


def _remember_put(
    memo: OrderedDict[tuple[str, str], tuple[str, Any]], at: tuple[str, str], cid: str, vs: Any
) -> None:
    latest = memo.get(at)
    if latest is None or latest[0] <= cid:  # ids grow: a put of an older one is no latest
        memo[at] = (cid, dict(vs or {}))
        try:  # puts from several threads: a guess, no need for a lock
            memo.move_to_end(at)
            while len(memo) > 4096:
                memo.popitem(last=False)
        except KeyError:
            pass


def _matches(metadata: Mapping[str, Any], filter: Mapping[str, Any]) -> bool:
    return all(metadata.get(key) == value for key, value in filter.items())


def _tagged(
    scan: Iterable[tuple[bytes, bytes]], prefix: bytes
) -> Iterator[tuple[tuple[bytes, bytes], bytes]]:
    """Checkpoint keys under one packed (thread, ns) ``prefix`` -> ((checkpoint
    id element, prefix), record), the id as its packed bytes: packing
    preserves order, so positions compare as the keys do (a merge of
    namespaces, a resume below the last id returned: chunks never split one
    id across namespaces) without unpacking every key."""
    n = len(prefix)
    for key, raw in scan:
        yield (key[n:], prefix), raw


def _merge_desc(scans: list[Iterator[tuple[Any, bytes]]]) -> Iterator[tuple[Any, bytes]]:
    import heapq

    return heapq.merge(*scans, key=lambda item: item[0], reverse=True)


def _most_selective(txn: Any, ranges: list[tuple[bytes, bytes]], probe: int = 64) -> Any:
    """The index range with the fewest entries, counting at most ``probe`` in
    each: a filter like {"source": "input", "tag": "x"} walks the rare tag,
    not every input checkpoint."""
    best, best_n = ranges[0], None
    for rng in ranges:
        n = 0
        for _ in txn.scan(*rng):
            n += 1
            if n >= probe:
                break
        if best_n is None or n < best_n:
            best, best_n = rng, n
    return best


def _same_id(pos: Any, last: Any) -> bool:
    return last is not None and pos[0] == last[0]
