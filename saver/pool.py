"""The threads of a saver's async calls on a local store (``KVSaver._run``).

A commit waits for the disk, and every put that arrives meanwhile joins the
next one (group commit), so the more callers can wait, the fewer flushes per
checkpoint: a pool of its own (32 threads by default) rather than the event
loop's default executor (a few threads, ``min(32, cpus + 4)``, which a
graph's sync nodes share). The price is a longer worst wait of the event
loop: more threads that want the GIL.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["THREAD_NAME", "Pool"]

THREAD_NAME = "kvsaver-async"


class Pool:
    """``threads`` threads (None: the loop's default executor), made at the
    first call, and again in a child process after a fork (the parent's
    threads are not there)."""

    def __init__(self, threads: int | None) -> None:
        self.threads = threads
        # (pid, pool), made at the first async call; None after close() too
        self._pool: tuple[int, ThreadPoolExecutor] | None = None
        self._lock = threading.Lock()
        self._closed = False

    def executor(self) -> ThreadPoolExecutor | None:
        """The pool; None with ``threads=None``, and once closed: the
        default executor (where a call fails as any call on a closed saver
        does)."""
        pool = self._pool
        pid = os.getpid()
        if pool is not None and pool[0] == pid:
            return pool[1]
        with self._lock:
            if self._closed or self.threads is None:
                return None
            if self._pool is None or self._pool[0] != pid:
                self._pool = (pid, ThreadPoolExecutor(self.threads, thread_name_prefix=THREAD_NAME))
            return self._pool[1]

    def close(self) -> None:
        """After the calls in progress have ended (not from one of its own
        threads: a thread cannot wait for itself)."""
        with self._lock:
            pool, self._pool, self._closed = self._pool, None, True
        if pool is not None and pool[0] == os.getpid():
            ours = threading.current_thread().name.startswith(THREAD_NAME)
            pool[1].shutdown(wait=not ours)
