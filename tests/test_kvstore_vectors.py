"""kvstore/vectors.py: the texts a put embeds (LangGraph's rules, against
InMemoryStore's), the embedding checks, the vector records, and the ranking
of a search against a brute-force numpy computation and InMemoryStore's
order, on the stores a KVStore runs on."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kvsaver.kv import LMDBStore, MemoryStore, MissingDependencyError, Store
from kvsaver.kv.keys import unpack
from kvsaver.kvstore import vectors as vmod
from kvsaver.kvstore.vectors import Vectors
from kvstore_helpers import block_numpy
from langgraph.store.base import PutOp
from langgraph.store.memory import InMemoryStore

DIMS = 16


def fake_vector(text: str, dims: int = DIMS) -> list[float]:
    """A seeded random vector per text: deterministic, no network; float32
    values, so InMemoryStore (float64) and the stored float32 agree."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    v = np.random.default_rng(seed).standard_normal(dims).astype(np.float32)
    return [float(x) for x in v]


class Embedder:
    """An embed function that remembers which text each vector came from."""

    def __init__(self, dims: int = DIMS) -> None:
        self.dims = dims
        self.text_of: dict[tuple[float, ...], str] = {}

    def __call__(self, texts: list[str]) -> list[list[float]]:
        out = []
        for t in texts:
            v = fake_vector(t, self.dims)
            self.text_of[tuple(v)] = t
            out.append(v)
        return out


def config(embed: Any, fields: list[str] | None = None, dims: int = DIMS) -> dict[str, Any]:
    cfg: dict[str, Any] = {"dims": dims, "embed": embed}
    if fields is not None:
        cfg["fields"] = fields
    return cfg


def put(
    store: Store,
    vectors: Vectors,
    ns: tuple[str, ...],
    key: str,
    value: dict[str, Any] | None,
    index: Any = None,
) -> None:
    """What KVStore does around a put: embed first, then write in the txn."""
    if value is None:
        with store.write() as txn:
            vmod.delete_vectors(txn, ns, key)
        return
    texts = vectors.texts(value, index)
    embedded = vectors.embed_texts([t for _, t in texts])
    with store.write() as txn:
        vectors.write(txn, ns, key, [(f, v) for (f, _), v in zip(texts, embedded)], stored=True)


def ranked(store: Store, vectors: Vectors, query: str, prefix: tuple[str, ...] = ()) -> list:
    with store.read() as txn:
        return list(vectors.ranked(txn, vectors.embed_query(query), prefix))


def _open(backend: str, tmp_path: Path) -> Iterator[Store]:
    store: Store
    if backend in ("postgres", "pgvector"):  # postgres: no pgvector there, the numpy path
        from kvsaver.kv import PostgresStore
        from pg_helpers import drop_tables, shared_pgvector_server, shared_server, table_for

        server = shared_server() if backend == "postgres" else shared_pgvector_server()
        store = PostgresStore(server.url, table=table_for(tmp_path), max_size=4)
        with store:
            yield store
        if backend == "pgvector":
            drop_tables(server.url, [f"{table_for(tmp_path)}_vectors", table_for(tmp_path)])
        return
    store = MemoryStore() if backend == "memory" else LMDBStore(tmp_path / "db")
    with store:
        yield store


