"""What ``kvsaver`` reads from: a store opened read-only with a strict
serializer, behind one small interface whatever the store is.

``open_source(STORE)`` decides what STORE is, in one place:

- a ``postgresql://`` (or ``postgres://``) URL: ``KVSaver(url, readonly=True)``;
- a directory: an LMDB store (it must hold ``data.mdb``);
- a file starting with the FileStore magic (``kv.file.MAGIC``): a FileStore;
- a file starting with SQLite's header: a SqliteSaver database, read through
  ``SqliteSaver`` itself (``langgraph-checkpoint-sqlite``), as its users do;
- anything else is refused with a one-line reason (``cliutil.Fail``).

``store_kind`` is that decision, also for ``kvsaver store`` (a KVStore opens
the same stores but a SqliteSaver file), and ``open_readonly`` opens a
``KVSaver`` or a ``KVStore`` on what it found.

Decoding is strict: LangGraph's default serializer imports and
calls any class named in the stored data, so a viewer pointed at a store
someone else wrote would run their code. ``strict_serde()`` is LangGraph's
``JsonPlusSerializer`` in strict msgpack mode (``allowed_msgpack_modules=None``:
only ``SAFE_MSGPACK_TYPES`` are constructed), built explicitly rather than
through the ``LANGGRAPH_STRICT_MSGPACK`` environment variable. Where strict
mode would silently hand back a blocked object's raw arguments, ours returns
an ``Unallowed`` marker, shown as ``<unallowed type module.Class>``.

Readers never block a writer: LMDB readers take no lock a writer waits for,
and every read here is a short transaction (history reads a few hundred
checkpoints at a time), so a long listing never pins old pages of a store
that is being written.
"""

from __future__ import annotations

import heapq
import os
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import ormsgpack
from kvsaver import KVSaver
from kvsaver import schema as S
from kvsaver import stats as ST
from kvsaver import threads as TH
from kvsaver._compat import HAS_STRICT_MSGPACK, strict_jsonplus
from kvsaver._upstream import SAFE_MSGPACK_METHODS, SAFE_MSGPACK_TYPES
from kvsaver.kv import KVError
from kvsaver.kv.file import MAGIC as FILESTORE_MAGIC
from kvsaver.kv.keys import unpack
from kvsaver.kv.postgres import is_postgres_url
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from langgraph.checkpoint.serde import jsonplus as JP
from langgraph.checkpoint.serde.base import SerializerProtocol

from .cliutil import Fail

__all__ = [
    "Source",
    "Unallowed",
    "open_readonly",
    "open_source",
    "redact",
    "store_kind",
    "strict_serde",
]

T = TypeVar("T")
SQLITE_MAGIC = b"SQLite format 3\x00"
_CHUNK = 256  # checkpoint records per read transaction in history


# -- strict decoding ---------------------------------------------------------------


@dataclass(frozen=True)
class Unallowed:
    """A stored object of a type outside LangGraph's msgpack allowlist: not
    constructed; ``data`` is what it would have been built from (plain
    msgpack values)."""

    type_name: str
    data: Any

    def __repr__(self) -> str:
        return f"<unallowed type {self.type_name}>"


_CONSTRUCTORS = {
    JP.EXT_CONSTRUCTOR_SINGLE_ARG,
    JP.EXT_CONSTRUCTOR_POS_ARGS,
    JP.EXT_CONSTRUCTOR_KW_ARGS,
    JP.EXT_PYDANTIC_V1,
    JP.EXT_PYDANTIC_V2,
}


