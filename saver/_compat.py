"""What differs between the langgraph-checkpoint releases kvsaver supports.

pyproject allows ``langgraph-checkpoint>=4.0``; newer releases
added names that older ones lack, so they are imported here, guarded, and
nowhere else:

- ``DeltaChannelHistory`` and ``BaseCheckpointSaver.get_delta_channel_history``
  (since 4.1.0): where they are missing ``HAS_DELTA_CHANNELS`` is False and
  KVSaver has no ``get_delta_channel_history`` / ``aget_delta_channel_history``,
  as no saver of those releases has, and LangGraph there never asks for them.
- ``writes_sort_key`` (since 4.3.0): where it is missing, the local copy
  below, the same function.
- strict msgpack decoding, ``JsonPlusSerializer(allowed_msgpack_modules=None)``
  (since 4.0.1): ``strict_jsonplus()`` gives it where it exists; 4.0.0 has no
  allowlist at all, so there it is LangGraph's one decoding
  (``HAS_STRICT_MSGPACK`` is False; the README's Security section says so).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

__all__ = [
    "HAS_DELTA_CHANNELS",
    "HAS_STRICT_MSGPACK",
    "DeltaChannelHistory",
    "strict_jsonplus",
    "writes_sort_key",
]

# The beta DeltaChannel protocol: the saver walks the parent chain for the
# channel (langgraph-checkpoint 4.1.0+, used by langgraph 1.2+).
HAS_DELTA_CHANNELS: bool = hasattr(BaseCheckpointSaver, "get_delta_channel_history")

if TYPE_CHECKING:
    from langgraph.checkpoint.base import DeltaChannelHistory
else:
    try:
        from langgraph.checkpoint.base import DeltaChannelHistory
    except ImportError:  # langgraph-checkpoint < 4.1: nothing asks for it
        DeltaChannelHistory = dict[str, Any]

if TYPE_CHECKING:
    from langgraph.checkpoint.base import writes_sort_key
else:
    try:
        from langgraph.checkpoint.base import writes_sort_key
    except ImportError:  # langgraph-checkpoint < 4.3

        def writes_sort_key(
            task_path: str, task_id: str = "", idx: int = 0
        ) -> tuple[str, str, int]:
            """Sort key for the writes of one super-step (copied from
            langgraph-checkpoint 4.3's ``langgraph.checkpoint.base``): live
            execution applies a super-step's tasks in this order, so replayed
            writes must be sorted by it too."""
            return (task_path, task_id, idx)


def strict_jsonplus() -> JsonPlusSerializer:
    """LangGraph's serializer in strict msgpack mode (no class outside its
    safe list is imported), where the installed release has that mode."""
    if HAS_STRICT_MSGPACK:
        return JsonPlusSerializer(allowed_msgpack_modules=None)
    return JsonPlusSerializer()


def _has_strict_msgpack() -> bool:
    try:
        JsonPlusSerializer(allowed_msgpack_modules=None)
    except TypeError:  # langgraph-checkpoint 4.0.0
        return False
    return True


HAS_STRICT_MSGPACK: bool = _has_strict_msgpack()
