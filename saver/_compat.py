"""What differs between the langgraph-checkpoint releases kvsaver supports.

pyproject allows ``langgraph-checkpoint>=4.0`` (issue #12.2); newer releases
added names that older ones lack, so they are imported here, guarded, and
nowhere else:

- ``DeltaChannelHistory`` and ``BaseCheckpointSaver.get_delta_channel_history``
  (since 4.1.0): where they are missing ``HAS_DELTA_CHANNELS`` is False and
  KVSaver has no ``get_delta_channel_history`` / ``aget_delta_channel_history``,
  as no saver of those releases has, and LangGraph there never asks for them.
- ``writes_sort_key`` (since 4.3.0): where it is missing, the local copy
  below, the same function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import BaseCheckpointSaver

__all__ = ["HAS_DELTA_CHANNELS", "DeltaChannelHistory", "writes_sort_key"]

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