def strict_serde() -> SerializerProtocol:
    """LangGraph's serializer in strict msgpack mode, whose blocked types
    come back as ``Unallowed`` markers instead of their raw arguments.
    Where the installed release has no strict mode (langgraph-checkpoint
    4.0.0), LangGraph's one decoding, as the README's Security section says."""
    if not HAS_STRICT_MSGPACK:
        return strict_jsonplus()
    # The strict hook LangGraph builds for allowed_msgpack_modules=None; ours
    # only decides what is blocked and hands everything else to it.
    strict = JP.JsonPlusSerializer(allowed_msgpack_modules=None)._unpack_ext_hook

    def ext_hook(code: int, data: bytes) -> Any:
        if code in _CONSTRUCTORS or code == JP.EXT_METHOD_SINGLE_ARG:
            try:
                tup = ormsgpack.unpackb(data, ext_hook=ext_hook, option=ormsgpack.OPT_NON_STR_KEYS)
                module, name = str(tup[0]), str(tup[1])
                if code == JP.EXT_METHOD_SINGLE_ARG:
                    allowed = (module, name, tup[3]) in SAFE_MSGPACK_METHODS
                else:
                    allowed = (module, name) in SAFE_MSGPACK_TYPES
            except Exception:
                return strict(code, data)  # malformed: LangGraph's own fallback
            if not allowed:
                return Unallowed(f"{module}.{name}", tup[2])
        return strict(code, data)

    return JP.JsonPlusSerializer(allowed_msgpack_modules=None, __unpack_ext_hook__=ext_hook)


# -- what a source gives ----------------------------------------------------------------


@dataclass
class ThreadInfo:
    thread_id: str
    checkpoints: int
    namespaces: list[str]
    last_checkpoint_id: str | None  # the latest of the root namespace (else of any)
    last_ts: str | None  # that checkpoint's ts
    last_activity: float | None  # seconds since the epoch (KVSaver's activity index)
    writes: int | None
    bytes: int | None  # keys + values (KVSaver stores only)


@dataclass
class Entry:
    """One checkpoint of a history: what can be read without its values."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    ts: str | None
    metadata: dict[str, Any]
    channel_versions: dict[str, Any]
    pending_writes: int
    changed: list[str] = field(default_factory=list)


def _activity(info: ThreadInfo) -> float:
    """When a thread was last written: the activity index, else its latest
    checkpoint's ts (stores written before the index existed)."""
    if info.last_activity is not None:
        return info.last_activity
    try:
        return datetime.fromisoformat(info.last_ts or "").timestamp()
    except ValueError:
        return 0.0


def _changed(versions: dict[str, Any], parent: dict[str, Any] | None) -> list[str]:
    parent = parent or {}
    return sorted(ch for ch, v in versions.items() if parent.get(ch) != v)


