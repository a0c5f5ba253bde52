"""``verify``: ``list()`` and ``get_tuple()`` of two savers compared per
(thread, namespace); the first difference raised as ``VerificationError``."""

from __future__ import annotations

import math
import reprlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple

from .common import ProgressFn, VerificationError, _cfg, _ids

# -- verification ---------------------------------------------------------------------

_repr = reprlib.Repr()
_repr.maxstring = 80
_repr.maxother = 80


def _short(value: Any) -> str:
    return _repr.repr(value)


def _diff(a: Any, b: Any, path: str) -> str | None:
    """The first place where a (source) and b (destination) differ, or None."""
    try:
        if type(a) is type(b) and a == b:
            return None
    except Exception:  # an __eq__ that raises: fall through to the structure
        pass
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return None
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in a:
            if key not in b:
                return f"{path}[{key!r}]: only on the source ({_short(a[key])})"
        for key in b:
            if key not in a:
                return f"{path}[{key!r}]: only on the destination ({_short(b[key])})"
        for key in a:
            if (d := _diff(a[key], b[key], f"{path}[{key!r}]")) is not None:
                return d
        if type(a) is not type(b):
            ta, tb = type(a).__name__, type(b).__name__
            return f"{path}: type {ta} on the source, {tb} on the destination"
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and type(a) is type(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if (d := _diff(x, y, f"{path}[{i}]")) is not None:
                return d
        if len(a) != len(b):
            return f"{path}: {len(a)} items on the source, {len(b)} on the destination"
        return None
    if type(a) is type(b) and type(a).__eq__ is object.__eq__ and hasattr(a, "__dict__"):
        return _diff(vars(a), vars(b), path)
    return f"{path}: source {_short(a)} != destination {_short(b)}"


def _by_task(writes: Sequence[Any]) -> dict[str, list[tuple[str, Any]]]:
    out: dict[str, list[tuple[str, Any]]] = {}
    for task_id, channel, value in writes:
        out.setdefault(task_id, []).append((channel, value))
    return out


def _diff_tuple(
    a: CheckpointTuple | None, b: CheckpointTuple | None, where: str, writes_order: bool
) -> str | None:
    if a is None or b is None:
        if a is b:
            return None
        side = "source" if b is None else "destination"
        return f"{where}: only the {side} has a checkpoint"
    for name in ("config", "parent_config", "metadata", "checkpoint"):
        if (d := _diff(getattr(a, name), getattr(b, name), f"{where}.{name}")) is not None:
            return d
    wa, wb = list(a.pending_writes or []), list(b.pending_writes or [])
    if not writes_order:
        return _diff(_by_task(wa), _by_task(wb), f"{where}.pending_writes(by task)")
    return _diff(wa, wb, f"{where}.pending_writes")


def verify(
    source: BaseCheckpointSaver,
    dest: BaseCheckpointSaver,
    namespaces: Iterable[tuple[str, str]],
    *,
    exact: bool = True,
    writes_order: bool = True,
    progress: ProgressFn | None = None,
    total: int = 0,
) -> int:
    """Compare ``list()`` and the latest ``get_tuple()`` of source and
    destination for every (thread, namespace); return the number of
    checkpoints compared, or raise ``VerificationError`` with the first
    difference.

    ``exact=False`` (after a merge) ignores destination checkpoints the source
    does not have. ``writes_order=False`` compares each task's pending writes
    in order rather than the whole list (for copies that lost ``task_path``).
    """
    compared = 0
    if progress is not None:
        progress("verify", 0, total)
    for thread, ns in namespaces:
        where = f"thread {thread!r} namespace {ns!r}"
        config = _cfg(thread, ns)
        latest_id = None
        # Both lists are streamed side by side (a long thread never sits in
        # memory whole) and closed before get_tuple: SqliteSaver.list holds
        # the saver's lock until its generator finishes.
        src_iter, dst_iter = source.list(config), dest.list(config)
        try:
            for i, a in enumerate(src_iter):
                a_id = _ids(a.config)[2]
                latest_id = latest_id or a_id
                b = next(dst_iter, None)
                while not exact and b is not None and _ids(b.config)[2] > a_id:
                    b = next(dst_iter, None)  # merged in from elsewhere: not ours to compare
                if b is None:
                    raise VerificationError(
                        f"{where}: list()[{i}] is checkpoint {a_id!r} on the source; the "
                        "destination's list() has ended"
                    )
                if (b_id := _ids(b.config)[2]) != a_id:
                    raise VerificationError(
                        f"{where}: list()[{i}] is checkpoint {a_id!r} on the source, {b_id!r} "
                        "on the destination"
                    )
                if (d := _diff_tuple(a, b, f"{where}: list()[{i}]", writes_order)) is not None:
                    raise VerificationError(d)
                compared += 1
            if exact and (extra := next(dst_iter, None)) is not None:
                raise VerificationError(
                    f"{where}: the destination's list() goes on after the source's ends, with "
                    f"checkpoint {_ids(extra.config)[2]!r}"
                )
        finally:
            for it in (src_iter, dst_iter):
                close = getattr(it, "close", None)
                if close is not None:
                    close()
        if latest_id is not None:
            latest = config if exact else _cfg(thread, ns, latest_id)
            label = "get_tuple()" if exact else f"get_tuple({latest_id!r})"
            got_a, got_b = source.get_tuple(latest), dest.get_tuple(latest)
            if (d := _diff_tuple(got_a, got_b, f"{where}: {label}", writes_order)) is not None:
                raise VerificationError(d)
        if progress is not None:
            progress("verify", compared, max(total, compared))
    return compared
