"""Small values in the checkpoint record (format 6, ``schema.is_small``).

A put keeps in its checkpoint's ``channel_values`` every small value the
checkpoint has, changed or not, so a read never needs to know which
checkpoint first wrote a version: a channel is in the record, or in its
blob. An unchanged channel the put is given no value for takes the one its
parent's record holds at the same version.

The parent's small values come from ``Memo`` (what this process put last
per thread and namespace, the parent of nearly every put) or, when it does
not hold the parent, from the parent's stored record.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import ormsgpack

from . import schema as S

__all__ = ["Memo", "for_head", "held", "of_record", "split"]

Held = dict[str, tuple[Any, Any]]  # channel -> (version, small value)

_LIMIT = 4096  # (thread, ns) a Memo holds at most; emptied when full


def _same(a: Any, b: Any) -> bool:
    # versions 1, 1.0 and True are three blobs (heads.version_key)
    return type(a) is type(b) and a == b


def split(
    parent: Callable[[], Held],
    versions: Mapping[str, Any],
    new_versions: Mapping[str, Any],
    values: Mapping[str, Any],
) -> tuple[dict[str, Any], Mapping[str, Any]]:
    """(the checkpoint's small values, the new versions whose values go to
    blobs). Every small value the put is given is kept (LangGraph gives
    every channel's, changed or not); a channel it keeps at its parent's
    version without giving a value takes the parent's, when ``parent()``
    (its small values with their versions) holds that version."""
    small: dict[str, Any] = {}
    unseen = []
    for ch, v in versions.items():
        if ch in values:
            value = values[ch]
            if S.is_small(value) and (ch not in new_versions or _same(new_versions[ch], v)):
                small[ch] = value
        elif ch not in new_versions:
            unseen.append(ch)
    if unseen:
        kept = parent()
        for ch in unseen:
            got = kept.get(ch)
            if got is not None and _same(got[0], versions[ch]):
                small[ch] = got[1]
    if not any(ch in small for ch in new_versions):
        return small, new_versions
    return small, {ch: v for ch, v in new_versions.items() if ch not in small}


def held(versions: Mapping[str, Any], small: Mapping[str, Any]) -> Held:
    """The small values of a checkpoint with their versions."""
    return {ch: (versions[ch], value) for ch, value in small.items() if ch in versions}


def for_head(versions: Mapping[str, Any], small: Mapping[str, Any]) -> Held:
    """channel -> (version, msgpack) of the small values: ``heads.build``'s
    ``mine`` for them."""
    return {ch: (versions[ch], ormsgpack.packb(v)) for ch, v in small.items() if ch in versions}


def of_record(loads: Callable[[S.Typed], Any], raw: bytes | None) -> Held:
    """The small values of a stored checkpoint record (none when there is
    no record, or one that does not decode: its values are lost with it)."""
    if raw is None:
        return {}
    try:
        cp = loads(S.decode_checkpoint(raw).checkpoint)
        return held(cp.get("channel_versions") or {}, cp.get("channel_values") or {})
    except Exception:
        return {}


class Memo:
    """(thread, ns) -> (checkpoint id, its small values) of the last put."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], tuple[str, Held]] = {}

    def get(self, thread: str, ns: str, checkpoint_id: str) -> Held | None:
        last = self._last.get((thread, ns))
        return last[1] if last is not None and last[0] == checkpoint_id else None

    def put(self, thread: str, ns: str, checkpoint_id: str, values: Held) -> None:
        if len(self._last) >= _LIMIT:
            self._last.clear()
        self._last[(thread, ns)] = (checkpoint_id, values)