class Source:
    """A read-only checkpoint saver and the few questions ``kvsaver`` asks it,
    answered with the ``BaseCheckpointSaver`` API; ``KVSource`` overrides the
    listings with cheaper reads of its own keys."""

    def __init__(self, saver: BaseCheckpointSaver[Any], label: str) -> None:
        self.saver = saver
        self.label = label

    def close(self) -> None:
        pass

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one checkpoint, decoded ------------------------------------------------

    def get(self, thread: str, ns: str | None, checkpoint_id: str | None) -> CheckpointTuple:
        """A checkpoint by id (in any namespace unless ``ns`` is given), or the
        latest of ``ns`` (default: the root namespace)."""
        conf: dict[str, Any] = {"thread_id": thread}
        if checkpoint_id is None:
            conf["checkpoint_ns"] = ns or ""
            found = self.saver.get_tuple({"configurable": conf})
        else:
            conf["checkpoint_id"] = checkpoint_id
            if ns is not None:
                conf["checkpoint_ns"] = ns
            found = next(iter(self.saver.list({"configurable": conf}, limit=1)), None)
            if found is None:  # a unique prefix of an id will do
                matches = sorted(set(self.ids_starting(thread, ns, checkpoint_id)))
                if len(matches) > 1:
                    raise Fail(
                        f"{checkpoint_id!r} is the start of {len(matches)} checkpoint ids in "
                        f"thread {thread!r}; give more of it"
                    )
                if matches:
                    return self.get(thread, ns, matches[0])
        if found is None:
            self.missing(thread, ns, checkpoint_id)
        assert found is not None
        return found

    def missing(self, thread: str, ns: str | None, checkpoint_id: str | None) -> None:
        if not self.has_thread(thread):
            raise Fail(f"no thread {thread!r} in {self.label}")
        where = "" if ns is None else f" namespace {ns!r}"
        if checkpoint_id is None:
            raise Fail(f"thread {thread!r} has no checkpoint in{where or ' the root namespace'}")
        raise Fail(f"no checkpoint {checkpoint_id!r} in thread {thread!r}{where}")

    def has_thread(self, thread: str) -> bool:
        conf: Any = {"configurable": {"thread_id": thread}}  # a RunnableConfig
        return next(iter(self.saver.list(conf, limit=1)), None) is not None

    def ids_starting(self, thread: str, ns: str | None, prefix: str) -> Iterator[str]:
        """Checkpoint ids of the thread (in ``ns``, or any) that start with ``prefix``."""
        conf: dict[str, Any] = {"thread_id": thread}
        if ns is not None:
            conf["checkpoint_ns"] = ns
        for t in self.saver.list({"configurable": conf}):
            if t.config["configurable"]["checkpoint_id"].startswith(prefix):
                yield t.config["configurable"]["checkpoint_id"]

    # -- generic (public API) versions of the listings ------------------------------

    def threads(self) -> list[ThreadInfo]:
        """Every thread, most recently active first (here: by ``list(None)``,
        which decodes every checkpoint: what a SqliteSaver offers)."""
        found: dict[str, ThreadInfo] = {}
        latest: dict[str, tuple[bool, str]] = {}
        for t in self.saver.list(None):
            conf = t.config["configurable"]
            thread, ns, cid = (
                conf["thread_id"],
                conf.get("checkpoint_ns", ""),
                conf["checkpoint_id"],
            )
            info = found.setdefault(thread, ThreadInfo(thread, 0, [], None, None, None, 0, None))
            info.checkpoints += 1
            info.writes = (info.writes or 0) + len(t.pending_writes or ())
            if ns not in info.namespaces:
                info.namespaces.append(ns)
            rank = (ns == "", cid)
            if thread not in latest or rank > latest[thread]:
                latest[thread] = rank
                info.last_checkpoint_id, info.last_ts = cid, t.checkpoint.get("ts")
        for info in found.values():
            info.namespaces.sort()
        return sorted(found.values(), key=lambda i: (_activity(i), i.thread_id), reverse=True)

    def history(self, thread: str, ns: str | None, limit: int | None) -> list[Entry]:
        """Checkpoints newest first, with the channels each one changed."""
        conf: dict[str, Any] = {"thread_id": thread}
        if ns is not None:
            conf["checkpoint_ns"] = ns
        out = [_entry(t) for t in self.saver.list({"configurable": conf}, limit=limit)]
        known = {(e.checkpoint_ns, e.checkpoint_id): e.channel_versions for e in out}
        for e in out:
            parent = None
            if e.parent_checkpoint_id is not None:
                key = (e.checkpoint_ns, e.parent_checkpoint_id)
                if key not in known:
                    pconf = {**conf, "checkpoint_ns": key[0], "checkpoint_id": key[1]}
                    p = self.saver.get_tuple({"configurable": pconf})
                    known[key] = p.checkpoint["channel_versions"] if p else {}
                parent = known[key]
            e.changed = _changed(e.channel_versions, parent)
        return out


def _entry(t: CheckpointTuple) -> Entry:
    conf = t.config["configurable"]
    parent = t.parent_config["configurable"]["checkpoint_id"] if t.parent_config else None
    return Entry(
        thread_id=conf["thread_id"],
        checkpoint_ns=conf.get("checkpoint_ns", ""),
        checkpoint_id=conf["checkpoint_id"],
        parent_checkpoint_id=parent,
        ts=t.checkpoint.get("ts"),
        metadata=dict(t.metadata or {}),
        channel_versions=dict(t.checkpoint.get("channel_versions") or {}),
        pending_writes=len(t.pending_writes or ()),
    )


