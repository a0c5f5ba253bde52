"""Helpers of the KVStore tests: the reference (InMemoryStore), stores on
each backend, results made comparable, and the workers the process tests
run as ``python tests/kvstore_helpers.py <worker> <json kwargs>``."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kvsaver import KVStore
from langgraph.store.base import Item, PutOp, SearchItem
from langgraph.store.memory import InMemoryStore

STORE_BACKENDS = ["memory", "lmdb", "postgres"]


class Reference(InMemoryStore):
    """InMemoryStore, less two artefacts of its ``defaultdict``, so that it
    is the reference of what a store holds: a read or a delete of a key in a
    namespace that holds nothing adds that namespace (to its listings, and
    at that place in its search order), and a namespace whose items were all
    deleted stays in ``list_namespaces`` (SqliteStore and PostgresStore list
    the namespaces of stored items, as KVStore does). And one bug: two puts
    of one batch with the same text to embed raise (``_insertinmem_store``)."""

    def _prepare_ops(self, ops: Any) -> Any:
        before = set(self._data)
        try:
            return super()._prepare_ops(ops)
        finally:
            self._forget_new_empty(before)

    def _apply_put_ops(self, put_ops: Any) -> None:
        for where, op in put_ops.items():  # one by one: a delete adds none either
            before = set(self._data)
            try:
                super()._apply_put_ops({where: op})
            finally:
                self._forget_new_empty(before)

    def _forget_new_empty(self, before: set[tuple[str, ...]]) -> None:
        for ns in [ns for ns, items in self._data.items() if not items and ns not in before]:
            del self._data[ns]

    def _insertinmem_store(self, to_embed: Any, embeddings: Any) -> None:
        # InMemoryStore embeds each distinct text once, then pairs the vectors
        # with every (namespace, key, path) and raises when two puts of one
        # batch share a text: here each text's vector goes to all of its places.
        for places, vector in zip(to_embed.values(), embeddings, strict=True):
            for ns, key, path in places:
                self._vectors[ns][key][path] = vector

    def _handle_list_namespaces(self, op: Any) -> Any:
        data = self._data
        self._data = {ns: items for ns, items in data.items() if items}  # type: ignore[assignment]
        try:
            return super()._handle_list_namespaces(op)
        finally:
            self._data = data


def embed(texts: list[str]) -> list[list[float]]:
    """A deterministic embedding (no network): a seeded random float32
    vector per text, so equal texts tie exactly and the stored float32
    vectors are the ones InMemoryStore computes with."""
    import hashlib

    import numpy as np

    out = []
    for text in texts:
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
        v = np.random.default_rng(seed).standard_normal(8).astype(np.float32)
        out.append([float(x) for x in v])
    return out


def comparable(result: Any, expected: bool = False) -> Any:
    """A batch result without timestamps (InMemoryStore sets created_at anew
    at each put; LangGraph's Item defines it as the item's creation);
    ``expected``: the reference's, its scores to within float32 rounding
    (vectors are stored as float32, InMemoryStore computes in float64)."""
    if isinstance(result, list):
        return [comparable(r, expected) for r in result]
    if isinstance(result, SearchItem):
        score = result.score
        if score is not None and expected:
            import pytest

            score = pytest.approx(score, abs=1e-5)
        return ("S", result.namespace, result.key, result.value, score)
    if isinstance(result, Item):
        return ("I", result.namespace, result.key, result.value)
    return result


@contextmanager
def backend_place(backend: str) -> Iterator[Any]:
    """Where a fresh KVStore on ``backend`` opens: ``":memory:"``, a temporary
    LMDB directory, or a PostgresStore on a fresh table of the session's
    server, through its shared pool (closed and dropped after); ``pgvector``:
    of the session's cluster with pgvector."""
    if backend == "memory":
        yield ":memory:"
        return
    if backend == "lmdb":
        with tempfile.TemporaryDirectory() as d:
            yield d
        return
    from kvsaver.kv import PostgresStore
    from pg_helpers import (
        drop_tables,
        shared_pgvector_server,
        shared_pool,
        shared_server,
        unique_table,
    )

    table = unique_table("kvs")
    if backend == "pgvector":  # the cluster with pgvector (its vectors' table goes first)
        url = shared_pgvector_server().url
        kv = PostgresStore(url, table=table, max_size=2)
        try:
            yield kv
        finally:
            kv.close()
            drop_tables(url, [f"{table}_vectors", table])
        return
    pool = shared_pool()
    pool.check()  # drop connections a server restart (test_postgres's faults) ended
    kv = PostgresStore(pool, table=table)
    try:
        yield kv
    finally:
        kv.close()
        drop_tables(shared_server().url, [table])


@contextmanager
def open_store(backend: str, **options: Any) -> Iterator[KVStore]:
    """A fresh KVStore on ``backend`` (``backend_place``), closed and removed after."""
    with backend_place(backend) as place:
        store = KVStore(place, **options)
        try:
            yield store
        finally:
            store.close()


