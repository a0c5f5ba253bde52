"""The long-term memory store: KVStore against LangGraph's stores, same rounds.

    pytest bench/test_store.py --benchmark-only -s

Rows (each store built on the same items, all open at once; every round
times each row's step once, in an order that rotates every round, round 0
discarded; medians per operation; ``x_sqlite`` = median over rounds of the
row's time / SqliteStore's in that round; ``cpu_x_sqlite`` the same of the
calling thread's CPU time, which a busy machine inflates less; a server's CPU
is not in it):

  KVStore            ``KVStore(dir, index=...)``: LMDB, durability "full"
  KVStore-memory     ``KVStore(":memory:", index=...)``
  KVStore-postgres   ``KVStore(url, index=...)`` on the throwaway server
  SqliteStore        ``langgraph.store.sqlite.SqliteStore`` on a file, as
                     ``from_conn_string`` opens it (autocommit, SQLite's default
                     journal and synchronous=FULL), with the index: vectors in
                     its ``store_vectors`` table, scored by sqlite-vec's
                     ``vec_distance_cosine`` (an exact scan)
  InMemoryStore      ``langgraph.store.memory.InMemoryStore(index=...)`` (numpy
                     installed: its cosine similarity is numpy's)
  PostgresStore      ``langgraph.store.postgres.PostgresStore`` on the same
                     server, WITHOUT an index (its vector search needs the
                     pgvector extension, which the test server lacks), so it
                     has no vector-search row and its puts embed nothing
  KVStore-pgvector   ``KVStore(url, index=...)`` on a second throwaway server
                     with pgvector (the pgserver wheel's PostgreSQL 16): it
                     ranks on the server, exactly (no ``ann_index_config``)
  PostgresStore-pgvector  PostgresStore with the index on that server, with
                     its default ``ann_index_config`` (an HNSW index)

The items, at 10k and 100k (``--quick``: 500 and 2,000): 100 per namespace
``("users", "user-NNNN", "memories")``, key ``mem-NNNNNN``, value
``{"text": 80-160 characters of words, "kind": "kind-K" (20 kinds), "user",
"n"}``; the index embeds ``text`` in 384 dimensions with a deterministic fake
(no network, no model): a word's vector is a unit vector drawn from a random
generator seeded by the word, a text's the normalized sum of its words' (texts
that share words are near, as with a real model; KVSAVER_BENCH_STORE_EMBED=random:
one seeded random unit vector per whole text, no structure at all). Built
fast (batches of PutOps, no syncs), then reopened with the defaults.

Groups, per size (``<op>@10k``, ``<op>@100k``):

  get              50 ``get(ns, key)`` of existing items per row and round
  put              20 ``put`` of new items (a namespace of their own, outside
                   "users"), each its own commit; embedding included
  search:ns        ``search(("users", "user-N"), limit=10)``: one namespace's items
  search:filter    ``search(("users",), filter={"kind": "kind-K"}, limit=10)``
                   over every item (5% match)
  search:vector    ``search(("users",), query=TEXT, limit=10)`` over every item;
                   ``recall_at_10``: the share of the exact top 10 (numpy,
                   float64, over the same fake vectors) a row returned, over
                   every query the rounds ran
  list_namespaces  ``list_namespaces(prefix=("users",), max_depth=2, limit=100)``

PostgreSQL rows are in the 10k groups only (building 100k items over a
network connection is minutes that say nothing new). Without PostgreSQL's
binaries they are left out and ``info`` says so; without ``kvsaver.KVStore``
(an older checkout) its rows are left out and its targets "not measured".

put:floor (each size): SqliteStore, then KVStore and the floor of its layout
on copies of the built KVStore: the very records a KVStore put writes
(recorded on a third copy), written by py-lmdb in one fully durable commit
each, after the same embed call.

Targets: every operation's KVStore row <= 0.5x SqliteStore; search:vector@100k
<= 0.1x SqliteStore with recall@10 >= 0.95. Results: bench/results/store.json.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import sqlite3
import sys
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import kvsaver
import numpy as np
import pytest
from _workloads import (
    ZIPF_WORDS,
    fresh_database,
    metric_rows,
    paired_rounds,
    pick,
    record,
    target,
    us,
    words_text,
    x_of,
)
from langgraph.store.base import BaseStore, PutOp
from langgraph.store.memory import InMemoryStore
from langgraph.store.sqlite import SqliteStore

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

AREA = "store"
KV = "KVStore"
KV_MEM = "KVStore-memory"
KV_PG = "KVStore-postgres"
SQLITE = "SqliteStore"
INMEM = "InMemoryStore"
PG = "PostgresStore"
KV_PGV = "KVStore-pgvector"
PG_PGV = "PostgresStore-pgvector"
SIZES = pick([10_000, 100_000], [500, 2_000])
PG_SIZES = SIZES[:1]
PER_NS = 100
DIMS = 384
KINDS = 20
LIMIT = 10
BUILD_BATCH = 1_000
ROUNDS = pick(10, 2)
VECTOR_ROUNDS = {SIZES[0]: pick(10, 2), SIZES[1]: pick(6, 2)}
EMBED = os.environ.get("KVSAVER_BENCH_STORE_EMBED", "words")
KVStore: Any = getattr(kvsaver, "KVStore", None)  # absent before the store existed
_ids = itertools.count()


# -- the fake embeddings ----------------------------------------------------------------

VOCAB = ZIPF_WORDS[:2_000]  # drawn uniformly: a text shares a word with ~1% of the others
_word_vectors: dict[str, np.ndarray] = {}


def _seeded_unit(seed_text: str) -> np.ndarray:
    v = np.random.default_rng(zlib.crc32(seed_text.encode())).standard_normal(DIMS)
    return v / np.linalg.norm(v)


def vectors(texts: Sequence[str]) -> np.ndarray:
    """The fake embedding of each text (see the module docstring), float64, unit."""
    out = np.empty((len(texts), DIMS))
    for i, t in enumerate(texts):
        if EMBED == "random":
            out[i] = _seeded_unit(t)
            continue
        words = t.split() or [""]
        for w in words:
            if w not in _word_vectors:
                _word_vectors[w] = _seeded_unit(w)
        v = np.sum([_word_vectors[w] for w in words], axis=0)
        out[i] = v / np.linalg.norm(v)
    return out


def embed(texts: Sequence[str]) -> list[list[float]]:
    """The index's ``embed``: a plain function, as IndexConfig takes one."""
    return vectors(texts).tolist()  # type: ignore[no-any-return]


