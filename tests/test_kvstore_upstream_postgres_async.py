"""LangGraph's AsyncPostgresStore suite (langgraph-checkpoint-postgres's
tests/test_async_store.py, from the installed version's sdist) on KVStore, each
case on every backend
(tests/upstream_suites.py: what is replaced, what is left out and why)."""

from upstream_suites import expose

globals().update(
    expose("langgraph-checkpoint-postgres", "test_async_store", conftest=("fake_embeddings",))
)
