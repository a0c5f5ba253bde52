"""LangChain messages decoded with less Python around the same validation.

A read of a long chat's latest checkpoint is mostly the decode of its message
list, which every saver pays alike (SqliteSaver decodes the same msgpack with
the same serializer). ``JsonPlusSerializer``'s ext hook builds each message as
``cls(**kwargs)``: an ``importlib.import_module`` call, the allowlist check,
then four Python ``__init__`` methods (the message class's, ``BaseMessage``'s,
``Serializable``'s, pydantic's ``BaseModel``'s) that each pass the keywords
on, until pydantic's validator does the work. Calling the validator directly
makes a message list's decode much cheaper, for the same objects. A saver
uses it with ``fast_paths=True`` only (``compression.loader``).

``fast_hook(stock)`` returns an ext hook that, for a pydantic-v2 record
(``EXT_PYDANTIC_V2``) of one of LangChain's message classes, calls that
validator directly (``validate_python(kwargs, self_instance=obj)``, what
``BaseModel.__init__`` does), and hands everything else to ``stock`` (the
serializer's own hook, with its allowlist). It is the same result because:

- the class is allowed without a side effect: its (module, name) is in
  ``SAFE_MSGPACK_TYPES``, which the stock check accepts first, whatever the
  allowlist (no event, no warning);
- every ``__init__`` on the class's MRO is one of ``_FORWARDING`` (the message
  classes' and ``Serializable``'s, which only pass ``content`` and the
  keywords on while ``content_blocks`` is absent) or pydantic's own, and the
  record has ``content`` and no ``content_blocks`` (``model_dump`` makes
  exactly such records); otherwise (``RemoveMessage``, whose ``__init__``
  differs, a subclass with its own) the stock hook builds it;
- any exception (a record that does not validate) goes to the stock hook with
  the same bytes, which then does what it always does (its
  ``model_construct`` fallback included).

The private names this relies on come from ``_upstream`` (``tests/test_upstream.py``
fails when a release changes them so that messages would take the stock hook).
``tests/test_messages.py`` compares both hooks' objects (their ``__dict__``,
fields set, extras and private attributes) over many message shapes, so a
LangChain release that changes one of these ``__init__`` methods fails there.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import ormsgpack
from langgraph.checkpoint.serde.jsonplus import EXT_PYDANTIC_V2

from . import _upstream as U
from ._msgpack import header, str_at

__all__ = ["fast_hook"]

Hook = Callable[[int, bytes], Any]

_SAFE = frozenset(k for k in U.SAFE_MSGPACK_TYPES if k[0].startswith("langchain_core.messages."))


def _forwarding() -> frozenset[Any]:
    """The ``__init__`` functions known to only pass their arguments on."""
    from langchain_core.load.serializable import Serializable
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
    )
    from pydantic import BaseModel

    classes = (AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage, Serializable)
    return frozenset([*(vars(c)["__init__"] for c in classes), vars(BaseModel)["__init__"]])


_FORWARDING: frozenset[Any] | None = None
_classes: dict[tuple[str, str], Any] = {}  # (module, name) -> class, or None: stock
# The names come from stored records (any pydantic class): emptied when full,
# as the other memos of names are (``elements._PLAIN``, ``keyspace._memo``).
_CLASSES_MAX = 1024


def _fast_class(module: str, name: str) -> Any:
    """The class to build directly, or None (the stock hook builds it)."""
    global _FORWARDING
    key = (module, name)
    if key in _classes:
        return _classes[key]
    if len(_classes) >= _CLASSES_MAX:
        _classes.clear()  # the same dict: fast_hook's reference stays valid
    if key not in _SAFE:
        _classes[key] = None
        return None
    mod = sys.modules.get(module)  # a message class's module is imported with langchain_core
    if mod is None:
        return None  # not remembered: it may be imported later
    if _FORWARDING is None:
        _FORWARDING = _forwarding()
    cls = None
    c = getattr(mod, name, None)
    if isinstance(c, type) and U.validator(c) is not None:
        inits = [vars(k)["__init__"] for k in c.__mro__[:-1] if "__init__" in vars(k)]
        if all(f in _FORWARDING for f in inits) and "__new__" not in vars(c):
            cls = c
    _classes[key] = cls
    return cls


def _head(data: bytes) -> tuple[str, str]:
    """(module, class name): the first two elements of a pydantic record's
    msgpack array, read without decoding the rest (ValueError otherwise)."""
    h = header(data)
    if h is None or h[0] < 3:
        raise ValueError("not a msgpack array of 3 or more")
    module, i = str_at(data, h[1])
    name, _ = str_at(data, i)
    return module, name


def fast_hook(stock: Hook) -> Hook:
    """``stock`` (a ``JsonPlusSerializer``'s ext hook) with messages built
    directly. A record of any other class goes to ``stock`` undecoded (its
    module and name are read first), so it is decoded once, as by ``stock``
    alone."""
    unpackb, option = ormsgpack.unpackb, ormsgpack.OPT_NON_STR_KEYS
    classes = _classes

    def ext_hook(code: int, data: bytes) -> Any:
        if code != EXT_PYDANTIC_V2:
            return stock(code, data)
        try:
            key = _head(data)
            cls = classes[key] if key in classes else _fast_class(*key)
            if cls is None:
                return stock(code, data)
            kwargs = unpackb(data, ext_hook=ext_hook, option=option)[2]
            if "content" not in kwargs or "content_blocks" in kwargs or "self" in kwargs:
                return stock(code, data)
            obj = cls.__new__(cls)
            if cls.__pydantic_validator__.validate_python(kwargs, self_instance=obj) is obj:
                return obj
            return stock(code, data)  # a validator returned another object: as stock does
        except Exception:
            return stock(code, data)

    return ext_hook