class KVSource(Source):
    """A KVSaver store: listings from the key layout (``saver/schema.py``),
    decoding only the checkpoint records shown, never channel values."""

    saver: KVSaver

    def __init__(self, saver: KVSaver, label: str) -> None:
        super().__init__(saver, label)
        self._writes: dict[tuple[str, str, str], int] = {}

    def close(self) -> None:
        self.saver.close()

    def has_thread(self, thread: str) -> bool:
        with self.saver.store.read() as txn:
            return next(iter(txn.scan(*S.checkpoints_range(thread))), None) is not None

    def ids_starting(self, thread: str, ns: str | None, prefix: str) -> Iterator[str]:
        """From the keys alone (an id too long for a key is never a match)."""
        with self.saver.store.read() as txn:
            ids = [
                unpack(key)[3]
                for key, _ in txn.scan(*S.checkpoints_range(thread, ns))  # no values decoded
            ]
        return (cid for cid in ids if isinstance(cid, str) and cid.startswith(prefix))

    def threads(self) -> list[ThreadInfo]:
        """Counts and bytes from ``stats.collect`` (one pass over the keys,
        decoding only write records, which hold one write or a batch),
        activity from the activity index, and per thread its namespaces and
        latest checkpoint by skipping along its keys."""
        stats = ST.collect(self.saver.store)
        out = []
        for t in stats.threads:
            if not t.checkpoints:
                continue  # only writes or blobs left (never by KVSaver itself)
            with self.saver.store.read() as txn:
                namespaces = TH.namespaces(txn, t.thread_id)
                root = "" if "" in namespaces else None
                raws = [TH.find_record(txn, t.thread_id, ns, None) for ns in namespaces]
            recs = [S.decode_checkpoint(raw) for raw in raws if raw is not None]
            latest, ts = None, None
            if recs:
                mine = [r for r in recs if root is None or r.checkpoint_ns == root]
                latest = max(mine, key=lambda r: r.checkpoint_id)
                ts = self.saver.serde.loads_typed(latest.checkpoint).get("ts")
            out.append(
                ThreadInfo(
                    thread_id=t.thread_id,
                    checkpoints=t.checkpoints,
                    namespaces=sorted(namespaces),
                    last_checkpoint_id=latest.checkpoint_id if latest else None,
                    last_ts=ts,
                    last_activity=t.last_activity,
                    writes=t.writes,
                    bytes=t.bytes,
                )
            )
        out.sort(key=lambda i: (_activity(i), i.thread_id), reverse=True)
        return out

    def history(self, thread: str, ns: str | None, limit: int | None) -> list[Entry]:
        with self.saver.store.read() as txn:
            namespaces = [ns] if ns is not None else TH.namespaces(txn, thread)
        streams = [self._records(thread, one) for one in namespaces]
        merged = heapq.merge(
            *streams, key=lambda r: (r.checkpoint_id, r.checkpoint_ns), reverse=True
        )
        out: list[Entry] = []
        for rec in merged:
            if limit is not None and len(out) >= limit:
                break
            out.append(self._entry(rec))
        known = {(e.checkpoint_ns, e.checkpoint_id): e.channel_versions for e in out}
        with self.saver.store.read() as txn:
            for e in out:
                parent = None
                if e.parent_checkpoint_id is not None:
                    key = (e.checkpoint_ns, e.parent_checkpoint_id)
                    if key not in known:
                        raw = txn.get(S.checkpoint_key(thread, *key))
                        known[key] = (
                            TH.versions(self.saver.serde, S.decode_checkpoint(raw)) if raw else {}
                        )
                    parent = known[key]
                e.changed = _changed(e.channel_versions, parent)
        return out

    def _records(self, thread: str, ns: str) -> Iterator[S.CheckpointRecord]:
        """The records of (thread, ns), newest first, in short read transactions,
        each with its pending-write count."""
        start, stop = S.checkpoints_range(thread, ns)
        while True:
            chunk = []
            with self.saver.store.read() as txn:
                for key, raw in txn.scan(start, stop, reverse=True):
                    rec = S.decode_checkpoint(raw)
                    writes = txn.scan(*S.writes_range(thread, ns, rec.checkpoint_id))
                    n = sum(len(S.decode_writes(raw)) for _, raw in writes)
                    chunk.append((key, rec, n))
                    if len(chunk) == _CHUNK:
                        break
            for _, rec, n in chunk:
                self._writes[(rec.thread_id, rec.checkpoint_ns, rec.checkpoint_id)] = n
                yield rec
            if len(chunk) < _CHUNK:
                return
            stop = chunk[-1][0]

    def _entry(self, rec: S.CheckpointRecord) -> Entry:
        loads = self.saver.serde.loads_typed
        cp = loads(rec.checkpoint)
        return Entry(
            thread_id=rec.thread_id,
            checkpoint_ns=rec.checkpoint_ns,
            checkpoint_id=rec.checkpoint_id,
            parent_checkpoint_id=rec.parent_id,
            ts=cp.get("ts"),
            metadata=dict(loads(rec.metadata) or {}),
            channel_versions=dict(cp.get("channel_versions") or {}),
            pending_writes=self._writes.pop(
                (rec.thread_id, rec.checkpoint_ns, rec.checkpoint_id), 0
            ),
        )


