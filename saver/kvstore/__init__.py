"""KVStore: LangGraph's ``BaseStore`` (long-term memory) on the kv engine,
in a keyspace of its own (``("s", ...)``, see ``saver/schema.py``)."""

from .store import KVStore

__all__ = ["KVStore"]
