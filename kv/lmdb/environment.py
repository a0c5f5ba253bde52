"""``_Env``: this process's one handle on an LMDB directory, and the registry
of them.

LMDB must not open the same files twice in one process, so the stores on one
directory share one ``_Env`` (``_REGISTRY``, refcounted; ``_registered``
forgets one whose files were deleted or replaced since). After ``fork()`` the
child reopens the directory on first use (``check_fork``), and the fork hooks
here make sure that no transaction is open across the fork. An ``_Env`` is
made of the parts in ``growth`` and ``snapshot``, and of the group-commit queue
(``kv.group_commit``).

``_PID`` and ``_REGISTRY_LOCK`` are set anew in a forked child: other modules
read them as attributes of this module, never through ``from ... import``.
"""

from __future__ import annotations

import os
import struct
import threading
from typing import Any, Literal

import lmdb

from ..group_commit import CommitQueue
from ..store import CorruptStoreError, KVError
from .datafile import _TXNID, _check_data_file, _identity, _map_metas
from .gate import _SharedExclusive
from .lockfile import _hold_shared
from .snapshot import _Snapshots

Durability = Literal["full", "meta", "none"]
_DURABILITY: dict[str, dict[str, bool]] = {
    "full": {"sync": True, "metasync": True},
    "meta": {"sync": True, "metasync": False},
    "none": {"sync": False, "metasync": False},
}
_DEFAULT_MAP_SIZE = 64 << 20
_POLL_SECONDS = 0.05  # a waiting transact() call looks at its request this often


class _Env(_Snapshots, CommitQueue):
    """One process's handle on one LMDB directory, shared by its stores."""

    def __init__(self, path: str, readonly: bool, options: dict[str, Any]) -> None:
        self.path = path
        self.readonly = readonly
        self.options = options
        self.refs = 0
        self.quiet_at_fork = True
        self.stale = False  # its files were deleted or replaced (see _registered())
        self.fork_owner: tuple[int, int] | None = None  # the gate, held across fork()
        self.lock_fd: int | None = None
        self._open()

    def _open(self) -> None:
        self.write_lock = threading.Lock()
        # Taken with ``with env.write_lock:`` only: a lock's own __enter__ and
        # __exit__ are C, so an interrupt cannot fall between taking it and
        # the block that releases it (a Python context manager's __exit__ can
        # be interrupted before its first line).
        self.writer: int | None = None  # thread holding write_lock (check_not_writing)
        self.noop_txnid = -1  # see commit_noop()
        self.over_cap = False  # a delete-only transaction is using the reserve
        self.headroom_skips = 0  # see ensure_headroom()
        # transact()'s group commit (kv.group_commit), leaders gathering
        self.init_queue(poll_seconds=_POLL_SECONDS, gathers=True)
        self.gate = _SharedExclusive()
        # Zeroing ahead (see zero_ahead()): the data file's end we know is
        # written, and the fd we write through; only where commits fsync.
        if (inherited_fd := getattr(self, "data_fd", None)) is not None:
            os.close(inherited_fd)  # inherited through fork()
        self.data_fd: int | None = None
        self.zeroed_to = 0
        self.zeroing = not self.readonly and self.options["durability"] != "none"
        if self.lock_fd is not None:
            os.close(self.lock_fd)  # inherited through fork(); the parent keeps its lock
        self.lock_fd = _hold_shared(self.path, self.readonly)
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
        except BaseException as e:
            if self.lock_fd is not None:
                os.close(self.lock_fd)
                self.lock_fd = None
            if isinstance(e, lmdb.Error):
                _check_data_file(self.path)  # a clearer reason, if the file has one
            if isinstance(e, lmdb.InvalidError):
                raise CorruptStoreError(f"{self.path} does not hold a valid LMDB store: {e}") from e
            if isinstance(e, lmdb.VersionMismatchError):
                raise CorruptStoreError(
                    f"{self.path} was written by an incompatible LMDB version: {e}"
                ) from e
            raise
        try:
            # After LMDB's open, which waits for a creating process to have
            # written the meta pages; before any page is read through the map.
            _check_data_file(self.path)
        except BaseException:
            self.env.close()
            if self.lock_fd is not None:
                os.close(self.lock_fd)
                self.lock_fd = None
            raise
        self.identity = _identity(self.path)
        self.env.reader_check()
        self.max_key = self.env.max_key_size()
        self.psize = int(self.env.stat()["psize"])
        self.metas = _map_metas(self.path, self.psize)  # see last_txnid()
        # Both meta pages' transaction ids in one unpack (every read begins
        # with last_txnid()): the first, psize - 8 bytes skipped, the second.
        self.txnids = struct.Struct(f"<Q{self.psize - _TXNID.size}xQ").unpack_from
        self.readers_checked_at = self.used_bytes()  # see check_readers()
        self.mapsize = int(self.env.info()["map_size"])  # see set_mapsize()
        # Last: check_fork()'s unlocked fast path reads pid, so another thread
        # of a forked child must not see our pid before the new env is ready.
        self.pid = os.getpid()

    def check_fork(self) -> None:
        if self.pid == _PID:  # not os.getpid(): a system call, at every transaction
            return
        with _REGISTRY_LOCK:
            if self.pid == os.getpid():
                return
            if not self.quiet_at_fork:
                # Not "open a new store here": py-lmdb refuses to open the
                # same files twice in one process, and the inherited handle
                # cannot be closed (that would end the parent's transactions).
                raise KVError(
                    f"the store at {self.path} had a transaction open when this process "
                    "forked, so the inherited handle cannot be used or closed safely here, "
                    "and LMDB cannot open the same store twice in one process; use it from "
                    "a process started with the 'spawn' method, or fork while no "
                    "transaction is open"
                )
            # No transaction was open at fork() (the pre-fork hook made sure),
            # so closing the inherited handle touches no reader slot of the
            # parent's; then open the directory afresh.
            self.env.close()
            self._open()

    def check_not_writing(self) -> None:
        if self.writer == threading.get_ident():
            raise RuntimeError("a write transaction is already open in this thread")


