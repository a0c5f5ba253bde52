"""saver/messages.py: the fast ext hook builds the same objects as the stock one."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import ormsgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvsaver import compression as C
from kvsaver import messages as M
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    AnyMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    HumanMessageChunk,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
    ToolMessageChunk,
)
from langgraph.checkpoint.serde.jsonplus import EXT_PYDANTIC_V2, JsonPlusSerializer
from pydantic import BaseModel

OPT = ormsgpack.OPT_NON_STR_KEYS


class Shouting(HumanMessage):
    """A user's subclass with its own ``__init__``: the stock hook builds it."""

    def __init__(self, content: Any = None, **kwargs: Any) -> None:
        if isinstance(content, str):
            content = content.upper()
        super().__init__(content=content, **kwargs)


def same(a: Any, b: Any) -> bool:
    """Equal values, and for pydantic models every part of their state."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if hasattr(a, "__pydantic_fields_set__"):
        return (
            same(a.__dict__, b.__dict__)
            and a.__pydantic_fields_set__ == b.__pydantic_fields_set__
            and a.__pydantic_extra__ == b.__pydantic_extra__
            and a.__pydantic_private__ == b.__pydantic_private__
        )
    return bool(a == b)


def both(value: Any, serde: JsonPlusSerializer | None = None) -> tuple[Any, Any]:
    """``value`` decoded by the stock hook and by the fast one."""
    serde = serde or JsonPlusSerializer()
    typ, data = serde.dumps_typed(value)
    assert typ == "msgpack"
    stock = serde._unpack_ext_hook
    return (
        ormsgpack.unpackb(data, ext_hook=stock, option=OPT),
        ormsgpack.unpackb(data, ext_hook=M.fast_hook(stock), option=OPT),
    )


SHAPES: list[Any] = [
    HumanMessage("hi", id="h-1"),
    HumanMessage("hi"),
    HumanMessage([{"type": "text", "text": "a"}, "b"], name="ann", id="h-2"),
    HumanMessage("x", additional_kwargs={"when": datetime.datetime(2026, 1, 2), "n": [1, 2]}),
    HumanMessage("x", example=True),
    AIMessage("ok", id="a-1", response_metadata={"model": "m", "stop": None}),
    AIMessage(
        "",
        tool_calls=[{"name": "f", "args": {"q": 1}, "id": "c1", "type": "tool_call"}],
        invalid_tool_calls=[{"name": "g", "args": "{", "id": "c2", "error": "bad"}],
        usage_metadata={"input_tokens": 3, "output_tokens": 4, "total_tokens": 7},
    ),
    # A legacy record: tool calls only in additional_kwargs (a validator parses them).
    AIMessage(
        "",
        additional_kwargs={
            "tool_calls": [{"id": "c3", "function": {"name": "f", "arguments": '{"a": 1}'}}]
        },
    ),
    AIMessageChunk("par", id="a-2", tool_call_chunks=[{"name": "f", "args": "{", "index": 0}]),
    SystemMessage("be brief", id=str(uuid.UUID(int=7))),
    ToolMessage("42", tool_call_id="c1", artifact={"raw": [1]}, status="error"),
    ToolMessageChunk("4", tool_call_id="c1"),
    ChatMessage("hey", role="critic"),
    FunctionMessage("r", name="f"),
    HumanMessageChunk("chunk"),
    RemoveMessage(id="h-1"),
    Shouting("quiet", id="s-1"),
    {"nested": [HumanMessage("in a dict"), (AIMessage("in a tuple"),)]},
]


@pytest.mark.parametrize("value", SHAPES, ids=lambda v: type(v).__name__)
def test_fast_hook_builds_what_the_stock_hook_builds(value: Any) -> None:
    stock, fast = both([value, value])
    assert same(stock, fast)


def test_same_sees_what_equality_does_not() -> None:
    """The comparison above can fail: a model built without validation has
    other fields set, though ``==`` calls it equal."""
    built = HumanMessage("x", id="1")
    constructed = HumanMessage.model_construct(content="x", id="1", type="human")
    assert built == constructed
    assert not same(built, constructed)


def test_messages_take_the_fast_path_and_the_rest_the_stock_one() -> None:
    serde = JsonPlusSerializer()
    calls: list[int] = []
    inner = serde._unpack_ext_hook

    def counting(code: int, data: bytes) -> Any:
        calls.append(code)
        return inner(code, data)

    value = [
        HumanMessage("a"),
        AIMessage("b"),
        ToolMessage("c", tool_call_id="t"),
        RemoveMessage(id="x"),
        Shouting("d"),
        uuid.UUID(int=1),
    ]
    _, data = serde.dumps_typed(value)
    out = ormsgpack.unpackb(data, ext_hook=M.fast_hook(counting), option=OPT)
    stock = ormsgpack.unpackb(data, ext_hook=inner, option=OPT)
    assert same(out, stock)
    # RemoveMessage's and Shouting's __init__ do more than pass arguments on.
    assert calls.count(EXT_PYDANTIC_V2) == 2
    assert len(calls) == 3  # and the UUID


def test_a_record_that_does_not_validate_decodes_as_the_stock_hook_decodes_it() -> None:
    """The stock hook falls back to ``model_construct``; so does the fast one."""
    serde = JsonPlusSerializer()
    kwargs = {"content": 12, "type": "human", "id": None, "name": None}
    record = ormsgpack.packb(["langchain_core.messages.human", "HumanMessage", kwargs, "x"])
    data = ormsgpack.packb([ormsgpack.Ext(EXT_PYDANTIC_V2, record)])
    stock = ormsgpack.unpackb(data, ext_hook=serde._unpack_ext_hook, option=OPT)
    fast = ormsgpack.unpackb(data, ext_hook=M.fast_hook(serde._unpack_ext_hook), option=OPT)
    assert same(stock, fast)
    assert stock[0].content == 12


def test_a_record_with_a_field_named_self_decodes_as_the_stock_hook_decodes_it() -> None:
    """``cls(self=..., **kwargs)`` fails in the stock hook, which falls back to
    ``model_construct``; the fast hook hands such a record to it."""
    serde = JsonPlusSerializer()
    kwargs = {"content": "x", "type": "human", "self": 1}
    record = ormsgpack.packb(["langchain_core.messages.human", "HumanMessage", kwargs, "x"])
    data = ormsgpack.packb([ormsgpack.Ext(EXT_PYDANTIC_V2, record)])
    stock = ormsgpack.unpackb(data, ext_hook=serde._unpack_ext_hook, option=OPT)
    fast = ormsgpack.unpackb(data, ext_hook=M.fast_hook(serde._unpack_ext_hook), option=OPT)
    assert same(stock, fast)


def test_a_class_outside_the_allowlist_goes_to_the_stock_hook() -> None:
    """Strict msgpack: a class not in SAFE_MSGPACK_TYPES is blocked by the
    stock hook (its kwargs come back); the fast hook does not build it."""
    strict = JsonPlusSerializer(allowed_msgpack_modules=None)
    stock, fast = both([Shouting("no")], strict)
    assert same(stock, fast)
    assert isinstance(fast[0], dict)


def _counting(serde: JsonPlusSerializer) -> list[int]:
    """Replace ``serde``'s stock hook by one that counts its calls (codes)."""
    calls: list[int] = []
    inner = serde._unpack_ext_hook

    def counting(code: int, data: bytes) -> Any:
        calls.append(code)
        return inner(code, data)

    serde._unpack_ext_hook = counting
    return calls


