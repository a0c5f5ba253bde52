"""Expiry: the sweep of expired items through the expiry index (the items
whose expiry time has passed, read in expiry order: never a scan of every
item), and the sweeper thread that runs it every ``sweep_interval_minutes``,
as SqliteStore's ``start_ttl_sweeper``/``stop_ttl_sweeper`` do."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Generator
from typing import Any

from kvsaver.kv.store import Store, Txn

from . import keyspace as KS
from .ops import remove_item

__all__ = ["Sweeper", "SweeperFuture", "sweep"]

log = logging.getLogger("kvsaver.kvstore")

_CHUNK = 256  # expired items per write transaction: a sweep never holds the writer long


def sweep(store: Store, now_ms: int | None = None) -> int:
    """Delete every item expired at ``now_ms`` (default: now), with its index
    entries and vectors, a chunk per transaction; the number deleted."""
    at = int(time.time() * 1000) if now_ms is None else now_ms
    total = 0
    while True:
        n = store.transact(lambda txn: _sweep_chunk(txn, at))
        total += n
        if n < _CHUNK:
            return total


def _sweep_chunk(txn: Txn, at: int) -> int:
    n = 0
    for key, el in list(txn.scan(*KS.expiry_range(at), limit=_CHUNK)):
        expires, ns_id, seq = KS.expiry_ids(key)
        n += 1
        raw = txn.get(KS.item_key(ns_id, el))
        rec = None if raw is None else KS.decode_item(raw)
        if rec is not None and rec.expires_ms == expires and rec.seq == seq:
            remove_item(txn, None, ns_id, el, rec)  # this entry goes with it
        else:  # refreshed since (its own entry is elsewhere in the index), or gone
            txn.delete(key)
    return n


class SweeperFuture(concurrent.futures.Future[None]):
    """The sweeper's future (done when it stops), in both of LangGraph's forms:
    SqliteStore's ``start_ttl_sweeper()`` returns a concurrent future,
    AsyncPostgresStore's is a coroutine whose ``await`` gives its task back
    while the sweeper goes on. KVStore is one object for sync and async code,
    so ``await store.start_ttl_sweeper()`` gives this same future at once
    (it does not wait for the sweeper to stop)."""

    def __await__(self) -> Generator[Any, None, SweeperFuture]:
        yield from ()
        return self


class Sweeper:
    """A daemon thread calling ``run`` every ``interval`` minutes until stopped."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self, run: Callable[[], int], minutes: float) -> SweeperFuture:
        future = SweeperFuture()
        future.add_done_callback(lambda f: self._stop.set() if f.cancelled() else None)
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return future
            self._stop.clear()

            def loop() -> None:
                try:
                    while not self._stop.wait(minutes * 60):
                        try:
                            n = run()
                            if n:
                                log.info("store swept %d expired items", n)
                        except Exception:
                            log.exception("store TTL sweep failed")
                    if not future.done():
                        future.set_result(None)
                except BaseException as e:  # the thread's last word
                    if not future.done():
                        future.set_exception(e)

            self._thread = threading.Thread(target=loop, daemon=True, name="kvstore-ttl-sweeper")
            self._thread.start()
        return future

    def stop(self, timeout: float | None = None) -> bool:
        """True once the thread has ended (or none ran)."""
        with self._lock:
            thread = self._thread
            if thread is None or not thread.is_alive():
                self._thread = None
                return True
            self._stop.set()
        if thread is not threading.current_thread():
            thread.join(timeout)
        if thread.is_alive():
            return False
        with self._lock:
            self._thread = None
        return True
