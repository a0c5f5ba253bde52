"""KVStore's search by meaning on PostgreSQL with pgvector (the session's
second cluster, tests/pg_helpers.py: the pgserver wheel's binaries): the
server ranks, and the results equal the numpy path's (a KVStore in memory
given the same operations) exactly, scores included; a vector row lives and
dies with its record (failed puts, deletes, TTL sweeps, rollbacks); stores
see each other's writes; a table made after records were written is filled
from them; an HNSW index is approximate but finds most of the nearest."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
from kvsaver import KVStore
from kvsaver.kv.postgres import txn as pgtxn
from kvsaver.kv.postgres.statements import _register_arrays
from kvsaver.kvstore import vectors as vmod
from kvsaver.kvstore.vectors import Vectors
from langgraph.store.base import PutOp, SearchOp
from pg_helpers import drop_tables, unique_table
from psycopg import sql

DIMS = 8
TEXTS = [f"t{i}" for i in range(40)] + ["zero", "same-a", "same-b"]


def vector_of(text: str, dims: int = DIMS) -> list[float]:
    """A seeded float32 vector per text; "zero" is the zero vector and the
    two "same-" texts one vector (exact ties)."""
    if text == "zero":
        return [0.0] * dims
    text = "same" if text.startswith("same-") else text
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    return [float(x) for x in np.random.default_rng(seed).standard_normal(dims).astype(np.float32)]


def embed(texts: list[str]) -> list[list[float]]:
    return [vector_of(t) for t in texts]


INDEX: dict[str, Any] = {"dims": DIMS, "embed": embed, "fields": ["text", "tags[*]"]}


@pytest.fixture
def table(pgvector_url: str) -> Iterator[str]:
    name = unique_table("pgv")
    yield name
    drop_tables(pgvector_url, [f"{name}_vectors", name])


def count_vectors(url: str, table: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{table}_vectors"').fetchone()
        assert row is not None
        return int(row[0])


def vector_records(store: KVStore) -> int:
    with store.store.read() as txn:
        return sum(1 for _ in txn.scan(*vmod.namespace_range(())[:2]))


def results(store: KVStore, op: SearchOp) -> list[tuple[Any, ...]]:
    return [(tuple(i.namespace), i.key, i.value, i.score) for i in store.batch([op])[0]]


def test_search_equals_the_numpy_path(pgvector_url: str, table: str) -> None:
    """Seeded random puts, re-puts, deletes, unindexed puts, nested
    namespaces, zero vectors and ties; every search (prefixes, filters,
    offsets, limits) equals the numpy path's, scores to the bit."""
    rng = np.random.default_rng(2024)
    pg = KVStore(pgvector_url, index=INDEX, table=table)
    ref = KVStore(":memory:", index=INDEX)
    assert pg._vectors is not None and pg._vectors.server
    assert ref._vectors is not None and not ref._vectors.server
    spaces = [("a",), ("a", "b"), ("a", "b", "c"), ("b",), ("a", "x" * 300)]

    def value() -> dict[str, Any]:
        v: dict[str, Any] = {"text": str(rng.choice(TEXTS)), "n": int(rng.integers(4))}
        if rng.random() < 0.4:
            v["tags"] = [str(t) for t in rng.choice(TEXTS, int(rng.integers(1, 3)))]
        return v

    checked = 0
    for _ in range(25):
        ops: list[Any] = []
        for _ in range(int(rng.integers(5, 30))):
            ns = spaces[int(rng.integers(len(spaces)))]
            key = f"k{int(rng.integers(60))}"
            r = rng.random()
            if r < 0.15:
                ops.append(PutOp(ns, key, None))
            elif r < 0.25:
                ops.append(PutOp(ns, key, value(), index=False))
            else:
                ops.append(PutOp(ns, key, value()))
        # one batch's ops on one key: the last one counts on both stores
        pg.batch(ops)
        ref.batch(ops)
        for _ in range(6):
            prefix = spaces[int(rng.integers(len(spaces)))][: int(rng.integers(0, 3))]
            query = str(rng.choice([*TEXTS, "zero"]))
            filt = {"n": int(rng.integers(4))} if rng.random() < 0.3 else None
            op = SearchOp(prefix, filt, int(rng.integers(0, 40)), int(rng.integers(0, 20)), query)
            assert results(pg, op) == results(ref, op), op
            checked += 1
    # past a page of the server's (64 records): everything, in order
    op = SearchOp((), None, 1000, 0, "t1")
    got = results(pg, op)
    assert len(got) > 64 and got == results(ref, op)
    assert count_vectors(pgvector_url, table) == vector_records(pg)
    pg.close()


