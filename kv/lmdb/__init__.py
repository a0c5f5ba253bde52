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
  If the directory's ``data.mdb`` was deleted or replaced since (``rmtree``
  and open again), a new open gets a fresh environment on the new files and
  the old handles raise ``StoreClosedError`` (``_registered``).
* **Writers.** One write transaction at a time: an in-process lock, and across
  processes LMDB's own writer mutex. Readers never block and never wait.
* **fork().** An environment must not be used in a child after ``fork()``. The
  child reopens the directory on first use and never closes the parent's
  handle (closing it would release the parent's reader slots).
* **Dead readers.** Reader slots left by killed processes are cleared
  (``reader_check``) at open, when the reader table fills up, as the data
  file grows (a dead reader's snapshot keeps freed pages from being reused)
  and before a write is refused at the size cap (``_Env.check_readers``).
* **Interrupts.** A ``KeyboardInterrupt`` (or any exception raised from a
  signal handler) landing anywhere in a write leaves no lock, gate hold,
  lead or open transaction behind, and reaches only its own thread
  (``LMDBStore.transact``).
* **Snapshots.** LMDB 0.9 can give a read transaction begun during two quick
  commits of another process a newer snapshot than its id names, and the
  next read an older one; every read transaction is checked and begun again
  when that may have happened (``_Env._settled``), so reads never go back.
* **Zeroing ahead.** Where commits fsync, the data file is written (zeros)
  a little past LMDB's last page, so commits overwrite blocks rather than
  extend the file, which makes each ``fdatasync`` cheaper
  (``_Env.zero_ahead``).
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
naming the cap, and leaves the store as it was. A transaction that only
deletes may use a small reserve past the cap (1/32 of it, at least 256 KiB),
because a delete needs a few free pages too: a store at its cap can always be
cleaned up (``delete_thread``, ``prune``), and the cap applies again after.

**Compaction.** An LMDB file never shrinks: pages freed by deletes are reused,
never returned. ``compact_lmdb(path)`` rewrites the store offline: every
record, in key order, appended to a new file (full pages, no free ones; see
``_rebuild``) beside ``data.mdb``, which then ``os.replace``s ``data.mdb``, so
a crash leaves the old or the new file, never a mix. Offline means nobody else
has the store open, which the store checks through ``kvsaver.lock`` in its
directory: every ``LMDBStore`` holds a shared ``flock`` on it while open (taken
before LMDB opens its files, released after they are closed), and compaction
takes it exclusively without waiting, or fails with ``StoreBusyError``. An
opener that finds compaction running waits for it (at most
``_COMPACTION_WAIT_SECONDS``) and then opens the compacted file. As a second
check, for LMDB users that are not ``LMDBStore`` (e.g. ``mdb_stat``), the
compactor probes LMDB's own ``lock.mdb``: every process with the environment
open holds a shared ``fcntl`` lock on its first byte.

The modules, each importing only modules listed before it:

* ``gate``: the in-process shared/exclusive lock around every transaction;
* ``datafile``: the data file's meta pages, read beside LMDB;
* ``lockfile``: ``kvsaver.lock``, and the probe of LMDB's ``lock.mdb``;
* ``failures``: LMDB's errors as ours, and the cleanup after an interrupt;
* ``ranges``: range scans and deletes on a cursor;
* ``growth``: map growth, the delete-only reserve, zeroing ahead, dead readers;
* ``snapshot``: beginning transactions, on a settled snapshot;
* ``environment``: ``_Env`` (made of the two above and ``kv.group_commit``'s
  queue, which ``kv.postgres`` shares), its registry, ``fork()``;
* ``store``: ``LMDBStore`` and its transactions;
* ``compact``: ``compact_lmdb``.
"""

from .compact import CompactResult, compact_lmdb
from .environment import Durability
from .lockfile import LOCK_FILE
from .store import LMDBStore

__all__ = ["LOCK_FILE", "CompactResult", "Durability", "LMDBStore", "compact_lmdb"]
