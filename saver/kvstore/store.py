"""``KVStore``: LangGraph's long-term memory (``BaseStore``) on the kv engine.

A batch is checked whole before anything is read or written (a bad op
changes nothing), its texts and queries are embedded before any
transaction, then it runs in one transaction (``ops.Run``): a read
transaction when it only reads, else ``Store.transact``, which a backend
with write conflicts (PostgreSQL) reruns. The async methods run the same
core: reads on the event loop where the store's reads never block, the
rest in a pool of worker threads (``saver/pool.py``).
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

from kvsaver.kv.store import FormatVersionError, Store
from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
)

from .. import backends as B
from ..pool import Pool
from . import checks as CK
from . import keyspace as KS
from . import ops as OPS
from . import ttl as TTL
from .ops import Plan, Put, Run

if TYPE_CHECKING:
    import numpy as np

__all__ = ["KVStore"]

_CACHE_MAX = 16384  # namespace ids kept (they never change once committed)


class KVStore(BaseStore):
    """A LangGraph store in a kvsaver directory (LMDB, the default, and
    shareable with a ``KVSaver`` on the same directory), ``":memory:"``, a
    ``"postgresql://..."`` URL, or an open ``kvsaver.kv.Store``::

        graph = builder.compile(checkpointer=KVSaver("./state"), store=KVStore("./state"))

    ``index``: LangGraph's ``IndexConfig`` (search by meaning; needs
    ``pip install kvsaver[vector]``). ``ttl``: ``TTLConfig`` (``default_ttl``
    and ``ttl=`` in minutes; expired items are never returned;
    ``sweep_interval_minutes`` starts a sweeper thread). Backend options
    (``durability``, ``max_size``, ``backend``, PostgreSQL's ``pool_*``...)
    are KVSaver's. See docs/store.md.
    """

    supports_ttl: bool = True

    def __init__(
        self,
        path_or_store: str | os.PathLike[str] | Store = ":memory:",
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        readonly: bool = False,
        backend: str | None = None,
        async_threads: int | None = 32,
        **store_options: Any,
    ) -> None:
        if ttl is not None:
            _check_ttl_config(ttl)
        chosen = B.choose(path_or_store, backend, store_options, KVStore.__init__, "KVStore")
        self.ttl_config = ttl
        self.index_config = index
        self._vectors = None
        if index is not None:
            from .vectors import Vectors  # numpy: only with an index

            self._vectors = Vectors(index)
        self._owns_store = not isinstance(path_or_store, Store)
        if isinstance(path_or_store, Store):
            self.store = path_or_store
        else:
            assert chosen is not None
            self.store = B.open_store(chosen, path_or_store, readonly, store_options)
        self._ns_ids: dict[tuple[str, ...], int] = {}
        self._ttl_ids: set[int] = set()  # namespaces whose ttl is set (it stays set)
        self._inline_reads = self.store.nonblocking_reads
        self._pool = Pool(None if self.store.pipelines_reads else async_threads)
        self._sweeper = TTL.Sweeper()
        try:
            self._check_schema()
            if self._vectors is not None:
                self._vectors.attach(self.store)
        except BaseException:
            if self._owns_store:
                self.store.close()
            raise
        if ttl and ttl.get("sweep_interval_minutes") and not self.store.readonly:
            self.start_ttl_sweeper()

    def __repr__(self) -> str:
        return f"KVStore({self.store!r})"

    def _check_schema(self) -> None:
        with self.store.read() as txn:
            raw = txn.get(KS.SCHEMA_KEY)
        if raw is None:
            if not self.store.readonly:
                self.store.transact(
                    lambda txn: (
                        None
                        if txn.get(KS.SCHEMA_KEY) is not None
                        else txn.put(KS.SCHEMA_KEY, KS.encode_schema())
                    )
                )
            return
        version = KS.decode_schema(raw)
        if version > KS.FORMAT:
            raise FormatVersionError(
                f"this store's items were written by kvstore format {version}; this version "
                f"of kvsaver reads format {KS.FORMAT}. Upgrade kvsaver."
            )
        if version < KS.FORMAT:  # formats before it were never released: no upgrade
            raise FormatVersionError(
                f"this store's items were written by kvstore format {version}, a development "
                f"format that no release wrote; this version of kvsaver reads format "
                f"{KS.FORMAT} only: read it with the development version that wrote it, "
                "or start a new store."
            )

    @property
    def embeddings(self) -> Any:
        """The index's embeddings (LangChain ``Embeddings``), None without an index."""
        return None if self._vectors is None else self._vectors.embeddings

    def setup(self) -> B.Done:
        """Nothing to set up (the store is ready when opened): here, as in
        SqliteStore and PostgresStore, so code that calls it runs unchanged;
        awaitable, for AsyncSqliteStore and AsyncPostgresStore code."""
        return B.DONE

    # -- lifecycle ------------------------------------------------------------

    def close(self) -> None:
        """Stop the sweeper, wait for async calls in progress, close the store
        if this KVStore opened it."""
        self._sweeper.stop()
        try:
            self._pool.close()
        finally:
            if self._owns_store:
                self.store.close()

    def __enter__(self) -> KVStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> KVStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    # -- the batch ------------------------------------------------------------

    def _prepare(self, ops: Iterable[Op]) -> Plan:
        """Every op checked, before anything is embedded, read or written."""
        checked: list[Op] = []
        puts: dict[tuple[tuple[str, ...], str], Put] = {}
        for op in ops:
            if isinstance(op, PutOp):
                op = op._replace(namespace=CK.labels(op.namespace))
                _check_key(op.key)
                value = None if op.value is None else CK.pack_value(op.value)
                _check_index(op.index)
                _check_ttl(op.ttl)
                p = Put(op.namespace, op.key, value, op.ttl)
                if value is not None and self._vectors is not None and op.value is not None:
                    p.texts = self._vectors.texts(dict(op.value), op.index)
                puts[(op.namespace, op.key)] = p  # the last put of a key wins
            elif isinstance(op, GetOp):
                op = op._replace(namespace=CK.labels(op.namespace))
                _check_key(op.key)
            elif isinstance(op, SearchOp):
                op = _checked_search(op)
            elif isinstance(op, ListNamespacesOp):
                op = op._replace(match_conditions=CK.conditions(op.match_conditions))
                CK.check_page(op.limit, op.offset, "list_namespaces")
                if op.max_depth is not None and (type(op.max_depth) is not int or op.max_depth < 0):
                    raise ValueError(f"max_depth must be an int >= 0, got {op.max_depth!r}")
            else:
                raise ValueError(f"Unknown operation type: {type(op)}")
            checked.append(op)
        return Plan(checked, puts)

    def _wanted(self, plan: Plan) -> tuple[list[str], list[str]]:
        texts = [t for p in plan.puts.values() for _, t in p.texts]
        queries = []
        if self._vectors is not None:
            queries = list(
                dict.fromkeys(op.query for op in plan.ops if isinstance(op, SearchOp) and op.query)
            )
        return texts, queries

    def _embedded(self, plan: Plan, vectors: list[bytes], queries: dict[str, np.ndarray]) -> None:
        it = iter(vectors)
        for p in plan.puts.values():
            p.vectors = [(path, next(it)) for path, _ in p.texts]
        plan.queries = queries

    def _embed(self, plan: Plan) -> None:
        texts, queries = self._wanted(plan)
        if self._vectors is None or not (texts or queries):
            return
        vectors = self._vectors.embed_texts(texts) if texts else []
        self._embedded(plan, vectors, {q: self._vectors.embed_query(q) for q in queries})

    async def _aembed(self, plan: Plan) -> None:
        texts, queries = self._wanted(plan)
        if self._vectors is None or not (texts or queries):
            return
        vectors = await self._vectors.aembed_texts(texts) if texts else []
        got = await asyncio.gather(*(self._vectors.aembed_query(q) for q in queries))
        self._embedded(plan, vectors, dict(zip(queries, got, strict=True)))

    def _execute(self, plan: Plan) -> list[Result]:
        now_us = time.time_ns() // 1000
        if plan.writes:
            run_box: list[Run] = []

            def fn(txn: Any) -> list[Result]:
                run = Run(txn, now_us, self._ns_ids, self._vectors, True, self._ttl_ids)
                run_box[:] = [run]
                return run.execute(plan)

            results = self.store.transact(fn)
            self._learn(run_box[0])
            return results
        run = self._read(now_us, lambda run: run.execute(plan))
        if run.refresh:
            self._refresh(run.refresh, now_us)
        return run.results

    def _read(self, now_us: int, reads: Callable[[Run], list[Any]]) -> Run:
        """A run of ``reads`` in a read transaction; its results in ``results``."""
        with self.store.read() as txn:
            run = Run(txn, now_us, self._ns_ids, self._vectors, write=False)
            run.results = reads(run)
        self._learn(run)
        return run

    def _refresh(self, wanted: list[tuple[int, bytes]], now_us: int) -> None:
        """The TTLs of items a read returned, pushed back in a write transaction
        of their own (not on a read-only store: its items expire as written)."""
        if self.store.readonly:
            return
        self.store.transact(
            lambda txn: Run(txn, now_us, self._ns_ids, None, write=True).refresh_ttls(wanted)
        )

    def _learn(self, run: Run) -> None:
        if run.found:
            _learned(self._ns_ids, run.found)
        if run.ttl_found:
            _learned(self._ttl_ids, run.ttl_found)

    # -- one op, without a batch's planning -----------------------------------

    def _refresh_default(self, refresh_ttl: bool | None) -> bool:
        if refresh_ttl is not None:
            return refresh_ttl
        return True if self.ttl_config is None else self.ttl_config.get("refresh_on_read", True)

    def get(
        self, namespace: tuple[str, ...], key: str, *, refresh_ttl: bool | None = None
    ) -> Item | None:
        """``BaseStore.get``: the one op checked as ``batch`` checks it, then
        read in a read transaction of its own."""
        _check_key(key)
        namespace = CK.labels(namespace)
        now_us = time.time_ns() // 1000
        ns_id = self._ns_ids.get(namespace)
        with self.store.read() as txn:
            if ns_id is None and (ns_id := OPS.stored_ns_id(txn, namespace)) is not None:
                _learned(self._ns_ids, {namespace: ns_id})  # committed: what a read sees
            if ns_id is None:
                return None
            hit = OPS.live_lookup(txn, ns_id, key, now_us // 1000)
        if hit is None:
            return None
        el, rec = hit
        if rec.ttl is not None and self._refresh_default(refresh_ttl):
            self._refresh([(ns_id, el)], now_us)
        return OPS.as_item(namespace, rec)

    def search(
        self,
        namespace_prefix: tuple[str, ...],
        /,
        *,
        query: str | None = None,
        filter: dict[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        refresh_ttl: bool | None = None,
    ) -> list[SearchItem]:
        """``BaseStore.search``: the one op checked as ``batch`` checks it;
        one that embeds nothing is run in a read of its own, as ``_execute``
        runs a batch of reads, without the batch's plan."""
        op = _checked_search(
            SearchOp(
                namespace_prefix, filter, limit, offset, query, self._refresh_default(refresh_ttl)
            )
        )
        if query is not None and self._vectors is not None:
            plan = Plan([op], {})
            self._embed(plan)
            return cast("list[SearchItem]", self._execute(plan)[0])
        now_us = time.time_ns() // 1000
        run = self._read(now_us, lambda run: run.search(op, None))
        if run.refresh:
            self._refresh(run.refresh, now_us)
        return run.results

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` (GetOp, PutOp, SearchOp, ListNamespacesOp) as one
        batch: every read sees the store as it was before the batch's puts,
        and the puts (the last one of each key) commit together or not at all."""
        plan = self._prepare(ops)
        self._embed(plan)
        return self._execute(plan)

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Async ``batch``: embeddings awaited, then the same core."""
        plan = self._prepare(ops)
        await self._aembed(plan)
        if plan.writes or not self._inline_reads:
            return await self._run(self._execute, plan)
        now_us = time.time_ns() // 1000
        run = self._read(now_us, lambda run: run.execute(plan))
        results, refresh = run.results, run.refresh
        # Not held across the await: the run holds its ended read transaction,
        # which keeps an LMDB reader slot while it lives, and thousands of
        # reads awaiting their refresh took every slot (MDB_READERS_FULL).
        del run
        if refresh:
            await self._run(self._refresh, refresh, now_us)
        return results

    async def _run(self, fn: Any, *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool.executor(), functools.partial(fn, *args))

    # -- TTL ------------------------------------------------------------------

    def sweep_ttl(self) -> int:
        """Delete the items whose TTL has passed (through the expiry index);
        the number deleted. What ``kvsaver sweep`` runs on a store."""
        return TTL.sweep(self.store)

    async def asweep_ttl(self) -> int:
        return int(await self._run(TTL.sweep, self.store))

    def start_ttl_sweeper(self, sweep_interval_minutes: float | None = None) -> TTL.SweeperFuture:
        """Sweep every ``sweep_interval_minutes`` (default: the TTLConfig's, else
        5) in a daemon thread; a future that ends when it stops. Also
        awaitable, as AsyncPostgresStore's ``await store.start_ttl_sweeper()``:
        the ``await`` gives the same future at once."""
        cfg = self.ttl_config or {}
        minutes = sweep_interval_minutes or cfg.get("sweep_interval_minutes") or 5
        # the sweep itself, not sweep_ttl: a subclass may make that a coroutine
        # (AsyncSqliteStore's and AsyncPostgresStore's form), as asweep_ttl does not
        return self._sweeper.start(functools.partial(TTL.sweep, self.store), float(minutes))

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the sweeper thread; True once it has stopped (or none ran)."""
        return self._sweeper.stop(timeout)


def _learned(memo: dict[Any, Any] | set[Any], new: Mapping[Any, Any] | set[Any]) -> None:
    """``new`` added to one of the store's memos of committed ids, which is
    emptied first when it would grow past ``_CACHE_MAX``."""
    if len(memo) + len(new) > _CACHE_MAX:
        memo.clear()
    memo.update(new)  # type: ignore[arg-type]


def _checked_search(op: SearchOp) -> SearchOp:
    prefix = CK.labels(op.namespace_prefix, "namespace_prefix")
    if prefix is not op.namespace_prefix:  # a list (or a tuple subclass) made a tuple
        op = op._replace(namespace_prefix=prefix)
    CK.check_filter(op.filter)
    CK.check_page(op.limit, op.offset, "search")
    if op.query is not None and not isinstance(op.query, str):
        raise TypeError(f"search query must be a str, got {type(op.query).__name__}")
    return op


def _check_key(key: Any) -> None:
    if not isinstance(key, str):
        raise TypeError(f"a store item's key must be a str, got {type(key).__name__}: {key!r}")


def _check_index(index: Any) -> None:
    if index is None or index is False:
        return
    if not isinstance(index, list) or not all(isinstance(p, str) for p in index):
        raise TypeError(f"index must be False, None or a list of field paths, got {index!r}")


def _check_ttl(ttl: Any) -> None:
    if ttl is None:
        return
    if (
        isinstance(ttl, bool)
        or not isinstance(ttl, (int, float))
        or not math.isfinite(ttl)
        or ttl <= 0
    ):
        raise ValueError(f"ttl must be a number of minutes > 0 or None, got {ttl!r}")


_TTL_KEYS = {"refresh_on_read", "default_ttl", "sweep_interval_minutes", "omit_expired"}


def _check_ttl_config(cfg: Mapping[str, Any]) -> None:
    unknown = set(cfg) - _TTL_KEYS
    if unknown:
        raise ValueError(f"unknown TTLConfig keys {sorted(unknown)}; known: {sorted(_TTL_KEYS)}")
    _check_ttl(cfg.get("default_ttl"))
    every = cfg.get("sweep_interval_minutes")
    if every is not None and (
        isinstance(every, bool) or not isinstance(every, (int, float)) or every <= 0
    ):
        raise ValueError(f"sweep_interval_minutes must be a number > 0 or None, got {every!r}")
