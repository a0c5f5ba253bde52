"""Vector search: KVStore's exact search on its cached matrix against
SqliteStore's (sqlite-vec) and two ANN indexes (usearch, faiss HNSW), on one
deterministic workload (seeded random unit vectors, no network).

    python scripts/bench_vectors.py [N ...]      # default: 10000 100000
    python scripts/bench_vectors.py --no-ann N   # KVStore and SqliteStore only

Needs numpy, usearch and faiss-cpu, and a Python whose sqlite3 can load
extensions (SqliteStore loads sqlite-vec). Query rounds rotate the order of
the systems; figures are medians. The results and the conclusion are in
docs/performance.md ("Vector search").
"""

from __future__ import annotations

import itertools
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

DIMS = 384
QUERIES = 40
K = 10
EFS = [64, 256, 1024, 4096]


def workload(n: int, dims: int = DIMS, seed: int = 0, queries: int = QUERIES) -> dict[str, Any]:
    """n documents {"text": "doc i"} in 10 namespaces ("docs", "u0".."u9"),
    each text's embedding a seeded random unit vector, and queries whose
    embeddings are random unit vectors of their own. ``embed`` maps texts to
    those vectors (a LangGraph embed function)."""
    rng = np.random.default_rng(seed)
    docs = rng.standard_normal((n, dims)).astype(np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    qs = rng.standard_normal((queries, dims)).astype(np.float32)
    qs /= np.linalg.norm(qs, axis=1, keepdims=True)
    table = {f"doc {i}": i for i in range(n)}
    qtable = {f"query {j}": j for j in range(queries)}

    def embed(texts: list[str]) -> list[list[float]]:
        return [(docs[table[t]] if t in table else qs[qtable[t]]).tolist() for t in texts]

    items = [(("docs", f"u{i % 10}"), f"k{i}", {"text": f"doc {i}"}) for i in range(n)]
    return {"docs": docs, "queries": qs, "embed": embed, "items": items,
            "query_texts": list(qtable)}  # fmt: skip


def exact_top(docs: np.ndarray, q: np.ndarray, k: int = K) -> list[int]:
    s = docs.astype(np.float64) @ q.astype(np.float64)
    return [int(i) for i in np.argsort(-s)[:k]]


def recall(got: list[list[int]], want: list[list[int]]) -> float:
    return statistics.mean(len(set(g) & set(w)) / len(w) for g, w in zip(got, want))


class Kvstore:
    """KVStore's path: Vectors over an LMDB store, writes in the items' txns."""

    name = "KVStore exact (cached matrix)"

    def __init__(self, w: dict[str, Any], root: str) -> None:
        from kvsaver.kv import LMDBStore
        from kvsaver.kvstore.vectors import Vectors

        self.store = LMDBStore(os.path.join(root, "kv"))
        self.vectors = Vectors({"dims": DIMS, "embed": w["embed"], "fields": ["text"]})
        self.w = w
        t = time.perf_counter()
        items = w["items"]
        for start in range(0, len(items), 1000):
            chunk = items[start : start + 1000]
            texts = [self.vectors.texts(v, None) for _, _, v in chunk]
            embedded = self.vectors.embed_texts([t for ts in texts for _, t in ts])
            with self.store.write() as txn:
                for (ns, key, _), ts, vec in zip(chunk, texts, embedded):
                    self.vectors.write(txn, ns, key, [(ts[0][0], vec)])
        self.load_s = time.perf_counter() - t
        tracemalloc.start()
        t = time.perf_counter()
        self.search(w["queries"][0])  # builds the cache
        self.build_s = time.perf_counter() - t
        self.memory = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()

    def search(self, q: np.ndarray) -> list[int]:
        with self.store.read() as txn:
            top = itertools.islice(self.vectors.ranked(txn, q.tolist(), ("docs",)), K)
            return [int(key[1:]) for _, key, _ in top]

    def update(self, i: int) -> float:
        """One re-put, then the time of the search that takes it in."""
        ns, key, _ = self.w["items"][i]
        with self.store.write() as txn:
            self.vectors.write(txn, ns, key, [("text", self.w["docs"][i].tolist())])
        t = time.perf_counter()
        self.search(self.w["queries"][0])
        return time.perf_counter() - t

    def close(self) -> None:
        self.store.close()


class Sqlite:
    name = "SqliteStore (sqlite-vec)"

    def __init__(self, w: dict[str, Any], root: str) -> None:
        from langgraph.store.base import PutOp
        from langgraph.store.sqlite import SqliteStore

        self.path = os.path.join(root, "store.sqlite")
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        index = {"dims": DIMS, "embed": w["embed"], "fields": ["text"], "text_fields": ["text"]}
        self.store = SqliteStore(conn, index=index)  # type: ignore[arg-type]
        self.store.setup()
        self.w = w
        t = time.perf_counter()
        items = w["items"]
        for start in range(0, len(items), 1000):
            self.store.batch([PutOp(ns, key, v) for ns, key, v in items[start : start + 1000]])
        self.load_s = time.perf_counter() - t
        self.build_s = 0.0
        self.memory = os.path.getsize(self.path)
        self.qtext = {tuple(q.tolist()): t for q, t in zip(w["queries"], w["query_texts"])}

    def search(self, q: np.ndarray) -> list[int]:
        hits = self.store.search(("docs",), query=self.qtext[tuple(q.tolist())], limit=K)
        return [int(h.key[1:]) for h in hits]

    def update(self, i: int) -> float:
        return float("nan")

    def close(self) -> None:
        self.store.conn.close()


class Usearch:
    name = "usearch HNSW"

    def __init__(self, w: dict[str, Any], root: str) -> None:
        from usearch.index import Index

        docs = w["docs"]
        self.index = Index(ndim=DIMS, metric="cos", dtype="f32")
        t = time.perf_counter()
        self.index.add(np.arange(len(docs)), docs)
        self.build_s = time.perf_counter() - t
        self.load_s = 0.0
        self.memory = self.index.memory_usage
        self.w = w

    def search(self, q: np.ndarray) -> list[int]:
        return [int(k) for k in self.index.search(q, K).keys]

    def set_ef(self, ef: int) -> None:
        self.index.expansion_search = ef

    def update(self, i: int) -> float:
        t = time.perf_counter()
        self.index.remove(i)
        self.index.add(i, self.w["docs"][i])
        return time.perf_counter() - t

    def close(self) -> None:
        pass


class FaissHnsw:
    name = "faiss HNSW (M=32)"

    def __init__(self, w: dict[str, Any], root: str) -> None:
        import faiss

        docs = w["docs"]
        self.index = faiss.IndexHNSWFlat(DIMS, 32, faiss.METRIC_INNER_PRODUCT)
        t = time.perf_counter()
        self.index.add(docs)
        self.build_s = time.perf_counter() - t
        self.load_s = 0.0
        self.memory = len(docs) * (DIMS * 4 + 32 * 2 * 8)  # vectors + level-0 links, about
        self.w = w

    def search(self, q: np.ndarray) -> list[int]:
        _, ids = self.index.search(q[None, :], K)
        return [int(i) for i in ids[0]]

    def set_ef(self, ef: int) -> None:
        self.index.hnsw.efSearch = ef

    def update(self, i: int) -> float:
        return float("nan")  # HNSWFlat cannot remove

    def close(self) -> None:
        pass


SYSTEMS: list[Callable[[dict[str, Any], str], Any]] = [Kvstore, Sqlite, Usearch, FaissHnsw]


def run(n: int) -> tuple[list[dict[str, Any]], list[tuple[str, int, float, float]]]:
    w = workload(n)
    want = [exact_top(w["docs"], q) for q in w["queries"]]
    root = tempfile.mkdtemp(prefix="kvvec-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        systems = [make(w, root) for make in SYSTEMS[: 2 if "--no-ann" in sys.argv else None]]
        times: dict[str, list[float]] = {s.name: [] for s in systems}
        got: dict[str, list[list[int]]] = {s.name: [] for s in systems}
        for r, q in enumerate(w["queries"]):  # rounds rotate the order
            for s in systems[r % len(systems) :] + systems[: r % len(systems)]:
                t = time.perf_counter()
                got[s.name].append(s.search(q))
                times[s.name].append(time.perf_counter() - t)
        updates = {s.name: statistics.median(s.update(i) for i in range(5)) for s in systems}
        sweep = []  # the ANN indexes at higher search effort: what 0.95 recall costs
        for s in systems:
            if hasattr(s, "set_ef"):
                for ef in EFS:
                    s.set_ef(ef)
                    ts, res = [], []
                    for q in w["queries"]:
                        t = time.perf_counter()
                        res.append(s.search(q))
                        ts.append(time.perf_counter() - t)
                    sweep.append((s.name, ef, 1e3 * statistics.median(ts), recall(res, want)))
        rows = []
        for s in systems:
            rows.append({
                "n": n, "system": s.name, "query_ms": 1e3 * statistics.median(times[s.name]),
                "recall@10": recall(got[s.name], want), "load_s": s.load_s,
                "build_s": s.build_s, "update_ms": 1e3 * updates[s.name],
                "memory_mb": s.memory / 1e6,
            })  # fmt: skip
            s.close()
        return rows, sweep
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:] if a.isdigit()] or [10_000, 100_000]
    print("| n | system | query ms (median) | vs SqliteStore | recall@10 | load s | "
          "index build s | update+query ms | memory MB |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    sweeps = []
    for n in sizes:
        rows, sweep = run(n)
        sweeps.append((n, rows, sweep))
        base = next(r["query_ms"] for r in rows if r["system"].startswith("SqliteStore"))
        for r in rows:
            print(
                f"| {n:,} | {r['system']} | {r['query_ms']:.2f} | {base / r['query_ms']:.1f}x | "
                f"{r['recall@10']:.3f} | {r['load_s']:.1f} | {r['build_s']:.2f} | "
                f"{r['update_ms']:.2f} | {r['memory_mb']:.0f} |",
                flush=True,
            )
    print()
    print("| n | ANN | ef (search) | query ms | vs SqliteStore | recall@10 |")
    print("|---|---|---|---|---|---|")
    for n, rows, sweep in sweeps:
        base = next(r["query_ms"] for r in rows if r["system"].startswith("SqliteStore"))
        for name, ef, ms, rec in sweep:
            print(f"| {n:,} | {name} | {ef} | {ms:.2f} | {base / ms:.1f}x | {rec:.3f} |")


if __name__ == "__main__":
    main()
