"""KVStore against InMemoryStore (the reference, ``kvstore_helpers.Reference``):
random batches of every op, on each backend, with hostile namespaces and
keys; every result equal, orders of search and list_namespaces included
(timestamps aside: see ``comparable``)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvstore_helpers import STORE_BACKENDS, Reference, comparable, embed, open_store
from langgraph.store.base import GetOp, ListNamespacesOp, MatchCondition, PutOp, SearchOp

LONG = "L" * 10_000
LABELS = ["a", "b", "c", "é", "🙂", "*", "x" * 120, LONG, "a b", "\xff\u0100"]
KEYS = ["k", "", "a\x00b", "🙂", "K" * 10_000, "k2", "\x00", "\U0010ffff"]

labels = st.sampled_from(LABELS)
namespaces = st.lists(labels, min_size=1, max_size=3).map(tuple)
keys = st.sampled_from(KEYS)
values = st.fixed_dictionaries(
    {"n": st.one_of(st.integers(-3, 3), st.sampled_from([0.5, -1.5, 2.0]))},
    optional={
        "s": st.sampled_from(["x", "y", "", "🙂"]),
        "t": st.fixed_dictionaries({"u": st.integers(0, 3)}),
        "l": st.lists(st.integers(0, 2), max_size=2),
    },
)
filters = st.one_of(
    st.none(),
    st.sampled_from(
        [
            {"n": 1},
            {"n": {"$gt": 0}},
            {"n": {"$gte": 0.5, "$lt": 3}},
            {"n": {"$lte": -1}},
            {"n": {"$ne": 2}},
            {"s": "x"},
            {"s": {"$eq": "y"}},
            {"s": {"$ne": "x"}},
            {"t": {"u": 2}},
            {"t": {"u": {"$gt": 1}}},
            {"l": [1]},
            {"n": {"$gt": -5}, "s": "🙂"},
        ]
    ),
)
puts = st.builds(
    lambda n, k, v: PutOp(n, k, v), namespaces, keys, st.one_of(st.none(), values, values)
)
gets = st.builds(lambda n, k: GetOp(n, k), namespaces, keys)
searches = st.builds(
    lambda p, f, limit, offset: SearchOp(p, f, limit, offset),
    st.lists(labels, max_size=2).map(tuple),
    filters,
    st.integers(0, 6),
    st.integers(0, 3),
)
paths = st.lists(st.one_of(labels, st.just("*")), min_size=1, max_size=2).map(tuple)
conditions = st.lists(
    st.builds(MatchCondition, st.sampled_from(["prefix", "suffix"]), paths), max_size=2
).map(tuple)
lists = st.builds(
    ListNamespacesOp,
    conditions,
    st.one_of(st.none(), st.integers(0, 3)),
    st.integers(0, 8),
    st.integers(0, 3),
)
ops = st.one_of(puts, puts, gets, searches, lists)
batches = st.lists(st.lists(ops, min_size=1, max_size=4), min_size=1, max_size=12)


def _check(store: Any, program: list[list[Any]], ref: Reference | None = None) -> None:
    ref = Reference() if ref is None else ref
    for batch in program:
        want = comparable(ref.batch(batch), expected=True)
        got = comparable(store.batch(batch))
        assert got == want, batch
    # and the whole contents at the end, in search order
    whole = SearchOp((), None, 10_000, 0)
    assert comparable(store.batch([whole])) == comparable(ref.batch([whole]), expected=True)


_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("backend", [b for b in STORE_BACKENDS if b != "postgres"])
@settings(max_examples=60, **_SETTINGS)  # type: ignore[arg-type]
@given(program=batches)
def test_differential_local(backend: str, program: list[list[Any]]) -> None:
    with open_store(backend) as store:
        _check(store, program)


@settings(max_examples=12, **_SETTINGS)  # type: ignore[arg-type]
@given(program=batches)
def test_differential_postgres(pg_server: Any, program: list[list[Any]]) -> None:
    with open_store("postgres") as store:
        _check(store, program)


@pytest.mark.parametrize("backend", STORE_BACKENDS)
def test_async_batches_equal_sync(backend: str, request: pytest.FixtureRequest) -> None:
    """abatch runs the same core: a fixed program through abatch equals the
    reference too."""
    import asyncio

    if backend == "postgres":
        request.getfixturevalue("pg_server")
    program = [
        [PutOp(("a",), "k", {"n": 1}), PutOp(("a", "b"), "k2", {"n": 2})],
        [GetOp(("a",), "k"), SearchOp(("a",), None, 10, 0)],
        [PutOp(("a",), "k", None), ListNamespacesOp(None, None, 10, 0)],
        [SearchOp((), {"n": {"$gt": 1}}, 10, 0), ListNamespacesOp(None, 1, 10, 0)],
    ]
    ref = Reference()
    with open_store(backend) as store:

        async def run() -> None:
            for batch in program:
                assert comparable(await store.abatch(batch)) == comparable(ref.batch(batch), True)

        asyncio.run(run())


# -- search by meaning ------------------------------------------------------------
# Every value has a "text" (the one indexed field) from a small pool, so equal
# texts tie exactly: ties come back in insertion order, as InMemoryStore's
# stable sort returns them. (InMemoryStore keeps an item's old vectors when a
# later put indexes other fields or none; KVStore replaces them, so the
# program re-puts only the same field.)

INDEX = {"dims": 8, "embed": embed, "fields": ["text"]}
texts = st.sampled_from(["red apple", "green apple", "blue sky", "🙂", "apple pie"])
text_values = st.builds(lambda v, t: {**v, "text": t}, values, texts)
vector_puts = st.builds(
    lambda n, k, v: PutOp(n, k, v), namespaces, keys, st.one_of(st.none(), text_values, text_values)
)
unindexed = st.builds(lambda n, v: PutOp(n, "unindexed", v, index=False), namespaces, values)
queries = st.builds(
    lambda p, f, limit, offset, q: SearchOp(p, f, limit, offset, q),
    st.lists(labels, max_size=2).map(tuple),
    filters,
    st.integers(0, 6),
    st.integers(0, 3),
    st.one_of(texts, st.just("apple")),
)
vector_ops = st.one_of(vector_puts, vector_puts, unindexed, gets, queries, queries)
vector_batches = st.lists(st.lists(vector_ops, min_size=1, max_size=4), min_size=1, max_size=10)


@pytest.mark.parametrize("backend", [b for b in STORE_BACKENDS if b != "postgres"])
@settings(max_examples=40, **_SETTINGS)  # type: ignore[arg-type]
@given(program=vector_batches)
def test_differential_search_by_meaning(backend: str, program: list[list[Any]]) -> None:
    with open_store(backend, index=INDEX) as store:
        _check(store, program, Reference(index=INDEX))  # type: ignore[arg-type]


@settings(max_examples=8, **_SETTINGS)  # type: ignore[arg-type]
@given(program=vector_batches)
def test_differential_search_by_meaning_postgres(pg_server: Any, program: list[list[Any]]) -> None:
    with open_store("postgres", index=INDEX) as store:
        _check(store, program, Reference(index=INDEX))  # type: ignore[arg-type]


@settings(max_examples=8, **_SETTINGS)  # type: ignore[arg-type]
@given(program=vector_batches)
def test_differential_search_by_meaning_pgvector(program: list[list[Any]]) -> None:
    """Ranked by pgvector on the server (tests/test_kvstore_pgvector.py)."""
    with open_store("pgvector", index=INDEX) as store:
        assert store._vectors is not None and store._vectors.server
        _check(store, program, Reference(index=INDEX))  # type: ignore[arg-type]
