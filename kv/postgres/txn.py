"""``_PGTxn``, the ``Txn`` protocol: one transaction on one pooled connection.
It buffers writes and queues scans until a round trip has to be paid, sends
them with BEGIN, a guard of speculated reads, and COMMIT in as few round trips
as it can, and finds out what became of a commit whose connection broke. Its
connection and cache come from the store (connections.py, cache.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..store import KeyTooLongError, KVError, ReadOnlyError, ScanArgs, StoreClosedError
from .cache import _inside
from .driver import (
    _TUPLES_OK,
    _ended,
    _error,
    _exchange,
    _own_result,
    _prepared_names,
    _results,
    _Rows,
)
from .errors import (
    SpeculationFailed,
    StoreUnavailableError,
    _classify,
    _shut_down,
    _translate,
    _unprepared,
)
from .statements import _XID, _bool_array, _bytea_array, _text, _VectorValue

if TYPE_CHECKING:
    from .postgres_store import PostgresStore


MAX_KEY = 2000  # a btree index entry must fit a third of an 8 KiB page
_FIRST_CHUNK = 64
_MAX_CHUNK = 1024
_HASH_OVER = 64  # a guard compares a longer assumed value by its SHA-256
VECTORS_EACH = 2048  # the most buffered vectors: then they are sent
_DELETE_EACH = 8  # up to this many keys deleted: a statement each (see _Queries)


class _PGTxn:
    """One transaction on one pooled connection. ``_known`` holds what this
    transaction knows of a key's current value (point reads and its own
    writes); ``_dirty`` the writes not yet sent (``None``: delete)."""

    def __init__(self, store: PostgresStore, conn: Any, write: bool) -> None:
        self._store = store
        self._q = store._q
        self._conn = conn
        self._cursor: Any = None  # made on first use (a write-only put needs none)
        self._write = write
        self._begin = store._begin_write if write else store._begin_read
        self._begun = False
        self._open = True
        self._known: dict[bytes, bytes | None] = {}
        self._dirty: dict[bytes, bytes | None] = {}
        # Vectors (SupportsVectors): their statements, once the store opened
        # them, and the vectors put not yet sent (after the records' writes).
        self._vq = store._vq
        self._vdirty: dict[bytes, _VectorValue] = {}
        # First chunks of scans not yet sent: they go with the next round trip.
        self._queue: list[tuple[Any, Any, _Pending | None]] = []
        self._xid = _Pending((), 1)
        # The connection still holds the previous read's snapshot: its
        # ROLLBACK goes first in this transaction's first round trip.
        self._pre_rollback = False
        self._unclaimed: dict[tuple[Any, ...], _Pending] = {}
        self.lost = False  # the connection broke (the store discards it)
        self.failed: KVError | None = None  # a statement failed: the txn is rolled back
        self.may_resend = True  # nothing committed or returned yet: a retry is safe
        # Speculation (transact only): reads answered from the store's cache of
        # committed values, verified by a guard statement in the same round
        # trip as the writes and COMMIT (see PostgresStore.transact).
        self.speculate = False
        self._assumed: dict[bytes, bytes | None] = {}  # not yet in a guard
        self.assumed_keys: list[bytes] = []
        self._ranges: list[tuple[bytes | None, bytes | None]] = []  # delete_range calls
        self._sent = 0  # round trips made (a mark is restorable only with none since)

    @property
    def _cur(self) -> Any:
        cur = self._cursor
        if cur is None:
            cur = self._cursor = self._conn.cursor(binary=True)
        return cur

    # -- statements -------------------------------------------------------------
    def _run(self, query: Any, params: Sequence[Any] | None) -> Any:
        """Execute one statement (``None``: only what is queued) after BEGIN,
        the buffered writes and the queued scans, all in one round trip; the
        cursor, ready to fetch."""
        if not self._open:
            raise StoreClosedError("transaction is finished")
        if self.failed is not None:
            raise self.failed
        pre: list[tuple[Any, Any, _Pending | None]] = []
        if not self._begun:
            pre.append((self._begin, None, None))
            if self._write:  # the id whose fate a lost COMMIT is checked by
                pre.append((_XID, None, self._xid))
        pre.extend((q, p, None) for q, p in self._guard_statements())
        pre.extend(self._queue)
        pre.extend((q, p, None) for q, p in self._flush_statements())
        self.speculate = False  # a round trip is paid now: read for real from here on
        self._sent += 1
        out: Any = None
        resent = 0
        while True:
            try:
                self._store._statements += len(pre) + (query is not None)
                self._store._round_trips += 1
                if self._store.prepare:
                    out = self._exchange(pre, query, params)
                elif pre:
                    with self._conn.pipeline():
                        if self._pre_rollback:
                            self._cur.execute("ROLLBACK")
                        for q, p, pending in pre:
                            if pending is None:
                                self._cur.execute(_text(q), p)
                            else:
                                pending.cur = self._conn.cursor(binary=True)
                                pending.cur.execute(_text(q), p)
                        if query is not None:
                            self._cur.execute(_text(query), params)
                    for _, _, pending in pre:
                        if pending is not None:
                            pending.rows = pending.cur.fetchall()
                            pending.cur = None
                else:
                    self._cur.execute(_text(query), params)
                break
            except Exception as e:
                if not self._begun and self.may_resend:
                    if _classify(e) == "lost" and self._store._reconnect(self):
                        continue  # the first statement on a dead pooled connection: resend
                    if _unprepared(e) and not resent:
                        resent += 1
                        # Our statements were deallocated behind our back
                        # (DEALLOCATE ALL, DISCARD ALL of a pool's reset): it
                        # failed before anything ran; end what BEGIN opened,
                        # prepare them all again (_exchange forgot every name)
                        # and resend, once.
                        self._pre_rollback = True
                        continue
                self._fail(e, "statement")
            except BaseException:
                # Interrupted (Ctrl-C) mid-round-trip: the connection is
                # discarded, never kept for the next transaction half-read.
                self.lost = True
                raise
        self._begun = True
        self._pre_rollback = False
        self.may_resend = False
        self._dirty.clear()
        self._queue.clear()
        return self._cur if out is None else out

    def _exchange(
        self, pre: list[tuple[Any, Any, _Pending | None]], query: Any, params: Any
    ) -> _Rows | None:
        """``_run``'s round trip as prepared statements in one libpq pipeline;
        the last statement's result (None: there is none)."""
        items: list[tuple[Any, Any]] = [("ROLLBACK", None)] if self._pre_rollback else []
        items.extend((q, p) for q, p, _ in pre)
        if query is not None:
            items.append((query, params))
        results = _exchange(self._conn, items)
        first = len(items) - len(pre) - (query is not None)
        for (_, _, pending), res in zip(pre, results[first:]):
            if pending is not None:
                pending.rows = res.rows
        return results[-1] if query is not None else None

    def _mark(self) -> tuple[Any, ...]:
        """What ``_restore`` needs to undo one caller's function in a group
        commit (see PostgresStore.transact): everything it did is still in
        this process until the transaction's next round trip."""
        return (
            self._sent,
            dict(self._known),
            dict(self._dirty),
            dict(self._assumed),
            len(self.assumed_keys),
            len(self._ranges),
            len(self._queue),
            dict(self._unclaimed),
            dict(self._vdirty),
        )

    def _restore(self, mark: tuple[Any, ...]) -> bool:
        """Back to ``mark``; False when that cannot be (a round trip since
        sent some of it, or a statement failed)."""
        if mark[0] != self._sent or self.failed is not None or not self._open:
            return False
        (
            _,
            self._known,
            self._dirty,
            self._assumed,
            keys,
            ranges,
            queued,
            self._unclaimed,
            self._vdirty,
        ) = mark
        del self.assumed_keys[keys:]
        del self._ranges[ranges:]
        del self._queue[queued:]
        return True

    def _fail(self, e: Exception, where: str) -> None:
        if _classify(e) == "lost" or self._conn.broken or self._conn.closed:
            self.lost = True
        self.failed = self._guard_failed(e) or _translate(e, where)
        raise self.failed from e

    def _guard_failed(self, e: BaseException) -> KVError | None:
        from psycopg import errors

        if self.assumed_keys and isinstance(e, errors.DivisionByZero):
            err = SpeculationFailed("a value read from the cache had changed; rerun")
            err.__cause__ = e
            return err
        return None

    def _assume(self, keys: list[bytes]) -> bool:
        """Answer reads of ``keys`` from the store's cache (a key it has no
        entry for is assumed absent), to be verified by a guard; False when
        one cannot be (a value too large to cache)."""
        guesses = self._store._cache.guess(keys)
        if guesses is None:
            return False
        for k, v in zip(keys, guesses):
            self._known[k] = self._assumed[k] = v
        self.assumed_keys.extend(keys)
        return True

    def _guard_statements(self) -> list[tuple[Any, Any]]:
        if not self._assumed:
            return []
        keys, values, hashed = [], [], []
        for k, v in self._assumed.items():
            keys.append(k)
            big = v is not None and len(v) > _HASH_OVER
            values.append(hashlib.sha256(v).digest() if big and v is not None else v)
            hashed.append(big)
        self._assumed = {}
        return [(self._q.guard, (_bytea_array(keys), _bytea_array(values), _bool_array(hashed)))]

    def _flush_statements(self) -> list[tuple[Any, Any]]:
        if not self._dirty and not self._vdirty:
            return []
        puts = [(k, v) for k, v in self._dirty.items() if v is not None]
        dels = [k for k, v in self._dirty.items() if v is None]
        out: list[tuple[Any, Any]] = []
        if puts:
            params = (_bytea_array([k for k, _ in puts]), _bytea_array([v for _, v in puts]))
            out.append((self._q.upsert, params))
        return out + self._vector_statements() + self._delete_statements(dels)

    def _vector_statements(self) -> list[tuple[Any, Any]]:
        """The vectors put, sent after the records' upsert (a vector's key must
        be there) and before the deletes (a key deleted after its vector was
        put takes the vector with it); taken from the buffer."""
        if not self._vdirty:
            return []
        vq, vdirty = self._vq, self._vdirty
        assert vq is not None
        self._vdirty = {}
        return [(vq.upsert, (_bytea_array(list(vdirty)), vq.vectors(list(vdirty.values()))))]

    def _delete_statements(self, dels: list[bytes]) -> list[tuple[Any, Any]]:
        if len(dels) > _DELETE_EACH:
            return [(self._q.delete_many, (_bytea_array(dels),))]
        one = self._q.delete_one
        return [(one, (k,)) for k in dels]

    def _unsent_writes(self) -> list[tuple[Any, Any]]:
        queued = [(q, p) for q, p, pending in self._queue if pending is None]
        self._queue.clear()
        return queued + self._flush_statements()

    def finish(self, commit: bool) -> None:
        """COMMIT (with the buffered writes, one round trip) or ROLLBACK. A
        transaction one of whose statements failed is rolled back, and asked
        to commit, raises that failure (its function may have caught it)."""
        self._open = False
        if commit and self.failed is not None:
            if not self.lost:
                self._rollback_quietly()
            raise self.failed
        if commit and not self._begun and not self._queue and not self.lost:
            # Only writes (and guesses), no read: BEGIN, one statement doing
            # them all (and one per deleted key, of a few), and COMMIT, in one go.
            writes = self._write_all()
            if writes:
                self._commit_first(writes, xid_in=True)
            elif self._pre_rollback:
                self._rollback_quietly()
            return
        writes = self._guard_statements() + self._unsent_writes() if commit else []
        if not self._begun or self.lost:
            if writes and not self.lost:
                self._commit_first(writes, xid_in=False)
            elif self._pre_rollback and not self.lost:
                self._rollback_quietly()
            return
        if commit and self.failed is None:
            self._commit(writes)
            return
        try:
            self._store._round_trips += 1
            self._cur.execute("ROLLBACK")
        except Exception:
            self.lost = True  # the server rolls back a broken session itself

    def _commit_first(self, writes: list[tuple[Any, Any]], *, xid_in: bool) -> None:
        """Commit a transaction that has sent nothing yet. On a connection the
        server already ended (a restart), send nothing: a new connection, or
        a clear "not committed"."""
        if _ended(self._conn) and not self._store._reconnect(self):
            self.failed = StoreUnavailableError(
                "commit: PostgreSQL unavailable; the transaction was not sent"
            )
            raise self.failed
        first = [("ROLLBACK", None)] if self._pre_rollback else []
        if xid_in and self._store._serializable.get(self._conn, False):
            self._commit([*first, *writes], len(first) - 1, xid_in=True, implicit=True)
            return
        self._commit([*first, (self._begin, None), *writes], xid_after=len(first), xid_in=xid_in)

    def _write_all(self) -> list[tuple[Any, Any]]:
        """The statements of a write-only transaction (none: nothing to do):
        its one statement, then its deletes."""
        assumed, dirty = self._assumed, self._dirty
        if not assumed and not dirty and not self._vdirty:
            return []
        self._assumed = {}
        av: list[bytes | None] = []
        ah: list[bool] = []
        for v in assumed.values():
            if v is not None and len(v) > _HASH_OVER:
                av.append(hashlib.sha256(v).digest())
                ah.append(True)
            else:
                av.append(v)
                ah.append(False)
        pk: list[bytes] = []
        pv: list[bytes] = []
        dels: list[bytes] = []
        for k, value in dirty.items():
            if value is None:
                dels.append(k)
            else:
                pk.append(k)
                pv.append(value)
        params = (
            *(_bytea_array(list(assumed)), _bytea_array(av), _bool_array(ah)),
            *(_bytea_array(pk), _bytea_array(pv)),
        )
        vectors = self._vector_statements()
        return [(self._q.write_all, params), *vectors, *self._delete_statements(dels)]

    def _commit(
        self,
        pre: list[tuple[Any, Any]],
        xid_after: int | None = None,
        xid_in: bool = False,
        implicit: bool = False,
    ) -> None:
        """The buffered writes and COMMIT in one pipeline (one round trip). An
        error the server reports aborts the transaction (nothing committed).
        A connection lost on the way: the transaction's id, fetched with its
        first statement, is looked up on a new connection (txid_status), so
        the outcome is known unless the server cannot be reached.
        ``implicit``: ``pre`` is a whole transaction by itself on a
        SERIALIZABLE session (its statements up to the pipeline's Sync are
        one implicit transaction), after ``ROLLBACK`` of a lingering read if
        any: no BEGIN, no COMMIT."""
        with_xid = xid_after is not None
        self._store._statements += (not implicit) + len(pre) + (with_xid and not xid_in)
        self._store._round_trips += 1
        try:
            if self._store.prepare:
                q = self._q.write_all
                if (
                    implicit
                    and len(pre) == 1
                    and pre[0][0] is q
                    and q.name in _prepared_names(self._conn)
                ):
                    self._xid.rows = self._exec_prepared(pre[0][1])
                else:
                    self._xid.rows = self._exchange_commit(pre, xid_after, xid_in, implicit)
                return
            if implicit and len(pre) == 1:  # one statement: no pipeline needed
                self._xid.cur = self._conn.cursor()
                self._xid.cur.execute(_text(pre[0][0]), pre[0][1])
                self._xid.rows = self._xid.cur.fetchall()
                return
            with self._conn.pipeline():
                for i, (q, params) in enumerate(pre):
                    if xid_in and xid_after is not None and i == xid_after + 1:
                        # this statement's result is the transaction's id
                        self._xid.cur = self._conn.cursor()
                        self._xid.cur.execute(_text(q), params)
                        continue
                    self._cur.execute(_text(q), params)
                    if i == xid_after and not xid_in:
                        self._xid.cur = self._conn.cursor()
                        self._xid.cur.execute(_XID)
                if not implicit:
                    self._cur.execute("COMMIT")
            if with_xid:  # after the pipeline: fetched inside, it would wait for a Flush
                self._xid.rows = self._xid.cur.fetchall()
        except Exception as e:
            lost = _classify(e) == "lost" or self._conn.broken or self._conn.closed
            if not lost:
                if not implicit:  # an implicit transaction ended with its statement
                    self._rollback_quietly()
                self.failed = self._guard_failed(e) or _translate(e, "commit")
                raise self.failed from e
            self.lost = True
            if with_xid and self._xid.rows is None and self._xid.cur is not None:
                try:
                    self._xid.rows = self._xid.cur.fetchall()
                except Exception:
                    pass
            if with_xid and not self._xid.rows and _shut_down(e):
                # The server's results come in order, and the first one is its
                # notice that it ended the session: it executed nothing of ours.
                self.failed = _translate(e, "commit")
                raise self.failed from e
            fate = self._store._fate(self._xid.rows[0][0] if self._xid.rows else None)
            # xid_in: a write-only transaction (its statement returns its id),
            # whose every write is in _dirty (cleared only below, in finally).
            if fate is None and xid_in and self._dirty and self._store._holds(self._dirty):
                fate = "committed"  # its id never came back, its writes are there
            if fate == "committed":
                return
            self.failed = _translate(e, "commit", committing=fate != "aborted")
            raise self.failed from e
        finally:
            self._dirty.clear()
            self._vdirty.clear()

    def _exec_prepared(self, params: Sequence[Any]) -> list[tuple[int]]:
        """The write-only statement, prepared on this connection already (see
        _commit), as a server-side prepared statement of our own, parsed and
        planned once per connection as PostgresSaver's statements are (not at
        every put and put_writes): no pipeline, the least client CPU. A
        statement the server no longer has (a pool's reset, DEALLOCATE ALL)
        failed before running, so nothing is applied twice: it is prepared
        again and sent once more. The rows: the transaction's id."""
        stmt = self._q.write_all
        conn = self._conn
        pgconn = conn.pgconn
        try:
            # our arrays: bytes already, sent as they are (binary)
            pgconn.send_query_prepared(stmt.name, params, (1,) * len(params), 0)
            results = _results(pgconn)
        except BaseException:
            conn.close()  # lost, or interrupted (Ctrl-C): never left half-read
            raise
        res = results[0] if len(results) == 1 else _own_result(results, conn)
        if res.status == _TUPLES_OK:
            return [(int(res.get_value(0, 0) or b"0"),)]
        error = _error(res, conn)
        if not _unprepared(error):
            raise error
        _prepared_names(conn).clear()  # every statement went: see _exchange
        rows = self._exchange_commit([(stmt, params)], -1, True, True)
        assert rows is not None
        return rows

    def _exchange_commit(
        self, pre: list[tuple[Any, Any]], xid_after: int | None, xid_in: bool, implicit: bool
    ) -> list[Any] | None:
        """``_commit``'s pipeline as prepared statements (``_exchange``: one
        round trip, ours named and prepared, not parsed and planned at every
        commit as psycopg's pipeline would); the rows of the transaction's id
        (None: not asked). A statement of ours the server no longer has
        (DEALLOCATE ALL) in a transaction's first round trip failed before
        anything was applied: prepared again and sent once more."""
        items = list(pre)
        xid_at = None if xid_after is None else xid_after + 1
        if xid_at is not None and not xid_in:
            items.insert(xid_at, (_XID, None))
        if not implicit:
            items.append(("COMMIT", None))
        try:
            results = _exchange(self._conn, items)
        except Exception as e:
            came: list[_Rows] | None = getattr(e, "kv_rows", None)
            if xid_at is not None and came is not None and len(came) > xid_at:
                self._xid.rows = came[xid_at].rows or None  # the id, before the break
            if not _unprepared(e) or self._begun:
                raise
            if items[0][0] != "ROLLBACK":  # a failed BEGIN block must end first
                items.insert(0, ("ROLLBACK", None))
                xid_at = None if xid_at is None else xid_at + 1
            results = _exchange(self._conn, items)  # _exchange forgot every name
        return None if xid_at is None else results[xid_at].rows

    def _rollback_quietly(self) -> None:
        try:
            self._cur.execute("ROLLBACK")
        except Exception:
            self.lost = True

    # -- the Txn protocol ---------------------------------------------------------
    def _require_write(self) -> None:
        if not self._write:
            raise ReadOnlyError("cannot write in a read transaction")
        if not self._open:
            raise StoreClosedError("transaction is finished")

    def get(self, key: bytes) -> bytes | None:
        key = bytes(key)
        known = self._known
        if key in known:
            return known[key]
        if len(key) > MAX_KEY:
            return None
        if self.speculate and self._assume([key]):
            return known[key]
        row = self._run(self._q.get, (key,)).fetchone()
        value = None if row is None else row[0]
        known[key] = value
        return value

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Values of ``keys`` (None where missing), in one round trip."""
        keys = [bytes(k) for k in keys]
        known = self._known
        missing = [k for k in dict.fromkeys(keys) if k not in known and len(k) <= MAX_KEY]
        if missing and not (self.speculate and self._assume(missing)):
            found = dict(self._run(self._q.get_many, (_bytea_array(missing),)).fetchall())
            for k in missing:
                known[k] = found.get(k)
        return [known.get(k) for k in keys]

    def prefetch(self, keys: Sequence[bytes] = (), scans: Sequence[ScanArgs] = ()) -> None:
        """The scans' first chunks queued (as ``scan`` queues them, for the
        identical scans that follow), then ``keys`` looked up with them in
        one round trip; with no keys, the scans go with the next one."""
        for start, stop, reverse, limit in scans:
            self.scan(start, stop, reverse=reverse, limit=limit)
        if keys:
            self.get_many(keys)

    def put(self, key: bytes, value: bytes) -> None:
        self._require_write()
        key, value = bytes(key), bytes(value)
        if len(key) > MAX_KEY:
            raise KeyTooLongError(
                f"key of {len(key)} bytes is longer than PostgresStore's limit of {MAX_KEY} bytes"
            )
        self._known[key] = self._dirty[key] = value
        self._unclaimed.clear()  # a scan queued before this write must not be shared after it

    def delete(self, key: bytes) -> bool:
        self._require_write()
        key = bytes(key)
        if self.get(key) is None:
            return False
        self._known[key] = self._dirty[key] = None
        self._vdirty.pop(key, None)  # its vector goes with it, sent or not
        self._unclaimed.clear()
        return True

    def delete_range(self, start: bytes | None, stop: bytes | None) -> int:
        self._require_write()
        if start is not None and stop is not None and start >= stop:
            return 0
        params = [b for b in (start, stop) if b is not None]
        q = self._q.delete_range(start is not None, stop is not None)
        n = int(self._run(q, params).rowcount)
        self._unclaimed.clear()
        self._ranges.append((start, stop))
        for k in [k for k in self._known if _inside(k, start, stop)]:
            self._known[k] = None
        return n

    # -- VectorTxn (the store's vectors opened: PostgresStore.open_vectors) ------------
    def _vectors(self) -> Any:
        if self._vq is None:
            raise KVError("this store's vectors are not open (PostgresStore.open_vectors)")
        return self._vq

    def put_vector(self, key: bytes, vector: bytes) -> None:
        self._require_write()
        vq = self._vectors()
        key = bytes(key)
        self._vdirty[key] = vq.vector(vector)  # checked and converted once, now
        self._unclaimed.clear()
        if len(self._vdirty) >= VECTORS_EACH:  # sent now: a statement's size stays bounded
            self._run(None, None)

    def search_vectors(
        self,
        start: bytes,
        stop: bytes,
        query: bytes,
        limit: int,
        offset: int = 0,
        exact: bool = False,
    ) -> list[tuple[bytes, bytes]]:
        """The records, by their vectors' distance: one statement, sent with
        what is buffered (this transaction's own writes are searched too).
        With HNSW (unless ``exact``), ``hnsw.ef_search`` is set first to
        ``offset + limit`` (at least pgvector's default 40, at most its
        1000): the index returns no more rows than that, and those outside
        the range are left out after (a narrow range finds fewer)."""
        vq = self._vectors()
        if limit <= 0 or start >= stop:
            return []
        vector = vq.vector(query)
        params: tuple[Any, ...]
        if vq.nearest is None or exact:
            stmt, params = vq.exact, (vector, start, stop, vector, limit, offset)
        else:
            ef = min(max(offset + limit, 40), 1000)
            self._queue.append((vq.ef_search, (ef,), None))
            stmt, params = vq.nearest, (vector, vector, ef, start, stop, limit, offset)
        return [(k, v) for k, v in self._run(stmt, params).fetchall()]

    def scan(
        self,
        start: bytes | None = None,
        stop: bytes | None = None,
        *,
        reverse: bool = False,
        limit: int | None = None,
    ) -> Iterator[tuple[bytes, bytes]]:
        """Keyset-paginated chunks: the first of ``min(limit, 64)`` rows, then
        growing to 1024, each resuming after the last key returned.

        The first chunk's query is queued when ``scan`` is called and sent with
        the next round trip (any read's, or this iterator's first ``next``):
        a caller that calls ``scan`` and then ``get_many`` pays one round trip
        for both. Identical scans called before any of them is iterated share
        the queued result: the first one iterated gets it (a later one asks
        again), so a caller may queue a scan that a callee repeats."""
        if limit is not None and limit <= 0:
            return iter(())
        if start is not None and stop is not None and start >= stop:
            return iter(())
        if not self._open:
            raise StoreClosedError("transaction is finished")
        args = (start, stop, reverse, limit)
        token = object()
        pending = self._unclaimed.get(args)
        if pending is None:
            chunk = _FIRST_CHUNK if limit is None else min(limit, _MAX_CHUNK)
            pending = _Pending(args, chunk)
            # Writes made before this scan are sent before it.
            self._queue.extend((q, p, None) for q, p in self._flush_statements())
            self._dirty.clear()
            q, params = self._scan_query(start, stop, reverse, chunk)
            self._queue.append((q, params, pending))
            self._unclaimed[args] = pending
        return self._scan(pending, token)

    def _scan_query(
        self, start: bytes | None, stop: bytes | None, reverse: bool, chunk: int
    ) -> tuple[Any, list[Any]]:
        q = self._q.scan(start is not None, stop is not None, reverse)
        params: list[Any] = [b for b in (start, stop) if b is not None]
        params.append(chunk)
        return q, params

    def _scan(self, pending: _Pending, token: object) -> Iterator[tuple[bytes, bytes]]:
        start, stop, reverse, limit = pending.args
        chunk = pending.chunk
        if pending.owner is None:  # the first one iterated gets the queued result
            pending.owner = token
            if self._unclaimed.get(pending.args) is pending:
                del self._unclaimed[pending.args]
        if pending.owner is token:
            if pending.rows is None:
                self._run(None, None)  # sends the queue, this scan's first chunk with it
            rows = pending.rows
        else:  # another identical scan was iterated first: ask again
            q, params = self._scan_query(start, stop, reverse, chunk)
            rows = self._run(q, params).fetchall()
        left = limit
        while True:
            assert rows is not None
            for row in rows:
                yield row[0], row[1]
            if left is not None:
                left -= len(rows)
                if left <= 0:
                    return
            if len(rows) < chunk:
                return
            last = rows[-1][0]
            if reverse:
                stop = last
            else:
                start = last + b"\x00"  # the smallest key after the last one
            chunk = min(chunk * 4, _MAX_CHUNK)
            if left is not None:
                chunk = min(chunk, left)
            q, params = self._scan_query(start, stop, reverse, chunk)
            rows = self._run(q, params).fetchall()


class _Pending:
    """A scan's first chunk: queued, then its rows."""

    __slots__ = ("args", "chunk", "cur", "owner", "rows")

    def __init__(self, args: tuple[Any, ...], chunk: int) -> None:
        self.args = args
        self.chunk = chunk
        self.cur: Any = None
        self.owner: object | None = None
        self.rows: list[Any] | None = None
