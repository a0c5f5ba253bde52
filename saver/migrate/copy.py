"""``copy_all``: every thread copied between any two ``BaseCheckpointSaver``
objects through their public methods (a KVSaver source's writes read with
their task paths and indexes from its store)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from langgraph.checkpoint.base import WRITES_IDX_MAP, BaseCheckpointSaver, CheckpointTuple

from ..kvsaver import KVSaver
from .common import (
    MigrationStats,
    ProgressFn,
    _cfg,
    _describe,
    _ids,
    _interrupts,
    _refuse,
    _strict_pair,
)
from .verify import verify as _verify

# -- copy_all: any saver to any saver -------------------------------------------------


def _write_groups(
    source: BaseCheckpointSaver, tup: CheckpointTuple
) -> list[tuple[str, str, list[tuple[str, Any]]]]:
    """The pending writes of a checkpoint as put_writes calls:
    (task_path, task_id, [(channel, value), ...]).

    A write is identified by (task_id, idx), and put_writes numbers a batch
    from 0, so a task's regular writes go in idx order, one call per run of
    one task_path (a task id may be written under several paths); a run that
    starts at idx s > 0 is preceded by the task's writes at 0..s-1, which
    the destination holds from the earlier calls and ignores, as every saver
    with SqliteSaver's semantics does. So each write keeps its idx and its
    task_path. Special channels go in calls of their
    own (they keep replace semantics, at their fixed negative indexes)."""
    thread, ns, cid = _ids(tup.config)
    pending = list(tup.pending_writes or [])
    if isinstance(source, KVSaver):
        # The records hold task_path and idx; get_tuple's list holds the
        # decoded values, in the same (writes_sort_key) order.
        with source.store.read() as txn:
            recs = source._reads.load_writes(txn, thread, ns, cid)
        if [(w.task_id, w.channel) for w in recs] == [(t, c) for t, c, _ in pending]:
            values = [v for _, _, v in pending]
        else:  # written to in between: decode the records themselves
            values = [source.serde.loads_typed(w.value) for w in recs]
        rows = [(w.task_path, w.task_id, w.idx, w.channel, v) for w, v in zip(recs, values)]
    else:
        # Public pending writes carry neither task_path nor idx: "" and each
        # task's regular writes numbered in order.
        counts: dict[str, int] = {}
        rows = []
        for task_id, channel, value in pending:
            idx = WRITES_IDX_MAP.get(channel, counts.get(task_id, 0))
            if channel not in WRITES_IDX_MAP:
                counts[task_id] = idx + 1
            rows.append(("", task_id, idx, channel, value))
    special: dict[tuple[str, str], list[tuple[str, Any]]] = {}
    regular: dict[str, list[tuple[int, str, str, Any]]] = {}
    for task_path, task_id, idx, channel, value in rows:
        if channel in WRITES_IDX_MAP:
            special.setdefault((task_path, task_id), []).append((channel, value))
        else:
            regular.setdefault(task_id, []).append((idx, task_path, channel, value))
    calls: list[tuple[str, str, list[tuple[str, Any]]]] = []
    for task_id, items in regular.items():
        items.sort(key=lambda x: x[0])
        at = {idx: (channel, value) for idx, _, channel, value in items}
        i = 0
        while i < len(items):
            j = i
            while j < len(items) and items[j][1] == items[i][1]:
                j += 1
            first = items[i][0]
            # Indexes below a run are all stored (put_writes fills 0..n-1);
            # were one missing, the run would be renumbered rather than pad
            # the destination with a write the source does not have.
            pad = [at[n] for n in range(first)] if all(n in at for n in range(first)) else []
            calls.append((items[i][1], task_id, pad + [(ch, v) for _, _, ch, v in items[i:j]]))
            i = j
    calls += [(task_path, task_id, group) for (task_path, task_id), group in special.items()]
    return calls


def copy_all(
    source: BaseCheckpointSaver,
    dest: BaseCheckpointSaver,
    *,
    merge: bool = False,
    verify: bool = True,
    progress: ProgressFn | None = None,
) -> MigrationStats:
    """Copy every checkpoint of every thread from ``source`` to ``dest`` through
    their public methods, e.g. a KVSaver store to a ``PostgresSaver`` (call
    its ``setup()`` first).

    Re-runnable: checkpoints already in ``dest`` are not put again (their
    missing pending writes are); a ``dest`` holding checkpoints that
    ``source`` does not have is refused unless ``merge=True``. With
    ``verify`` (default) both are compared afterwards (see ``verify``).
    See the module docstring for what public methods cannot carry.
    """
    with _interrupts() as interrupted:
        return _copy_all(source, dest, merge, verify, progress, interrupted)


def _copy_all(
    source: BaseCheckpointSaver,
    dest: BaseCheckpointSaver,
    merge: bool,
    verify: bool,
    progress: ProgressFn | None,
    interrupted: Callable[[], bool],
) -> MigrationStats:
    stats = MigrationStats(source=repr(source), dest=repr(dest))
    existing: dict[tuple[str, str, str], int] = {
        _ids(t.config): len(t.pending_writes or []) for t in dest.list(None)
    }
    if existing and not merge:
        for t, ns, cid in existing:
            if source.get_tuple(_cfg(t, ns, cid)) is None:
                raise _refuse(stats.dest, stats.source, _describe(t, ns, cid))
    started = time.perf_counter()
    namespaces: set[tuple[str, str]] = set()
    for tup in source.list(None):
        thread, ns, cid = _ids(tup.config)
        namespaces.add((thread, ns))
        stats.checkpoints += 1
        if progress is not None:
            progress("copy", stats.checkpoints, 0)  # the total is not known ahead
        writes = tup.pending_writes or []
        stats.writes += len(writes)
        key = (thread, ns, cid)
        if interrupted():  # a value of tup may be a swallowed Ctrl-C's fallback
            raise KeyboardInterrupt()
        if key in existing:
            stats.checkpoints_present += 1
            if existing[key] >= len(writes):
                stats.writes_present += len(writes)
                continue
        else:
            parent = (
                tup.parent_config["configurable"]["checkpoint_id"] if tup.parent_config else None
            )
            checkpoint: dict[str, Any] = dict(tup.checkpoint)
            checkpoint["channel_values"] = dict(checkpoint.get("channel_values") or {})
            dest.put(
                _cfg(thread, ns, parent),
                checkpoint,  # type: ignore[arg-type]
                dict(tup.metadata or {}),  # type: ignore[arg-type]
                dict(checkpoint.get("channel_versions") or {}),
            )
            stats.checkpoints_copied += 1
        for task_path, task_id, group in _write_groups(source, tup):
            if interrupted():
                raise KeyboardInterrupt()
            dest.put_writes(_cfg(thread, ns, cid), group, task_id, task_path)
        stats.writes_copied += len(writes)
    stats.seconds = time.perf_counter() - started
    stats.namespace_list = sorted(namespaces)
    stats.namespaces = len(namespaces)
    stats.threads = len({t for t, _ in namespaces})
    if verify:
        started = time.perf_counter()
        stats.verified = _verify(
            *_strict_pair(source, dest),
            stats.namespace_list,
            exact=not merge,
            writes_order=isinstance(source, KVSaver),
            progress=progress,
            total=stats.checkpoints,
        )
        stats.verify_seconds = time.perf_counter() - started
    return stats
