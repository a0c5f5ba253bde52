"""Beginning transactions, and the snapshot every read must get.

LMDB 0.9 can give a read transaction begun during two quick commits of
another process a newer snapshot than its id names, and the next read an
older one: every read transaction is checked, and begun again when that may
have happened (``_settled``), so reads never go back. A begin also adopts
another process's growth of the map and clears dead readers' slots when the
reader table is full.

``_Snapshots`` is a part of ``environment._Env``, whose ``_open`` sets the
state declared here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lmdb

from .datafile import _TXNID_AT
from .growth import _MapGrowth

_SETTLE_TRIES = 32


class _Snapshots(_MapGrowth):
    """Beginning read and write transactions, for ``_Env``."""

    # Set by _Env._open (see there): both meta pages' transaction ids.
    txnids: Callable[..., tuple[Any, ...]]

    def last_txnid(self) -> int:
        """The newest meta page's transaction id, as ``env.info()`` gives it,
        read from our own map of the two meta pages: ``info()`` releases the
        GIL, so an event loop reading inline (aget_tuple) would give it away at
        every read to threads that then keep it for a switch interval; and it
        builds a dict. The same bytes info() reads, through the same page
        cache, so the same value whenever LMDB's own would be."""
        a, b = self.txnids(self.metas, _TXNID_AT)
        return a if a > b else b

    def begin(self, write: bool) -> lmdb.Transaction:
        """Begin a transaction; adopt another process's growth; clear dead
        readers; a write transaction zeroes the file ahead (zero_ahead)."""
        for _ in range(8):
            try:
                txn = self.env.begin(write=write, buffers=False)
                return self._ready(txn, write)
            except lmdb.MapResizedError:
                self.gate.release_shared()
                try:
                    self.grow(adopt_only=True)
                finally:
                    self.gate.acquire_shared()
            except lmdb.ReadersFullError:
                if not self.env.reader_check():
                    raise
        return self._ready(self.env.begin(write=write, buffers=False), write)

    def begin_read(self) -> lmdb.Transaction:
        """``begin(write=False)``, its common case first: every read comes here."""
        txn = None
        try:
            txn = self.env.begin(buffers=False)
            if self.last_txnid() <= txn.id():
                return txn  # no commit newer than ours: settled (see _settled)
            # _settled begins again: another process may grow the map meanwhile
            return self._settled(txn)
        except (lmdb.MapResizedError, lmdb.ReadersFullError):
            return self.begin(write=False)  # adopts the growth, clears dead readers
        except BaseException:
            # An interrupt between begin and return: end the transaction now, or
            # its reader slot pins old pages until the traceback is collected.
            if txn is not None:
                txn.abort()
            raise

    def _ready(self, txn: lmdb.Transaction, write: bool) -> lmdb.Transaction:
        if not write:
            return self._settled(txn)
        if self.zeroing:
            try:
                self.zero_ahead()
            except BaseException:
                txn.abort()
                raise
        return txn

    def _settled(self, txn: lmdb.Transaction) -> lmdb.Transaction:
        """A read transaction whose snapshot is the one its id names.

        LMDB 0.9 begins a read by taking the last committed txnid N from the
        lock table and only then copying the roots from meta slot N % 2. A
        reader paused between the two while another process commits N+1 and
        N+2 (which overwrites that slot) copies N+2's roots: its snapshot is
        newer than N, and a read that starts a moment later, while N+2's
        writer is between writing its meta page and publishing N+2, gets N+1,
        so a thread could see the store go back in time (rarely, against a
        busy writer). Overwriting slot N % 2 needs N+1 published first, so
        when no meta page newer than N exists after the copy, the copy was
        N's. The pages of a too-new snapshot are safe meanwhile (LMDB keeps
        every page a reader of N may see).

        A newer meta page is nearly always N+1's, written but not yet
        published: at durability "full" its writer holds it so for a whole
        device flush (LMDB writes the meta page through a synchronous fd, then
        publishes), and re-beginning until then would cost every read that
        begins in that window up to ``_SETTLE_TRIES`` begins, and beside a busy
        writer many reads begin in that window. So the probe is a second begin:
        it reads the published id after our copy, and if that is still N, N+1
        was not published before the copy, so N+2's meta page was not begun:
        the copy was N's. Otherwise the probe is the next candidate. A writer
        publishing faster than we can begin falls back, after
        ``_SETTLE_TRIES``, to accepting a meta page one newer than the id."""
        attempt = 0
        probe = None
        try:
            while self.last_txnid() > txn.id() + (attempt >= _SETTLE_TRIES):
                probe = self.env.begin(write=False, buffers=False)
                if probe.id() == txn.id():
                    probe.abort()
                    return txn
                txn.abort()
                txn = probe
                attempt += 1
        except BaseException:
            # An interrupt: leave no reader slot pinned (see begin_read).
            txn.abort()
            if probe is not None:
                probe.abort()
            raise
        return txn
