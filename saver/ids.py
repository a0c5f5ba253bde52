"""Ids and configs as KVSaver takes and returns them: ``config["configurable"]``
checked, a thread and namespace read from it, an id as stored (its text), and
the config of a stored checkpoint."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from uuid import UUID

from langchain_core.runnables import RunnableConfig

__all__ = ["as_id", "config_of", "configurable", "id_list", "thread_ns"]


def configurable(config: RunnableConfig | None, what: str) -> Mapping[str, Any]:
    """``config["configurable"]``, checked (read only: callers never change it)."""
    # type() first: the ABC check of isinstance(Mapping) costs more than a read.
    if type(config) is not dict and not isinstance(config, Mapping):
        raise TypeError(f"{what}: config must be a dict (RunnableConfig), got {config!r}")
    conf = config.get("configurable")
    if type(conf) is not dict and not isinstance(conf, Mapping):
        raise ValueError(
            f"{what}: config has no 'configurable' dict; pass "
            "{'configurable': {'thread_id': ...}}"
        )
    return conf


def thread_ns(config: RunnableConfig, what: str) -> tuple[str, str, Mapping[str, Any]]:
    conf = configurable(config, what)
    thread = conf.get("thread_id")
    if thread is None:
        raise ValueError(
            f"{what}: config['configurable']['thread_id'] is missing; every checkpoint "
            "belongs to a thread, e.g. {'configurable': {'thread_id': 'user-42'}}"
        )
    ns = conf.get("checkpoint_ns")
    # as_id's common case first, inline: every read and write comes here, and
    # the labels are formatted only when as_id is called, for an error.
    if type(thread) is not str or not thread.isascii():
        thread = as_id(thread, f"{what}: config['configurable']['thread_id']")
    if ns is None:
        ns = ""
    elif type(ns) is not str or not ns.isascii():
        ns = as_id(ns, f"{what}: checkpoint_ns")
    return thread, ns, conf


def as_id(value: Any, what: str) -> str:
    """An id as stored: a str, or an int or UUID as its text (SqliteSaver
    str()s every id). Anything else is refused rather than stored as "None"
    or "<object at 0x...>", and so is a str that UTF-8 cannot encode (a lone
    surrogate: a ValueError naming it, not a bare TypeError from the encoder)."""
    if type(value) is str and value.isascii():  # the common case, checked on every call
        return value
    if not isinstance(value, (str, int, UUID)) or isinstance(value, bool):
        kind = type(value).__name__
        raise TypeError(f"{what} must be a str (or an int or UUID), not {kind}: {value!r}")
    text = str(value)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(
                f"{what} {text!r} is not a valid id: it contains a lone surrogate "
                f"({text[e.start]!r} at index {e.start}), which UTF-8 cannot encode"
            ) from None
    return text


def id_list(value: Any, what: str) -> list[str]:
    if isinstance(value, (str, bytes)):
        raise TypeError(
            f"{what} takes a list of ids, not a single string {value!r}; "
            f"write {what.split('(')[0]}([{value!r}])"
        )
    return [as_id(v, f"{what}: an id") for v in value]


def config_of(thread: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }
