"""kv: an ordered key-value engine. Keys are packed tuples (``kv.keys``); every
backend implements the small ``Store`` protocol (``kv.store``).

Imports nothing of ours above it: ``saver/`` builds on this, never the reverse.
"""

from .file import FileStore
from .keys import pack, prefix_range, unpack
from .lmdb_store import LMDBStore
from .memory import MemoryStore
from .store import (
    CorruptStoreError,
    FormatVersionError,
    KeyTooLongError,
    KVError,
    ReadOnlyError,
    Store,
    StoreBusyError,
    StoreClosedError,
    StoreFullError,
    SupportsDiskUsage,
    Txn,
)

__all__ = [
    "CorruptStoreError",
    "FileStore",
    "FormatVersionError",
    "KVError",
    "KeyTooLongError",
    "LMDBStore",
    "MemoryStore",
    "ReadOnlyError",
    "Store",
    "StoreBusyError",
    "StoreClosedError",
    "StoreFullError",
    "SupportsDiskUsage",
    "Txn",
    "pack",
    "prefix_range",
    "unpack",
]