_REGISTRY: dict[str, _Env] = {}
_REGISTRY_LOCK = threading.Lock()


_FORK_WAIT_SECONDS = 5.0
# This process's id, kept by _after_fork_child: the fast checks of every read
# and write compare it with the id an environment was opened in, instead of
# calling os.getpid() (a system call) at every transaction.
_PID = os.getpid()


def _before_fork() -> None:
    # Quiesce every environment so the child inherits no open transaction.
    # A thread that forks while holding one, or a transaction that outlives
    # the wait, leaves that environment unusable in the child (clear error).
    _REGISTRY_LOCK.acquire()
    for env in _REGISTRY.values():
        env.fork_owner = (
            None if env.gate.held_shared_by_me() else env.gate.acquire_exclusive(_FORK_WAIT_SECONDS)
        )
        env.quiet_at_fork = env.fork_owner is not None


def _after_fork_parent() -> None:
    for env in _REGISTRY.values():
        if env.quiet_at_fork:
            env.gate.release_exclusive(env.fork_owner)
    _REGISTRY_LOCK.release()


def _after_fork_child() -> None:
    global _REGISTRY_LOCK, _PID
    _PID = os.getpid()  # first: every environment now belongs to another process
    _REGISTRY_LOCK = threading.Lock()
    for env in _REGISTRY.values():
        # Locks may have been held by parent threads that do not exist here.
        env.write_lock = threading.Lock()
        env.writer = None
        env.init_queue(poll_seconds=_POLL_SECONDS, gathers=True)
        env.gate = _SharedExclusive()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child
)


def _registered(key: str) -> _Env | None:
    """The environment this process has open on directory ``key``, unless
    its data file was deleted or replaced since (a notebook or a test
    fixture runs ``shutil.rmtree(path)`` and opens ``path`` again while
    an old store is still open). Reusing it would serve the deleted files,
    and every write would vanish; so it is marked stale (its stores raise
    StoreClosedError from then on) and forgotten, and the caller opens the
    new files. Its own handles are released as its stores close. The old
    file stays open meanwhile, so its inode cannot be reused by the new one.
    Caller holds _REGISTRY_LOCK."""
    env = _REGISTRY.get(key)
    if env is not None and env.pid == os.getpid() and _identity(key) != env.identity:
        env.stale = True
        del _REGISTRY[key]
        return None
    return env


def _release(key: str, env: _Env) -> None:
    with _REGISTRY_LOCK:
        env.refs -= 1
        if env.refs > 0:
            return
        if _REGISTRY.get(key) is env:
            del _REGISTRY[key]
        if env.pid == os.getpid():
            env.env.close()
            env.metas.close()
            if env.data_fd is not None:
                os.close(env.data_fd)
                env.data_fd = None
            if env.lock_fd is not None:  # after the files are closed: compaction may start
                os.close(env.lock_fd)
                env.lock_fd = None
