"""``FileStore``: a ``MemoryStore`` persisted to one file after every commit.

The successor of LangGraph's ``PersistentDict`` without its pickle and without
its lost-on-crash window: each commit writes the whole content to a temporary
file, fsyncs it, ``os.replace``s it over the store file and fsyncs the
directory, so the file is always either the old or the new state.

File layout (format version 1)::

    magic   8 bytes  b"KVSFILE\\x00"
    version u32 BE   1
    crc32   u32 BE   of the body
    length  u64 BE   of the body
    body    msgpack array [key0, value0, key1, value1, ...] (bytes)

A truncated, corrupt or foreign file raises ``CorruptStoreError``; a file of a
newer format raises ``FormatVersionError``. Either way the file is left as it
is. One process at a time may open a store for writing (an exclusive
``flock`` on ``<path>.lock``); read-only openers share the lock and see the
content as of their opening. Every commit costs a rewrite of the whole file:
this store is for small state, not for long-lived production threads.
"""

from __future__ import annotations

import fcntl
import os
import struct
import zlib
from collections.abc import Iterator

import ormsgpack
from sortedcontainers import SortedDict

from ._fs import fsync_dir
from .memory import MemoryStore, _Version
from .store import CorruptStoreError, FormatVersionError, StoreBusyError

__all__ = ["FileStore"]

MAGIC = b"KVSFILE\x00"
FORMAT_VERSION = 1
_HEADER = struct.Struct(">8sIIQ")


class FileStore(MemoryStore):
    """A sorted store kept in memory and persisted atomically to ``path``."""

    def __init__(self, path: str | os.PathLike[str], *, readonly: bool = False) -> None:
        super().__init__(readonly=readonly)
        self.path = os.path.abspath(os.fspath(path))
        if os.path.isdir(self.path):
            raise CorruptStoreError(f"{self.path} is a directory, not a FileStore file")
        self._lock_fd = self._take_lock()
        try:
            if os.path.exists(self.path):
                self._current = _Version(self._read_file())
            elif readonly:
                raise FileNotFoundError(f"no FileStore at {self.path}")
        except BaseException:
            os.close(self._lock_fd)
            raise

    def _take_lock(self) -> int:
        lock_path = self.path + ".lock"
        if self.readonly:
            fd = os.open(lock_path, os.O_RDONLY | os.O_CREAT, 0o644)
        else:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if self.readonly else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreBusyError(
                f"{self.path} is open for writing in another process; a FileStore has "
                "one writer at a time (use LMDBStore for several processes)"
            ) from None
        return fd

    def _read_file(self) -> SortedDict:
        with open(self.path, "rb") as f:
            raw = f.read()
        if len(raw) < _HEADER.size or raw[:8] != MAGIC:
            raise CorruptStoreError(f"{self.path} is not a FileStore file (bad header)")
        _, version, crc, length = _HEADER.unpack_from(raw)
        if version > FORMAT_VERSION:
            raise FormatVersionError(
                f"{self.path} was written by FileStore format {version}; this code "
                f"reads format {FORMAT_VERSION} and older. Upgrade kvsaver."
            )
        body = raw[_HEADER.size :]
        if len(body) != length:
            raise CorruptStoreError(
                f"{self.path} is truncated or damaged: body is {len(body)} bytes, "
                f"header says {length}"
            )
        if zlib.crc32(body) != crc:
            raise CorruptStoreError(f"{self.path} is damaged: checksum mismatch")
        try:
            flat = ormsgpack.unpackb(body)
        except Exception as e:
            raise CorruptStoreError(f"{self.path} is damaged: {e}") from e
        if (
            not isinstance(flat, list)
            or len(flat) % 2
            or not all(type(x) is bytes for x in flat)  # else a str key breaks every lookup
        ):
            raise CorruptStoreError(f"{self.path} is damaged: body is not a key/value array")
        return SortedDict(zip(flat[0::2], flat[1::2]))

    def _persist(self, items: Iterator[tuple[bytes, bytes]]) -> None:
        flat: list[bytes] = []
        for k, v in items:
            flat.append(k)
            flat.append(v)
        body = ormsgpack.packb(flat)
        header = _HEADER.pack(MAGIC, FORMAT_VERSION, zlib.crc32(body), len(body))
        tmp = f"{self.path}.tmp.{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                f.write(header)
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        fsync_dir(os.path.dirname(self.path))

    def disk_usage(self) -> int:
        """Bytes of the store file (0 before the first commit)."""
        self._check_open()
        try:
            return os.path.getsize(self.path)
        except FileNotFoundError:
            return 0

    def close(self) -> None:
        if not self._closed:
            super().close()
            os.close(self._lock_fd)
