"""``PostgresStore``: the ``Store`` protocol on one PostgreSQL table.

For applications deployed on several machines: every instance opens the same
table on a shared server. One table of ordered byte keys::

    CREATE TABLE kv_store (key bytea PRIMARY KEY, value bytea NOT NULL)

``bytea`` compares as unsigned bytes (memcmp, then length), exactly the order
of Python ``bytes``, so scans return what every other backend returns. The
table's comment is the store's schema record (``kvsaver.kv PostgresStore
format 1``); ``setup()`` creates the table idempotently on first use (under an
advisory lock, so concurrent first openers do not race) and refuses a table
of another kind or of a newer format.

Transactions
    ``read()`` is one consistent snapshot: ``REPEATABLE READ, READ ONLY``,
    taken at the transaction's first read (PostgreSQL takes it then).
    ``write()`` and ``transact()`` are ``SERIALIZABLE``. ``transact(fn)``
    reruns ``fn`` on a serialization failure or a deadlock (bounded, with
    exponential backoff and jitter), and when the connection was lost before
    ``COMMIT`` was sent (the transaction cannot have committed). A rerun starts
    from a fresh transaction: writes buffered by an attempt are discarded with
    it, so no change is applied twice. ``write()`` cannot rerun a ``with``
    body: a conflict there raises ``StoreConflictError`` (use ``transact``).
    Inside one process, write transactions run one at a time (as on LMDB);
    across machines, PostgreSQL serializes them.

Round trips (what a network costs; counted by tests/test_postgres.py)
    Writes are buffered in the transaction and sent as one statement
    (``INSERT ... SELECT unnest(...) ON CONFLICT DO UPDATE``, plus a
    ``DELETE`` of each deleted key, or one ``DELETE ... = ANY(...)`` of more
    than ``_DELETE_EACH``), pipelined with ``COMMIT`` or with the next read
    that must go to the server. A write-only transaction that deletes
    nothing (a speculated put or put_writes) is one statement, a
    server-side prepared statement of ours
    (``_exec_prepared``: parsed and planned once per connection, not through
    psycopg's cache; ``prepare=False`` parses it every time). The statements
    of a round trip before the commit (reads, scans, a guard, buffered
    writes) are named prepared statements too, sent with ``BEGIN`` in one
    libpq pipeline (``_exchange``), each prepared in that same pipeline the
    first time a connection needs it: the server neither parses nor plans them
    again, and planning is a large part of a short read's server time; so are
    the statements that commit a transaction (with ``prepare=False``, psycopg's
    pipeline). ``BEGIN`` is pipelined with the first statement. A connection is
    not given back to the pool after a transaction that went well: it lingers
    for the store's next one (a write's session idle, a read's still in its
    snapshot, whose ``ROLLBACK`` goes in the first round trip of that next
    transaction), and a reaper thread gives it back after ``_LINGER`` seconds
    unused (rolling a read back first), so no session stays idle in a
    transaction for long.
    A scan's first chunk is queued and sent with the next round trip (so a
    scan followed by ``get_many`` costs one). Point reads are remembered for
    the rest of the transaction
    (the snapshot cannot change under it), so ``get_many`` followed by ``get``
    of the same keys costs one round trip. Scans fetch keyset-paginated
    chunks (``WHERE key > last ORDER BY key LIMIT n``), never the whole range
    at once; ``limit`` bounds the first chunk.

Speculation (``transact`` only; ``speculate=False`` turns it off)
    A write transaction's first reads are answered from a cache of what this
    process's committed write transactions wrote and read (a key not in it is
    assumed absent, as a new checkpoint's keys are), with no round trip. A
    guard statement sent first in the committing pipeline checks, under
    SERIALIZABLE and with one index lookup per key, that each of those keys
    still holds the value assumed; when one does not, the transaction fails
    whole and ``fn`` is rerun at once, reading from the server. So a KVSaver
    ``put`` or ``put_writes`` is one round trip, ``BEGIN`` to ``COMMIT``,
    when this process wrote the thread's last checkpoint, and a wrong guess
    (another machine wrote it) costs a rerun, never a wrong write.

Faults
    A dropped connection or a server restart: the first statement of a
    transaction is resent on a new connection (nothing was committed or
    returned yet); a later statement fails with ``StoreUnavailableError``
    (the transaction is rolled back by the server); a failure while
    committing raises ``CommitUnknownError`` (the commit may or may not have
    been applied). The pool replaces dead connections, so the same store works
    again as soon as the server is back. ``statement_timeout`` (a statement
    running longer is cancelled: ``StoreTimeoutError``) and
    ``connect_timeout`` are options.

Space
    PostgreSQL reuses the space of deleted rows by itself (autovacuum);
    ``vacuum(full=True)`` (``VACUUM FULL``, which locks the table while it
    rewrites it) returns it to the operating system.

psycopg 3 and psycopg_pool are an optional extra (``pip install
"kvsaver[postgres]"``), imported when a store is opened; only their
documented API is used: the libpq exchange drives psycopg's libpq wrapper
(``Connection.pgconn``, ``psycopg.pq``) with a loop of its own, not psycopg's
internals, which change between its releases
(tests/test_postgres_public_api.py checks the sources).

The package, a module per mechanism, each importing at run time only modules
listed before it (type hints alone may look back): ``errors`` (the exceptions,
psycopg's errors translated), ``statements`` (the SQL, prepared statements'
names, binary arrays), ``driver`` (the libpq exchange), ``cache`` (what
speculation guesses from), ``txn`` (one transaction), ``connections`` and
``transact`` (base classes of the store: its connections, ``transact`` on
``kv.group_commit``'s queue, the one LMDB uses too),
``postgres_store`` (``PostgresStore``).
"""

from .errors import (
    CommitUnknownError,
    StoreConflictError,
    StoreTimeoutError,
    StoreUnavailableError,
)
from .postgres_store import PostgresStore, is_postgres_url

__all__ = [
    "CommitUnknownError",
    "PostgresStore",
    "StoreConflictError",
    "StoreTimeoutError",
    "StoreUnavailableError",
    "is_postgres_url",
]