def problems(store: KVStore) -> list[str]:
    """What is inconsistent among the store's records: every order entry names
    its item and every item its order entry, expiry entries and items agree,
    namespaces have both records, a namespace with an item put with a TTL
    says so (a torn write would break one of these)."""
    from kvsaver.kv.keys import unpack
    from kvsaver.kvstore import keyspace as KS

    out: list[str] = []
    with store.store.read() as txn:
        lo, hi = KS.store_range()
        rows = {k: v for k, v in txn.scan(lo, hi)}
    items: dict[tuple[int, bytes], KS.ItemRecord] = {}
    order: dict[tuple[int, int], bytes] = {}
    spaces: dict[int, tuple[str, ...]] = {}
    ttl: dict[int, bool] = {}
    ids: dict[int, tuple[str, ...]] = {}
    expiries: dict[tuple[int, int, int], bytes] = {}
    for k, v in rows.items():
        t = unpack(k)
        if t[1] == KS.ITEM:
            el = k[len(KS.item_key(t[2], b"")) :]
            items[(t[2], el)] = KS.decode_item(v)
        elif t[1] == KS.ORDER:
            order[(t[2], t[3])] = v
        elif t[1] == KS.NS:
            rec = KS.decode_namespace(v)
            spaces[rec.ns_id] = rec.labels
            ttl[rec.ns_id] = rec.ttl
        elif t[1] == KS.NS_ID:
            ids[t[2]] = KS.decode_labels(v)
        elif t[1] == KS.EXPIRY:
            expiries[KS.expiry_ids(k)] = v
    if spaces != ids:
        out.append(f"namespace records disagree: {spaces} vs {ids}")
    for (ns_id, el), rec in items.items():
        if ns_id not in ids:
            out.append(f"item {rec.key!r} of an unknown namespace {ns_id}")
        if el != KS.key_element(rec.key):
            out.append(f"item {rec.key!r} of {ns_id} under another key {el!r}")
        if order.get((ns_id, rec.seq)) != el:
            out.append(f"item {rec.key!r} of {ns_id} has no order entry")
        if rec.expires_ms is not None and expiries.get((rec.expires_ms, ns_id, rec.seq)) != el:
            out.append(f"item {rec.key!r} of {ns_id} has no expiry entry")
        if rec.ttl is not None and not ttl.get(ns_id):
            out.append(f"item {rec.key!r} of {ns_id} has a TTL, its namespace's ttl is unset")
    for (ns_id, seq), el in order.items():
        rec = items.get((ns_id, el))
        if rec is None or rec.seq != seq:
            out.append(f"order entry {ns_id}/{seq} without its item")
    for (expires, ns_id, seq), el in expiries.items():
        rec = items.get((ns_id, el))
        if rec is None or rec.expires_ms != expires or rec.seq != seq:
            out.append(f"expiry entry {expires}/{ns_id}/{seq} without its item")
    return out


# -- workers (separate processes) ------------------------------------------------


def _ack(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def writer(path: str, name: str, n: int, ack: str, pause: float = 0.0) -> None:
    """Put ``n`` items into ("w", name) (every other one with a TTL) and, in
    the same batch, ("shared",); acknowledge each after its batch returned."""
    with KVStore(path) as store:
        for i in range(n):
            store.batch(
                [
                    PutOp(
                        ("w", name),
                        f"k{i}",
                        {"i": i, "by": name, "pad": "x" * (i % 7) * 100},
                        ttl=60 if i % 2 else None,
                    ),
                    PutOp(("shared",), f"{name}-{i}", {"i": i}),
                ]
            )
            if i % 5 == 4:  # and rewrite an older one: updates are killed too
                store.put(("w", name), f"k{i - 3}", {"i": i - 3, "by": name, "again": True})
            _ack(ack, f"{name} {i}")
            if pause:
                time.sleep(pause)


def graph_writer(path: str, user: str, text: str, thread: str) -> None:
    """The memory graph of test_kvstore_graph.py, run once in this process."""
    sys.path.insert(0, os.path.dirname(__file__))
    from kvsaver import KVSaver
    from kvstore_graph import build

    with KVSaver(path) as saver, KVStore(path) as store:
        graph = build(saver, store)
        graph.invoke(
            {"text": text},
            {"configurable": {"thread_id": thread}},
            context={"user": user},
        )


def reader(path: str, out: str) -> None:
    """Every item of ("shared",) and the memories, as JSON in ``out``."""
    with KVStore(path, readonly=True) as store:
        shared = [i.key for i in store.search(("shared",), limit=100000)]
        memories = {".".join(i.namespace): i.value for i in store.search(("memories",), limit=1000)}
    with open(out, "w") as f:
        json.dump({"shared": shared, "memories": memories}, f)


if __name__ == "__main__":
    globals()[sys.argv[1]](**json.loads(sys.argv[2]))


def block_numpy(monkeypatch: Any) -> None:
    """Make ``import numpy`` fail for the rest of the test, as where it is
    not installed."""
    import builtins

    real_import = builtins.__import__

    def no_numpy(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "numpy" or name.startswith("numpy."):
            raise ImportError("No module named 'numpy'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_numpy)