def test_a_failed_put_leaves_no_vector_row(pgvector_url: str, table: str) -> None:
    calls: list[int] = []

    def flaky(texts: list[str]) -> list[list[float]]:
        calls.append(1)
        if any(t == "boom" for t in texts):
            raise RuntimeError("embedder down")
        return embed(texts)

    store = KVStore(pgvector_url, index={**INDEX, "embed": flaky}, table=table)
    store.put(("n",), "ok", {"text": "t1"})
    with pytest.raises(RuntimeError, match="embedder down"):
        store.batch([PutOp(("n",), "k1", {"text": "t2"}), PutOp(("n",), "k2", {"text": "boom"})])
    with pytest.raises((TypeError, ValueError)):
        store.put(("n",), "k3", "not a dict")  # type: ignore[arg-type]
    assert count_vectors(pgvector_url, table) == 1
    # a transaction that wrote an item's vector and then failed: neither stays
    vectors = store._vectors
    assert vectors is not None
    with pytest.raises(KeyError), store.store.write() as txn:
        vectors.write(txn, ("n",), "k4", [("text", vector_of("t3"))], stored=False)
        raise KeyError("rolled back")
    assert count_vectors(pgvector_url, table) == 1
    assert [i.key for i in store.search(("n",), query="t3")] == ["ok"]
    store.close()


def test_deletes_and_the_ttl_sweep_remove_vector_rows(pgvector_url: str, table: str) -> None:
    store = KVStore(pgvector_url, index=INDEX, table=table, ttl={"default_ttl": None})
    store.put(("n",), "short", {"text": "t1", "tags": ["t2"]}, ttl=0.3 / 60)
    store.put(("n",), "long", {"text": "t3"})
    store.put(("n",), "gone", {"text": "t4"})
    assert count_vectors(pgvector_url, table) == 4
    store.delete(("n",), "gone")
    assert count_vectors(pgvector_url, table) == 3
    store.put(("n",), "long", {"text": "t5"}, index=False)  # put without vectors: they go
    assert count_vectors(pgvector_url, table) == 2
    time.sleep(0.4)
    assert store.sweep_ttl() == 1
    assert count_vectors(pgvector_url, table) == 0 == vector_records(store)
    assert store.search(("n",), query="t1") != []  # "long", unranked
    store.close()


def test_a_key_deleted_after_its_vector_was_put_takes_it_along(
    pgvector_url: str, table: str
) -> None:
    """In one transaction: a new key and its vector put, then the key deleted
    (by itself, and in a range), before anything is sent: nothing stays."""
    store = KVStore(pgvector_url, index=INDEX, table=table)
    vec = np.asarray(vector_of("t1"), dtype=np.float32).tobytes()
    with store.store.write() as txn:
        txn.put(b"\x01one", b"v")
        txn.put_vector(b"\x01one", vec)  # type: ignore[attr-defined]
        assert txn.delete(b"\x01one")
        txn.put(b"\x01two", b"v")
        txn.put_vector(b"\x01two", vec)  # type: ignore[attr-defined]
        assert txn.delete_range(b"\x01t", b"\x01u") == 1
    assert count_vectors(pgvector_url, table) == 0
    with store.store.read() as txn:
        assert txn.get(b"\x01one") is None and txn.get(b"\x01two") is None
    store.close()


