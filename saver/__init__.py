"""saver: KVSaver, a LangGraph checkpoint saver over the ``kv`` engine."""

from .compression import CompressingSerializer, EncryptedValueError
from .kvsaver import KVSaver, OptionError
from .retention import Retention, SweepReport
from .stats import StoreStats, ThreadStats

__all__ = [
    "CompressingSerializer",
    "EncryptedValueError",
    "KVSaver",
    "OptionError",
    "Retention",
    "StoreStats",
    "SweepReport",
    "ThreadStats",
]
