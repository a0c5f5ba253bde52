"""Every SQL statement of the store, composed once per table (``_Queries``),
each also a named server-side prepared statement (``_Stmt``); and the array
parameters, built here in PostgreSQL's binary format (``_bytea_array``,
``_register_arrays``): less client CPU than psycopg's list dumper. Nothing here
talks to the server; what it is sent is made in this one place.
"""

from __future__ import annotations

import array
import hashlib
import re
import struct
import sys
from collections.abc import Sequence
from typing import Any, cast

FORMAT_VERSION = 1


class _Queries:
    """Every statement, composed once from ``psycopg.sql`` identifiers; values
    are always parameters (``%b``: binary bytea)."""

    def __init__(self, table: str) -> None:
        from psycopg import sql

        self._sql = sql
        parts = table.split(".")
        if not 1 <= len(parts) <= 2 or not all(parts):
            raise ValueError(f"table must be 'name' or 'schema.name', got {table!r}")
        t = sql.Identifier(*parts)
        self.ident = t
        digest = hashlib.sha1(table.encode()).hexdigest()[:16]
        self._digest = f"{digest}_{FORMAT_VERSION}"
        self.get = self._stmt("get", "SELECT value FROM {} WHERE key = %b", (_BYTEA,))
        # One index lookup per key (a key not there: NULL), as the guard
        # below does: PostgreSQL's generic plan of ``key = ANY($1)`` (a
        # prepared statement's, from its sixth run) assumes 10 keys and
        # scans the whole table up to a few thousand rows, every time.
        self.get_many = self._stmt(
            "many2",
            "SELECT a.k, (SELECT t.value FROM {} AS t WHERE t.key = a.k) "
            "FROM unnest(%b::bytea[]) AS a(k)",
            (_BYTEA_ARRAY,),
        )
        self.upsert = self._stmt(
            "put",
            "INSERT INTO {} (key, value) SELECT * FROM unnest(%b::bytea[], %b::bytea[]) "
            "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            (_BYTEA_ARRAY, _BYTEA_ARRAY),
        )
        self.delete_many = self._stmt(
            "del", "DELETE FROM {} WHERE key = ANY(%b::bytea[])", (_BYTEA_ARRAY,)
        )
        # A few keys are deleted one statement each (all in the transaction's
        # one pipeline, after its write statement): the generic plan of
        # ``key = ANY($1)`` scans a table
        # of up to a few thousand rows (see get_many); a put deletes one key
        # (its thread's previous activity entry) when a second or more went
        # by since the thread's last put.
        self.delete_one = self._stmt("del1", "DELETE FROM {} WHERE key = %b", (_BYTEA,))
        # Fails (division by zero, which no other statement of ours can raise)
        # unless every key holds the value assumed for it (NULL: absent; a
        # long value is compared by its SHA-256). Not constant-folded: the
        # condition reads the table. One index lookup per key (a correlated
        # subquery: a join could be planned as a scan of the whole table,
        # slow and, under SERIALIZABLE, a lock on all of it).
        check = (
            "1 / (NOT EXISTS (SELECT 1 FROM unnest(%b::bytea[], %b::bytea[], %b::bool[]) "
            "AS a(k, v, h) WHERE (SELECT CASE WHEN a.h THEN sha256(t.value) ELSE t.value END "
            "FROM {} AS t WHERE t.key = a.k) IS DISTINCT FROM a.v))::int"
        )
        self.guard = self._stmt(
            "guard", "SELECT " + check, (_BYTEA_ARRAY, _BYTEA_ARRAY, _BOOL_ARRAY)
        )
        # A write-only transaction's statement (fewer statements, fewer
        # packets and wake-ups): its id, the guard, then the upserts, which
        # run only when the guard passed. Its deletes follow it in the same
        # pipeline and transaction (_delete_statements), not in it: a DELETE
        # of no key in it would still cost the server time at every put (the
        # generic plan of ``key = ANY``, see get_many). A named prepared
        # statement of ours (see _PGTxn._exec_prepared); its name is the
        # table's, so stores of one table on one pool share it.
        self.write_all = self._stmt(
            "wk",
            "WITH g AS MATERIALIZED (SELECT txid_current() AS xid, " + check + " AS ok), "
            "u AS (INSERT INTO {} (key, value) SELECT * FROM unnest(%b::bytea[], %b::bytea[]) "
            "WHERE (SELECT ok FROM g) = 1 ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value) "
            "SELECT xid FROM g",
            (_BYTEA_ARRAY,) * 2 + (_BOOL_ARRAY,) + (_BYTEA_ARRAY,) * 2,
        )
        self.create = sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (key bytea PRIMARY KEY, value bytea NOT NULL)"
        ).format(t)
        self._rendered = False
        self._scans: dict[tuple[bool, bool, bool], _Stmt] = {}
        self._deletes: dict[tuple[bool, bool], _Stmt] = {}

    def _stmt(self, kind: str, template: str, types: tuple[int, ...]) -> _Stmt:
        """A statement from a template of our own (``{}``: the table; ``%b``,
        ``%s``: parameters), for psycopg and as a named prepared statement."""
        sql, t = self._sql, self.ident
        n = template.count("{}")
        return _Stmt(
            sql.SQL(template).format(*[t] * n),
            f"kvsaver_{kind}_{self._digest}".encode(),
            sql.SQL(_numbered(template)).format(*[t] * n),
            types,
        )

    def render(self, conn: Any) -> None:
        """The fixed statements as bytes, composed once (psycopg would compose
        a ``Composed`` again at every execute)."""
        if self._rendered:
            return
        for name in (
            "get",
            "get_many",
            "upsert",
            "delete_many",
            "delete_one",
            "guard",
            "write_all",
        ):
            q = getattr(self, name)
            if isinstance(q, _Stmt):
                q.render(conn)
            elif not isinstance(q, bytes):  # two threads may render at once: the same bytes
                setattr(self, name, q.as_bytes(conn))
        self._rendered = True

    @staticmethod
    def _where(has_start: bool, has_stop: bool) -> str:
        conds = (["key >= %b"] if has_start else []) + (["key < %b"] if has_stop else [])
        return " WHERE " + " AND ".join(conds) if conds else ""

    def scan(self, has_start: bool, has_stop: bool, reverse: bool) -> _Stmt:
        q = self._scans.get((has_start, has_stop, reverse))
        if q is None:
            order = "DESC" if reverse else "ASC"
            q = self._stmt(
                f"scan{int(has_start)}{int(has_stop)}{int(reverse)}",
                f"SELECT key, value FROM {{}}{self._where(has_start, has_stop)} "
                f"ORDER BY key {order} LIMIT %s",
                (_BYTEA,) * (has_start + has_stop) + (_INT8,),
            )
            self._scans[(has_start, has_stop, reverse)] = q
        return q

    def delete_range(self, has_start: bool, has_stop: bool) -> _Stmt:
        q = self._deletes.get((has_start, has_stop))
        if q is None:
            q = self._stmt(
                f"drange{int(has_start)}{int(has_stop)}",
                "DELETE FROM {}" + self._where(has_start, has_stop),
                (_BYTEA,) * (has_start + has_stop),
            )
            self._deletes[(has_start, has_stop)] = q
        return q


