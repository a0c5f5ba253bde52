"""LangGraph's InMemoryStore suite (langgraph-checkpoint's tests/test_store.py,
from the installed version's sdist) on KVStore, each case on every backend
(tests/upstream_suites.py: what is replaced, what is left out and why)."""

from upstream_suites import expose

globals().update(expose("langgraph-checkpoint", "test_store"))