INDEX: dict[str, Any] = {"dims": DIMS, "embed": embed, "fields": ["text"]}
# SqliteStore reads the fields to embed from "text_fields", not IndexConfig's
# "fields" (without it, it embeds the whole value as JSON text).
SQLITE_INDEX: dict[str, Any] = {**INDEX, "text_fields": ["text"]}


# -- the items ---------------------------------------------------------------------------


def namespace(u: int) -> tuple[str, ...]:
    return ("users", f"user-{u:04d}", "memories")


def item(i: int) -> tuple[tuple[str, ...], str, dict[str, Any]]:
    rnd = random.Random(i)
    value = {
        "text": words_text(rnd, rnd.randint(80, 160), VOCAB),
        "kind": f"kind-{i % KINDS}",
        "user": i // PER_NS,
        "n": i,
    }
    return namespace(i // PER_NS), f"mem-{i:06d}", value


def query_text(q: int) -> str:
    return words_text(random.Random(10_000_000 + q), 40, VOCAB)


@dataclass
class Built:
    store: BaseStore
    seconds: float
    close: Callable[[], None]


@dataclass
class Stores:
    size: int
    rows: dict[str, Built]
    keys: list[tuple[tuple[str, ...], str]]  # of every item, by n
    matrix: np.ndarray  # the items' vectors, by n: the exact search's
    info: dict[str, Any] = field(default_factory=dict)

    def truth(self, query: str) -> set[tuple[tuple[str, ...], str]]:
        scores = self.matrix @ vectors([query])[0]
        top = np.argpartition(-scores, LIMIT)[:LIMIT]
        return {self.keys[int(i)] for i in top}


def _fill(store: BaseStore, size: int) -> None:
    for start in range(0, size, BUILD_BATCH):
        store.batch([PutOp(*item(i)) for i in range(start, min(size, start + BUILD_BATCH))])


def _timed_build(open_filled: Callable[[], tuple[BaseStore, Callable[[], None]]]) -> Built:
    t0 = time.perf_counter()
    store, close = open_filled()
    return Built(store, time.perf_counter() - t0, close)


def sqlite_module() -> Any:
    """A DB-API sqlite3 that can load sqlite-vec: the standard library's
    where its SQLite allows loading extensions; else pysqlite3-binary's (a
    Python built without them, as pyenv's is by default); else None."""
    if hasattr(sqlite3.Connection, "enable_load_extension"):
        return sqlite3
    try:
        import pysqlite3.dbapi2 as module  # type: ignore[import-not-found]
    except ImportError:
        return None
    return module


def _sqlite(path: str, size: int) -> tuple[BaseStore, Callable[[], None]]:
    module = sqlite_module()
    index = None if module is None else SQLITE_INDEX

    def connect() -> Any:  # as SqliteStore.from_conn_string connects
        return (module or sqlite3).connect(path, check_same_thread=False, isolation_level=None)

    conn = connect()
    builder = SqliteStore(conn, index=index)  # type: ignore[arg-type]
    builder.setup()
    conn.execute("PRAGMA synchronous=OFF")
    _fill(builder, size)
    conn.close()
    conn = connect()
    store = SqliteStore(conn, index=index)  # type: ignore[arg-type]
    store.setup()
    return store, conn.close


def _kv_lmdb(path: str, size: int) -> tuple[BaseStore, Callable[[], None]]:
    from kvsaver.kv import LMDBStore

    engine = LMDBStore(path, durability="none")
    builder = KVStore(engine, index=INDEX)
    _fill(builder, size)
    engine.sync()
    builder.close()
    engine.close()
    store = KVStore(path, index=INDEX)
    return store, store.close


def _kv_memory(size: int) -> tuple[BaseStore, Callable[[], None]]:
    store = KVStore(":memory:", index=INDEX)
    _fill(store, size)
    return store, store.close


def _inmemory(size: int) -> tuple[BaseStore, Callable[[], None]]:
    store = InMemoryStore(index=INDEX)  # type: ignore[arg-type]
    _fill(store, size)
    return store, lambda: None


def _postgres(url: str, size: int, vector: bool = False) -> tuple[BaseStore, Callable[[], None]]:
    import psycopg
    from langgraph.store.postgres import PostgresStore
    from psycopg.rows import dict_row

    conn = psycopg.connect(
        fresh_database(url, f"pgstore_{size}_{int(vector)}"),
        autocommit=True,
        prepare_threshold=0,
        row_factory=dict_row,
    )
    # no index where the server has no pgvector
    store = PostgresStore(conn, index=INDEX if vector else None)  # type: ignore[arg-type]
    store.setup()
    _fill(store, size)
    return store, conn.close


def _kv_postgres(url: str, size: int) -> tuple[BaseStore, Callable[[], None]]:
    store = KVStore(fresh_database(url, f"kvstore_{size}"), index=INDEX)
    _fill(store, size)
    return store, store.close


@pytest.fixture(scope="module", params=SIZES, ids=lambda n: _size(n))
def stores(
    request: Any, tmp_path_factory: Any, pg_url: str | None, pgvector_url: str | None
) -> Iterator[Stores]:
    size: int = request.param
    work = str(tmp_path_factory.mktemp(f"store-{size}"))
    builds: dict[str, Callable[[], tuple[BaseStore, Callable[[], None]]]] = {
        SQLITE: lambda: _sqlite(os.path.join(work, "store.sqlite"), size),
        INMEM: lambda: _inmemory(size),
    }
    info: dict[str, Any] = {"items": size, "namespaces": size // PER_NS, "embedding": EMBED}
    module = sqlite_module()
    if module is None:
        info["SqliteStore"] = "no sqlite3 that loads extensions: no index, no vector rows"
    else:
        info["SqliteStore"] = f"SQLite {module.sqlite_version} ({module.__name__}), sqlite-vec"
    if KVStore is not None:
        builds[KV] = lambda: _kv_lmdb(os.path.join(work, "kv"), size)
        builds[KV_MEM] = lambda: _kv_memory(size)
    else:
        info["KVStore"] = "not in this checkout"
    if pg_url is None:
        info["postgres"] = "PostgreSQL not installed: no PostgreSQL rows"
    elif size in PG_SIZES:
        builds[PG] = lambda: _postgres(pg_url, size)
        if KVStore is not None:
            builds[KV_PG] = lambda: _kv_postgres(pg_url, size)
        info["postgres"] = "PostgresStore without index (no pgvector on the server)"
    if pgvector_url is None:
        info["pgvector"] = "pgserver not installed: no pgvector rows"
    elif size in PG_SIZES:
        builds[PG_PGV] = lambda: _postgres(pgvector_url, size, vector=True)
        if KVStore is not None:
            builds[KV_PGV] = lambda: _kv_postgres(pgvector_url, size)
        info["pgvector"] = "PostgreSQL 16 with pgvector (pgserver's binaries)"
    rows = {name: _timed_build(b) for name, b in builds.items()}
    info["build_seconds"] = {n: round(b.seconds, 1) for n, b in rows.items()}
    keys = [item(i)[:2] for i in range(size)]
    matrix = vectors([item(i)[2]["text"] for i in range(size)])
    yield Stores(size, rows, keys, matrix, info)
    for b in rows.values():
        b.close()
    shutil.rmtree(work, ignore_errors=True)


# -- the operations ------------------------------------------------------------------------


def _gets(s: Stores, r: int) -> list[tuple[tuple[str, ...], str]]:
    rnd = random.Random(r)
    return [s.keys[rnd.randrange(s.size)] for _ in range(50)]


def _puts(r: int) -> list[tuple[tuple[str, ...], str, dict[str, Any]]]:
    base = next(_ids) * 1_000
    out = []
    for j in range(20):
        _, _, value = item(base + j)
        out.append((("bench-puts", f"round-{r}"), f"new-{base + j:08d}", value))
    return out


Step = Callable[[Stores, str, BaseStore, int], Callable[[], Any]]


def _get_step(s: Stores, name: str, st: BaseStore, r: int) -> Callable[[], Any]:
    keys = _gets(s, r)
    return lambda: [st.get(ns, k) for ns, k in keys]


def _put_step(s: Stores, name: str, st: BaseStore, r: int) -> Callable[[], Any]:
    items = _puts(r)
    return lambda: [st.put(ns, k, v) for ns, k, v in items]


def _ns_step(s: Stores, name: str, st: BaseStore, r: int) -> Callable[[], Any]:
    ns = namespace(random.Random(r).randrange(s.size // PER_NS))[:2]
    return lambda: st.search(ns, limit=LIMIT)


def _filter_step(s: Stores, name: str, st: BaseStore, r: int) -> Callable[[], Any]:
    kind = f"kind-{r % KINDS}"
    return lambda: st.search(("users",), filter={"kind": kind}, limit=LIMIT)


def _list_step(s: Stores, name: str, st: BaseStore, r: int) -> Callable[[], Any]:
    return lambda: st.list_namespaces(prefix=("users",), max_depth=2, limit=100)


OPS: dict[str, tuple[Step, int]] = {  # op: (one row's step in one round, operations in it)
    "get": (_get_step, 50),
    "put": (_put_step, 20),
    "search:ns": (_ns_step, 1),
    "search:filter": (_filter_step, 1),
    "list_namespaces": (_list_step, 1),
}


def _size(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 else str(n)


def _targets(group: str, x: dict[str, float], goal: float) -> list[dict[str, Any]]:
    return [target(f"{group}: KVStore vs SqliteStore", x.get(KV), goal)]


def _check(op: str, s: Stores, name: str, st: BaseStore) -> None:
    """What every row must return for its figures to count (untimed)."""
    ns, key = s.keys[7]
    got = st.get(ns, key)
    assert got is not None and got.value == item(7)[2], name
    if op == "search:filter":
        found = st.search(("users",), filter={"kind": "kind-3"}, limit=LIMIT)
        assert len(found) == LIMIT and all(f.value["kind"] == "kind-3" for f in found), name
    if op == "search:ns":
        found = st.search(namespace(3)[:2], limit=LIMIT)
        assert len(found) == LIMIT and all(f.namespace == namespace(3) for f in found), name
    if op == "list_namespaces":
        got_ns = st.list_namespaces(prefix=("users",), max_depth=2, limit=100)
        assert len(got_ns) == min(100, s.size // PER_NS), name


@pytest.mark.parametrize("op", list(OPS))
def test_store_ops(benchmark: Any, stores: Stores, op: str) -> None:
    make, per = OPS[op]
    for name, b in stores.rows.items():
        _check(op, stores, name, b.store)
    group = f"{op}@{_size(stores.size)}"

    def steps(r: int) -> dict[str, Callable[[], Any]]:
        return {n: make(stores, n, b.store, r) for n, b in stores.rows.items()}

    wall, cpu = paired_rounds(benchmark, group, steps, ROUNDS, per)
    x = x_of(wall, SQLITE)
    record(
        AREA,
        group,
        f"{op} on a store of {stores.size:,} items ({per} per row and round)",
        metric_rows(us=us(wall), x_sqlite=x, cpu_us=us(cpu), cpu_x_sqlite=x_of(cpu, SQLITE)),
        info={"rounds": ROUNDS, "ops_per_row_per_round": per, **stores.info},
        targets=_targets(group, x, 0.5),
    )


def test_store_vector_search(benchmark: Any, stores: Stores) -> None:
    if sqlite_module() is None:
        pytest.skip("SqliteStore cannot load sqlite-vec here: pip install pysqlite3-binary")
    rows = {n: b for n, b in stores.rows.items() if n != PG}  # PostgresStore: no index
    rounds = VECTOR_ROUNDS[stores.size]
    per = 3
    found: dict[str, list[float]] = {n: [] for n in rows}  # recall of each query
    group = f"search:vector@{_size(stores.size)}"

    def search(name: str, st: BaseStore, queries: list[tuple[str, set[Any]]]) -> None:
        for q, truth in queries:
            got = st.search(("users",), query=q, limit=LIMIT)
            found[name].append(len({(g.namespace, g.key) for g in got} & truth) / LIMIT)

    def steps(r: int) -> dict[str, Callable[[], Any]]:
        texts = [query_text(r * per + j) for j in range(per)]
        queries = [(q, stores.truth(q)) for q in texts]  # untimed: the round's setup
        return {n: (lambda n=n, st=b.store, qs=queries: search(n, st, qs)) for n, b in rows.items()}

    wall, cpu = paired_rounds(benchmark, group, steps, rounds, per)
    x = x_of(wall, SQLITE)
    recall = {n: round(sum(v) / len(v), 3) for n, v in found.items() if v}
    targets = _targets(group, x, 0.1 if stores.size == SIZES[-1] else 0.5)
    if stores.size == SIZES[-1]:
        targets.append(target(f"{group}: KVStore recall@10", recall.get(KV), 0.95, at_most=False))
    record(
        AREA,
        group,
        f"search by a query's vector over {stores.size:,} items, limit {LIMIT} "
        f"({per} queries per row and round)",
        metric_rows(
            us=us(wall),
            x_sqlite=x,
            cpu_us=us(cpu),
            cpu_x_sqlite=x_of(cpu, SQLITE),
            recall_at_10=recall,
        ),
        info={
            "rounds": rounds,
            "ops_per_row_per_round": per,
            "queries": len(found[SQLITE]),
            **stores.info,
        },
        targets=targets,
    )
    assert recall[SQLITE] >= 0.9  # an exact scan: the fake and the truth agree


# -- put against the floor of KVStore's layout --------------------------------------------


class _Recorder:
    """A ``Store`` that keeps each write transaction's puts and deletes
    (the last run of each: a transaction may run again after a map growth)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.txns: list[list[tuple[str, bytes, bytes | None]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def transact(self, fn: Callable[[Any], Any]) -> Any:
        last: list[list[tuple[str, bytes, bytes | None]]] = [[]]

        def recorded(txn: Any) -> Any:
            last[0] = []
            return fn(_RecordingTxn(txn, last[0]))

        result = self._store.transact(recorded)
        self.txns.append(last[0])
        return result


class _RecordingTxn:
    def __init__(self, txn: Any, ops: list[tuple[str, bytes, bytes | None]]) -> None:
        self._txn, self._ops = txn, ops

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)

    def put(self, key: bytes, value: bytes) -> None:
        self._ops.append(("put", key, value))
        self._txn.put(key, value)

    def delete(self, key: bytes) -> bool:
        self._ops.append(("delete", key, None))
        return bool(self._txn.delete(key))

    def delete_range(self, start: bytes, stop: bytes) -> int:
        self._ops.append(("range", start, stop))
        return int(self._txn.delete_range(start, stop))


def _replay(env: Any, ops: list[tuple[str, bytes, bytes | None]]) -> None:
    from kvsaver.kv.lmdb.ranges import _delete_range  # the range delete LMDBStore runs

    with env.begin(write=True) as txn:
        for op, a, b in ops:
            if op == "put":
                txn.put(a, b)
            elif op == "delete":
                txn.delete(a)
            else:
                _delete_range(txn, a, b, env.max_key_size())


def test_store_put_floor(benchmark: Any, stores: Stores, tmp_path: Any) -> None:
    """KVStore's put against the floor of its layout: the very records a put
    writes (recorded on a copy of the store), written by py-lmdb directly in
    one commit with LMDB's full durability, after the same embed call: what
    any code keeping this layout pays. Both on copies of the built store."""
    import lmdb
    from kvsaver.kv import LMDBStore

    if KV not in stores.rows:
        pytest.skip("no KVStore in this checkout")
    src = os.path.join(stores.rows[KV].store.store.path, "data.mdb")  # type: ignore[attr-defined]
    dirs = {n: tmp_path / n for n in ("record", "kv", "floor")}
    for d in dirs.values():
        d.mkdir()
        shutil.copy(src, d / "data.mdb")
    per = 20
    todo = [item(30_000_000 + j)[2] for j in range((ROUNDS + 1) * per)]

    def put_of(j: int) -> tuple[tuple[str, ...], str, dict[str, Any]]:
        return ("bench-puts", f"floor-{j // per}"), f"new-{j:08d}", todo[j]

    recorder = _Recorder(LMDBStore(str(dirs["record"]), durability="none"))
    recording = KVStore(recorder, index=INDEX)
    for j in range(len(todo)):
        recording.put(*put_of(j))
    recording.close()
    kv = KVStore(str(dirs["kv"]), index=INDEX)
    with open(dirs["floor"] / "data.mdb", "ab") as f:  # zeroed ahead, as KVStore does
        f.write(bytes(64 << 20))
        os.fsync(f.fileno())
    env = lmdb.open(str(dirs["floor"]), map_size=1 << 34, sync=True, metasync=True, max_dbs=0)
    sqlite = stores.rows[SQLITE].store

    def steps(r: int) -> dict[str, Callable[[], Any]]:
        js = range(r * per, (r + 1) * per)
        return {
            SQLITE: lambda: [sqlite.put(*put_of(j)) for j in js],
            KV: lambda: [kv.put(*put_of(j)) for j in js],
            "KVStore layout floor": lambda: [
                (embed([todo[j]["text"]]), _replay(env, recorder.txns[j])) for j in js
            ],
        }

    try:
        wall, cpu = paired_rounds(benchmark, f"put:floor@{_size(stores.size)}", steps, ROUNDS, per)
    finally:
        kv.close()
        env.close()
    x = x_of(wall, SQLITE)
    record(
        AREA,
        f"put:floor@{_size(stores.size)}",
        f"put on copies of the {stores.size:,}-item store against the floor of KVStore's "
        f"layout ({per} per row and round)",
        metric_rows(us=us(wall), x_sqlite=x, cpu_us=us(cpu), cpu_x_sqlite=x_of(cpu, SQLITE)),
        info={
            "rounds": ROUNDS,
            "ops_per_row_per_round": per,
            "writes_per_put": round(sum(map(len, recorder.txns)) / len(recorder.txns), 2),
            **stores.info,
        },
    )
