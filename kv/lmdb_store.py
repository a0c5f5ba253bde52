"""``LMDBStore``: the default backend, one LMDB environment per directory.

The rules of LMDB that wrappers usually get wrong are each handled once, here:

* **Map growth.** LMDB fails a write with ``MapFullError`` when the memory map
  is full, and ``set_mapsize`` needs every transaction of the process closed.
  Before each write transaction the map is grown (doubled) when less than
  half of it is free; a single transaction that still overflows it is
  aborted, the map grown, and its logged operations replayed, so no
  ``MapFullError`` reaches the caller. Growth takes an in-process exclusive
  lock that waits for this process's open transactions to finish. A growth
  by another process is adopted (``MapResizedError`` -> ``set_mapsize(0)``).
* **One environment per process.** LMDB must not open the same files twice in
  one process, so stores on one directory share one environment (refcounted).
* **Writers.** One write transaction at a time: an in-process lock, and across
  processes LMDB's own writer mutex. Readers never block and never wait.
* **fork().** An environment must not be used in a child after ``fork()``. The
  child reopens the directory on first use and never closes the parent's
  handle (closing it would release the parent's reader slots).
* **Dead readers.** Reader slots left by killed processes are cleared
  (``reader_check``) at open and whenever the reader table fills up.
* **Keys** longer than ``max_key_size()`` (511 bytes) raise ``KeyTooLongError``.

Durability (``durability=``), each exactly as LMDB documents it:

* ``"full"`` (default): data and metadata are fsynced at every commit. A
  commit that returned survives ``kill -9``, an OS crash and power loss.
* ``"meta"``: data pages are fsynced, the metadata page is not
  (``metasync=False``). An OS crash or power loss may undo the *last*
  committed transaction; the store stays consistent. ``kill -9`` loses nothing.
* ``"none"``: no fsync at commit (``sync=False``); the OS writes pages back
  when it chooses. ``kill -9`` of the process loses nothing (the pages are in
  the OS page cache), but an OS crash or power loss can lose any transaction
  committed since the last flush, and the store keeps atomicity only if the
  filesystem preserves write order. Call ``sync()`` to flush explicitly.

``max_size`` caps the data file: a write past it raises ``StoreFullError``
naming the cap, and leaves the store as it was.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, TypeVar

import lmdb

from .store import (
    CorruptStoreError,
    KeyTooLongError,
    KVError,
    ReadOnlyError,
    StoreClosedError,
    StoreFullError,
)

__all__ = ["LMDBStore"]

T = TypeVar("T")

Durability = Literal["full", "meta", "none"]
_DURABILITY: dict[str, dict[str, bool]] = {
    "full": {"sync": True, "metasync": True},
    "meta": {"sync": True, "metasync": False},
    "none": {"sync": False, "metasync": False},
}
_DEFAULT_MAP_SIZE = 64 << 20
_PAGE = 4096


class _SharedExclusive:
    """A lock with many shared holders or one exclusive holder (writer-preferring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._shared = 0
        self._exclusive = False
        self._waiting_exclusive = 0
        self._local = threading.local()

    def held_shared_by_me(self) -> int:
        return getattr(self._local, "n", 0)

    def acquire_shared(self) -> None:
        with self._cond:
            # A thread already holding it shared must not wait behind a
            # pending exclusive request (it would wait for itself).
            while self._exclusive or (self._waiting_exclusive and not self.held_shared_by_me()):
                self._cond.wait()
            self._shared += 1
        self._local.n = self.held_shared_by_me() + 1

    def release_shared(self) -> None:
        self._local.n = self.held_shared_by_me() - 1
        with self._cond:
            self._shared -= 1
            if self._shared == 0:
                self._cond.notify_all()

    def acquire_exclusive(self, timeout: float | None = None) -> bool:
        """Wait until no transaction of this process is open; False on timeout."""
        with self._cond:
            self._waiting_exclusive += 1
            try:
                ok = self._cond.wait_for(
                    lambda: not (self._exclusive or self._shared), timeout=timeout
                )
            finally:
                self._waiting_exclusive -= 1
            if ok:
                self._exclusive = True
            else:
                self._cond.notify_all()
            return ok

    def release_exclusive(self) -> None:
        with self._cond:
            self._exclusive = False
            self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        if self.held_shared_by_me():
            raise KVError(
                "the LMDB map must grow, but this thread holds an open transaction on "
                "the same store; finish it (e.g. exhaust or close a scan) and retry"
            )
        self.acquire_exclusive()
        try:
            yield
        finally:
            self.release_exclusive()


class _Env:
    """One process's handle on one LMDB directory, shared by its stores."""

    def __init__(self, path: str, readonly: bool, options: dict[str, Any]) -> None:
        self.path = path
        self.readonly = readonly
        self.options = options
        self.refs = 0
        self.quiet_at_fork = True
        self._open()

    def _open(self) -> None:
        self.pid = os.getpid()
        self.write_lock = threading.Lock()
        self.queue_lock = threading.Lock()
        self.queue: list[_Request] = []
        self.leading = False  # a thread is committing batches of transact()
        self.gate = _SharedExclusive()
        try:
            self.env = lmdb.open(
                self.path,
                map_size=self.options["map_size"],
                subdir=True,
                readonly=self.readonly,
                create=not self.readonly,
                max_readers=self.options["max_readers"],
                max_dbs=0,
                max_spare_txns=0,
                readahead=False,
                lock=True,
                **_DURABILITY[self.options["durability"]],
            )
        except lmdb.InvalidError as e:
            raise CorruptStoreError(f"{self.path} does not hold a valid LMDB store: {e}") from e
        except lmdb.VersionMismatchError as e:
            raise CorruptStoreError(
                f"{self.path} was written by an incompatible LMDB version: {e}"
            ) from e
        self.env.reader_check()
        self.max_key = self.env.max_key_size()

    def check_fork(self) -> None:
        if self.pid == os.getpid():
            return
        with _REGISTRY_LOCK:
            if self.pid == os.getpid():
                return
            if not self.quiet_at_fork:
                raise KVError(
                    f"the store at {self.path} had a transaction open in another thread "
                    "when this process forked, so the inherited handle cannot be used or "
                    "closed safely here; open a new store in the child process"
                )
            # No transaction was open at fork() (the pre-fork hook made sure),
            # so closing the inherited handle touches no reader slot of the
            # parent's; then open the directory afresh.
            self.env.close()
            self._open()

    # -- map size -----------------------------------------------------------
    def map_size(self) -> int:
        return int(self.env.info()["map_size"])

    def used_bytes(self) -> int:
        info = self.env.info()
        return (int(info["last_pgno"]) + 1) * int(self.env.stat()["psize"])

    def grow(self, minimum: int | None = None, *, adopt_only: bool = False) -> None:
        """Grow the map (or adopt another process's growth); waits for this
        process's open transactions. Raises StoreFullError at the cap."""
        cap = self.options["max_size"]
        with self.gate.exclusive():
            if adopt_only:
                self.env.set_mapsize(0)
                return
            current = self.map_size()
            target = max(current * 2, (minimum or 0) * 2, current + (1 << 20))
            if cap is not None:
                if current >= cap:
                    raise StoreFullError(
                        f"the store at {self.path} reached its size cap of {cap:,} bytes "
                        f"(max_size); delete threads or prune, or open it with a larger "
                        f"max_size"
                    )
                target = min(target, cap)
            target = (target + _PAGE - 1) // _PAGE * _PAGE
            self.env.set_mapsize(target)

    def ensure_headroom(self) -> None:
        """Grow before a write when less than half of the map is free."""
        if self.readonly:
            return
        used, size = self.used_bytes(), self.map_size()
        cap = self.options["max_size"]
        if used * 2 > size and (cap is None or size < cap):
            self.grow(used)

    def begin(self, write: bool) -> lmdb.Transaction:
        """Begin a transaction; adopt another process's growth; clear dead readers."""
        for _ in range(8):
            try:
                return self.env.begin(write=write, buffers=False)
            except lmdb.MapResizedError:
                self.gate.release_shared()
                try:
                    self.grow(adopt_only=True)
                finally:
                    self.gate.acquire_shared()
            except lmdb.ReadersFullError:
                if not self.env.reader_check():
                    raise
        return self.env.begin(write=write, buffers=False)


class _Request:
    """One caller's function waiting for a group commit."""

    __slots__ = ("done", "error", "fn", "result", "wake")

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False
        self.wake = threading.Event()

    def finish(self, error: BaseException) -> None:
        self.error = error
        self.done = True


def _run_one(store: LMDBStore, env: _Env, txn: lmdb.Transaction, r: _Request, nested: bool) -> None:
    """Run one request's function; in a batch, inside a nested transaction so
    that its failure undoes only its own changes. MapFullError propagates (the
    whole batch is rerun after the map grows)."""
    sub = env.env.begin(write=True, parent=txn) if nested else txn
    try:
        r.result = r.fn(_LMDBTxn(store, env, sub, write=True, replay=False))
    except lmdb.MapFullError:
        if nested:
            sub.abort()
        raise
    except BaseException as e:
        r.error = e
        if nested:
            sub.abort()
        return
    if nested:
        sub.commit()


_REGISTRY: dict[str, _Env] = {}
_REGISTRY_LOCK = threading.Lock()


_FORK_WAIT_SECONDS = 5.0


def _before_fork() -> None:
    # Quiesce every environment so the child inherits no open transaction.
    # A thread that forks while holding one, or a transaction that outlives
    # the wait, leaves that environment unusable in the child (clear error).
    _REGISTRY_LOCK.acquire()
    for env in _REGISTRY.values():
        env.quiet_at_fork = not env.gate.held_shared_by_me() and env.gate.acquire_exclusive(
            _FORK_WAIT_SECONDS
        )


def _after_fork_parent() -> None:
    for env in _REGISTRY.values():
        if env.quiet_at_fork:
            env.gate.release_exclusive()
    _REGISTRY_LOCK.release()


def _after_fork_child() -> None:
    global _REGISTRY_LOCK
    _REGISTRY_LOCK = threading.Lock()
    for env in _REGISTRY.values():
        # Locks may have been held by parent threads that do not exist here.
        env.write_lock = threading.Lock()
        env.queue_lock = threading.Lock()
        env.queue = []
        env.leading = False
        env.gate = _SharedExclusive()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child
)


