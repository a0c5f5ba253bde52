"""``transact``: a function run in a SERIALIZABLE transaction, rerun after a
conflict or a lost connection, with the group commit that runs the calls other
threads make meanwhile in one transaction and one commit. The queue of calls
and its leader are ``kv.group_commit``'s, which LMDB shares; here is what
PostgreSQL does with a batch: undo one function's buffered changes alone,
speculate, rerun after a conflict. ``_GroupCommit`` holds these methods of
``PostgresStore``, whose ``__init__`` makes their state (``_commits``).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..group_commit import CommitQueue, Request
from ..store import ReadOnlyError
from .errors import CommitUnknownError, SpeculationFailed, StoreConflictError, StoreUnavailableError
from .txn import _PGTxn

if TYPE_CHECKING:
    from .cache import _Cache


T = TypeVar("T")
_SPECULATE_BELOW = 0.25  # speculate while fewer guesses than this fail (moving average)
POLL_SECONDS = 0.5  # a call waiting in a group commit looks at its state this often


def _retryable(error: BaseException, txn: _PGTxn) -> bool:
    if isinstance(error, CommitUnknownError):
        return False
    if isinstance(error, StoreConflictError):
        return True
    return isinstance(error, StoreUnavailableError) and error is txn.failed


class _GroupCommit:
    """``PostgresStore.transact`` and its group commit (see the module's
    docstring)."""

    if TYPE_CHECKING:  # made by PostgresStore.__init__, and its other methods
        readonly: bool
        retries: int
        speculate: bool
        speculations: list[int]
        _misses: float
        _cache: _Cache
        _writer: int | None
        _commits: CommitQueue

        def _check_open(self) -> None: ...
        def _enter_writer(self) -> None: ...
        def _leave_writer(self) -> None: ...
        def _open_txn(self, write: bool) -> _PGTxn: ...
        def _close_txn(self, txn: _PGTxn, commit: bool) -> None: ...

    def transact(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(txn)`` in a SERIALIZABLE transaction and commit. Reruns
        ``fn`` on a fresh transaction after a serialization failure, a
        deadlock, or a connection lost before ``COMMIT`` was sent (bounded by
        ``retries``, exponential backoff with jitter); an exception of ``fn``
        rolls back its changes and reaches the caller. ``fn`` must act only
        through ``txn``, and may run more than once.

        Group commit (a graph's put_writes and put of one step come at once
        from two threads, which would otherwise often wait for each other's
        commit): calls made while another thread's transaction is running
        are queued, and the next leader runs all of them in one
        transaction, one after the other (each sees the changes of those
        before it), and commits them with one round trip and one WAL flush.
        A function that raises undoes only its own changes (they are still
        buffered in this process: else the transaction is rolled back and
        the others rerun) and its error reaches only its caller; a failed
        commit is every caller's.

        Speculation (a put in one round trip, COMMIT included): ``fn``'s
        first reads are answered from a cache of the values this process's
        committed write transactions wrote and read (a key not cached is
        assumed absent: a new checkpoint's keys are), with no round trip; one
        guard statement, sent in the same pipeline as the writes and
        ``COMMIT``, checks under SERIALIZABLE that every such key still holds
        the value assumed, and fails the transaction when one does not. Then
        (or when a function raised an ordinary exception after a guess,
        since a wrong guess may be why) the functions are rerun at once
        reading from the server, so a wrong guess costs a rerun, never a
        wrong write. Reads after the transaction's first round trip are
        always real. Speculation pauses while more than a quarter of recent
        guesses fail (another machine writing the same threads)."""
        self._check_open()
        if self.readonly:
            raise ReadOnlyError(f"{self!r} was opened read-only")
        if self._writer == threading.get_ident():
            raise RuntimeError("a write transaction is already open in this thread")
        call = Request(fn)
        commits = self._commits
        try:
            if not commits.submit(call):
                commits.wait_turn(call)
            if not call.done:
                self._lead(call)
        except BaseException:  # an interrupt: no call of ours left queued or leading
            with commits.queue_lock:
                commits.withdraw(call)
            raise
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[no-any-return]

    def _lead(self, call: Request) -> None:
        """Run every queued call (``call`` among them) as one batch, then make
        the first call queued meanwhile the next leader."""
        commits = self._commits
        batch: list[Request] = []
        try:
            self._enter_writer()  # write() blocks of other threads wait (and we for them)
            try:
                batch = commits.gather()
                self._run_batch(batch)
            finally:
                self._leave_writer()
        except BaseException as e:
            # Not run (the store closed, an interrupt): the next leader runs
            # the others' calls (an interrupt while committing made them done,
            # with CommitUnknownError); an interrupt is this thread's alone.
            if not isinstance(e, Exception):
                raise
            if not call.done:
                call.error, call.done = e, True
        finally:
            commits.wake_done(call, batch)
            with commits.queue_lock:
                commits.hand_over(call)

    def _close_quietly(self, txn: _PGTxn) -> None:
        try:
            self._close_txn(txn, commit=False)
        except Exception:
            pass

    def _run_batch(self, batch: list[Request]) -> None:
        """One transaction for ``batch``'s functions, committed once; reruns
        as ``transact`` says; every call ends done, with its result or error
        (an interrupt propagates: see _lead). A call whose function raised
        where its changes could not be undone alone leaves the batch, the
        transaction is rolled back, and it runs after the others' commit, by
        itself: its error is then that of a function run as if alone, after
        them (not one seen in changes of theirs that were never committed)."""
        later: list[Request] = []
        self._run_together(batch, later)
        for c in later:
            self._run_together([c], later)

    def _run_together(self, batch: list[Request], later: list[Request]) -> None:
        attempt = 0
        speculate = self.speculate and self._misses < _SPECULATE_BELOW
        if self.speculate and not speculate:
            self._misses *= 0.95  # so that it is tried again some time
        todo = list(batch)
        while todo:
            try:
                txn = self._open_txn(write=True)
            except StoreUnavailableError as e:
                if attempt >= self.retries:
                    for c in todo:
                        if not c.done:
                            c.error, c.done = e, True
                    return
            else:
                txn.speculate = speculate
                try:
                    ran, raised, error = self._run_calls(txn, todo)
                except BaseException:  # an interrupt in a function: nothing committed
                    self._close_quietly(txn)
                    raise
                committing = error is None and raised is None
                try:
                    self._close_txn(txn, commit=committing)
                except Exception as e:
                    error = error or e
                except BaseException:
                    if committing:  # an interrupt while committing: the batch's fate is unknown
                        unknown = CommitUnknownError(
                            "the thread committing this call's transaction (a group commit) "
                            "was interrupted; the transaction may or may not have been applied"
                        )
                        for c in ran:  # (one whose function raised keeps its error)
                            c.error, c.done = c.error or unknown, True
                    raise
                if txn.assumed_keys:
                    wrong = isinstance(error, SpeculationFailed) or raised is not None
                    self.speculations[0 if error is None and raised is None else 1] += 1
                    self._misses = self._misses * 0.9 + (0.1 if wrong else 0.0)
                    if error is not None or raised is not None:
                        self._cache.forget(txn.assumed_keys)
                    if wrong:
                        speculate = False
                        continue  # at once, every function reading from the server
                if raised is not None:  # the others run again; it, alone, after them
                    if len(todo) > 1:
                        later.append(raised)
                    else:
                        raised.done = True  # run alone: its error is final
                    todo.remove(raised)
                    continue
                if error is None:
                    for c in ran:
                        c.done = True
                    return
                if not _retryable(error, txn) or attempt >= self.retries:
                    for c in todo:
                        if not c.done:  # not those whose own error was final
                            c.error, c.done = error, True
                    return
            attempt += 1
            time.sleep(min(2.0, 0.01 * 2**attempt) * (0.5 + random.random()))

    def _run_calls(
        self, txn: _PGTxn, todo: list[Request]
    ) -> tuple[list[Request], Request | None, BaseException | None]:
        """Run the functions of ``todo`` in ``txn``: (the calls whose function
        returned, or raised and had its changes undone alone (its error kept
        for when the transaction commits; rerun with the others if it does
        not), a call whose function raised and whose changes could not be
        undone alone (the transaction must be rolled back), the store's own
        error that failed the transaction)."""
        ran: list[Request] = []
        alone = len(todo) == 1
        for c in todo:
            if c.done or c.abandoned:
                continue
            mark = None if alone else txn._mark()
            c.result, c.error = None, None
            try:
                c.result = c.fn(txn)
                if txn.failed is not None:  # it caught the store's error: nothing can commit
                    c.result = None
                    return ran, None, txn.failed
            except Exception as e:
                c.error = e
                if txn.failed is not None and _retryable(txn.failed, txn):
                    return ran, None, txn.failed  # a conflict, a lost connection: all again
                if txn.assumed_keys:
                    return ran, c, None  # maybe a wrong guess: all again, reading for real
                if mark is not None and txn._restore(mark):
                    ran.append(c)
                    continue
                return ran, c, None
            ran.append(c)
        return ran, None, None
