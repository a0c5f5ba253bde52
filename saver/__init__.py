"""saver: KVSaver, a LangGraph checkpoint saver over the ``kv`` engine, and
KVStore, a LangGraph store (long-term memory) on the same engine."""

from .compression import CompressingSerializer, EncryptedValueError
from .kvsaver import KVSaver, OptionError
from .kvstore import KVStore
from .retention import Retention, SweepReport
from .stats import StoreStats, ThreadStats

__all__ = [
    "CompressingSerializer",
    "EncryptedValueError",
    "KVSaver",
    "KVStore",
    "OptionError",
    "Retention",
    "StoreStats",
    "SweepReport",
    "ThreadStats",
]