class _LMDBTxn:
    def __init__(
        self,
        store: LMDBStore,
        env: _Env,
        txn: lmdb.Transaction,
        write: bool,
        replay: bool = True,
    ) -> None:
        self._store = store
        self._env = env
        self._txn = txn
        self._write = write
        # Mutations, replayed into a fresh transaction after a map growth
        # (not kept under transact(), which reruns the caller's function).
        self._log: list[tuple[str, bytes | None, bytes | None]] | None = (
            [] if write and replay else None
        )

    def _check_key(self, key: bytes) -> None:
        if len(key) > self._env.max_key:
            raise KeyTooLongError(
                f"key of {len(key)} bytes is longer than LMDB's limit of {self._env.max_key} bytes"
            )
        if not key:
            raise KeyTooLongError("LMDB does not accept an empty key")

    def _require_write(self) -> None:
        if not self._write:
            raise ReadOnlyError("cannot write in a read transaction")

    def get(self, key: bytes) -> bytes | None:
        if not key or len(key) > self._env.max_key:
            return None
        return self._txn.get(key)

    def _mutate(self, op: str, a: bytes | None, b: bytes | None) -> Any:
        if self._log is None:
            return self._apply(self._txn, op, a, b, self._env.max_key)
        while True:
            try:
                result = self._apply(self._txn, op, a, b, self._env.max_key)
                self._log.append((op, a, b))
                return result
            except lmdb.MapFullError:
                self._txn = self._store._regrow(self._txn, self._log)

    @staticmethod
    def _apply(
        txn: lmdb.Transaction, op: str, a: bytes | None, b: bytes | None, max_key: int = 511
    ) -> Any:
        if op == "put":
            return txn.put(a, b)
        if op == "delete":
            return txn.delete(a)
        return _delete_range(txn, a, b, max_key)

    def put(self, key: bytes, value: bytes) -> None:
        self._require_write()
        self._check_key(key)
        self._mutate("put", bytes(key), bytes(value))

    def delete(self, key: bytes) -> bool:
        self._require_write()
        if not key or len(key) > self._env.max_key:
            return False
        return bool(self._mutate("delete", bytes(key), None))

    def delete_range(self, start: bytes | None, stop: bytes | None) -> int:
        self._require_write()
        return int(self._mutate("delete_range", start, stop))

    def scan(
        self, start: bytes | None = None, stop: bytes | None = None, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        return _scan(self._txn, self._env.max_key, start, stop, reverse)


def _position(cur: lmdb.Cursor, bound: bytes, max_key: int) -> bool:
    """set_range that accepts bounds longer than a key can be: no stored key
    is longer than max_key, so positioning on the truncated bound lands at or
    before the true position (callers then skip keys below the bound)."""
    return bool(cur.set_range(bound[:max_key]))


def _scan(
    txn: lmdb.Transaction, max_key: int, start: bytes | None, stop: bytes | None, reverse: bool
) -> Iterator[tuple[bytes, bytes]]:
    with txn.cursor() as cur:
        if not reverse:
            ok = cur.first() if start is None else _position(cur, start, max_key)
            while ok:
                key = cur.key()
                if stop is not None and key >= stop:
                    return
                if start is None or key >= start:
                    yield key, cur.value()
                ok = cur.next()
            return
        # Reverse: the last key < stop. set_range lands on the first key >=
        # stop (step back one), or past the end (start from the last key).
        if stop is None:
            ok = cur.last()
        elif _position(cur, stop, max_key):
            ok = True
            while ok and cur.key() >= stop:
                ok = cur.prev()
        else:
            ok = cur.last()
        while ok:
            key = cur.key()
            if start is not None and key < start:
                return
            yield key, cur.value()
            ok = cur.prev()


def _delete_range(
    txn: lmdb.Transaction, start: bytes | None, stop: bytes | None, max_key: int
) -> int:
    n = 0
    with txn.cursor() as cur:
        ok = cur.first() if start is None else _position(cur, start, max_key)
        while ok:
            key = cur.key()
            if stop is not None and key >= stop:
                break
            if start is not None and key < start:
                ok = cur.next()
                continue
            ok = cur.delete()  # moves to the next item
            n += 1
    return n


class LMDBStore:
    """An ordered ``Store`` in an LMDB environment at directory ``path``.

    Args:
        path: directory of the store; created (with parents) unless readonly.
        readonly: open read-only; any write raises ``ReadOnlyError``. Sees new
            commits of other processes at every new transaction.
        durability: ``"full"`` (default), ``"meta"`` or ``"none"``; see the
            module docstring for exactly what each gives up.
        map_size: initial map size in bytes; the map grows by itself.
        max_size: cap on the data file in bytes, or None for no cap.
        max_readers: reader slots (simultaneous read transactions across all
            processes); only the first opener of a directory sets it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        readonly: bool = False,
        durability: Durability = "full",
        map_size: int = _DEFAULT_MAP_SIZE,
        max_size: int | None = None,
        max_readers: int = 256,
    ) -> None:
        if durability not in _DURABILITY:
            raise ValueError(
                f"unknown durability {durability!r}; choose one of {sorted(_DURABILITY)}"
            )
        if max_size is not None and max_size < _PAGE * 8:
            raise ValueError(f"max_size={max_size} is too small (minimum {_PAGE * 8} bytes)")
        self.path = os.path.abspath(os.fspath(path))
        self.readonly = readonly
        self.durability = durability
        self._closed = False
        _check_dir(self.path, readonly)
        map_size = max(_PAGE * 8, (map_size + _PAGE - 1) // _PAGE * _PAGE)
        if max_size is not None:
            map_size = min(map_size, max_size)
        options = {
            "map_size": map_size,
            "max_size": max_size,
            "durability": durability,
            "max_readers": max_readers,
        }
        key = os.path.realpath(self.path)
        inherited = _REGISTRY.get(key)
        if inherited is not None:
            inherited.check_fork()  # reopen a handle inherited through fork()
        with _REGISTRY_LOCK:
            env = _REGISTRY.get(key)
            if env is not None:
                if env.readonly and not readonly:
                    raise KVError(
                        f"{self.path} is already open read-only in this process; close "
                        "that store before opening it for writing"
                    )
            else:
                env = _Env(key, readonly, options)
                _REGISTRY[key] = env
            env.refs += 1
        self._env = env
        self._finalizer = weakref.finalize(self, _release, key, env)

    def _check_open(self) -> _Env:
        if self._closed:
            raise StoreClosedError(f"the store at {self.path} is closed")
        self._env.check_fork()
        return self._env

    @property
    def max_key_size(self) -> int:
        return self._env.max_key

    @contextmanager
    def read(self) -> Iterator[_LMDBTxn]:
        env = self._check_open()
        env.gate.acquire_shared()
        try:
            txn = env.begin(write=False)
            try:
                yield _LMDBTxn(self, env, txn, write=False)
            finally:
                txn.abort()
        finally:
            env.gate.release_shared()

    @contextmanager
    def write(self) -> Iterator[_LMDBTxn]:
        env = self._check_open()
        if self.readonly:
            raise ReadOnlyError(f"the store at {self.path} was opened read-only")
        with env.write_lock:
            env.ensure_headroom()
            env.gate.acquire_shared()
            try:
                wrapper = _LMDBTxn(self, env, env.begin(write=True), write=True)
                try:
                    yield wrapper
                except BaseException:
                    wrapper._txn.abort()
                    raise
                self._commit(wrapper)
            finally:
                env.gate.release_shared()

    def transact(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(txn)`` in a write transaction and return its result.

        Group commit: functions submitted while another commit is in progress
        are committed together, in one transaction and one sync. Each runs in
        its own nested transaction, so an exception in one caller's function
        rolls back only that function's changes and reaches only that caller.
        Every caller returns only after the commit holding its changes is
        durable (per ``durability``). ``fn`` may run more than once (after a
        map growth), so it must act only through ``txn``; it must not call
        ``transact`` or ``write`` itself.
        """
        env = self._check_open()
        if self.readonly:
            raise ReadOnlyError(f"the store at {self.path} was opened read-only")
        req = _Request(fn)
        with env.queue_lock:
            env.queue.append(req)
            lead = not env.leading
            env.leading = True
        if not lead:
            req.wake.wait()  # done by a leader, or promoted to lead
        if not req.done:
            with env.queue_lock:
                batch, env.queue = env.queue, []
            with env.write_lock:
                self._run_batch(env, batch)
            for r in batch:
                r.wake.set()
            with env.queue_lock:
                if env.queue:
                    env.queue[0].wake.set()  # the oldest waiter leads the next batch
                else:
                    env.leading = False
        if req.error is not None:
            raise req.error
        return req.result  # type: ignore[return-value]

    def _run_batch(self, env: _Env, batch: list[_Request]) -> None:
        try:
            env.ensure_headroom()
            env.gate.acquire_shared()
        except BaseException as e:
            for r in batch:
                r.finish(error=e)
            return
        txn: lmdb.Transaction | None = None
        try:
            while True:
                txn = env.begin(write=True)
                try:
                    for r in batch:
                        r.result, r.error = None, None
                        _run_one(self, env, txn, r, nested=len(batch) > 1)
                    if len(batch) == 1 and batch[0].error is not None:
                        txn.abort()
                    else:
                        txn.commit()
                    break
                except lmdb.MapFullError:
                    txn.abort()
                    env.gate.release_shared()
                    try:
                        env.grow(env.used_bytes())
                    finally:
                        env.gate.acquire_shared()
        except BaseException as e:
            # A failure of the shared commit itself (cap reached, disk error)
            # is every caller's failure: none of their changes were written.
            for r in batch:
                r.error = e
            if txn is not None:
                txn.abort()
        finally:
            env.gate.release_shared()
            for r in batch:
                r.done = True

    def _commit(self, wrapper: _LMDBTxn) -> None:
        while True:
            try:
                wrapper._txn.commit()
                return
            except lmdb.MapFullError:
                assert wrapper._log is not None
                wrapper._txn = self._regrow(wrapper._txn, wrapper._log)

    def _regrow(self, txn: lmdb.Transaction, log: list[Any]) -> lmdb.Transaction:
        """Abort ``txn``, grow the map, and replay ``log`` into a new one."""
        env = self._env
        txn.abort()
        env.gate.release_shared()
        try:
            env.grow(env.used_bytes())
        finally:
            env.gate.acquire_shared()
        new = env.begin(write=True)
        try:
            for op, a, b in log:
                _LMDBTxn._apply(new, op, a, b, env.max_key)
        except lmdb.MapFullError:
            return self._regrow(new, log)
        except BaseException:
            new.abort()
            raise
        return new

    def sync(self) -> None:
        """Flush to disk now (useful with durability ``"none"``)."""
        self._check_open().env.sync(True)

    def info(self) -> dict[str, int]:
        """Map size, bytes in use, and the data file's size on disk."""
        env = self._check_open()
        return {
            "map_size": env.map_size(),
            "used_bytes": env.used_bytes(),
            "file_bytes": os.path.getsize(os.path.join(self.path, "data.mdb")),
        }

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._finalizer()

    def __enter__(self) -> LMDBStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LMDBStore({self.path!r}, readonly={self.readonly}, durability={self.durability!r})"


def _release(key: str, env: _Env) -> None:
    with _REGISTRY_LOCK:
        env.refs -= 1
        if env.refs > 0:
            return
        if _REGISTRY.get(key) is env:
            del _REGISTRY[key]
        if env.pid == os.getpid():
            env.env.close()


def _check_dir(path: str, readonly: bool) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise CorruptStoreError(f"{path} exists and is not a directory; an LMDB store is one")
    if os.path.isdir(path):
        entries = set(os.listdir(path))
        if entries and "data.mdb" not in entries:
            raise CorruptStoreError(
                f"{path} is a non-empty directory without data.mdb: not an LMDB store "
                "(refusing to create one among other files)"
            )
    elif readonly:
        raise FileNotFoundError(f"no store at {path} (read-only open does not create one)")
    else:
        os.makedirs(path, exist_ok=True)
