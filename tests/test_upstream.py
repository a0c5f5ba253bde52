"""The private LangGraph and pydantic names the fast paths use
(``saver/_upstream.py``). A release that renames or changes one switches a
fast path off without an error (values stay right, reads and puts get
slower), so these tests fail, never skip, when that happens: an upgrade is
noticed. The exception is langgraph-checkpoint 4.0.0, which has no msgpack
allowlist and so no fast message decoding to switch off."""

from __future__ import annotations

from typing import Any

import ormsgpack
from kvsaver import _upstream as U
from kvsaver import compression as C
from kvsaver import delta as D
from kvsaver import elements as E
from kvsaver import messages as M
from kvsaver._compat import HAS_STRICT_MSGPACK
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

MESSAGES = (AIMessage, HumanMessage, SystemMessage, ToolMessage)


def _history() -> list[Any]:
    return [
        SystemMessage("s"),
        HumanMessage("a", id="1"),
        AIMessage("b", id="2", tool_calls=[{"name": "f", "args": {"q": 1}, "id": "c"}]),
        ToolMessage("c", tool_call_id="c", id="3"),
    ]


def test_element_by_element_serialization_is_on() -> None:
    """``jsonplus._msgpack_enc`` and ``_option`` are there, and a list's
    bytes are still its header followed by its elements' bytes."""
    assert U.msgpack_enc is not None and U.msgpack_option is not None
    assert E._enc is U.msgpack_enc and E._option == U.msgpack_option
    assert E.ENABLED
    serde = JsonPlusSerializer()
    assert D.codec(serde).elements is not None


def test_langchains_messages_are_models_pydantic_alone_serializes() -> None:
    """``__pydantic_decorators__``, ``__pydantic_computed_fields__``,
    ``__pydantic_core_schema__`` say so, and ``__pydantic_extra__`` gives
    every message a fingerprint."""
    for cls in MESSAGES:
        assert U.decorators(cls) is not None, cls
        assert U.core_schema(cls) is not None, cls
        assert E._plain_model(cls), cls
    history = _history()
    assert E._fingerprints(history) is not None
    assert all(E._fingerprint(m) is not None for m in history)
    made = E.Elements()
    assert made.dumps("k", history) == U.msgpack_enc(history)
    assert "k" in made.lists  # kept: the next put reuses the bytes


def test_messages_are_built_without_the_stock_hook() -> None:
    """``SAFE_MSGPACK_TYPES`` holds LangChain's messages, their validators
    take ``self_instance``, and their ``__init__`` methods only pass their
    arguments on: the fast hook builds them itself."""
    if not HAS_STRICT_MSGPACK:  # langgraph-checkpoint 4.0.0: see the docstring
        return
    for cls in MESSAGES:
        key = (cls.__module__, cls.__name__)
        assert key in U.SAFE_MSGPACK_TYPES, key
        assert U.validator(cls) is not None, cls
        assert M._fast_class(*key) is cls, cls
    serde = JsonPlusSerializer()
    stock = U.stock_ext_hook(serde)
    assert stock is not None
    calls: list[int] = []

    def counting(code: int, data: bytes) -> Any:
        calls.append(code)
        return stock(code, data)

    _, data = serde.dumps_typed(_history())
    out = ormsgpack.unpackb(data, ext_hook=M.fast_hook(counting), option=ormsgpack.OPT_NON_STR_KEYS)
    assert calls == []
    assert out == serde.loads_typed(("msgpack", data))


def test_the_saver_loads_values_through_the_fast_hook() -> None:
    """``_unpack_ext_hook`` and ``_custom_unpack_ext_hook`` are there: the
    default stack's loader unpacks values itself, with the fast hook."""
    serde = C.CompressingSerializer()
    stock = U.stock_ext_hook(serde.serde)
    assert stock is not None
    readers = C.value_readers(serde)
    assert readers is not None
    if HAS_STRICT_MSGPACK:
        assert U.custom_ext_hook(serde.serde) is False
        assert readers.ext_hook is not stock  # the fast hook around it
