"""saver: KVSaver, a LangGraph checkpoint saver over the ``kv`` engine."""

from .kvsaver import KVSaver

__all__ = ["KVSaver"]