def test_two_stores_see_each_others_writes(pgvector_url: str, table: str) -> None:
    one = KVStore(pgvector_url, index=INDEX, table=table)
    two = KVStore(pgvector_url, index=INDEX, table=table)
    one.put(("n",), "a", {"text": "t1"})
    assert [i.key for i in two.search(("n",), query="t1")] == ["a"]
    two.put(("n",), "b", {"text": "t1"})
    two.delete(("n",), "a")
    assert [i.key for i in one.search(("n",), query="t1")] == ["b"]
    one.close()
    two.close()


def test_a_table_made_after_records_were_written_is_filled(
    pgvector_url: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records written by a KVStore that did not use pgvector (as one made
    before the server had it): the first store that does fills the table."""
    with monkeypatch.context() as m:
        m.setattr(Vectors, "attach", lambda self, store: None)
        before = KVStore(pgvector_url, index=INDEX, table=table)
        for i in range(30):
            before.put(("n", str(i % 3)), f"k{i}", {"text": f"t{i}", "tags": ["zero"]})
        ref = [(i.key, i.score) for i in before.search(("n",), query="t7", limit=50)]
        before.close()
    monkeypatch.setattr(pgtxn, "VECTORS_EACH", 7)  # the fill sent in statements of 7
    after = KVStore(pgvector_url, index=INDEX, table=table)
    assert after._vectors is not None and after._vectors.server
    assert count_vectors(pgvector_url, table) == 60
    assert [(i.key, i.score) for i in after.search(("n",), query="t7", limit=50)] == ref
    after.close()


def test_a_table_name_of_capitals_finds_its_vectors(pgvector_url: str) -> None:
    """The vectors' table is looked up quoted, as it is made: a second
    store, read-only or not, finds it (and fills nothing again)."""
    name = "Pgv" + unique_table("Cap")
    try:
        one = KVStore(pgvector_url, index=INDEX, table=name)
        one.put(("n",), "a", {"text": "t1"})
        two = KVStore(pgvector_url, index=INDEX, table=name, readonly=True)
        assert one._vectors is not None and one._vectors.server
        assert two._vectors is not None and two._vectors.server
        assert [i.key for i in two.search(("n",), query="t1")] == ["a"]
        with psycopg.connect(pgvector_url, autocommit=True) as conn:
            q = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(f"{name}_vectors"))
            assert conn.execute(q).fetchone() == (1,)
        one.close()
        two.close()
    finally:
        drop_tables(pgvector_url, [f"{name}_vectors", name])


def test_a_role_that_may_not_make_the_table_ranks_here(pgvector_url: str, table: str) -> None:
    """pgvector installed, but the store's role may only read and write its
    table: the store opens and searches on the numpy path."""
    KVStore(pgvector_url, table=table).close()  # the table, made by its owner
    role = "app_" + table
    with psycopg.connect(pgvector_url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(
                sql.Identifier(table), sql.Identifier(role)
            )
        )
    try:
        url = pgvector_url.replace("postgresql://postgres@", f"postgresql://{role}@")
        store = KVStore(url, index=INDEX, table=table)
        assert store._vectors is not None and not store._vectors.server
        store.put(("n",), "a", {"text": "t1"})
        assert [i.key for i in store.search(("n",), query="t1")] == ["a"]
        store.close()
    finally:
        with psycopg.connect(pgvector_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_ann_index_config_kinds(pgvector_url: str, table: str) -> None:
    for bad, match in [
        ({"kind": "ivfflat"}, "kind 'ivfflat' is not supported"),
        ({"kind": "nope"}, "kind 'nope'"),
        ({"kind": "hnsw", "lists": 3}, "takes no"),
        ({"kind": "hnsw", "m": 0}, "positive int"),
        ({"vector_type": "bit"}, "vector_type"),
    ]:
        with pytest.raises(ValueError, match=match):
            KVStore(":memory:", index={**INDEX, "ann_index_config": bad})
    for exact in [{"kind": "flat"}, {"vector_type": "halfvec"}, {}]:  # no kind: exact
        flat = KVStore(pgvector_url, index={**INDEX, "ann_index_config": exact}, table=table)
        assert flat._vectors is not None and flat._vectors.server and flat._vectors.hnsw is None
        flat.close()
    with pytest.raises(ValueError, match="dims"):
        KVStore(pgvector_url, index={**INDEX, "dims": DIMS + 1}, table=table)


def test_hnsw_finds_most_of_the_nearest(pgvector_url: str, table: str) -> None:
    dims, n = 32, 3000
    rng = np.random.default_rng(5)
    matrix = rng.standard_normal((n, dims)).astype(np.float32)
    by_text = {f"v{i}": matrix[i].tolist() for i in range(n)}
    queries = rng.standard_normal((20, dims)).astype(np.float32)
    by_text.update({f"q{i}": queries[i].tolist() for i in range(len(queries))})
    cfg = {
        "dims": dims,
        "embed": lambda texts: [by_text[t] for t in texts],
        "fields": ["text"],
        "ann_index_config": {"kind": "hnsw", "m": 16, "ef_construction": 64},
    }
    store = KVStore(pgvector_url, index=cfg, table=table)  # type: ignore[arg-type]
    assert store._vectors is not None and store._vectors.hnsw == {"m": 16, "ef_construction": 64}
    store.batch([PutOp(("n",), f"k{i}", {"text": f"v{i}"}) for i in range(n)])
    vq = store.store._vq  # type: ignore[attr-defined]
    with psycopg.connect(pgvector_url, autocommit=True) as conn:  # the search asks the index
        _register_arrays(conn)
        vector = vq.vector(queries[0].tobytes())
        low, high = vmod.namespace_range(())[:2]
        params = (vector, vector, 40, low, high, 10, 0)
        plan = conn.execute(sql.SQL("EXPLAIN ") + vq.nearest.text, params).fetchall()
    assert f"Index Scan using {table}_vectors_hnsw" in " ".join(r[0] for r in plan)
    unit = matrix / np.linalg.norm(matrix, axis=1)[:, None]
    found = 0
    for i, q in enumerate(queries):
        exact = {f"k{j}" for j in np.argsort(-(unit @ q))[:10]}
        found += len(exact & {it.key for it in store.search(("n",), query=f"q{i}", limit=10)})
    assert found / (10 * len(queries)) >= 0.95
    # One namespace of many: the index's nearest hold few of it, and the
    # rest come in exact order, so a search still fills its limit.
    store.batch([PutOp(("m", f"u{i % 30}"), f"k{i}", {"text": f"v{i}"}) for i in range(n)])
    for i in range(5):
        got = store.search(("m", f"u{i}"), query=f"q{i}", limit=10)
        assert len(got) == 10 and all(it.namespace == ("m", f"u{i}") for it in got)
        assert len({it.key for it in got}) == 10
    store.close()


def test_near_ties_across_the_servers_pages_come_in_numpy_order(
    pgvector_url: str, table: str
) -> None:
    """Vectors a float32 rounding apart: pgvector's cosine orders some pairs
    the other way round from numpy's; at the edge of a page of the server's
    the ranking still yields numpy's order, item by item."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal(DIMS).astype(np.float32)
    near = (base + rng.standard_normal((400, DIMS)).astype(np.float32) * 1e-6).astype(np.float32)
    by_text = {f"v{i}": near[i].tolist() for i in range(len(near))}
    by_text["q"] = rng.standard_normal(DIMS).astype(np.float32).tolist()
    cfg = {"dims": DIMS, "embed": lambda texts: [by_text[t] for t in texts], "fields": ["t"]}
    pg = KVStore(pgvector_url, index=cfg, table=table)  # type: ignore[arg-type]
    ref = KVStore(":memory:", index=cfg)  # type: ignore[arg-type]
    ops = [PutOp(("n",), f"k{i:03d}", {"t": f"v{i}"}) for i in range(len(near))]
    pg.batch(ops)
    ref.batch(ops)

    def ranked(store: KVStore) -> list[Any]:
        vectors = store._vectors
        assert vectors is not None
        with store.store.read() as txn:
            return list(vectors.ranked(txn, by_text["q"], ("n",)))

    assert pg._vectors is not None and pg._vectors.server
    assert ranked(pg) == ranked(ref)
    pg.close()