@pytest.fixture(params=["memory", "lmdb", "postgres", "pgvector"])
def kv(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """pgvector: PostgreSQL with pgvector, where ``vectors_on`` ranks on the server."""
    yield from _open(request.param, tmp_path)


@pytest.fixture(params=["memory", "lmdb", "postgres"])
def numpy_kv(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """The stores where ranking is the numpy path's cache (the cache's own tests)."""
    yield from _open(request.param, tmp_path)


def vectors_on(store: Store, cfg: dict[str, Any]) -> Vectors:
    """``Vectors`` as KVStore makes them on ``store``: ranked on the server
    where the store keeps vectors (pgvector)."""
    from pg_helpers import _PGVECTOR

    vectors = Vectors(cfg)  # type: ignore[arg-type]
    vectors.attach(store)
    on_pgvector = bool(_PGVECTOR) and getattr(store, "conninfo", None) == _PGVECTOR[0].url
    assert vectors.server == on_pgvector
    return vectors


# -- texts: LangGraph's rules --------------------------------------------------

VALUES: list[dict[str, Any]] = [
    {"text": "hello", "n": 3},
    {"text": ["a", "b", "c"], "meta": {"title": "T", "tags": ["x", "y"]}},
    {"meta": {"title": "only title"}, "list": [{"q": "q0"}, {"q": "q1"}, {"r": "r2"}]},
    {"nothing": None, "flag": True, "num": 2.5},
    {"é": "ünï", "text": {"nested": ["deep", 1]}},
    {},
]
FIELD_SETS: list[list[str] | None] = [
    None,
    ["$"],
    ["text"],
    ["text", "meta.title"],
    ["list[*].q", "meta.tags[-1]", "meta.tags[5]"],
    ["meta.{title,tags}", "*"],
    ["missing.path", "num", "flag"],
]
INDEXES: list[Any] = [None, False, ["text"], ["meta.title", "list[0].q"], ["$"], []]


def in_memory_vectors(
    fields: list[str] | None, value: dict[str, Any], index: Any
) -> dict[str, str]:
    """InMemoryStore's vectors of one put, as {field path: text}."""
    embed = Embedder()
    mem = InMemoryStore(index=config(embed, fields))  # type: ignore[arg-type]
    mem.batch([PutOp(("ns",), "k", value, index=index)])
    got = mem._vectors[("ns",)].get("k", {})
    return {path: embed.text_of[tuple(v)] for path, v in got.items()}


@pytest.mark.parametrize("fields", FIELD_SETS)
@pytest.mark.parametrize("index", INDEXES)
def test_texts_are_in_memory_stores(fields: list[str] | None, index: Any) -> None:
    vectors = Vectors(config(Embedder(), fields))  # type: ignore[arg-type]
    for value in VALUES:
        ours = vectors.texts(value, index)
        assert len({f for f, _ in ours}) == len(ours)
        assert dict(ours) == in_memory_vectors(fields, value, index), (value, index)


def test_texts_whole_value_is_sorted_json() -> None:
    vectors = Vectors(config(Embedder()))  # type: ignore[arg-type]
    assert vectors.texts({"b": 1, "a": "é"}, None) == [("$", '{"a": "é", "b": 1}')]
    assert vectors.texts({"b": 1}, False) == []
    assert vectors.texts({"b": 1}, ["c"]) == []


def test_duplicate_texts_each_get_a_vector(kv: Store) -> None:
    """Two fields with one text: both embedded (InMemoryStore's put raises here)."""
    vectors = vectors_on(kv, config(Embedder(), ["a", "b"]))
    assert vectors.texts({"a": "same", "b": "same"}, None) == [("a", "same"), ("b", "same")]
    put(kv, vectors, ("n",), "k", {"a": "same", "b": "same"})
    assert [(ns, key) for ns, key, _ in ranked(kv, vectors, "same")] == [(("n",), "k")]


# -- embedding checks ------------------------------------------------------------


def test_dims_mismatch_from_embed_is_a_clear_error(kv: Store) -> None:
    vectors = vectors_on(kv, config(Embedder(DIMS + 1)))
    with pytest.raises(ValueError, match=f"vector of {DIMS + 1} dims.*dims={DIMS}"):
        vectors.embed_texts(["x"])
    with pytest.raises(ValueError, match=f"vector of {DIMS + 1} dims.*dims={DIMS}"):
        vectors.embed_query("x")
    with pytest.raises(ValueError, match="dims"), kv.write() as txn:
        vectors.write(txn, ("n",), "k", [("$", [0.5] * (DIMS - 1))], stored=True)
    with kv.read() as txn:
        assert list(txn.scan()) == []


def test_record_and_log_keys_are_the_schema_tables_tuples() -> None:
    """Keys built from packed heads equal the packed tuples of saver/schema.py."""
    from kvsaver.keyspace import k
    from kvsaver.kv.keys import pack, prefix_range
    from kvsaver.kvstore.keyspace import namespace_elements

    for ns, key in [(("a",), "b"), ((), ""), (("u", "v" * 30, "a\x00b"), "k" * 300)]:
        ns = ns + ("x" * 200,) * 3  # past the budget: the tail surrogate
        for labels in (ns[:1], ns):
            whole = ("s", "v", "e", *namespace_elements(labels, 240)[0], None, k(key))
            assert vmod.item_prefix(labels, key) == pack(whole)
            assert vmod.item_range(labels, key) == prefix_range(whole)
    for seq in (1, 255, 256, 10**12):
        assert vmod.log_key(seq) == pack(("s", "v", "l", seq))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_embedded_lists_are_float32_as_numpy_makes_them() -> None:
    """A list of floats becomes the float32 numpy makes of it, bit for bit;
    what cannot be a finite float32 vector is a clear error."""
    vectors = Vectors(config(Embedder()))  # type: ignore[arg-type]
    rng = np.random.default_rng(3)
    for scale in (1.0, 1e-42, 1e-30, 1e30):
        v = [float(x) for x in rng.standard_normal(DIMS) * scale]
        assert vectors.vector_bytes(v) == np.asarray(v, dtype=np.float32).tobytes()
    # a tie rounds to even, ints and bools and numpy floats count, -0.0 stays
    odd = [1 + 2**-24, 1 + 3 * 2**-24, 1, True, np.float64(0.1), 2**-149, -0.0]
    odd += [0.5] * (DIMS - len(odd))
    assert vectors.vector_bytes(odd) == np.asarray(odd, dtype=np.float32).tobytes()
    arr = rng.standard_normal(DIMS)  # an array goes through numpy
    assert vectors.vector_bytes(arr) == arr.astype(np.float32).tobytes()
    for bad in (float("nan"), float("inf"), -float("inf"), 1e39):
        for v in ([bad] + [0.0] * (DIMS - 1), np.array([0.0] * (DIMS - 1) + [bad])):
            with pytest.raises(ValueError, match="NaN or infinite"):
                vectors.vector_bytes(v)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        vectors.vector_bytes(["x"] * DIMS)
    for wrong in ([0.5] * (DIMS + 1), b"\0" * (4 * DIMS - 4)):
        with pytest.raises(ValueError, match="dims"):
            vectors.vector_bytes(wrong)


def f32(v: list[float]) -> list[float]:
    return [float(x) for x in np.asarray(v, dtype=np.float32)]


async def test_async_embedder_and_count_check() -> None:
    async def aembed(texts: list[str]) -> list[list[float]]:
        return [fake_vector(t) for t in texts]

    vectors = Vectors(config(aembed))  # type: ignore[arg-type]
    got = await vectors.aembed_texts(["a", "b"])  # as float32 bytes, checked
    assert [np.frombuffer(v, np.float32).tolist() for v in got] == [
        f32(fake_vector("a")),
        f32(fake_vector("b")),
    ]
    assert (await vectors.aembed_query("q")).tolist() == f32(fake_vector("q"))
    short = Vectors(config(lambda texts: [fake_vector("x")]))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="returned 1 vectors for 2 texts"):
        short.embed_texts(["a", "b"])


def test_bad_dims_config() -> None:
    for dims in (None, 0, -3, "16", True):
        with pytest.raises(ValueError, match="dims must be a positive int"):
            Vectors({"dims": dims, "embed": Embedder()})  # type: ignore[typeddict-item]


def test_a_distance_other_than_cosine_is_refused() -> None:
    # PostgresStore's index config: its pgvector operator; scores here are cosine.
    Vectors({"dims": DIMS, "embed": Embedder(), "distance_type": "cosine"})  # type: ignore[typeddict-unknown-key]
    for distance in ("l2", "inner_product"):
        with pytest.raises(ValueError, match=f"distance_type '{distance}' is not supported"):
            Vectors({"dims": DIMS, "embed": Embedder(), "distance_type": distance})  # type: ignore[typeddict-unknown-key]


def test_missing_numpy_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    block_numpy(monkeypatch)
    with pytest.raises(MissingDependencyError, match=r"pip install 'kvsaver\[vector\]'"):
        Vectors(config(Embedder()))  # type: ignore[arg-type]


# -- ranking -----------------------------------------------------------------------

NAMESPACES = [("a",), ("a", "b"), ("a", "b", "c"), ("ab",), ("b",), ("a", "x" * 200)]


def random_items(
    rng: np.random.Generator, n: int, keys: int | None = None
) -> list[tuple[tuple[str, ...], str, dict]]:
    """n puts; with ``keys``, of that many keys (re-puts), else each its own."""
    items = []
    for i in range(n):
        ns = NAMESPACES[int(rng.integers(len(NAMESPACES)))]
        key = f"k{int(rng.integers(keys)) if keys else i}" + ("y" * 300 if i % 17 == 0 else "")
        value: dict[str, Any] = {"title": f"t{rng.random()}"}
        if rng.random() < 0.5:
            value["body"] = [f"b{rng.random()}" for _ in range(int(rng.integers(0, 3)))]
        items.append((ns, key, value))
    return items


def brute_force(
    stored: dict[tuple[tuple[str, ...], str], list[list[float]]],
    q: list[float],
    prefix: tuple[str, ...],
) -> list[tuple[tuple[str, ...], str, float]]:
    """Each item's best cosine (float64, from the float32 values), best first."""
    qa = np.asarray(q, dtype=np.float64)
    out = []
    for (ns, key), vecs in stored.items():
        if ns[: len(prefix)] != prefix or not vecs:
            continue
        m = np.asarray(vecs, dtype=np.float32).astype(np.float64)
        cos = (m @ qa) / (np.linalg.norm(m, axis=1) * np.linalg.norm(qa))
        out.append((ns, key, float(cos.max())))
    out.sort(key=lambda r: -r[2])
    return out


def check_ranked(
    got: list[tuple[tuple[str, ...], str, float]],
    want: list[tuple[tuple[str, ...], str, float]],
) -> None:
    assert [(ns, key) for ns, key, _ in got] == [(ns, key) for ns, key, _ in want]
    np.testing.assert_allclose([s for *_, s in got], [s for *_, s in want], atol=2e-6)


def test_ranked_equals_brute_force_and_in_memory_store(kv: Store) -> None:
    """Distinct items (InMemoryStore keeps a re-put item's old fields' vectors)."""
    rng = np.random.default_rng(7)
    fields = ["title", "body[*]"]
    vectors = vectors_on(kv, config(Embedder(), fields))
    mem = InMemoryStore(index=config(Embedder(), fields))  # type: ignore[arg-type]
    stored: dict[tuple[tuple[str, ...], str], list[list[float]]] = {}
    for ns, key, value in random_items(rng, 300):
        put(kv, vectors, ns, key, value)
        mem.put(ns, key, value)
        stored[(ns, key)] = [fake_vector(t) for _, t in vectors.texts(value, None)]
    for prefix in [(), ("a",), ("a", "b"), ("ab",), ("zz",), ("a", "x" * 200)]:
        for query in ["q1", "q2"]:
            got = ranked(kv, vectors, query, prefix)
            want = brute_force(stored, fake_vector(query), prefix)
            check_ranked(got, want)
            hits = mem.search(prefix, query=query, limit=1000)
            check_ranked(got, [(h.namespace, h.key, h.score) for h in hits])


def test_rewrites_and_deletes_replace_vectors(kv: Store) -> None:
    vectors = vectors_on(kv, config(Embedder(), ["a", "b"]))
    put(kv, vectors, ("n",), "k", {"a": "one", "b": "two"})
    put(kv, vectors, ("n",), "k", {"a": "three"})  # b's vector goes
    assert ranked(kv, vectors, "two")[0][2] == pytest.approx(
        brute_force({(("n",), "k"): [fake_vector("three")]}, fake_vector("two"), ())[0][2],
        abs=2e-6,
    )
    put(kv, vectors, ("n",), "k", {"a": "four"}, index=False)  # no vectors now
    assert ranked(kv, vectors, "two") == []
    put(kv, vectors, ("n",), "k", {"a": "five"})
    put(kv, vectors, ("n",), "k", None)
    assert ranked(kv, vectors, "two") == []
    with kv.read() as txn:  # nothing left but the counter and the log
        left = {unpack(key)[2] for key, _ in txn.scan()}
    assert left == {"n", "l"}


def test_zero_vectors_score_zero(kv: Store) -> None:
    vectors = vectors_on(kv, config(lambda texts: [[0.0] * DIMS for _ in texts]))
    put(kv, vectors, ("n",), "k", {"a": "x"})
    with kv.read() as txn:
        assert list(vectors.ranked(txn, [0.0] * DIMS, ())) == [(("n",), "k", 0.0)]
        assert list(vectors.ranked(txn, [1.0] * DIMS, ())) == [(("n",), "k", 0.0)]


# -- the cache: in step with the store ---------------------------------------------


class Model:
    """What the store should hold: each item's vectors, by the same rules."""

    def __init__(self, vectors: Vectors) -> None:
        self.vectors = vectors
        self.stored: dict[tuple[tuple[str, ...], str], list[list[float]]] = {}

    def put(self, ns: tuple[str, ...], key: str, value: dict | None, index: Any = None) -> None:
        if value is None:
            self.stored.pop((ns, key), None)
        else:
            self.stored[(ns, key)] = [fake_vector(t) for _, t in self.vectors.texts(value, index)]

    def copy(self) -> dict[tuple[tuple[str, ...], str], list[list[float]]]:
        return dict(self.stored)


def random_op(rng: np.random.Generator) -> tuple[tuple[str, ...], str, dict | None, Any]:
    ns = NAMESPACES[int(rng.integers(len(NAMESPACES)))]
    key = f"k{int(rng.integers(40))}"
    r = rng.random()
    if r < 0.2:
        return ns, key, None, None
    value = {"title": f"t{rng.random()}", "body": [f"b{rng.random()}"] * int(rng.integers(3))}
    return ns, key, value, (False if r < 0.3 else None)


def check_all(store: Store, vectors: Vectors, model: Model, rng: np.random.Generator) -> None:
    for prefix in [(), ("a",), ("a", "b"), ("b",)]:
        query = f"q{rng.random()}"
        check_ranked(
            ranked(store, vectors, query, prefix),
            brute_force(model.stored, fake_vector(query), prefix),
        )


def test_cache_follows_puts_deletes_and_reputs(numpy_kv: Store) -> None:
    kv = numpy_kv
    rng = np.random.default_rng(11)
    fields = ["title", "body[*]"]
    writer = Vectors(config(Embedder(), fields))  # type: ignore[arg-type]
    reader = Vectors(config(Embedder(), fields))  # type: ignore[arg-type]
    model = Model(writer)
    for _ in range(30):
        for _ in range(int(rng.integers(1, 12))):
            ns, key, value, index = random_op(rng)
            put(kv, writer, ns, key, value, index)
            model.put(ns, key, value, index)
        check_all(kv, reader, model, rng)  # a cache that only reads
        check_all(kv, writer, model, rng)  # and the writer's own
    assert reader._cache is not None and reader._cache.seq > 0


def test_cache_compacts_dead_rows(numpy_kv: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    kv = numpy_kv
    monkeypatch.setattr(vmod, "COMPACT_DEAD", 64)
    vectors = Vectors(config(Embedder(), ["t"]))  # type: ignore[arg-type]
    model = Model(vectors)
    rng = np.random.default_rng(3)
    compacted = 0
    for i in range(400):
        ns, key, value = ("a",), f"k{i % 20}", {"t": f"v{i}"}
        put(kv, vectors, ns, key, value)
        model.put(ns, key, value)
        before = vectors._cache.dead if vectors._cache else 0
        check_all(kv, vectors, model, rng)
        assert vectors._cache is not None
        compacted += vectors._cache.dead < before
    assert compacted >= 4
    assert vectors._cache.n - vectors._cache.dead == 20 and vectors._cache.dead <= 64


def test_log_is_trimmed_and_a_cache_too_far_behind_rebuilds(
    numpy_kv: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    kv = numpy_kv
    monkeypatch.setattr(vmod, "LOG_KEEP", 8)
    monkeypatch.setattr(vmod, "LOG_TRIM", 4)
    rng = np.random.default_rng(5)
    writer = Vectors(config(Embedder(), ["t"]))  # type: ignore[arg-type]
    reader = Vectors(config(Embedder(), ["t"]))  # type: ignore[arg-type]
    model = Model(writer)
    put(kv, writer, ("a",), "k0", {"t": "v"})  # the counter's epoch is made
    model.put(("a",), "k0", {"t": "v"})
    check_all(kv, reader, model, rng)
    for steps in [3, 8, 9, 30, 1, 0, 8]:
        before = reader._cache
        for _ in range(steps):
            ns, key, value = ("a",), f"k{int(rng.integers(20))}", {"t": f"v{rng.random()}"}
            put(kv, writer, ns, key, value)
            model.put(ns, key, value)
        check_all(kv, reader, model, rng)
        assert (reader._cache is before) == (steps <= 8), steps  # replayed, or rebuilt
        with kv.read() as txn:
            log = [unpack(key)[3] for key, _ in txn.scan(*vmod.log_range(0, 10**9))]
            _, seq = vmod.read_counter(txn)
        # the last 8 at least, trimmed 4 at a time
        assert log == list(range(max(1, seq - 7 - seq % 4), seq + 1)), seq


def test_a_reader_behind_the_cache_sees_its_own_snapshot(numpy_kv: Store) -> None:
    """One thread's snapshot older than the cache another thread brought forward."""
    kv = numpy_kv
    rng = np.random.default_rng(9)
    vectors = Vectors(config(Embedder(), ["t"]))  # type: ignore[arg-type]
    model = Model(vectors)
    for i in range(20):
        put(kv, vectors, ("a",), f"k{i}", {"t": f"v{i}"})
        model.put(("a",), f"k{i}", {"t": f"v{i}"})
    check_all(kv, vectors, model, rng)
    old = model.copy()
    with kv.read() as old_txn:
        old_txn.get(vmod.COUNTER_KEY)  # the snapshot is taken
        for i in range(5):  # changes after it, which the cache then takes in
            put(kv, vectors, ("a",), f"k{i}", {"t": f"w{i}"} if i % 2 else None)
            model.put(("a",), f"k{i}", {"t": f"w{i}"} if i % 2 else None)
        put(kv, vectors, ("a", "b"), "new", {"t": "new"})
        model.put(("a", "b"), "new", {"t": "new"})
        check_all(kv, vectors, model, rng)
        for prefix in [(), ("a",), ("a", "b")]:
            q = fake_vector("v3")
            got = list(vectors.ranked(old_txn, q, prefix))
            check_ranked(got, brute_force(old, q, prefix))
    check_all(kv, vectors, model, rng)


def test_a_search_in_a_write_transaction_sees_its_writes_and_a_rollback_leaves_no_trace(
    kv: Store,
) -> None:
    rng = np.random.default_rng(13)
    vectors = vectors_on(kv, config(Embedder(), ["t"]))
    model = Model(vectors)

    class Rollback(Exception):
        pass

    for first in [True, False]:  # the txn that makes the counter, and a later one
        inside = model.copy()
        with pytest.raises(Rollback), kv.write() as txn:
            for i in range(6):
                value = {"t": f"x{i}"}
                texts = vectors.texts(value, None)
                embedded = vectors.embed_texts([t for _, t in texts])
                vectors.write(
                    txn,
                    ("a",),
                    f"k{i}",
                    [(f, v) for (f, _), v in zip(texts, embedded)],
                    stored=True,
                )
                inside[(("a",), f"k{i}")] = [np.frombuffer(v, np.float32) for v in embedded]
            vmod.delete_vectors(txn, ("a",), "k0")
            del inside[(("a",), "k0")]
            q = fake_vector("x3")
            check_ranked(list(vectors.ranked(txn, q, ())), brute_force(inside, q, ()))
            raise Rollback
        check_all(kv, vectors, model, rng)  # none of it
        if first:
            for i in range(3):
                put(kv, vectors, ("b",), f"k{i}", {"t": f"y{i}"})
                model.put(("b",), f"k{i}", {"t": f"y{i}"})
            check_all(kv, vectors, model, rng)


def test_an_emptied_store_written_again_is_not_taken_for_the_old_one(kv: Store) -> None:
    rng = np.random.default_rng(17)
    vectors = vectors_on(kv, config(Embedder(), ["t"]))
    model = Model(vectors)
    for i in range(4):
        put(kv, vectors, ("a",), f"k{i}", {"t": f"v{i}"})
        model.put(("a",), f"k{i}", {"t": f"v{i}"})
    check_all(kv, vectors, model, rng)
    with kv.write() as txn:
        txn.delete_range(None, None)
    model = Model(vectors)
    for i in range(4):  # the same number of changes: seq 4 again
        put(kv, vectors, ("b",), f"k{i}", {"t": f"w{i}"})
        model.put(("b",), f"k{i}", {"t": f"w{i}"})
    check_all(kv, vectors, model, rng)


# -- another process ---------------------------------------------------------------


def serve(path: str) -> None:
    """A second process on the store: JSON commands on stdin, one answer line
    each on stdout, after the command's transaction committed."""
    import json
    import sys

    vectors = Vectors(config(Embedder(), ["t", "u[*]"]))  # type: ignore[arg-type]
    with LMDBStore(path) as store:
        for line in sys.stdin:
            cmd = json.loads(line)
            ns = tuple(cmd.get("ns", ()))
            if cmd["op"] == "put":
                put(store, vectors, ns, cmd["key"], cmd["value"])
                out: Any = "ok"
            elif cmd["op"] == "del":
                put(store, vectors, ns, cmd["key"], None)
                out = "ok"
            else:
                out = ranked(store, vectors, cmd["query"], tuple(cmd["prefix"]))
            print(json.dumps(out), flush=True)


def test_two_processes_see_each_others_acknowledged_writes(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    path = str(tmp_path / "db")
    tests = str(Path(__file__).parent)
    child = subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {tests!r}); "
         f"from test_kvstore_vectors import serve; serve({path!r})"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdin is not None and child.stdout is not None

    def ask(**cmd: Any) -> Any:
        child.stdin.write(json.dumps(cmd) + "\n")  # type: ignore[union-attr]
        child.stdin.flush()  # type: ignore[union-attr]
        return json.loads(child.stdout.readline())  # type: ignore[union-attr]

    try:
        rng = np.random.default_rng(21)
        vectors = Vectors(config(Embedder(), ["t", "u[*]"]))  # type: ignore[arg-type]
        model = Model(vectors)
        with LMDBStore(path) as store:
            for step in range(120):
                ns = NAMESPACES[int(rng.integers(3))]
                key = f"k{int(rng.integers(25))}"
                value = (
                    None
                    if rng.random() < 0.2
                    else {"t": f"t{step}", "u": [f"u{step}"] * int(rng.integers(3))}
                )
                mine = step % 3 == 0
                if mine:
                    put(store, vectors, ns, key, value)
                elif value is None:
                    assert ask(op="del", ns=ns, key=key) == "ok"
                else:
                    assert ask(op="put", ns=ns, key=key, value=value) == "ok"
                model.put(ns, key, value)
                query, prefix = f"t{step}", ("a",) if step % 2 else ()
                want = brute_force(model.stored, fake_vector(query), prefix)
                check_ranked(ranked(store, vectors, query, prefix), want)
                theirs = [
                    (tuple(ns), k, s) for ns, k, s in ask(op="rank", query=query, prefix=prefix)
                ]
                check_ranked(theirs, want)
    finally:
        child.stdin.close()
        assert child.wait(timeout=60) == 0


def test_ranked_without_vecdot_is_the_same(kv: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy before 2.0 has no vecdot: einsum computes the same ranking."""
    rng = np.random.default_rng(23)
    vectors = vectors_on(kv, config(Embedder(), ["t"]))
    model = Model(vectors)
    for i in range(60):
        put(kv, vectors, NAMESPACES[i % 3], f"k{i}", {"t": f"v{i}"})
        model.put(NAMESPACES[i % 3], f"k{i}", {"t": f"v{i}"})
    check_all(kv, vectors, model, rng)
    if hasattr(np, "vecdot"):
        monkeypatch.delattr(np, "vecdot")
    check_all(kv, vectors, model, rng)


def test_threads_searching_while_one_writes_each_see_their_snapshot(tmp_path: Path) -> None:
    """Readers on threads, each at its own snapshot, while a writer commits:
    each search equals the brute force of the state its snapshot holds (the
    cache is brought forward by one reader while another is behind it)."""
    import threading

    rng = np.random.default_rng(29)
    vectors = Vectors(config(Embedder(), ["t"]))  # type: ignore[arg-type]
    model = Model(vectors)
    ops = []
    states = {0: model.copy()}
    for seq in range(1, 201):  # every op changes vectors: one seq each
        ns, key = NAMESPACES[int(rng.integers(3))], f"k{int(rng.integers(30))}"
        value = {"t": f"v{seq}"}
        ops.append((ns, key, value))
        model.put(ns, key, value)
        states[seq] = model.copy()
    problems: list[str] = []
    with LMDBStore(tmp_path / "db") as store:
        done = threading.Event()

        def write() -> None:
            try:
                for ns, key, value in ops:
                    put(store, vectors, ns, key, value)
            finally:
                done.set()

        def read(i: int) -> None:
            checked = 0
            while not done.is_set() or checked < 5:
                with store.read() as txn:
                    _, seq = vmod.read_counter(txn)
                    q = fake_vector(f"q{i}.{checked}")
                    prefix = ("a",) if checked % 2 else ()
                    got = list(vectors.ranked(txn, q, prefix))
                want = brute_force(states[seq], q, prefix)
                if [g[:2] for g in got] != [w[:2] for w in want]:
                    problems.append(f"reader {i} at seq {seq}")
                checked += 1

        threads = [threading.Thread(target=write)]
        threads += [threading.Thread(target=read, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert not problems, problems[:5]


# -- hostile names on LMDB ---------------------------------------------------------

HOSTILE_NAMESPACES = [
    ("🙂",),
    ("L" * 10_000,),
    ("L" * 10_000, "🙂"),
    tuple(f"{i:02d}" + "d" * 62 for i in range(12)),  # 12 labels of 64: past one key
    (*(f"{i:02d}" + "d" * 62 for i in range(11)), "other"),
    tuple(f"{i:02d}" + "🙂" * 62 for i in range(12)),
]
HOSTILE_KEYS = ["", "a\x00b", "🙂", "K" * 10_000, "\x00" * 10_000]  # NULs: escaped, longer
HOSTILE_FIELDS = ["t", "a\x00b", "🙂", "F" * 10_000, "\x00" * 47]


def vector_keys(store: Any) -> list[bytes]:
    with store.store.read() as txn:
        return [key for key, _ in txn.scan(*vmod.namespace_range(())[:2])]


def test_hostile_names_put_search_and_delete_on_lmdb(tmp_path: Path) -> None:
    from kvsaver import KVStore

    cases = [
        (ns, key, field)
        for ns in HOSTILE_NAMESPACES
        for key, field in zip(HOSTILE_KEYS, HOSTILE_FIELDS[::-1])
    ] + [(HOSTILE_NAMESPACES[3], f"{j}" + "K" * 10_000, f) for j, f in enumerate(HOSTILE_FIELDS)]
    with KVStore(tmp_path / "db", index=config(Embedder(), ["t"])) as store:  # type: ignore[arg-type]
        for i, (ns, key, field) in enumerate(cases):
            store.put(ns, key, {field: f"text {i}"}, index=[field])
        assert len(vector_keys(store)) == len(cases)
        for i, (ns, key, field) in enumerate(cases):
            item = store.get(ns, key)
            assert item is not None and item.value == {field: f"text {i}"}
            for prefix in (ns, ns[:-1], ()):
                hits = store.search(prefix, query=f"text {i}", limit=len(cases))
                assert (hits[0].namespace, hits[0].key) == (ns, key)
                assert hits[0].score == pytest.approx(1.0)
                assert all(h.namespace[: len(prefix)] == prefix for h in hits)
        # a prefix past the budget: its range holds a sibling, the records tell them apart
        deep, sibling = HOSTILE_NAMESPACES[3], HOSTILE_NAMESPACES[4]
        got = {(h.namespace, h.key) for h in store.search(deep, query="text 0", limit=100)}
        assert got == {(ns, key) for ns, key, _ in cases if ns == deep}
        assert not any(ns == sibling for ns, _ in got)
        for n, (ns, key, _field) in enumerate(cases, 1):
            store.delete(ns, key)
            assert len(vector_keys(store)) == len([c for c in cases[n:] if c[:2] != (ns, key)])
            hits = store.search((), query="text 0", limit=len(cases))
            assert (ns, key) not in {(h.namespace, h.key) for h in hits}
        assert vector_keys(store) == []


def test_a_prefix_past_the_budget_read_from_the_transaction_is_filtered(tmp_path: Path) -> None:
    """A search in the transaction that made the counter reads the records
    from ``txn`` (no cache can stand for it): the range of a prefix past
    the key budget holds its siblings, which the search leaves out."""
    deep, sibling = HOSTILE_NAMESPACES[3], HOSTILE_NAMESPACES[4]
    vectors = Vectors(config(Embedder()))  # type: ignore[arg-type]
    with LMDBStore(tmp_path / "db") as store, store.write() as txn:
        for ns in (deep, sibling):
            vectors.write(txn, ns, "k", [("$", fake_vector("q"))], stored=True)
        assert {ns for ns, _, _ in vectors.ranked(txn, fake_vector("q"), deep)} == {deep}
        assert {ns for ns, _, _ in vectors.ranked(txn, fake_vector("q"), deep[:5])} == {
            deep,
            sibling,
        }


def test_a_store_opened_without_its_index_removes_vectors_it_deletes(tmp_path: Path) -> None:
    """``kvsaver sweep`` and other tools open a KVStore without its index
    config: the items they delete, sweep or overwrite take their vectors
    with them (no stale rows for the next indexed search)."""
    from kvsaver import KVStore

    index = {"dims": 2, "embed": lambda texts: [[1.0, 0.0]] * len(texts), "fields": ["t"]}
    path = str(tmp_path / "s")
    with KVStore(path, index=index) as store:  # type: ignore[arg-type]
        store.put(("a",), "swept", {"t": "x"}, ttl=0.0001)
        store.put(("a",), "deleted", {"t": "x"})
        store.put(("a",), "overwritten", {"t": "x"})
        store.put(("a",), "kept", {"t": "x"})
        assert len(vector_keys(store)) == 4
    time.sleep(0.05)
    with KVStore(path) as plain:
        assert plain.sweep_ttl() == 1
        plain.delete(("a",), "deleted")
        plain.put(("a",), "overwritten", {"t": "y"})
        assert len(vector_keys(plain)) == 1
    with KVStore(path, index=index) as store:  # type: ignore[arg-type]
        assert [i.key for i in store.search(("a",), query="x")][:1] == ["kept"]
