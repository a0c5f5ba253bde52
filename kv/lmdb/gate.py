"""The gate: a lock per environment, held shared by every open transaction of
this process, and exclusively to change the map size or across ``fork()``.

LMDB's ``set_mapsize`` needs every transaction of the process closed, and a
child after ``fork()`` must inherit none: this lock is what waits for them,
made so that an interrupt landing anywhere in it leaves no hold behind.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ..store import KVError

_GATE_POLL_SECONDS = 0.0005


class _SharedExclusive:
    """A lock with many shared holders or one exclusive holder (writer-preferring).

    Interrupt-safe: the raw lock is entered with ``with`` (a Condition's
    ``__exit__`` is Python code, where an interrupt can land before it releases
    anything), and every change of a count happens with the matching record of
    who holds it in one locked step without a call in between, so an exception
    raised asynchronously (KeyboardInterrupt from a signal handler) cannot
    separate the two; ``restore()`` then puts a thread's holds back to what
    they were, whatever point it was interrupted at. Waits sleep with the lock
    released and look again every ``_GATE_POLL_SECONDS``: no Condition.wait,
    which releases and retakes the lock inside ``with``, where an interrupt
    landing in between leaves ``with`` releasing a lock nobody holds.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shared = 0
        self._exclusive = False
        self._owner: tuple[int, int] | None = None  # (thread, serial) holding it exclusively
        self._serial = 0
        self._waiting_exclusive = 0
        self._mine = threading.local()  # .n: this thread's shared holds

    def held_shared_by_me(self) -> int:
        return getattr(self._mine, "n", 0)

    # acquire_shared/release_shared run around every read: the common case (no
    # exclusive request anywhere) takes the plain lock once and nothing else.
    def acquire_shared(self) -> None:
        mine = self._mine
        while True:
            with self._lock:
                held = getattr(mine, "n", 0)
                # A thread already holding it shared must not wait behind a
                # pending exclusive request (it would wait for itself).
                if not (self._exclusive or (self._waiting_exclusive and not held)):
                    self._shared += 1
                    mine.n = held + 1
                    return
            # Waits sleep with the lock released, never Condition.wait (it
            # releases and retakes the lock inside ``with``: an interrupt in
            # between leaves ``with`` releasing a lock nobody holds).
            time.sleep(_GATE_POLL_SECONDS)

    def release_shared(self) -> None:
        mine = self._mine
        with self._lock:
            self._shared -= 1
            mine.n -= 1

    def acquire_exclusive(self, timeout: float | None = None) -> tuple[int, int] | None:
        """Wait until no transaction of this process is open; the owner token
        (for release_exclusive), or None on timeout."""
        me = threading.get_ident()
        deadline = None if timeout is None else time.monotonic() + timeout
        counted = False
        try:
            with self._lock:
                self._waiting_exclusive += 1
                counted = True  # no call in between: an interrupt cannot separate them
            while True:
                with self._lock:
                    if not (self._exclusive or self._shared):
                        self._serial += 1
                        owner = self._owner = (me, self._serial)
                        self._exclusive = True
                        return owner
                    if deadline is not None and time.monotonic() >= deadline:
                        return None
                time.sleep(_GATE_POLL_SECONDS)  # see acquire_shared
        finally:
            if counted:
                with self._lock:
                    self._waiting_exclusive -= 1

    def release_exclusive(self, owner: tuple[int, int] | None) -> None:
        with self._lock:
            if owner is not None and self._owner == owner:  # not one restore() gave back
                self._exclusive = False
                self._owner = None

    def restore(self, held: int) -> None:
        """Give back whatever this thread took beyond ``held`` shared holds
        (and an exclusive hold): the cleanup after an interrupt."""
        me = threading.get_ident()
        mine = self._mine
        with self._lock:
            n = getattr(mine, "n", 0)
            self._shared += held - n
            mine.n = held
            if self._owner is not None and self._owner[0] == me:
                self._exclusive = False
                self._owner = None

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        if self.held_shared_by_me():
            raise KVError(
                "the LMDB map must grow, but this thread holds an open transaction on "
                "the same store; finish it (e.g. exhaust or close a scan) and retry"
            )
        owner = self.acquire_exclusive()
        try:
            yield
        finally:
            self.release_exclusive(owner)
