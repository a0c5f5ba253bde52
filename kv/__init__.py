"""kv: an ordered key-value engine. Keys are packed tuples (``kv.keys``); every
backend implements the small ``Store`` protocol (``kv.store``).

Imports nothing of ours above it: ``saver/`` builds on this, never the reverse.
"""

from .file import FileStore
from .keys import pack, prefix_range, unpack
from .lmdb import LMDBStore
from .memory import MemoryStore
from .postgres import (  # psycopg itself is imported only when a store is opened
    CommitUnknownError,
    PostgresStore,
    StoreConflictError,
    StoreTimeoutError,
    StoreUnavailableError,
)
from .store import (
    CorruptStoreError,
    FormatVersionError,
    KeyTooLongError,
    KVError,
    MissingDependencyError,
    ReadOnlyError,
    ScanArgs,
    Store,
    StoreBusyError,
    StoreClosedError,
    StoreFullError,
    SupportsDiskUsage,
    SupportsVectors,
    Txn,
    VectorTxn,
)

__all__ = [
    "CommitUnknownError",
    "CorruptStoreError",
    "FileStore",
    "FormatVersionError",
    "KVError",
    "KeyTooLongError",
    "LMDBStore",
    "MemoryStore",
    "MissingDependencyError",
    "PostgresStore",
    "ReadOnlyError",
    "ScanArgs",
    "Store",
    "StoreBusyError",
    "StoreClosedError",
    "StoreConflictError",
    "StoreFullError",
    "StoreTimeoutError",
    "StoreUnavailableError",
    "SupportsDiskUsage",
    "SupportsVectors",
    "Txn",
    "VectorTxn",
    "pack",
    "prefix_range",
    "unpack",
]