_BYTEA, _INT8, _BOOL_ARRAY, _BYTEA_ARRAY = 17, 20, 1000, 1001  # type oids


class _Stmt:
    """One statement: ``text`` for psycopg (``%b`` parameters), and the same
    with numbered parameters (``$1``...), prepared by ``name`` on a
    connection the first time it is sent there (``_exchange``)."""

    __slots__ = ("name", "numbered", "text", "types")

    def __init__(self, text: Any, name: bytes, numbered: Any, types: tuple[int, ...]) -> None:
        self.text = text
        self.name = name
        self.numbered = numbered
        self.types = types

    def render(self, conn: Any) -> None:
        # Two threads may render at once (the same bytes): each attribute is
        # read once, so one never finds bytes where it tested a Composed.
        text, numbered = self.text, self.numbered
        if not isinstance(text, bytes):
            self.text = text.as_bytes(conn)
        if not isinstance(numbered, bytes):
            self.numbered = numbered.as_bytes(conn)


def _numbered(template: str) -> str:
    """``%b`` and ``%s`` placeholders as ``$1``, ``$2``, ... (a template of
    our own: identifiers are still ``{}`` fields, so none can come from a
    name)."""
    parts = re.split("%[bs]", template)
    return "".join(f"{p}${i}" for i, p in enumerate(parts[:-1], 1)) + parts[-1]


