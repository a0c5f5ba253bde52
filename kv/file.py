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
is. Every commit costs a rewrite of the whole file: this store is for small
state, not for long-lived production threads.

Several processes (and the children of a ``fork()``) may open one file for
writing. Each rewrites the file from its own copy, so without a lock of its
own held across the transaction they would lose each other's puts. Every write
transaction holds an exclusive ``flock`` on ``<path>.lock`` from its start to
its commit, through a descriptor opened by this process (a forked child opens
its own: a ``flock`` belongs to the open file description, which ``fork()``
shares), and first re-reads the file when another process replaced it since
this one last read or wrote it. A read transaction re-reads it too, so it sees
every commit made before it began. "Replaced" is told by the file's identity
(device, inode, size, mtime); the file last read stays open, so its inode
cannot be reused by a new file that would look the same. The temporary file of
a commit is made by ``mkstemp`` (``O_EXCL``, a random name) beside the store,
so a planted symlink cannot redirect the write.
"""

from __future__ import annotations

import fcntl
import os
import struct
import tempfile
import threading
import weakref
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ormsgpack
from sortedcontainers import SortedDict

from ._fs import fsync_dir
from .memory import MemoryStore, _Version
from .store import CorruptStoreError, FormatVersionError

__all__ = ["FileStore"]

MAGIC = b"KVSFILE\x00"
FORMAT_VERSION = 1
_HEADER = struct.Struct(">8sIIQ")


class FileStore(MemoryStore):
    """A sorted store kept in memory and persisted atomically to ``path``."""

    nonblocking_reads = False  # a read may re-read the file another process replaced
    path: str  # the file (no directory of its own: ``directory`` stays None)

    def __init__(self, path: str | os.PathLike[str], *, readonly: bool = False) -> None:
        super().__init__(readonly=readonly)
        self.path = os.path.abspath(os.fspath(path))
        if os.path.isdir(self.path):
            raise CorruptStoreError(f"{self.path} is a directory, not a FileStore file")
        self._file_lock = threading.Lock()  # guards _seen and _pin
        self._seen: _Identity | None = None  # the file the data in memory came from
        self._pin: int | None = None  # that file, kept open (see the module docstring)
        self._lock_fd: int | None = None
        self._persisted: tuple[int, _Identity] = (-1, (0, 0, 0, 0))  # see _commit
        self._pid = os.getpid()
        try:
            if not readonly:
                self._lock_fd = self._open_lock()
            elif not os.path.exists(self.path):
                raise FileNotFoundError(f"no FileStore at {self.path}")
            self._refresh()
        except BaseException:
            self._close_fds()
            raise
        _LIVE.add(self)

    def _open_lock(self) -> int:
        return os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)

    @contextmanager
    def _writing(self) -> Iterator[None]:
        # Called under the in-process write lock, so one thread at a time here.
        if self._pid != os.getpid():
            # Forked: the inherited descriptor shares the parent's lock. Closing
            # our copy leaves the parent's lock alone (flock(LOCK_UN) would not).
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
            self._lock_fd = self._open_lock()
            self._pid = os.getpid()
        fd = self._lock_fd
        assert fd is not None
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            self._refresh()  # another process may have committed since
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _refresh(self) -> None:
        """Load the file when it is not the one the data in memory came from."""
        with self._file_lock:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                if self._seen is None:
                    return  # nothing committed yet: the store is empty
                raise CorruptStoreError(
                    f"{self.path} was deleted or moved away while this FileStore had it "
                    "open; open it again"
                ) from None
            if _identity(st) == self._seen:
                return
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                with os.fdopen(os.dup(fd), "rb") as f:
                    raw = f.read()
                data = self._parse(raw)
                seen = _identity(os.fstat(fd))
            except BaseException:
                os.close(fd)
                raise
            with self._lock:
                self._current = _Version(data)
            self._adopt(fd, seen)

    def _adopt(self, fd: int, seen: _Identity) -> None:
        old, self._pin, self._seen = self._pin, fd, seen
        if old is not None:
            os.close(old)

    def _parse(self, raw: bytes) -> SortedDict:
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
        directory, name = os.path.split(self.path)
        # mkstemp: O_EXCL and a random name, never through a planted symlink.
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
        try:
            os.fchmod(fd, self._mode())
            with os.fdopen(os.dup(fd), "wb") as f:
                f.write(header)
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            seen = _identity(os.fstat(fd))
            os.replace(tmp, self.path)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        try:
            fsync_dir(directory)
        except BaseException:
            os.close(fd)  # not adopted: the next transaction reads the file back
            raise
        self._persisted = (fd, seen)

    def _commit(self, txn: Any, overlay: SortedDict) -> None:
        # The new file's identity is adopted only once its data is published
        # in memory: a reader thread, or a child forked meanwhile, that sees
        # the old identity reads the file again instead of trusting old data.
        super()._commit(txn, overlay)
        fd, seen = self._persisted
        with self._file_lock:
            self._adopt(fd, seen)

    def _mode(self) -> int:
        """Permissions for a new version of the file: the current one's."""
        try:
            return os.stat(self.path).st_mode & 0o7777
        except FileNotFoundError:
            return 0o644

    def disk_usage(self) -> int:
        """Bytes of the store file (0 before the first commit)."""
        self._check_open()
        try:
            return os.path.getsize(self.path)
        except FileNotFoundError:
            return 0

    def _close_fds(self) -> None:
        for name in ("_lock_fd", "_pin"):
            fd = getattr(self, name)
            if fd is not None:
                setattr(self, name, None)
                os.close(fd)

    def close(self) -> None:
        if not self._closed:
            super().close()
            self._close_fds()


_Identity = tuple[int, int, int, int]


def _identity(st: os.stat_result) -> _Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


_LIVE: weakref.WeakSet[FileStore] = weakref.WeakSet()


def _after_fork_child() -> None:
    # Threads of the parent do not exist here: a lock one of them held would
    # stay held forever. The lock file is reopened on first write (_writing).
    for store in list(_LIVE):
        store._lock = threading.Lock()
        store._write_lock = threading.Lock()
        store._file_lock = threading.Lock()
        store._writer = None


os.register_at_fork(after_in_child=_after_fork_child)
