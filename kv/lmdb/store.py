"""``LMDBStore``: the store a caller opens, its read and write transactions,
and the group commit that runs ``transact``.

Opening finds or opens the directory's shared ``_Env`` (``environment``);
reads enter a ``_ReadContext``; ``write()`` holds the writer lock for one
transaction, and ``transact()`` queues its function in the group-commit queue
(``kv.group_commit``), whose leader runs the batch in one transaction
(``_run_batch``).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import lmdb

from ..group_commit import Request as _Request
from ..store import (
    CorruptStoreError,
    KeyTooLongError,
    KVError,
    ReadOnlyError,
    ScanArgs,
    Store,
    StoreClosedError,
)

# _PID and _REGISTRY_LOCK through the module: a forked child sets them anew.
from . import environment as _environment
from .environment import (
    _DEFAULT_MAP_SIZE,
    _DURABILITY,
    _REGISTRY,
    Durability,
    _Env,
    _registered,
    _release,
)
from .failures import _DAMAGE, _damaged, _disk_full, _drop_orphans, _finished
from .growth import _PAGE, _no_puts
from .lockfile import CALLER_FILES
from .ranges import _delete_range, _one, _scan

T = TypeVar("T")


def _run_one(store: LMDBStore, env: _Env, txn: lmdb.Transaction, r: _Request, nested: bool) -> None:
    """Run one request's function; in a batch, inside a nested transaction so
    that its failure undoes only its own changes. MapFullError propagates (the
    whole batch is rerun after the map grows), and so does a BaseException
    that is not an Exception (KeyboardInterrupt, SystemExit): it interrupts
    the leader's thread, and other callers' functions are run again by the
    next leader instead of receiving it."""
    sub = env.env.begin(write=True, parent=txn) if nested else txn
    try:
        r.result = r.fn(_LMDBTxn(store, env, sub, write=True, replay=False))
    except lmdb.MapFullError:
        if nested:
            sub.abort()
        raise
    except Exception as e:
        r.error = _damaged(env.path, e) if isinstance(e, _DAMAGE) else e
        if nested:
            sub.abort()
        return
    except BaseException:
        if nested:
            sub.abort()
        raise
    if nested:
        sub.commit()


class _LMDBTxn:
    __slots__ = ("_cur", "_env", "_log", "_store", "_txn", "_write")

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
        self._cur: lmdb.Cursor | None = None  # _point()
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

    def _point(self) -> lmdb.Cursor:
        """The cursor of this transaction's point reads and writes, made on
        first use (``_cur``; None again whenever ``_txn`` is replaced).
        A positioned cursor looks for a key on its current leaf page before
        descending from the root (LMDB's MDB_SET), and the keys a checkpoint
        reads or writes are mostly neighbours, so most gets skip the descent.
        py-lmdb lets go of the GIL around every LMDB call, so the shorter
        call also gives the threads around it less chance to take the GIL
        meanwhile. A lone ``get`` (a head's) makes no cursor: making one
        costs more than it saves."""
        cur = self._cur
        if cur is None:
            cur = self._cur = self._txn.cursor()
        return cur

    def get(self, key: bytes) -> bytes | None:
        if not key or len(key) > self._env.max_key:
            return None
        cur = self._cur
        if cur is None:  # a lone get (a head's) is cheaper without a cursor
            return self._txn.get(key)
        return cur.value() if cur.set_key(key) else None

    def _mutate(self, op: str, a: bytes | None, b: bytes | None) -> Any:
        if self._log is None:
            return self._apply(self._txn, op, a, b, self._env.max_key)
        while True:
            try:
                result = self._apply(self._txn, op, a, b, self._env.max_key)
                self._log.append((op, a, b))
                return result
            except lmdb.MapFullError:
                shrinking = op != "put" and _no_puts(self._log)
                self._cur = None  # first: an interrupt may land between the two
                self._txn = self._store._regrow(self._txn, self._log, shrinking=shrinking)

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
        # The checks inline and, under transact() (no log), straight to LMDB:
        # a put of a checkpoint makes about ten of these.
        if not self._write:
            self._require_write()
        if not key or len(key) > self._env.max_key:
            self._check_key(key)
        if self._log is None:
            (self._cur or self._point()).put(bytes(key), bytes(value))
        else:
            self._mutate("put", bytes(key), bytes(value))

    def delete(self, key: bytes) -> bool:
        if not self._write:
            self._require_write()
        if not key or len(key) > self._env.max_key:
            return False
        if self._log is None:
            return bool(self._txn.delete(bytes(key)))
        return bool(self._mutate("delete", bytes(key), None))

    def delete_range(self, start: bytes | None, stop: bytes | None) -> int:
        self._require_write()
        return int(self._mutate("delete_range", start, stop))

    def prefetch(self, keys: Sequence[bytes] = (), scans: Sequence[ScanArgs] = ()) -> None:
        """Nothing: a memory-mapped read costs no more later (``Txn.prefetch``)."""

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        cur = self._cur or self._point()
        at, value, max_key = cur.set_key, cur.value, self._env.max_key
        return [value() if k and len(k) <= max_key and at(k) else None for k in keys]

    def scan(
        self,
        start: bytes | None = None,
        stop: bytes | None = None,
        *,
        reverse: bool = False,
        limit: int | None = None,
    ) -> Iterator[tuple[bytes, bytes]]:
        if limit == 1:  # "the first/last key in a range": every get_tuple of a latest
            return iter(_one(self._txn, self._env.max_key, start, stop, reverse))
        return _scan(self._txn, self._env.max_key, start, stop, reverse, limit)


_new_txn = object.__new__


class _ReadContext:
    """``LMDBStore.read()``: a class rather than a ``@contextmanager``
    generator, which is slower to enter and leave, and every read enters one."""

    __slots__ = ("_env", "_store", "_txn")

    def __init__(self, store: LMDBStore) -> None:
        self._store = store

    def __enter__(self) -> _LMDBTxn:
        store = self._store
        env = self._env = store._env
        if store._closed or env.stale or env.pid != _environment._PID:
            store._check_open()
        gate = env.gate
        held = gate.held_shared_by_me()
        try:
            gate.acquire_shared()
            self._txn = env.begin_read()
        except BaseException:
            gate.restore(held)  # exact, wherever an interrupt landed
            raise
        # The read wrapper built without __init__'s call: every read makes one.
        wrapper = _new_txn(_LMDBTxn)
        wrapper._store, wrapper._env, wrapper._txn = store, env, self._txn
        wrapper._write, wrapper._log, wrapper._cur = False, None, None
        return wrapper

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        try:
            self._txn.abort()
        finally:
            self._env.gate.release_shared()
        if exc is not None and isinstance(exc, _DAMAGE):
            raise _damaged(self._env.path, exc) from exc


class LMDBStore(Store):
    """An ordered ``Store`` in an LMDB environment at directory ``path``.

    Args:
        path: directory of the store; created (with parents) unless readonly.
        readonly: open read-only; any write raises ``ReadOnlyError``. Sees new
            commits of other processes at every new transaction.
        durability: ``"full"`` (default), ``"meta"`` or ``"none"``; see the
            package docstring (``kv.lmdb``) for exactly what each gives up.
        map_size: initial map size in bytes; the map grows by itself.
        max_size: cap on the data file in bytes, or None for no cap.
        max_readers: reader slots (simultaneous read transactions across all
            processes); only the first opener of a directory sets it.
    """

    nonblocking_reads = True  # reads are memory-map reads (see kv.store)
    path: str  # the directory

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
        # The directory of its files alone: a caller may keep files of its
        # own there, named CALLER_FILES* (see kv.store).
        self.directory = self.path
        self.readonly = readonly
        self.durability = durability
        self.max_size = max_size  # the cap on the data file, None for none
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
        with _environment._REGISTRY_LOCK:
            env = _registered(key)
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
        env = self._env
        if env.stale:
            raise StoreClosedError(
                f"the store at {self.path} was deleted or replaced while this handle was "
                "open (a store opened there since uses the new files); this handle is "
                "closed: open the path again"
            )
        env.check_fork()
        return env

    @property
    def max_key_size(self) -> int:
        return self._env.max_key

    def read(self) -> _ReadContext:
        return _ReadContext(self)

    @contextmanager
    def write(self) -> Iterator[_LMDBTxn]:
        env = self._check_open()
        if self.readonly:
            raise ReadOnlyError(f"the store at {self.path} was opened read-only")
        env.check_not_writing()  # else this thread would wait for itself
        me = threading.get_ident()
        held = env.gate.held_shared_by_me()
        wrapper: _LMDBTxn | None = None
        try:
            with env.write_lock:
                env.writer = me
                try:
                    env.ensure_headroom()
                    env.gate.acquire_shared()
                    cleaned = False
                    try:
                        wrapper = _LMDBTxn(self, env, env.begin(write=True), write=True)
                        try:
                            yield wrapper
                            self._commit(wrapper)
                        except BaseException:
                            # Before the gate is given back: the map may grow
                            # only while no transaction is open. (Nothing if
                            # the commit happened.)
                            wrapper._txn.abort()
                            raise
                        cleaned = bool(wrapper._log) and _no_puts(wrapper._log or [])
                    finally:
                        env.gate.release_shared()
                        env.settle_cap(cleaned)
                finally:
                    env.writer = None
        except BaseException as e:
            if not isinstance(e, Exception):
                # Interrupted, maybe between two steps above:
                # end the transaction, give back the gate, and drop what the
                # interrupted frames still hold (see _drop_orphans).
                if wrapper is not None:
                    wrapper._txn.abort()  # nothing if it committed
                env.gate.restore(held)
                _drop_orphans(e)
            if isinstance(e, _DAMAGE):
                raise _damaged(self.path, e) from e
            raise

    def transact(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(txn)`` in a write transaction and return its result.

        Group commit: functions submitted while another commit is in progress
        are committed together, in one transaction and one sync. Each runs in
        its own nested transaction, so an exception in one caller's function
        rolls back only that function's changes and reaches only that caller.
        Every caller returns only after the commit holding its changes is
        durable (per ``durability``). ``fn`` may run more than once (after a
        map growth, or when the thread committing its batch is interrupted),
        so it must act only through ``txn``; it must not call ``transact`` or
        ``write`` itself.

        An interrupt (``KeyboardInterrupt``, or any ``BaseException`` that is
        not an ``Exception``, e.g. from a signal handler) reaches only the
        thread it was raised in, wherever it lands: the batch that thread was
        committing is rolled back unless its commit already happened, the
        other callers' functions are committed by the next leader, and every
        later write goes through. The interrupted call's own function may or
        may not have been committed, as with any interrupted commit.
        """
        env = self._check_open()
        if self.readonly:
            raise ReadOnlyError(f"the store at {self.path} was opened read-only")
        env.check_not_writing()  # else this thread would wait for itself
        req = _Request(fn)
        held = env.gate.held_shared_by_me()
        try:
            self._group_commit(env, req)
        except BaseException as e:
            self._interrupted(env, req, held, e)
            raise
        if req.error is not None:
            raise req.error
        return req.result  # type: ignore[return-value]

    def _group_commit(self, env: _Env, req: _Request) -> None:
        """Queue ``req`` (kv.group_commit); as the leader, commit a batch
        under the writer lock, then hand the lead over."""
        if not env.submit(req):
            env.wait_turn(req)
            if req.done:
                return
        batch = env.gather()
        with env.write_lock:
            env.writer = threading.get_ident()
            try:
                started = time.monotonic()
                self._run_batch(env, batch)
                env.commit_seconds = time.monotonic() - started
            finally:
                env.writer = None
        env.wake_done(req, batch)
        with env.queue_lock:
            env.hand_over(req)

    def _interrupted(self, env: _Env, req: _Request, held: int, e: BaseException) -> None:
        """Clean up after an exception escaped the group commit: an interrupt,
        which can land between any two steps of it. Whatever this thread
        held is given back from the state itself, not from how far it got:
        its gate holds (to ``held``), the batch transaction (committed if and
        only if LMDB closed it without our abort; else aborted and the other
        callers' requests queued again), its queue entry and the lead."""
        txn = req.txn
        committed = False
        if txn is not None:
            committed = not req.aborted and _finished(txn)
            if not committed:
                req.aborted = True
                txn.abort()
        env.gate.restore(held)  # after the abort: the map grows only with no transaction open
        with env.queue_lock:
            if committed and env.leader is req:
                for r in env.batch:
                    r.done = True  # results and errors were set before the commit
            env.withdraw(req)
        _drop_orphans(e)

    def _run_batch(self, env: _Env, batch: list[_Request]) -> None:
        """Run ``batch`` in one write transaction (``lead.txn``, ``lead`` the
        request of the thread running it, ``env.leader``) and commit it;
        each request gets its result or error and is marked done. A failure of
        the commit itself (cap reached, disk error) is every caller's failure:
        none of their changes were written. An interrupt propagates as it is,
        nothing marked done (see _interrupted)."""
        lead = env.leader
        assert lead is not None
        failure: BaseException | None = None
        try:
            env.ensure_headroom()
            env.gate.acquire_shared()
            try:
                while True:
                    lead.txn = env.begin(write=True)
                    lead.aborted = False
                    try:
                        for r in batch:
                            r.result, r.error = None, None
                            _run_one(self, env, lead.txn, r, nested=len(batch) > 1)
                        if len(batch) == 1 and batch[0].error is not None:
                            lead.aborted = True
                            lead.txn.abort()
                        else:
                            lead.txn.commit()
                        break
                    except lmdb.MapFullError:
                        lead.aborted = True  # first: the commit may have closed it
                        lead.txn.abort()
                        used = env.used_bytes()  # under the gate (see sizes())
                        env.gate.release_shared()
                        try:
                            env.grow(used)
                        finally:
                            env.gate.acquire_shared()
                    except lmdb.Error as e:
                        lead.aborted = True
                        lead.txn.abort()
                        # Disk full right after a delete: the pages it freed become
                        # usable after one more commit (see commit_noop); retry once.
                        if _disk_full(self.path, e) is e or not env.commit_noop():
                            raise
            except BaseException:
                # Before the gate is given back (the map grows only with no
                # transaction open): end a transaction still open. One LMDB
                # closed was committed, or is marked aborted already.
                if lead.txn is not None and not _finished(lead.txn):
                    lead.aborted = True
                    lead.txn.abort()
                raise
            finally:
                env.gate.release_shared()
        except Exception as e:
            lead.aborted = True
            if lead.txn is not None:
                lead.txn.abort()
            failure = _damaged(self.path, e) if isinstance(e, _DAMAGE) else _disk_full(self.path, e)
        for r in batch:
            if failure is not None:
                r.error = failure
            r.done = True

    def _commit(self, wrapper: _LMDBTxn) -> None:
        while True:
            try:
                wrapper._txn.commit()
                return
            except lmdb.MapFullError:
                assert wrapper._log is not None
                shrinking = _no_puts(wrapper._log)
                wrapper._cur = None  # first, as in _LMDBTxn._mutate
                wrapper._txn = self._regrow(wrapper._txn, wrapper._log, shrinking=shrinking)
            except lmdb.Error as e:
                full = _disk_full(self.path, e)
                if full is e:
                    raise
                if not self._env.commit_noop():  # as in _run_batch: retry once
                    raise full from e
                assert wrapper._log is not None
                wrapper._cur = None
                wrapper._txn = self._regrow(wrapper._txn, wrapper._log, grow=False)

    def _regrow(
        self, txn: lmdb.Transaction, log: list[Any], grow: bool = True, shrinking: bool = False
    ) -> lmdb.Transaction:
        """Abort ``txn``, grow the map, and replay ``log`` into a new one."""
        env = self._env
        txn.abort()
        if grow:
            used = env.used_bytes()  # under the gate (see sizes())
            env.gate.release_shared()
            try:
                env.grow(used, shrinking=shrinking)
            finally:
                env.gate.acquire_shared()
        new = env.begin(write=True)
        try:
            for op, a, b in log:
                _LMDBTxn._apply(new, op, a, b, env.max_key)
        except lmdb.MapFullError:
            return self._regrow(new, log, shrinking=shrinking)
        except BaseException:
            new.abort()
            raise
        return new

    def sync(self) -> None:
        """Flush to disk now (useful with durability ``"none"``)."""
        env = self._check_open()
        env.gate.acquire_shared()  # see _Env.sizes()
        try:
            env.env.sync(True)
        finally:
            env.gate.release_shared()

    def info(self) -> dict[str, int]:
        """Map size, bytes in use, and the data file's size on disk."""
        used, size = self._check_open().sizes()
        return {
            "map_size": size,
            "used_bytes": used,
            "file_bytes": os.path.getsize(os.path.join(self.path, "data.mdb")),
        }

    def used_bytes(self) -> int:
        """``info()["used_bytes"]`` without a system call (the newest meta
        page, read from a map of the data file's first pages)."""
        return self._check_open().used_by_meta()

    def disk_usage(self) -> int:
        """Bytes of the files in the store's directory (data, LMDB's lock
        file, ``kvsaver.lock`` and those a caller keeps there)."""
        self._check_open()
        total = 0
        for entry in os.scandir(self.path):
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
        return total

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


def _check_dir(path: str, readonly: bool) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise CorruptStoreError(f"{path} exists and is not a directory; an LMDB store is one")
    if os.path.isdir(path):
        # Lock files alone are a store being created by another process this
        # moment (LMDB makes lock.mdb, then data.mdb), or an open that failed.
        # (and the files named CALLER_FILES*, ours and a caller's).
        entries = {e for e in os.listdir(path) if not e.startswith(CALLER_FILES)} - {"lock.mdb"}
        if entries and "data.mdb" not in entries:
            raise CorruptStoreError(
                f"{path} is a non-empty directory without data.mdb: not an LMDB store "
                "(refusing to create one among other files)"
            )
        if readonly and "data.mdb" not in entries:  # else lmdb.Error, outside our family
            raise FileNotFoundError(f"no store at {path} (read-only open does not create one)")
    elif readonly:
        raise FileNotFoundError(f"no store at {path} (read-only open does not create one)")
    else:
        os.makedirs(path, exist_ok=True)
