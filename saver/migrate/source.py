"""The SQLite source of ``migrate_from_sqlite``: a ``SqliteSaver`` database
read directly (opened read-only), its tables checked, counted and read in
batches; and ``open_sqlite_saver`` for verification."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import SerializerProtocol

if TYPE_CHECKING:
    from langgraph.checkpoint.sqlite import SqliteSaver

from .common import MigrationError, _describe

_BATCH_BYTES = 32 << 20  # a batch also ends after this much source data

_CHECKPOINT_COLUMNS = {
    "thread_id",
    "checkpoint_ns",
    "checkpoint_id",
    "parent_checkpoint_id",
    "type",
    "checkpoint",
    "metadata",
}
_WRITE_COLUMNS = {
    "thread_id",
    "checkpoint_ns",
    "checkpoint_id",
    "task_id",
    "idx",
    "channel",
    "type",
    "value",
}

# -- the SQLite source ------------------------------------------------------------


def _sqlite_uri(path: str | os.PathLike[str]) -> str:
    return Path(os.fspath(path)).absolute().as_uri() + "?mode=ro"


def _file_bytes(path: str) -> int:
    total = 0
    for suffix in ("", "-wal"):
        try:
            total += os.path.getsize(path + suffix)
        except OSError:
            pass
    return total


class _Source:
    """A SqliteSaver database opened read-only, checked before anything is written."""

    def __init__(self, path: str | os.PathLike[str], *, check: bool = True) -> None:
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise MigrationError(f"{self.path}: no such file")
        if not os.path.isfile(self.path):
            raise MigrationError(f"{self.path} is not a file (a SqliteSaver database is one)")
        try:
            # isolation_level=None: we open the one read transaction ourselves,
            # so every query of the migration sees the same snapshot.
            self.conn = sqlite3.connect(
                _sqlite_uri(self.path), uri=True, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as e:
            raise MigrationError(f"cannot open {self.path} read-only: {e}") from None
        try:
            self._check(check)
            self.conn.execute("BEGIN")
            self._count()
        except sqlite3.DatabaseError as e:
            self.conn.close()
            raise MigrationError(
                f"{self.path} is not a readable SQLite database ({e}); nothing was written"
            ) from None
        except BaseException:
            self.conn.close()
            raise

    def _columns(self, table: str) -> set[str]:
        return {row[1] for row in self.conn.execute(f"PRAGMA table_info({table})")}

    def _check(self, integrity: bool) -> None:
        tables = {
            row[0] for row in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        if "checkpoints" not in tables:
            raise MigrationError(
                f"{self.path} is an SQLite database without a 'checkpoints' table: "
                "not a SqliteSaver database"
            )
        missing = _CHECKPOINT_COLUMNS - self._columns("checkpoints")
        if missing:
            raise MigrationError(
                f"{self.path}: table 'checkpoints' lacks columns {sorted(missing)}: not a "
                "SqliteSaver database of a supported version (langgraph-checkpoint-sqlite >= 1.0)"
            )
        self.has_writes = "writes" in tables
        self.has_task_path = False
        if self.has_writes:
            columns = self._columns("writes")
            missing = _WRITE_COLUMNS - columns
            if missing:
                raise MigrationError(
                    f"{self.path}: table 'writes' lacks columns {sorted(missing)}: not a "
                    "SqliteSaver database of a supported version"
                )
            self.has_task_path = "task_path" in columns
        if integrity:
            # Reads every page once: a damaged file fails here, before the
            # destination exists, instead of halfway through the copy.
            problems = [row[0] for row in self.conn.execute("PRAGMA quick_check")]
            if problems != ["ok"]:
                raise MigrationError(
                    f"{self.path} is damaged (sqlite quick_check: {'; '.join(problems[:3])}); "
                    "nothing was written"
                )

    def _count(self) -> None:
        q = self.conn.execute
        self.checkpoints = q("SELECT COUNT(*) FROM checkpoints").fetchone()[0]
        self.namespace_list = [
            (str(t), str(ns or ""))
            for t, ns in q(
                "SELECT DISTINCT thread_id, checkpoint_ns FROM checkpoints "
                "ORDER BY thread_id, checkpoint_ns"
            )
        ]
        self.threads = len({t for t, _ in self.namespace_list})
        self.writes = self.orphan_writes = 0
        if self.has_writes:
            self.orphan_writes = q(
                "SELECT COUNT(*) FROM writes w WHERE NOT EXISTS (SELECT 1 FROM checkpoints c "
                "WHERE c.thread_id = w.thread_id AND c.checkpoint_ns = w.checkpoint_ns "
                "AND c.checkpoint_id = w.checkpoint_id)"
            ).fetchone()[0]
            self.writes = q("SELECT COUNT(*) FROM writes").fetchone()[0] - self.orphan_writes

    def rows(self, batch: int) -> Iterator[list[tuple[Any, ...]]]:
        """Checkpoint rows in key order, in batches of at most ``batch`` rows
        and about ``_BATCH_BYTES`` of data."""
        cur = self.conn.execute(
            "SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, "
            "checkpoint, metadata FROM checkpoints ORDER BY thread_id, checkpoint_ns, checkpoint_id"
        )
        out: list[tuple[Any, ...]] = []
        size = 0
        for row in cur:
            out.append(row)
            size += len(row[5] or b"") + len(row[6] or b"")
            if len(out) >= batch or size >= _BATCH_BYTES:
                yield out
                out, size = [], 0
        if out:
            yield out

    def writes_of(self, thread: Any, ns: Any, checkpoint_id: Any) -> list[tuple[Any, ...]]:
        """(task_id, task_path, idx, channel, type, value) rows of one checkpoint."""
        if not self.has_writes:
            return []
        task_path = "task_path" if self.has_task_path else "''"
        return self.conn.execute(
            f"SELECT task_id, {task_path}, idx, channel, type, value FROM writes "
            "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
            (thread, ns, checkpoint_id),
        ).fetchall()

    def pickled(self) -> Iterator[tuple[str, str, tuple[str, bytes]]]:
        """("checkpoint" or "write", where, typed value) of every value stored
        as type "pickle" (a serializer's ``pickle_fallback``)."""
        for t, ns, cid, ctype, cbytes in self.conn.execute(
            "SELECT thread_id, checkpoint_ns, checkpoint_id, type, checkpoint FROM checkpoints "
            "WHERE type = 'pickle'"
        ):
            yield "checkpoint", _describe(str(t), str(ns or ""), str(cid)), (ctype, cbytes)
        if not self.has_writes:
            return
        for t, ns, cid, task_id, channel, wtype, wvalue in self.conn.execute(
            "SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, channel, type, value "
            "FROM writes WHERE type = 'pickle'"
        ):
            where = _describe(str(t), str(ns or ""), str(cid))
            yield (
                "write",
                f"{where}, pending write of task {task_id!r} to {channel!r}",
                (
                    wtype,
                    wvalue,
                ),
            )

    def has_checkpoint(self, thread: str, ns: str, checkpoint_id: str) -> bool:
        return (
            self.conn.execute(
                "SELECT 1 FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? "
                "AND checkpoint_id = ?",
                (thread, ns, checkpoint_id),
            ).fetchone()
            is not None
        )

    def close(self) -> None:
        self.conn.close()


def open_sqlite_saver(
    path: str | os.PathLike[str], *, serde: SerializerProtocol | None = None
) -> SqliteSaver:
    """A real ``SqliteSaver`` on ``path`` opened read-only (``mode=ro``).

    ``SqliteSaver.setup()`` writes (``PRAGMA journal_mode=WAL``, ``CREATE
    TABLE IF NOT EXISTS``, an ``ALTER TABLE`` for ``task_path``), which a
    read-only connection refuses; the tables are already there, so setup is
    marked done and the ``task_path`` column is looked up instead. Close it
    with ``saver.conn.close()``.
    """
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
    except ImportError:  # pragma: no cover - depends on the environment
        raise MigrationError(
            "reading a SqliteSaver database back needs langgraph-checkpoint-sqlite: "
            "pip install 'kvsaver[tools]' (or skip verification)"
        ) from None
    conn = sqlite3.connect(_sqlite_uri(path), uri=True, check_same_thread=False)
    try:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(writes)")}
    except sqlite3.DatabaseError as e:
        conn.close()
        raise MigrationError(f"cannot read {os.fspath(path)}: {e}") from None
    saver = SqliteSaver(conn, serde=serde)
    saver.is_setup = True
    saver._has_task_path = "task_path" in columns
    return saver
