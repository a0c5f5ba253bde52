"""What the ways into and out of KVSaver share: their errors and counts,
verification's strict msgpack reads, Ctrl-C during a copy, and the ids of a
config."""

from __future__ import annotations

import copy
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from .. import _upstream as U
from ..compression import CompressingSerializer

ProgressFn = Callable[[str, int, int], None]
"""``progress(phase, done, total)``: phase is ``"copy"`` or ``"verify"``;
done and total count checkpoints (total 0: not known)."""

DEFAULT_BATCH = 256


class MigrationError(Exception):
    """The migration cannot start or go on: a bad source, a refused destination,
    a checkpoint that cannot be represented. The message says which.
    ``stats`` holds what was done before the error, when anything was."""

    stats: MigrationStats | None = None


class VerificationError(MigrationError):
    """Source and destination differ; ``difference`` names the first place."""

    def __init__(self, difference: str) -> None:
        super().__init__(f"verification failed: {difference}")
        self.difference = difference


@dataclass
class MigrationStats:
    """What a migration found, did (or, with ``dry_run``, would do) and took."""

    source: str = ""
    dest: str = ""
    dry_run: bool = False
    threads: int = 0
    namespaces: int = 0
    checkpoints: int = 0
    """Checkpoints in the source."""
    checkpoints_copied: int = 0
    checkpoints_present: int = 0
    """Already in the destination (an earlier run): not decoded again."""
    writes: int = 0
    """Pending writes of the source's checkpoints."""
    writes_copied: int = 0
    writes_present: int = 0
    orphan_writes: int = 0
    """Writes in the source whose checkpoint does not exist (never readable
    through SqliteSaver either): not copied."""
    blobs_written: int = 0
    bytes_written: int = 0
    """Keys and values put into the destination store."""
    source_bytes: int = 0
    """The SQLite file (and its -wal), on disk."""
    seconds: float = 0.0
    verified: int | None = None
    """Checkpoints compared by verification (None: not verified)."""
    verify_seconds: float = 0.0
    namespace_list: list[tuple[str, str]] = field(default_factory=list, repr=False)

    @property
    def rate(self) -> float:
        """Checkpoints copied per second."""
        return self.checkpoints_copied / self.seconds if self.seconds > 0 else 0.0


# -- verification reads in strict msgpack mode ---------------------------------------


def _strict_serde(serde: SerializerProtocol) -> SerializerProtocol | None:
    """``serde`` in LangGraph's strict msgpack mode, when it is a
    ``JsonPlusSerializer`` (bare or inside KVSaver's compression) without an
    allowlist or ext hook of its own; else None (an allowlist, encryption, a
    serializer of the user's: used as they are). Strict mode rebuilds only LangGraph's
    safe types; any other class or function named in stored data comes back
    as its raw arguments instead of being imported and called."""
    comp = serde if isinstance(serde, CompressingSerializer) else None
    inner = comp.serde if comp is not None else serde
    if type(inner) is not JsonPlusSerializer or U.custom_ext_hook(inner):
        return None  # not LangGraph's own decoding: the user's to decide
    policy = U.msgpack_policy(inner)
    if policy is None:
        return serde
    if policy is not True:
        return None
    strict = JsonPlusSerializer(pickle_fallback=inner.pickle_fallback, allowed_msgpack_modules=None)
    return comp.with_inner(strict) if comp is not None else strict


def _strict_pair(
    source: BaseCheckpointSaver, dest: BaseCheckpointSaver
) -> tuple[BaseCheckpointSaver, BaseCheckpointSaver]:
    """The two savers as verification reads them: both in strict msgpack mode
    when both can be (verification decodes every stored value, and
    in the default mode a crafted one can name any importable callable for the
    decoder to run); else both as they are, so both sides decode alike."""
    strict = [_strict_serde(source.serde), _strict_serde(dest.serde)]
    if None in strict:
        return source, dest
    views = []
    for saver, serde in zip((source, dest), strict):
        if serde is not saver.serde:
            saver = copy.copy(saver)
            saver.serde = serde  # type: ignore[assignment]
        views.append(saver)
    return views[0], views[1]


# -- Ctrl-C ----------------------------------------------------------------------------


@contextmanager
def _interrupts() -> Iterator[Callable[[], bool]]:
    """Yields ``interrupted()``: whether Ctrl-C (SIGINT) came meanwhile.

    Decoding can swallow a KeyboardInterrupt: LangGraph's msgpack
    ``ext_hook`` (and ours, ``_keep_ext``) runs inside ormsgpack, which
    replaces any exception raised in a hook, KeyboardInterrupt included, by
    ``ValueError('ext_hook failed')``; LangGraph's hook may then catch that
    in a nested value and decode it to a fallback value. So while a migration
    runs, SIGINT is also recorded here (in the main thread; the previous
    handler still runs), a batch commits only if none came, and an exception
    that ends the migration after one is raised as the KeyboardInterrupt it
    was, as is a migration that finished anyway.
    """
    hits: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None
    if not callable(previous):  # another thread, or SIGINT ignored or not from Python
        yield lambda: False
        return

    def record(signum: int, frame: Any) -> None:
        hits.append(signum)
        previous(signum, frame)

    signal.signal(signal.SIGINT, record)
    try:
        yield lambda: bool(hits)
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        if hits:
            raise KeyboardInterrupt() from e
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
    if hits:
        raise KeyboardInterrupt()


def _describe(thread: str, ns: str, checkpoint_id: str) -> str:
    return f"thread {thread!r} namespace {ns!r} checkpoint {checkpoint_id!r}"


def _refuse(dest: str, source: str, first: str) -> MigrationError:
    return MigrationError(
        f"the destination {dest} already holds checkpoints that are not in {source} "
        f"(e.g. {first}); refusing to mix them. Pass --merge (merge=True) to add to it "
        "anyway, or choose an empty destination"
    )


def _ids(config: RunnableConfig) -> tuple[str, str, str]:
    conf = config["configurable"]
    return str(conf["thread_id"]), str(conf.get("checkpoint_ns") or ""), str(conf["checkpoint_id"])


def _cfg(thread: str, ns: str, checkpoint_id: str | None = None) -> RunnableConfig:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if checkpoint_id:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}
