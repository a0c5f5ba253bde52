"""``list``: checkpoints newest first, read in chunks of ``CHUNK`` in short
read transactions (a long iteration never pins old pages of the store).

A source is a function ``(txn, resume) -> iterator of (position, raw
record)`` in output order: one (thread, ns)'s reverse key scan, namespaces
merged, or, over every thread, the id index or the meta index of the most
selective filter value; ``resume`` is the position of the last record of
the previous chunk, where the next chunk's scans start below.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from kvsaver.kv import Store, Txn
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple

from . import schema as S
from . import threads as TH
from .ids import configurable, thread_ns
from .reads import Reads

__all__ = ["CHUNK", "chunks"]

CHUNK = 32  # checkpoints per read transaction

Source = Callable[[Txn, Any], Iterator[tuple[Any, bytes]]]


def chunks(
    store: Store,
    reads: Reads,
    config: RunnableConfig | None,
    *,
    filter: dict[str, Any] | None = None,
    before: RunnableConfig | None = None,
    limit: int | None = None,
) -> Iterator[list[CheckpointTuple]]:
    """``KVSaver.list``'s checkpoints, a chunk (a read transaction) at a time."""
    if limit is not None and limit <= 0:
        return
    if filter is not None and not isinstance(filter, Mapping):
        raise TypeError(f"list: filter must be a dict of metadata values, got {filter!r}")
    before_id = None
    if before is not None:
        # None: no bound. "" is an id, below which none sorts (as
        # SqliteSaver's ``checkpoint_id < ''``): every bound below tests
        # ``is not None``, not truth
        before_id = configurable(before, "list(before=...)").get("checkpoint_id")
    remaining = limit
    if config is None:
        sources = index_source(filter, None if before_id is None else str(before_id))
    else:
        sources = thread_source(config, before_id)
    # Each source is a function: (txn, resume_after) -> iterator of
    # (position, raw_record) in output order; position resumes a scan.
    resume: Any = None
    while True:
        found: list[tuple[S.CheckpointRecord, Any]] = []
        last_pos: Any = None
        exhausted = True
        with store.read() as txn:
            for pos, raw in sources(txn, resume):
                if len(found) >= CHUNK and not _same_id(pos, last_pos):
                    exhausted = False
                    break
                last_pos = pos
                rec = S.decode_checkpoint(raw)
                metadata = None
                if filter:
                    metadata = reads.loads(rec.metadata)
                    if not _matches(metadata, filter):
                        continue
                found.append((rec, metadata))
                if remaining is not None:
                    remaining -= 1
                    if remaining == 0:
                        break
            chunk = reads.load_page(txn, found, consecutive=config is not None and not filter)
        if chunk:
            yield chunk
        if exhausted or remaining == 0:
            return
        resume = last_pos


def index_source(filter: Mapping[str, Any] | None, before_id: str | None) -> Source:
    """All threads, newest first: the meta index of the most selective
    scalar filter value (only checkpoints carrying it are visited; the rest
    of the filter is checked on their metadata), else the id index."""
    candidates = []
    for key, value in (filter or {}).items():
        ok, norm = S.meta_value(value)
        if ok:
            candidates.append(S.meta_range(key, norm, before_id))
    default = S.by_id_range()
    if before_id is not None:
        default = (default[0], S.by_id_stop(before_id))
    chosen: list[tuple[bytes, bytes]] = []

    def source(txn: Txn, resume: Any) -> Iterator[tuple[Any, bytes]]:
        if not chosen:
            chosen.append(_most_selective(txn, candidates) if candidates else default)
        start, stop = chosen[0]
        for key, _ in txn.scan(start, resume[1] if resume else stop, reverse=True):
            kcid, ckey = S.index_entry(key, start)
            raw = txn.get(ckey)
            if raw is not None:
                yield (kcid, key), raw

    return source


def thread_source(config: RunnableConfig, before_id: Any) -> Source:
    """One thread, newest first: one namespace's reverse key scan, or every
    namespace's merged; one checkpoint when the config names its id."""
    thread, _, conf = thread_ns(config, "list")
    ns = conf.get("checkpoint_ns")
    checkpoint_id = conf.get("checkpoint_id")
    if checkpoint_id:
        # One checkpoint at most, as SqliteSaver's "checkpoint_id = ?".
        def exact(txn: Txn, resume: Any) -> Iterator[tuple[Any, bytes]]:
            if resume is not None:
                return
            for one_ns in [str(ns)] if ns is not None else TH.namespaces(txn, thread):
                if before_id is not None and not str(checkpoint_id) < str(before_id):
                    continue
                raw = txn.get(S.checkpoint_key(thread, one_ns, str(checkpoint_id)))
                if raw is not None:
                    yield (S.id_element(str(checkpoint_id)), one_ns), raw

        return exact

    def source(txn: Txn, resume: Any) -> Iterator[tuple[Any, bytes]]:
        namespaces = [str(ns)] if ns is not None else TH.namespaces(txn, thread)
        scans = []
        for one_ns in namespaces:
            start, stop = S.checkpoints_range(thread, one_ns)
            if before_id is not None:
                stop = min(stop, S.checkpoint_key(thread, one_ns, str(before_id)))
            if resume is not None:  # ids below the last one returned
                stop = min(stop, start[:-1] + resume[0])
            scans.append(_tagged(txn.scan(start, stop, reverse=True), start[:-1]))
        if len(scans) == 1:
            yield from scans[0]
        else:
            yield from _merge_desc(scans)

    return source


def _matches(metadata: Mapping[str, Any], filter: Mapping[str, Any]) -> bool:
    return all(metadata.get(key) == value for key, value in filter.items())


def _tagged(
    scan: Iterable[tuple[bytes, bytes]], prefix: bytes
) -> Iterator[tuple[tuple[bytes, bytes], bytes]]:
    """Checkpoint keys under one packed (thread, ns) ``prefix`` -> ((checkpoint
    id element, prefix), record), the id as its packed bytes: packing
    preserves order, so positions compare as the keys do (a merge of
    namespaces, a resume below the last id returned: chunks never split one
    id across namespaces) without unpacking every key."""
    n = len(prefix)
    for key, raw in scan:
        yield (key[n:], prefix), raw


def _merge_desc(scans: list[Iterator[tuple[Any, bytes]]]) -> Iterator[tuple[Any, bytes]]:
    return heapq.merge(*scans, key=lambda item: item[0], reverse=True)


def _most_selective(txn: Txn, ranges: list[tuple[bytes, bytes]], probe: int = 64) -> Any:
    """The index range with the fewest entries, counting at most ``probe`` in
    each: a filter like {"source": "input", "tag": "x"} walks the rare tag,
    not every input checkpoint."""
    best, best_n = ranges[0], None
    for rng in ranges:
        n = 0
        for _ in txn.scan(*rng):
            n += 1
            if n >= probe:
                break
        if best_n is None or n < best_n:
            best, best_n = rng, n
    return best


def _same_id(pos: Any, last: Any) -> bool:
    return last is not None and pos[0] == last[0]
