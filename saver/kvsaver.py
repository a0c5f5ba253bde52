"""``KVSaver``: a LangGraph checkpoint saver over any ``kv.Store``.

A façade: each method checks its arguments, then calls the mechanism that
does the work: ``backends`` (what a path opens), ``reads`` (a stored record
-> CheckpointTuple), ``listing`` (``list``'s chunks), ``writes`` (a
checkpoint's records written), ``whole`` (head records), ``threads``
(range operations), ``retention``, ``pool`` (the async calls' threads).
Uses only the ``Store`` protocol and the key/record formats of
``saver.schema``. Async methods run the sync code in a worker thread, so a
disk sync never blocks the event loop and no method body is written twice;
``aget_tuple`` on an LMDB or memory store runs on the loop itself (its
reads never wait for a sync or a writer).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Literal, TypeVar

from kvsaver.kv import Store, Txn
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    SerializerProtocol,
    get_checkpoint_metadata,
)

from . import backends as B
from . import compression as C
from . import delta as D
from . import listing as LS
from . import retention as R
from . import schema as S
from . import small as SV
from . import stats as ST
from . import threads as TH
from . import upgrade as U
from ._compat import HAS_DELTA_CHANNELS, DeltaChannelHistory
from .backends import DONE, Done, Opening, OptionError
from .ids import as_id, config_of, id_list, thread_ns
from .pool import Pool
from .reads import Reads
from .whole import Heads
from .writes import task_writes, write_checkpoint

__all__ = ["KVSaver", "OptionError"]

T = TypeVar("T")
# The threads of a saver's async calls on a local store (see _run).
_ASYNC_THREADS = 32


class KVSaver(BaseCheckpointSaver[str], AbstractContextManager, AbstractAsyncContextManager):
    """A durable, multi-process LangGraph checkpointer in one directory.

    ``KVSaver("./state")`` opens (or creates) an LMDB store in that directory;
    ``KVSaver(":memory:")`` keeps everything in memory; ``KVSaver(path,
    backend="file")`` uses a single-file ``FileStore``;
    ``KVSaver("postgresql://...")`` a table on a PostgreSQL server shared by
    many machines (``kv.PostgresStore``; options: ``backends._POSTGRES_OPTIONS``); any
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
            blob per channel. ``"idle"`` (the default): written by a
            background thread once no put of this saver came for the thread
            for a second, and by ``close()``: a running graph pays nothing
            per superstep, a thread read after it went quiet reads its head;
            on LMDB, a thread that readers (of any process) keep finding
            without its head has it written by every put for a while
            (``saver.whole``: the readers' marks). ``True``: every ``put``
            rewrites the head. ``False``: no heads, none read. Local stores
            only; not with encrypted values.
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
        fast_paths: speed paths built on private names of LangGraph and
            pydantic (``saver._upstream``): message lists serialized element
            by element (``elements``), messages decoded by their validator
            (``messages``), values unpacked without ``loads_typed``. Off by
            default: an upgrade of either can change those names (what is
            stored is the same; docs/performance.md has what they save).
        **store_options: options of the backend's store, checked against
            what that backend takes (``backends.BACKENDS``): for LMDB ``map_size``
            and ``max_readers`` (``kv.LMDBStore``), for a PostgreSQL URL
            those of ``backends._POSTGRES_OPTIONS``. A misspelled option, or
            one the backend does not take (``durability=`` with
            ``":memory:"``), raises ``TypeError`` naming it and the valid ones.
    """

    store: Store
    # BaseCheckpointSaver's default, until __init__ sets one (``serde``)
    _serde: SerializerProtocol = BaseCheckpointSaver.serde

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
        fast_paths: bool = False,
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
        if type(whole_latest) is not bool and whole_latest != "idle":
            raise ValueError(f"whole_latest must be True, False or 'idle', got {whole_latest!r}")
        self._whole_latest = whole_latest
        if type(fast_paths) is not bool:
            raise ValueError(f"fast_paths must be True or False, got {fast_paths!r}")
        if cache_bytes is not None and (type(cache_bytes) is not int or cache_bytes < 0):
            raise ValueError(f"cache_bytes must be an int >= 0 or None, got {cache_bytes!r}")
        self._backend = B.choose(path_or_store, backend, given, KVSaver.__init__)
        super().__init__(serde=serde)
        # Always wrapped, also with compress=False: values stored compressed
        # earlier must keep loading.
        self.serde = C.wrap(
            self.serde,
            compress_threshold if compress else None,
            None if cache_bytes is None else cache_bytes // 4,
        )
        # The delta layer of this serializer: every put and read goes through it.
        self._codec = D.codec(self.serde)
        self.retention: R.Retention | None = R.coerce(retention)
        self.clock: Callable[[], float] = time.time if clock is None else clock
        self._sweeper = R.Sweeper()
        self._owns_store = not isinstance(path_or_store, Store)
        if isinstance(path_or_store, Store):
            self.store = path_or_store
        else:
            assert self._backend is not None  # None only for a given Store
            self.store = B.open_store(self._backend, path_or_store, readonly, given)
        # Reads that never wait on a disk sync, a lock or a writer (a memory-
        # mapped LMDB file, memory): aget_tuple runs them on the event loop.
        self._inline_reads = self.store.nonblocking_reads
        # A network store, where a round trip costs a whole local read: a
        # get_tuple guesses its reads from this saver's last put (Reads.guess),
        # no head records (the guess makes a read one round trip without
        # their bytes), and async calls take the loop's default executor (each
        # holds a pooled connection). What a read reads together is said to
        # every store alike (Txn.prefetch).
        pipelined = self.store.pipelines_reads
        self._pool = Pool(None if pipelined else async_threads)
        self._reads = Reads(self.serde, self._codec, pipelined, fast_paths)
        self._heads = Heads(self.store, self._codec, self._reads.plain, whole_latest, pipelined)
        # the small values of this saver's last put per (thread, ns): the next put's parent
        self._small = SV.Memo()
        try:
            self._check_schema()
        except BaseException:
            self._heads.close()
            if self._owns_store:
                self.store.close()
            raise

    @classmethod
    def from_conn_string(
        cls, conn_string: str | os.PathLike[str], **options: Any
    ) -> Opening[KVSaver]:
        """Open a KVSaver for a ``with`` or ``async with`` block and close it
        at the end, as ``SqliteSaver.from_conn_string`` and
        ``AsyncSqliteSaver.from_conn_string`` do::

            with KVSaver.from_conn_string("./state") as saver: ...
            async with KVSaver.from_conn_string("./state") as saver: ...

        ``conn_string`` is what ``KVSaver()`` takes (a directory,
        ``":memory:"``, a file with ``backend="file"``); ``options`` are
        KVSaver's keyword options. ``async with`` opens and closes the store
        in a worker thread."""
        return Opening(functools.partial(cls, conn_string, **options))

    def setup(self) -> Done:
        """Nothing to set up: the store is ready when KVSaver opens it (its
        schema record is written then). Here, as in SqliteSaver and
        PostgresSaver, so code that calls it runs unchanged; idempotent.
        Returns an already finished awaitable, so ``await saver.setup()``
        (AsyncSqliteSaver and AsyncPostgresSaver code) works too."""
        self._check_schema()
        return DONE

    async def asetup(self) -> None:
        """Async ``setup()``: nothing to set up, idempotent."""
        await self._run(self.setup)

    def __repr__(self) -> str:
        if not self._owns_store:
            return f"KVSaver({self.store!r})"
        path = self.store.path if self.store.path is not None else ":memory:"
        return f"KVSaver({path!r}, backend={self._backend!r}, readonly={self.store.readonly})"

    # -- lifecycle ------------------------------------------------------------

    def _check_schema(self) -> None:
        """Write the schema record of a new store; refuse a foreign store or a
        newer format; upgrade an older format (writable) or note it (read-only)."""
        if U.check_schema(self.store):  # a format-1 store opened read-only
            self._reads.legacy_writes = True

    def close(self) -> None:
        """Close the underlying store if this saver opened it, after the async
        calls in progress have ended (their threads, see ``_run``) and then
        the heads still waiting are written (``whole_latest="idle"``: those
        the store can take, within a few seconds)."""
        try:
            self._pool.close()
        finally:
            try:
                self._heads.close()
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
        # close() waits for the calls in progress and the waiting heads:
        # in a thread, so the event loop's other tasks go on meanwhile
        await asyncio.to_thread(self.close)

    # -- reads --------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by ``checkpoint_id``, or the thread's latest
        in ``checkpoint_ns`` (found by one reverse scan), or None."""
        thread, ns, conf = thread_ns(config, "get_tuple")
        checkpoint_id = conf.get("checkpoint_id")
        reads = self._reads
        with self.store.read() as txn:
            reads.guess(txn, thread, ns, checkpoint_id)  # nothing on a local store
            raw = TH.find_record(txn, thread, ns, checkpoint_id)
            if raw is None:
                return None
            found = self._heads.read(txn, thread, ns, checkpoint_id, raw)
            if found is not None:
                cid, parent, metadata, checkpoint = found
                return reads.load_tuple(
                    txn,
                    S.bare_record(thread, ns, cid, parent),
                    config if checkpoint_id else None,
                    metadata,
                    checkpoint,
                    whole=True,
                )
            return reads.load_tuple(
                txn, S.decode_checkpoint(raw), config if checkpoint_id else None
            )

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
        chunks = LS.chunks(
            self.store, self._reads, config, filter=filter, before=before, limit=limit
        )
        for chunk in chunks:
            yield from chunk

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
        thread, ns, conf = thread_ns(config, "put")
        codec = self._codec  # lists as plain msgpack: stored as deltas where they extend
        dumps = codec.serde.dumps_typed  # (the codec's serializer is self.serde)
        cp: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = cp.pop("channel_values", None) or {}
        checkpoint_id = as_id(cp["id"], "put: checkpoint['id']")
        parent_id = conf.get("checkpoint_id")
        # whole_latest: this checkpoint whole in a head record (``whole``),
        # made in the transaction from this put's bytes and the previous
        # head's; hkey: the head's key, read in the transaction.
        heads = self._heads
        hkey, whole = heads.plan(thread, ns)
        versions = cp.get("channel_versions") or {}
        small, to_blobs = SV.split(
            lambda: self._parent_small(thread, ns, parent_id), versions, new_versions, values
        )
        reuse = self._reads.fast_paths  # message lists through ``elements``
        blobs = codec.prepare(thread, ns, to_blobs, values, dumps, parent_id, whole, reuse)
        # A small record (zstd with a dictionary) holding the small values,
        # and with a head its msgpack without them, from one serialization.
        cp_typed, cp_plain = codec.dumps_checkpoint(cp, small, whole)
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
        mine = None
        if whole:
            mine = {p.channel: (new_versions[p.channel], p.head) for p in blobs}
            # and the record's small values: a head holds what the record does
            mine.update(SV.for_head(versions, small))

        def write(txn: Txn) -> None:
            # The reads of this function (touch() reads akey, the codec its
            # blobs' keys and bases) in one get_many: one round trip on a
            # network store.
            keys = [ckey, akey, *codec.read_keys(thread, ns, parent_id, blobs)]
            if hkey is not None:
                keys.append(hkey)
            known = dict(zip(keys, txn.get_many(keys)))
            write_checkpoint(txn, codec, rec, ckey, record, index, blobs, known, None, akey, now)
            previous = known[hkey] if hkey is not None else None
            heads.on_put(txn, hkey, previous, whole, rec, record, cp_plain, versions, mine)

        # transact(): concurrent puts share one commit and one sync.
        self.store.transact(write)
        codec.remember(thread, ns, checkpoint_id, cp.get("channel_versions"))
        self._small.put(thread, ns, checkpoint_id, SV.held(versions, small))
        heads.after_put(thread, ns)
        self._reads.remember_put(thread, ns, checkpoint_id, versions, small)  # for guess
        self._sweeper.maybe_step(self)  # retention: a bounded step when one is due
        return config_of(thread, ns, checkpoint_id)

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
            found = SV.of_record(self._reads.loads, raw)
        return found

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
        thread, ns, conf = thread_ns(config, "put_writes")
        checkpoint_id = conf.get("checkpoint_id")
        if checkpoint_id is None:  # "" is an id (SqliteSaver stores writes under it)
            raise ValueError(
                "put_writes: config['configurable']['checkpoint_id'] is missing; writes "
                "belong to a stored checkpoint"
            )
        checkpoint_id = as_id(checkpoint_id, "put_writes: checkpoint_id")
        task_id = as_id(task_id, "put_writes: task_id")
        task_path = as_id(task_path, "put_writes: task_path")
        now = R.now_ms(self.clock)
        write = task_writes(self._codec, thread, ns, checkpoint_id, task_id, task_path, writes, now)
        self.store.transact(write)

    # -- maintenance ------------------------------------------------------------

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, blob and write of a thread, in one transaction."""
        thread = as_id(thread_id, "delete_thread: thread_id")
        self._maintain(lambda txn: TH.delete_thread(txn, thread))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) created by the given runs,
        then the blobs no remaining checkpoint of those threads uses."""
        ids = id_list(run_ids, "delete_for_runs(run_ids)")

        # may be rerun (transact): its state lives in the call
        self._maintain(lambda txn: TH.delete_for_runs(txn, self.serde, ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, blob and write (the complete parent chain) of
        one thread to another, in one transaction. Records already on the
        target with the same ids are overwritten; others are kept."""
        src = as_id(source_thread_id, "copy_thread: source_thread_id")
        dst = as_id(target_thread_id, "copy_thread: target_thread_id")
        if src == dst:
            return

        now = functools.partial(R.now_ms, self.clock)
        self._maintain(lambda txn: TH.copy_thread(txn, self.serde, self._codec, src, dst, now))

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

        def prune_one(thread: str, txn: Txn) -> None:
            if strategy == "delete":
                TH.delete_thread(txn, thread)
                return
            for ns in TH.namespaces(txn, thread):
                TH.keep_latest(txn, self.serde, thread, ns)

        for thread in id_list(thread_ids, "prune(thread_ids)"):
            self._maintain(functools.partial(prune_one, thread))

    def _maintain(self, fn: Callable[[Txn], T]) -> T:
        """One maintenance transaction; ``fn``'s result. On a store whose write
        transactions can conflict (PostgreSQL: ``write_conflicts``) through
        ``transact()``, which reruns ``fn`` on a conflict instead of raising
        (so ``fn`` keeps its effects in ``txn`` and returns what it counted);
        elsewhere one ``write()`` (on LMDB, transact's nested transaction would
        need free pages that a full store, which a delete is there to
        relieve, lacks). Retention sweeps and the migration use it too."""
        if self.store.write_conflicts:
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

    @property  # type: ignore[override]
    def serde(self) -> SerializerProtocol:
        """The serializer. One set after construction (a copy's, as
        LangGraph's ``with_allowlist`` and the migration's strict reads make)
        is the one values are read and written with from then on."""
        return self._serde

    @serde.setter
    def serde(self, serde: SerializerProtocol) -> None:
        self._serde = serde
        if "_reads" in self.__dict__:  # not while __init__ makes them
            self._codec = D.codec(serde)
            self._reads = self._reads.for_codec(serde, self._codec)
            self._heads = self._heads.for_codec(self._codec, self._reads.plain)

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Walk the parent chain of the target checkpoint in one read
        transaction, collecting each channel's writes (oldest first) back to
        the nearest ancestor with a stored value, returned as ``seed``."""
        if not channels:
            return {}
        thread, ns, conf = thread_ns(config, "get_delta_channel_history")
        with self.store.read() as txn:
            return self._reads.delta_history(txn, thread, ns, conf.get("checkpoint_id"), channels)

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
        pool of ``async_threads`` threads (32 by default; ``saver.pool``),
        so that puts waiting for one commit share it; ``async_threads``
        sets the pool's size (fewer threads: a shorter wait of the event
        loop for the GIL, more flushes). A network store keeps the default
        executor: each of its calls holds a pooled connection."""
        loop = asyncio.get_running_loop()
        call = functools.partial(fn, *args, **kwargs)
        return await loop.run_in_executor(self._pool.executor(), call)

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
        chunks = LS.chunks(
            self.store, self._reads, config, filter=filter, before=before, limit=limit
        )
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


if not HAS_DELTA_CHANNELS:
    # langgraph-checkpoint < 4.1 has no DeltaChannel and no saver there has
    # these methods; KVSaver has them exactly where LangGraph can call them.
    del KVSaver.get_delta_channel_history, KVSaver.aget_delta_channel_history
