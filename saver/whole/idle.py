"""Work done for a key once it has been left alone for a while, in one
background thread (the head records of threads gone idle).

``IdleWork(delay, action, owner)``: ``note(key)`` at each change of
``key``; once no change came for ``delay`` seconds, ``action(owner, keys)``
runs in this object's thread with the keys due (up to ``BATCH`` at a time,
oldest first). ``owner`` is held by a weak reference: an owner nobody
holds any more (a saver never closed) is not kept alive by the thread,
which ends once it finds the owner gone. ``action`` should not raise
(what it cannot do, it leaves undone: the work is an optimization).
``flush()`` runs it now for every key waiting; ``close()`` stops the
thread, and ``close(flush=True)`` runs what waits first. A key noted
again before its turn waits ``delay`` from that note.

``note`` is on the path of every ``put``, so it takes no lock a
``KeyboardInterrupt`` could leave held (a put interrupted anywhere never
hangs a later one): it only sets the key's time in an
``OrderedDict`` (single C calls, atomic under the GIL), and starts the
thread once, behind a lock it only ever tries. The thread is not woken by
notes: it looks again after ``delay`` when nothing waits, so a key is done
within twice ``delay`` of its last note.

The thread is a daemon, started at the first ``note`` (a process that
never writes has none), made again in a child process after ``fork`` (the
parent's keys are not the child's to do), and stopped before the
interpreter exits (``atexit``), without running what waits: a process
that ends without ``close()`` leaves that work undone, as a crash would.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["BATCH", "IdleWork"]

BATCH = 64  # keys per call of ``action``
_STOP_SECONDS = 5.0  # what close(), flush() and the exit wait for an action in progress


class IdleWork:
    def __init__(
        self, delay: float, action: Callable[[Any, list[Any]], None], owner: object
    ) -> None:
        self.delay = delay
        self.action = action
        self._owner = weakref.ref(owner)
        self._reset()
        _LIVE.add(self)

    def _reset(self) -> None:
        """Also in a child after ``fork`` (``_after_fork``): none of the
        parent's keys or thread."""
        # key -> monotonic time of its last note, oldest first
        self._due: OrderedDict[Hashable, float] = OrderedDict()
        self._thread: threading.Thread | None = None
        self._starting = threading.Lock()  # taken once, never given back
        self._stop = threading.Event()
        self._busy = threading.Lock()  # held while keys are taken and done

    def note(self, key: Hashable) -> None:
        """``key`` changed now: its work waits ``delay`` from now. Never
        raises: a thread that cannot be started (the process's limit) leaves
        the keys to ``flush()`` and ``close()``."""
        if self._stop.is_set():
            return
        due = self._due
        due.pop(key, None)  # then in at the end: no call that can miss the key
        due[key] = time.monotonic()
        if self._thread is None and self._starting.acquire(blocking=False):
            try:
                thread = threading.Thread(target=self._loop, name="kvsaver-idle", daemon=True)
                thread.start()
                self._thread = thread
            except Exception:  # e.g. "can't start new thread": no background writing
                pass

    def pending(self) -> int:
        """How many keys wait."""
        return len(self._due)

    def waiting(self, key: Hashable) -> bool:
        """Whether ``key`` waits (noted, not yet taken by its action)."""
        return key in self._due

    def _take(self, now: float | None) -> list[Any]:
        """Up to ``BATCH`` keys due at ``now`` (None: every key), out of the
        queue, oldest first. Called with ``_busy`` held (notes go on)."""
        out: list[Any] = []
        due = self._due
        while len(out) < BATCH:
            try:
                key, at = due.popitem(last=False)
            except KeyError:  # empty
                break
            if now is not None and at + self.delay > now:
                # Not due: back in front, unless noted again meanwhile (then
                # it is at the end, with its new time).
                if due.setdefault(key, at) == at:
                    try:
                        due.move_to_end(key, last=False)
                    except KeyError:  # taken meanwhile (close, flush): gone
                        pass
                break
            out.append(key)
        return out

    def _next_wait(self) -> float:
        """Seconds until the oldest key is due (``delay`` when none waits)."""
        try:
            oldest = next(iter(self._due.values()))
        except (StopIteration, RuntimeError):  # empty, or changed while looked at
            return max(self.delay, 0.01)
        return max(0.0, oldest + self.delay - time.monotonic())

    def _run(self, keys: list[Any]) -> bool:
        """``action(owner, keys)``; False when the owner is gone."""
        owner = self._owner()
        if owner is None:
            return False
        try:
            self.action(owner, keys)
        except Exception:  # the action's own failure: work left undone
            pass
        return True

    def _loop(self) -> None:
        stop, busy = self._stop, self._busy
        while not stop.wait(self._next_wait()):
            if self._owner() is None:
                return
            with busy:
                while not stop.is_set():
                    try:
                        keys = self._take(time.monotonic())
                    except Exception:  # (not seen) the queue changed under it: look again
                        break
                    if not keys:
                        break
                    if not self._run(keys):
                        return

    def flush(self) -> None:
        """Run ``action`` now for every key waiting, in this thread (after an
        action in progress, waiting a few seconds at most)."""
        if not self._busy.acquire(timeout=_STOP_SECONDS):
            return
        try:
            while (keys := self._take(None)) and self._run(keys):
                pass
        finally:
            self._busy.release()

    def close(self, flush: bool = False) -> None:
        """Stop the thread (waiting a few seconds at most for an action in
        progress); with ``flush``, run what waits first. Idempotent."""
        try:
            if flush and not self._stop.is_set():
                self.flush()
        finally:
            self._stop.set()
            thread = self._thread
            if thread is not None and thread is not threading.current_thread():
                thread.join(_STOP_SECONDS)
            self._due.clear()
            _LIVE.discard(self)


_LIVE: weakref.WeakSet[IdleWork] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for work in list(_LIVE):
        work.close()


def _after_fork() -> None:
    try:
        works = list(_LIVE)
    except RuntimeError:  # another thread was changing it at the fork: none to reset
        return
    for work in works:
        work._reset()


os.register_at_fork(after_in_child=_after_fork)
