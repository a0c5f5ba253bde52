"""A small table of times shared by every process that opens a store: one
process says "key is wanted now", another asks "was key wanted lately?".

What for (issue #13): a reader process that finds a thread's latest
checkpoint without its head record (the writer put it less than a second
ago) marks the thread; the writer, at its next put of that thread, sees
the mark and writes the head in the put's transaction, so the readers of a
thread that is being written read it whole. Without a mark the writer
leaves heads to its idle thread, which a graph's own writes prefer.

A hint is only ever advice: a lost, stale or colliding one costs speed,
never data. So the table is as cheap as can be and never fails a caller:

* a file ``kvsaver.hints`` in the store's directory, ``SLOTS`` unsigned
  32-bit slots (a key's slot: its CRC-32 modulo ``SLOTS``; two keys in one
  slot share their marks), each the wall-clock second of its last mark;
* made by the first ``mark`` (a store nobody marks has no such file),
  sized with ``ftruncate`` (a sparse file of zeros);
* ``mark`` writes its slot with ``pwrite``: on a full disk, a read-only
  directory or any other ``OSError`` the mark is dropped. Not through a
  shared mapping, whose write to a page the filesystem cannot allocate is
  a ``SIGBUS`` that kills the process;
* ``recent`` reads through a read-only mapping (no system call: it runs in
  every put, and a call that releases the GIL hands it to another thread),
  made once the file exists with its full size (looked for at most every
  ``_LOOK_EVERY`` seconds before that). Reading a mapped page never
  allocates.

The file is never shrunk by this code; one truncated by hand is mapped
again only after it is put back to its size (``recent`` checks the size
before it maps).
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
import weakref
import zlib

__all__ = ["HINTS_FILE", "SLOTS", "Hints"]

HINTS_FILE = "kvsaver.hints"
SLOTS = 4096
_SLOT = struct.Struct("<I")
_SIZE = SLOTS * _SLOT.size
_LOOK_EVERY = 0.1  # seconds between looks for a file not there yet (an open that fails: ~2 µs)


def _slot(key: bytes) -> int:
    return (zlib.crc32(key) % SLOTS) * _SLOT.size


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _now() -> int:
    return int(time.time()) & 0xFFFFFFFF


class Hints:
    """The hint table of the store in directory ``path``."""

    def __init__(self, path: str) -> None:
        self.path = os.path.join(path, HINTS_FILE)
        self._fd: int | None = None  # for mark's writes
        self._map: mmap.mmap | None = None  # for recent's reads
        self._looked = -1e9  # monotonic time of the last look for the file
        # Opening, closing, and a mark's write; never taken by ``recent``.
        self._lock = threading.Lock()
        self._closed = False
        self._fd_closer: weakref.finalize | None = None

    def mark(self, key: bytes) -> None:
        """``key`` is wanted now. Never raises (an ``OSError`` drops the mark)."""
        try:
            with self._lock:  # else close() could end the descriptor under the write
                fd = self._fd if self._fd is not None else self._open_for_marks()
                if fd is not None:
                    os.pwrite(fd, _SLOT.pack(_now()), _slot(key))
        except OSError:
            pass

    def recent(self, key: bytes, seconds: int) -> bool:
        """Whether ``key`` (or a key of its slot) was marked within the last
        ``seconds`` of wall-clock time. Never raises."""
        m = self._map
        if m is None:
            m = self._open_map()
            if m is None:
                return False
        try:
            (when,) = _SLOT.unpack_from(m, _slot(key))
        except (ValueError, TypeError):  # closed meanwhile
            return False
        return when != 0 and (_now() - when) & 0xFFFFFFFF <= seconds

    def _open_for_marks(self) -> int | None:
        """The descriptor marks write through, made now. Caller holds _lock."""
        if self._closed:
            return None
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            if os.fstat(fd).st_size < _SIZE:
                os.ftruncate(fd, _SIZE)  # by two processes at once: the same size
        except OSError:
            os.close(fd)
            raise
        self._fd = fd
        self._fd_closer = weakref.finalize(self, _close_quietly, fd)  # a table never closed
        return fd

    def _open_map(self) -> mmap.mmap | None:
        now = time.monotonic()
        if now - self._looked < _LOOK_EVERY:
            return None
        with self._lock:
            self._looked = now
            if self._closed or self._map is not None:
                return self._map
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
            try:
                if os.fstat(fd).st_size < _SIZE:
                    return None  # being made by another process (or cut short)
                self._map = mmap.mmap(fd, _SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
            except (OSError, ValueError):
                return None
            finally:
                os.close(fd)
            return self._map

    def close(self) -> None:
        with self._lock:
            self._closed = True
            closer, self._fd_closer, self._fd = self._fd_closer, None, None
            m, self._map = self._map, None
        if closer is not None:
            closer()
        if m is not None:
            try:
                m.close()
            except BufferError:  # a read in another thread right now: the GC closes it
                pass
