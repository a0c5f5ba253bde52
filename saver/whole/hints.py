"""A small table of times shared by every process that opens a store: one
process says "key is wanted now", another asks "was key wanted lately?".

What for: a reader process that keeps finding a thread's latest checkpoint
without its head record (the writer put it less than a second ago) marks
the thread; the writer, at its next put of that thread, sees the mark and
writes the head in the put's transaction, so the readers of a thread that
is being written read it whole. Without a mark the writer leaves heads to
its idle thread, which a graph's own writes prefer.

A hint is only ever advice: a lost, stale or colliding one costs speed,
never data. So the table is as cheap as can be and never fails a caller:

* a file ``kvsaver.hints`` in the store's directory (``Store.directory``), ``SLOTS`` unsigned
  32-bit slots (a key's slot: its CRC-32 modulo ``SLOTS``; two keys in one
  slot share their marks), each the wall-clock second of its last mark;
* ``mark`` opens the file by its path (making it, sized with
  ``ftruncate``: a sparse file of zeros), writes its slot with ``pwrite``
  and closes it: on a full disk, a read-only directory or any other
  ``OSError`` the mark is dropped. Made with mode 0o666 (less the umask),
  so readers running as other users can mark too;
* ``recent`` reads a copy of the table, read again (open, ``pread``,
  close) when it is older than ``_REFRESH`` seconds: the writer asks at
  every put, and a system call releases the GIL, which under load hands it
  to another thread for a switch interval, so the table is read at most
  ten times a second. A mark is seen within ``_REFRESH`` seconds.

No descriptor or mapping is kept, so nothing here can outlive a ``fork``,
race with ``close``, or fault on a file cut short by someone else (a short
read is zeros), and a file deleted or replaced is simply the one found next.
"""

from __future__ import annotations

import os
import struct
import time
import zlib

__all__ = ["HINTS_FILE", "SLOTS", "Hints"]

HINTS_FILE = "kvsaver.hints"
SLOTS = 4096
_SLOT = struct.Struct("<I")
_SIZE = SLOTS * _SLOT.size
_REFRESH = 0.1  # seconds a copy of the table is used before it is read again


def _slot(key: bytes) -> int:
    return (zlib.crc32(key) % SLOTS) * _SLOT.size


def _now() -> int:
    return int(time.time()) & 0xFFFFFFFF


class Hints:
    """The hint table of the store in directory ``path``."""

    def __init__(self, path: str) -> None:
        self.path = os.path.join(path, HINTS_FILE)
        self._copy = b""  # the table as last read ("": none, or no file)
        self._read_at = -1e9  # monotonic time of that read
        self._closed = False

    def mark(self, key: bytes) -> None:
        """``key`` is wanted now. Never raises (an ``OSError`` drops the mark)."""
        if self._closed:
            return
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError:
            return
        try:
            if os.fstat(fd).st_size < _SIZE:
                os.ftruncate(fd, _SIZE)  # by two processes at once: the same size
            os.pwrite(fd, _SLOT.pack(_now()), _slot(key))
        except OSError:
            pass
        finally:
            os.close(fd)

    def recent(self, key: bytes, seconds: int) -> bool:
        """Whether ``key`` (or a key of its slot) was marked within the last
        ``seconds`` of wall-clock time, as the table read at most
        ``_REFRESH`` seconds ago says. Never raises."""
        now = time.monotonic()
        copy = self._copy
        if now - self._read_at >= _REFRESH and not self._closed:
            self._read_at = now
            copy = self._copy = _read(self.path)
        if not copy:  # no table (nobody marked): the common case, no hashing
            return False
        at = _slot(key)
        if len(copy) < at + _SLOT.size:
            return False
        (when,) = _SLOT.unpack_from(copy, at)
        return when != 0 and (_now() - when) & 0xFFFFFFFF <= seconds

    def close(self) -> None:
        self._closed = True
        self._copy = b""


def _read(path: str) -> bytes:
    """The table's bytes, b"" when there is no file or it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.pread(fd, _SIZE, 0)
    except OSError:
        return b""
    finally:
        os.close(fd)