def _text(q: Any) -> Any:
    """What psycopg executes for a statement."""
    return q.text if isinstance(q, _Stmt) else q


_XID = "SELECT txid_current()"


class _ByteaArray(bytes):
    """A ``bytea[]`` in PostgreSQL's binary array format, built here: psycopg's
    list dumper looks up each element's type, a good part of a put's CPU."""

    __slots__ = ()


class _BoolArray(bytes):
    """A ``bool[]`` in the binary array format."""

    __slots__ = ()


_HEAD = struct.Struct("!iiiii")  # ndim 1, has nulls, element oid, length, lower bound
_LEN = struct.Struct("!i")
_NULL = _LEN.pack(-1)


_EMPTY_BYTEA_ARRAY = _ByteaArray(struct.pack("!iii", 0, 0, 17))  # empty: no dimension


def _bytea_array(items: Sequence[bytes | None]) -> _ByteaArray:
    if not items:
        return _EMPTY_BYTEA_ARRAY
    nulls = None in items
    parts = [_HEAD.pack(1, nulls, 17, len(items), 1)]
    pack = _LEN.pack
    if nulls:
        for v in items:
            parts += (_NULL,) if v is None else (pack(len(v)), v)
    else:
        for v in cast("Sequence[bytes]", items):
            parts += (pack(len(v)), v)
    return _ByteaArray(b"".join(parts))


def _bool_array(items: Sequence[bool]) -> _BoolArray:
    if not items:
        return _BoolArray(struct.pack("!iii", 0, 0, 16))
    body = b"".join(b"\x00\x00\x00\x01\x01" if v else b"\x00\x00\x00\x01\x00" for v in items)
    return _BoolArray(_HEAD.pack(1, 0, 16, len(items), 1) + body)


_DUMPERS: list[tuple[type, type]] = []


def _register_arrays(conn: Any) -> None:
    """Teach a connection to send our arrays as they are (bytea[]: oid 1001,
    bool[]: oid 1000, binary), and our vectors (their type left unknown)."""
    if not _DUMPERS:
        from psycopg import pq
        from psycopg.adapt import Dumper

        arrays: tuple[tuple[type, int], ...] = (
            (_ByteaArray, 1001),
            (_BoolArray, 1000),
            (_VectorValue, 0),
        )
        for cls, oid in arrays:

            class ArrayDumper(Dumper):
                format = pq.Format.BINARY

                def dump(self, obj: Any) -> Any:
                    return obj

            ArrayDumper.oid = oid
            _DUMPERS.append((cls, ArrayDumper))
    for cls, dumper in _DUMPERS:
        conn.adapters.register_dumper(cls, dumper)


def vectors_table(table: str) -> Any:
    """The identifier of a store's vectors' table: ``<table>_vectors``, in
    the store's schema (quoted as the store's own is: case kept)."""
    from psycopg import sql

    *schema, name = table.split(".")
    return sql.Identifier(*schema, f"{name}_vectors")


