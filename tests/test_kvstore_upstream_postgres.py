"""LangGraph's PostgresStore suite (langgraph-checkpoint-postgres's
tests/test_store.py, from the installed version's sdist) on KVStore, each case
on every backend, and on PostgreSQL with pgvector, where the server ranks
(tests/upstream_suites.py: what is replaced, what is left out and why)."""

from kvstore_helpers import STORE_BACKENDS
from upstream_suites import expose

globals().update(
    expose(
        "langgraph-checkpoint-postgres",
        "test_store",
        conftest=("fake_embeddings",),
        backends=[*STORE_BACKENDS, "pgvector"],
    )
)