class SqliteSource(Source):
    """A SqliteSaver database, read through SqliteSaver's public API."""

    def close(self) -> None:
        self.saver.conn.close()  # type: ignore[attr-defined]


# -- opening -----------------------------------------------------------------------


def _head(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(16)
    except OSError as e:
        raise Fail(f"cannot read {path}: {e.strerror or e}") from None


def store_kind(store: str) -> str:
    """What STORE is (see the module docstring): ``"postgres"``, ``"lmdb"``
    (a directory holding ``data.mdb``), ``"file"`` (a FileStore file),
    ``"sqlite"``, or ``""`` for a file of none of these, which the caller
    refuses, naming what it reads. A directory without ``data.mdb``, a
    missing path or an unreadable file is refused here."""
    if is_postgres_url(store):
        return "postgres"
    if os.path.isdir(store):
        if not os.path.isfile(os.path.join(store, "data.mdb")):
            raise Fail(f"{store} is not a kvsaver store (a directory without data.mdb)")
        return "lmdb"
    if not os.path.exists(store):
        raise Fail(f"{store}: no such file or directory")
    head = _head(store)
    if head.startswith(FILESTORE_MAGIC):
        return "file"
    if head.startswith(SQLITE_MAGIC):
        return "sqlite"
    return ""


def open_readonly(open_: Callable[..., T], store: str, kind: str, **kw: Any) -> T:
    """``open_(store, readonly=True, **kw)`` (``KVSaver`` or ``KVStore``) for
    a STORE whose ``store_kind`` is ``kind`` (``"postgres"``, ``"lmdb"`` or
    ``"file"``); what it refuses is a one-line error."""
    if kind == "postgres":
        # A person waits at the prompt: a server that is not there is said in
        # seconds, not after the pool's 30 s of retries.
        kw = {"connect_timeout": 5, "pool_timeout": 5, **kw}
    elif kind == "file":
        kw = {"backend": "file", **kw}
    try:
        return open_(store, readonly=True, **kw)
    except (KVError, ValueError, OSError) as e:
        where = redact(store) if kind == "postgres" else store
        raise Fail(f"cannot open {where}: {' '.join(str(e).split())}") from None


def open_source(store: str, *, serde: SerializerProtocol | None = None) -> Source:
    """Open STORE read-only (see the module docstring for what STORE may be)."""
    serde = strict_serde() if serde is None else serde
    kind = store_kind(store)
    if kind == "sqlite":
        return SqliteSource(_open_sqlite(store, serde), store)
    if not kind:
        raise Fail(
            f"{store} is not a store kvsaver reads (an LMDB directory, a FileStore file, "
            "a SqliteSaver .sqlite file or a postgresql:// URL)"
        )
    saver = open_readonly(KVSaver, store, kind, serde=serde)
    return KVSource(saver, redact(store) if kind == "postgres" else store)


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    scheme, _, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not at:
        return url
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}@{host}"


def _open_sqlite(path: str, serde: SerializerProtocol) -> BaseCheckpointSaver[Any]:
    try:
        import langgraph.checkpoint.sqlite  # noqa: F401
    except ImportError:
        raise Fail(
            f"{path} is a SQLite database; reading it needs langgraph-checkpoint-sqlite: "
            "pip install 'kvsaver[tools]'"
        ) from None
    from kvsaver.migrate import MigrationError, open_sqlite_saver

    try:
        saver = open_sqlite_saver(path, serde=serde)
    except MigrationError as e:
        raise Fail(str(e)) from None
    try:
        tables = {
            row[0]
            for row in saver.conn.execute(  # type: ignore[attr-defined]
                "SELECT name FROM sqlite_master WHERE type='table'"
            )
        }
    except sqlite3.DatabaseError as e:
        saver.conn.close()  # type: ignore[attr-defined]
        raise Fail(f"cannot read {path}: {e}") from None
    if not {"checkpoints", "writes"} <= tables:
        saver.conn.close()  # type: ignore[attr-defined]
        raise Fail(f"{path} is an SQLite database but not a SqliteSaver one (no checkpoints table)")
    return saver