class _VectorQueries:
    """The statements of a store's vectors: a table beside the store's,
    ``<table>_vectors (key bytea PRIMARY KEY REFERENCES <table> ON DELETE
    CASCADE, embedding vector(dims))``: the server removes a key's vector
    with the key, whichever statement deletes it. ``hnsw`` (its options):
    searches order by the bare distance, which an HNSW index serves
    (approximate); without, by the distance with a zero vector's NaN taken
    as 1 and then the key, which no index serves: a scan, exact."""

    def __init__(self, table: str, dims: int, oid: int, hnsw: dict[str, int] | None = None) -> None:
        from psycopg import sql

        *schema, name = table.split(".")
        kv = sql.Identifier(*schema, name)
        t = vectors_table(table)
        self.table, self.dims, self.oid, self.hnsw = t, dims, oid, hnsw
        self.index_name = sql.Identifier(f"{name}_vectors_hnsw")
        digest = hashlib.sha1(f"{table}:{dims}:{hnsw is not None}".encode()).hexdigest()[:16]
        self.create = sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (key bytea PRIMARY KEY REFERENCES {} (key) "
            "ON DELETE CASCADE, embedding vector({}) NOT NULL)"
        ).format(t, kv, sql.Literal(dims))

        def stmt(kind: str, template: str, types: tuple[int, ...]) -> _Stmt:
            # {0}: the vectors' table, {1}: the store's
            text = sql.SQL(template).format(t, kv)
            numbered = sql.SQL(_numbered(template)).format(t, kv)
            return _Stmt(text, f"kvsaver_{kind}_{digest}".encode(), numbered, types)

        self.upsert = stmt(
            "vput",
            "INSERT INTO {0} (key, embedding) SELECT * FROM unnest(%b::bytea[], %b::vector[]) "
            "ON CONFLICT (key) DO UPDATE SET embedding = EXCLUDED.embedding",
            (_BYTEA_ARRAY, 0),
        )
        # The records of the nearest keys, in that order, each value one index
        # lookup (a join may be planned as a scan of the store's whole table).
        # Exact: the range's vectors, a zero vector's NaN taken as 1 (a score
        # of 0), then by key; no index serves that order: a scan. HNSW: the
        # index's nearest (no more than hnsw.ef_search), then those in the
        # range: with the range in the same query the planner would scan it
        # by the key instead of asking the index.
        value = "(SELECT t.value FROM {1} AS t WHERE t.key = v.key)"
        self.exact = stmt(
            "vexact",
            f"SELECT v.key, {value} FROM (SELECT key, embedding <=> %b::vector AS d "
            "FROM {0} WHERE key >= %b AND key < %b "
            "ORDER BY coalesce(nullif(embedding <=> %b::vector, 'NaN'), 1), key "
            "LIMIT %s OFFSET %s) AS v ORDER BY coalesce(nullif(v.d, 'NaN'), 1), v.key",
            (0, _BYTEA, _BYTEA, 0, _INT8, _INT8),
        )
        self.nearest = None
        if hnsw is not None:
            self.nearest = stmt(
                "vnear",
                f"SELECT v.key, {value} FROM (SELECT key, embedding <=> %b::vector AS d "
                "FROM {0} ORDER BY embedding <=> %b::vector LIMIT %s) AS v "
                "WHERE v.key >= %b AND v.key < %b ORDER BY v.d LIMIT %s OFFSET %s",
                (0, 0, _INT8, _BYTEA, _BYTEA, _INT8, _INT8),
            )
        # HNSW returns at most ef_search rows: set for each search, to what it asks.
        self.ef_search = _Stmt(
            sql.SQL("SELECT set_config('hnsw.ef_search', %b::text, true)"),
            f"kvsaver_vef_{digest}".encode(),
            sql.SQL("SELECT set_config('hnsw.ef_search', $1::text, true)"),
            (_INT8,),
        )

    def vector(self, little: bytes) -> _VectorValue:
        """A vector parameter in pgvector's binary format (dims, 0, big-endian
        float32) from little-endian float32 bytes."""
        if len(little) != 4 * self.dims:
            raise ValueError(f"a vector of {len(little) // 4} dims; the vectors have {self.dims}")
        floats = array.array("f", little)
        if sys.byteorder == "little":
            floats.byteswap()
        return _VectorValue(_VHEAD.pack(self.dims, 0) + floats.tobytes())

    def vectors(self, items: Sequence[_VectorValue]) -> _VectorValue:
        """A ``vector[]`` in the binary array format (of ``vector``'s oid), of
        vectors ``vector`` made."""
        if not items:
            return _VectorValue(struct.pack("!iii", 0, 0, self.oid))
        head = _HEAD.pack(1, 0, self.oid, len(items), 1)
        size = _LEN.pack(4 + 4 * self.dims)
        return _VectorValue(b"".join([head, *(size + v for v in items)]))


_VHEAD = struct.Struct("!hh")


class _VectorValue(bytes):
    """A ``vector`` or ``vector[]`` parameter, binary: sent as it is, its type
    (an extension's oid) left for the server to take from the statement's cast."""

    __slots__ = ()
