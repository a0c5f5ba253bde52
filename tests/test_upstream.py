"""The private LangGraph and pydantic names the fast paths use
(``saver/_upstream.py``). A release that renames or changes one switches a
fast path off without an error (values stay right, reads and puts get
slower), so these tests fail, never skip, when that happens: an upgrade is
noticed. The exception is langgraph-checkpoint 4.0.0, which has no msgpack
allowlist and so no fast message decoding to switch off."""

from __future__ import annotations

from typing import Any

import ormsgpack
import pytest
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
    readers = C.value_readers(serde, True)
    assert readers is not None
    if HAS_STRICT_MSGPACK:
        assert U.custom_ext_hook(serde.serde) is False
        assert readers.ext_hook is not stock  # the fast hook around it


def test_the_default_saver_takes_no_private_name(tmp_path: Any, monkeypatch: Any) -> None:
    """``fast_paths=False`` (the default): a chat graph's puts, reads and
    heads go through public calls only; every fast path is made to raise, so
    a use of one fails here. With ``fast_paths=True`` they are used."""
    from kvsaver import KVSaver
    from saver_helpers_graphs import chat_graph, human

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a private upstream name was used")

    monkeypatch.setattr(U, "stock_ext_hook", refuse)
    monkeypatch.setattr(U, "custom_ext_hook", refuse)
    monkeypatch.setattr(U, "validator", refuse)
    monkeypatch.setattr(E.Elements, "dumps", refuse)
    monkeypatch.setattr(C, "fast_hook", refuse)
    cfg: Any = {"configurable": {"thread_id": "t"}}
    with KVSaver(tmp_path / "default") as saver:
        graph = chat_graph(saver)
        for i in range(4):
            graph.invoke(human(i), cfg)
        want = graph.get_state(cfg).values["messages"]
    with KVSaver(tmp_path / "default", readonly=True) as saver:  # its heads, written at close
        assert saver._heads.readable and saver._reads.fast is None
        assert chat_graph(saver).get_state(cfg).values["messages"] == want
        assert len(list(saver.list(cfg))) > 4
    with pytest.raises(AssertionError, match="private upstream name"):
        KVSaver(tmp_path / "fast", fast_paths=True)


def test_the_migrations_strict_reads_find_the_serializers_policy() -> None:
    """Not a speed path: ``migrate.common``'s strict verification reads
    ``_allowed_msgpack_modules`` and ``_custom_unpack_ext_hook`` (no public
    API says either); were they gone, verification would decode in the
    serializer's own mode without a word, so this fails instead."""
    if not HAS_STRICT_MSGPACK:  # langgraph-checkpoint 4.0.0: see the docstring
        return
    assert U.msgpack_policy(JsonPlusSerializer(allowed_msgpack_modules=None)) is None
    assert U.msgpack_policy(JsonPlusSerializer()) is not False
    assert U.custom_ext_hook(JsonPlusSerializer()) is False
    assert U.custom_ext_hook(JsonPlusSerializer(__unpack_ext_hook__=lambda c, d: d)) is True


def test_the_commands_safe_methods_list() -> None:
    """``SAFE_MSGPACK_METHODS`` (tools/sources.py: which stored method calls
    the commands decode) holds (module, class, method) triples, datetime's
    ``fromisoformat`` among them, where the release has strict msgpack."""
    if not HAS_STRICT_MSGPACK:  # langgraph-checkpoint 4.0.0: no allowlist at all
        return
    assert U.SAFE_MSGPACK_METHODS, "langgraph.checkpoint.serde._msgpack changed"
    assert all(isinstance(t, tuple) and len(t) == 3 for t in U.SAFE_MSGPACK_METHODS)
    assert ("datetime", "datetime", "fromisoformat") in U.SAFE_MSGPACK_METHODS