def test_the_loader_uses_the_fast_hook() -> None:
    serde = C.CompressingSerializer()
    typed = serde.dumps_typed([HumanMessage("x" * 5000, id="1"), AIMessage("y")])
    ref = serde.loads_typed(typed)  # the stock hook's objects
    stock_calls = _counting(serde.serde)  # type: ignore[arg-type]
    loads = C.loader(serde, True)
    assert same(loads(typed), ref)
    assert stock_calls == []  # messages: built without the stock hook
    assert C.loader(serde, True) is loads  # remembered for this serializer


def test_a_users_own_ext_hook_decides_alone() -> None:
    """A hook passed as ``__unpack_ext_hook__`` (a stricter policy, say) is
    called for every ext value, messages included: no fast path around it."""
    refused: list[int] = []

    def refuse_all(code: int, data: bytes) -> Any:
        refused.append(code)
        return None

    saver_serde = C.CompressingSerializer(JsonPlusSerializer(__unpack_ext_hook__=refuse_all))
    typed = saver_serde.dumps_typed([HumanMessage("hi" * 2000)])
    assert C.loader(saver_serde, True)(typed) == [None] == saver_serde.loads_typed(typed)
    assert refused == [EXT_PYDANTIC_V2, EXT_PYDANTIC_V2]


class Chat(BaseModel):
    """A user's model holding messages: not a message, so the stock hook."""

    title: str
    messages: list[AnyMessage]


def test_another_class_is_decoded_once_by_the_stock_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """A record of a class that is not a fast message reaches the stock hook
    undecoded (its module and name are read from the bytes first): the fast
    hook does not unpack it (and build the messages inside) before handing
    it over, which built them twice."""
    unpacked: list[int] = []

    class Counting:
        OPT_NON_STR_KEYS = OPT

        @staticmethod
        def unpackb(data: bytes, **kwargs: Any) -> Any:
            unpacked.append(len(data))
            return ormsgpack.unpackb(data, **kwargs)

    monkeypatch.setattr(M, "ormsgpack", Counting)
    serde = JsonPlusSerializer()
    value = Chat(title="t", messages=[HumanMessage("a"), AIMessage("b")])
    _, data = serde.dumps_typed(value)
    stock = ormsgpack.unpackb(data, ext_hook=serde._unpack_ext_hook, option=OPT)
    fast = ormsgpack.unpackb(data, ext_hook=M.fast_hook(serde._unpack_ext_hook), option=OPT)
    assert same(fast, stock) and isinstance(fast, Chat)
    assert unpacked == []
    _, data = serde.dumps_typed([HumanMessage("a")])
    ormsgpack.unpackb(data, ext_hook=M.fast_hook(serde._unpack_ext_hook), option=OPT)
    assert len(unpacked) == 1  # a message's record: unpacked by the fast hook


def test_head_reads_the_module_and_name_or_refuses() -> None:
    record = ["langchain_core.messages.human", "HumanMessage", {"content": "x"}, "m"]
    assert M._head(ormsgpack.packb(record)) == tuple(record[:2])
    long_name = ["m" * 300, "N" * 70000, {}]  # str16 and str32 lengths
    with pytest.raises(ValueError):
        M._head(ormsgpack.packb(long_name))
    assert M._head(ormsgpack.packb(["m" * 300, "N", {}])) == ("m" * 300, "N")
    for bad in ([1, 2, 3], ["a", "b"], {"a": 1}, "abc"):
        with pytest.raises((ValueError, IndexError)):
            M._head(ormsgpack.packb(bad))
    with pytest.raises((ValueError, IndexError)):
        M._head(ormsgpack.packb(record)[:20])  # truncated


def test_fast_hooks_are_not_kept_after_their_serializer() -> None:
    """Nothing global holds a fast hook or the stock hook it wraps: with
    ``LANGGRAPH_STRICT_MSGPACK`` every ``compile()`` makes a serializer
    (``with_allowlist``), and each one's hooks were kept for good."""
    import gc
    import weakref

    serde = C.CompressingSerializer()
    C.loader(serde, True)(serde.dumps_typed([HumanMessage("x")]))
    gone = weakref.ref(serde.serde._unpack_ext_hook)  # type: ignore[attr-defined]
    del serde
    gc.collect()
    assert gone() is None


text = st.text(max_size=20)
jsonish = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
content = text | st.lists(text | st.fixed_dictionaries({"type": st.just("text"), "text": text}))
common = {
    "id": st.none() | text,
    "name": st.none() | text,
    "additional_kwargs": st.dictionaries(text, jsonish, max_size=3),
    "response_metadata": st.dictionaries(text, jsonish, max_size=3),
}
messages = st.one_of(
    st.builds(HumanMessage, content=content, **common),
    st.builds(AIMessage, content=content, **common),
    st.builds(SystemMessage, content=content, **common),
    st.builds(ToolMessage, content=content, tool_call_id=text, **common),
    st.builds(ChatMessage, content=content, role=text, **common),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(messages, max_size=6))
def test_fast_hook_property(value: list[Any]) -> None:
    stock, fast = both(value)
    assert same(stock, fast)


def test_a_hook_that_cannot_be_weakly_referenced_still_works() -> None:
    stock = JsonPlusSerializer()._unpack_ext_hook

    class Slotted:
        __slots__ = ()

        def __call__(self, code: int, data: bytes) -> Any:
            return stock(code, data)

    hook = M.fast_hook(Slotted())
    _, data = JsonPlusSerializer().dumps_typed([HumanMessage("x")])
    want = ormsgpack.unpackb(data, ext_hook=stock, option=OPT)
    assert same(ormsgpack.unpackb(data, ext_hook=hook, option=OPT), want)
