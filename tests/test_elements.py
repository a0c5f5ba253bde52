"""saver/elements.py: a list's msgpack made element by element is the
serializer's own, whatever happened to the elements since."""

from __future__ import annotations

import copy
import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvsaver import KVSaver
from kvsaver import elements as E
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer, _msgpack_enc
from pydantic import BaseModel, computed_field, field_serializer


def _msgs(n: int, start: int = 0) -> list[Any]:
    out: list[Any] = []
    for i in range(start, start + n):
        if i % 3 == 0:
            out.append(HumanMessage(content=f"question {i} " * 5, id=f"h{i}"))
        elif i % 3 == 1:
            out.append(
                AIMessage(
                    content=f"answer {i}",
                    id=f"a{i}",
                    tool_calls=[{"name": "search", "args": {"q": i}, "id": f"c{i}"}],
                    response_metadata={"tokens": i, "nested": {"k": [i, 1.5]}},
                )
            )
        else:
            out.append(ToolMessage(content=f"result {i}", tool_call_id=f"c{i - 1}", id=f"t{i}"))
    return out


def test_the_probe_finds_the_serializer_as_assumed() -> None:
    # Everything else in this file would pass with the module turned off.
    assert E.ENABLED
    assert KVSaver(":memory:").serde is not None
    from kvsaver import delta as D

    assert D.codec(KVSaver(":memory:").serde).elements is not None


@pytest.fixture
def calls(monkeypatch: Any) -> list[Any]:
    """What the module serializes with the serializer, call by call."""
    made: list[Any] = []

    def counting(value: Any) -> bytes:
        made.append(value)
        return _msgpack_enc(value)

    monkeypatch.setattr(E, "_enc", counting)
    return made


def test_an_extended_list_serializes_only_its_new_elements(calls: list[Any]) -> None:
    el = E.Elements()
    history = _msgs(10)
    assert el.dumps("k", history) == _msgpack_enc(history)
    assert calls == [history]  # a list seen first: one call, as the serializer makes it
    calls.clear()
    history = [*history, *_msgs(2, 10)]
    assert el.dumps("k", history) == _msgpack_enc(history)
    assert calls == history[10:]
    calls.clear()
    # replaced by id (add_messages: a new object at the same place): not an
    # extension, and the elements' bytes are not kept one by one after a list
    # made in one call: made in one call again, then extended as before
    history = [*history[:4], AIMessage(content="edited", id="a4"), *history[5:]]
    assert el.dumps("k", history) == _msgpack_enc(history)
    assert calls == [history]
    calls.clear()
    history = [*history, *_msgs(1, 12)]
    assert el.dumps("k", history) == _msgpack_enc(history)
    assert calls == history[-1:]


_EDITS = [
    lambda m: setattr(m, "content", m.content + "!"),
    lambda m: m.additional_kwargs.__setitem__("x", 1),
    lambda m: m.response_metadata.__setitem__("tokens", True),  # 1 -> True: equal, not the same
    lambda m: m.response_metadata.__setitem__("tokens", 1.0),
    lambda m: m.response_metadata.setdefault("nested", {"k": []})["k"].append(None),
    lambda m: setattr(m, "id", None),
    lambda m: setattr(m, "name", "someone"),
    lambda m: m.__pydantic_extra__.__setitem__("extra_field", [1]),  # an extra (extra="allow")
    lambda m: m.response_metadata.__setitem__("when", datetime.datetime(2026, 1, 1)),
    lambda m: m.additional_kwargs.__setitem__("model", HumanMessage(content="nested")),
]


@pytest.mark.parametrize("edit", range(len(_EDITS)))
def test_a_message_changed_in_place_is_serialized_again(edit: int) -> None:
    el = E.Elements()
    history = _msgs(6)
    el.dumps("k", history)
    for m in history[:5]:
        _EDITS[edit](m)
    history.append(AIMessage(content="next"))
    assert el.dumps("k", history) == _msgpack_enc(history)
    assert el.dumps("k", history) == _msgpack_enc(history)
    _EDITS[edit](history[1])
    assert el.dumps("k", history) == _msgpack_enc(history)


def test_a_message_that_is_not_plain_data_is_serialized_each_time(calls: list[Any]) -> None:
    el = E.Elements()
    odd = AIMessage(content="x", response_metadata={"at": datetime.datetime(2026, 1, 1)})
    history = [*_msgs(3), odd, *_msgs(3, 3)]
    for _ in range(3):
        calls.clear()
        assert el.dumps("k", history) == _msgpack_enc(history)
    assert calls == [odd]
    history = [*history, *_msgs(1, 6)]
    calls.clear()
    assert el.dumps("k", history) == _msgpack_enc(history)
    assert calls == [odd, history[-1]]


def test_lists_it_does_not_make_are_left_to_the_serializer() -> None:
    class Computed(BaseModel):
        a: int

        @computed_field  # type: ignore[prop-decorator]
        @property
        def twice(self) -> int:
            return 2 * self.a

    class Serialized(BaseModel):
        a: int

        @field_serializer("a")
        def _a(self, a: int) -> int:
            return a + 1

    el = E.Elements()
    assert el.dumps("k", []) is None
    assert el.dumps("k", [Computed(a=1)]) is None
    assert el.dumps("k", [Serialized(a=1)]) is None
    assert el.dumps("k", [*_msgs(2), {"a": 1}]) is None
    assert el.dumps("k", [*_msgs(2), "text"]) is None
    # a value the serializer cannot encode: the serializer's own error, later
    bad = AIMessage(content="x")
    bad.additional_kwargs["f"] = object()
    assert el.dumps("k", [*_msgs(2), bad]) is None
    assert "k" not in el.lists


def test_the_cache_is_bounded() -> None:
    el = E.Elements(max_bytes=64 << 10)
    for t in range(200):
        el.dumps(("t", t), _msgs(8))
        assert el.size <= el.max_bytes
    assert 0 < len(el.lists) < 200
    assert el.size == sum(h.size for h in el.lists.values())
    big = _msgs(400)
    el.dumps("big", big)  # more than a quarter of the bound: made, not kept
    assert "big" not in el.lists


def test_a_list_too_large_to_keep_is_left_to_the_serializer(
    calls: list[Any], monkeypatch: Any
) -> None:
    """Made once, found too large to keep, then not made again (its
    fingerprints would cost every put for nothing) until it shrinks to half."""
    prints: list[Any] = []
    real = E._fingerprints
    monkeypatch.setattr(E, "_fingerprints", lambda v: prints.append(v) or real(v))
    sizes = E.Elements(max_bytes=1 << 30)
    for n in (200, 400):
        sizes.dumps(n, _msgs(n))
    # A quarter of the bound between what 200 and 400 messages hold.
    el = E.Elements(max_bytes=2 * (sizes.lists[200].size + sizes.lists[400].size))
    big = _msgs(400)
    assert el.dumps("big", big) == _msgpack_enc(big)
    assert "big" not in el.lists and el.large == {"big": [400, 0]}
    calls.clear()
    prints.clear()
    for n in (401, 420, 201):
        assert el.dumps("big", _msgs(n)) is None  # the caller serializes it whole
    assert calls == [] and prints == []
    small = _msgs(200)  # half: tried again, and kept
    assert el.dumps("big", small) == _msgpack_enc(small)
    assert "big" in el.lists and "big" not in el.large
    assert el.dumps("small", _msgs(5)) is not None and "small" in el.lists
    # A list whose length stays while its elements shrink: tried again after
    # E._LARGE_RETRY puts left to the serializer.
    el.dumps("wide", big)
    assert "wide" in el.large
    calls.clear()
    for _ in range(E._LARGE_RETRY):
        assert el.dumps("wide", big) is None
    assert calls == []
    assert el.dumps("wide", big) == _msgpack_enc(big)  # made again (and still too large)
    assert calls == [big] and el.large["wide"] == [400, 0]


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["append", "edit", "replace", "remove", "swap", "dup", "copy", "trim"]),
        st.integers(0, 1_000),
        st.integers(0, len(_EDITS) - 1),
    ),
    max_size=25,
)


@settings(deadline=None)
@given(_OPS)
def test_whatever_happens_to_the_list_the_bytes_are_the_serializers(ops: list[Any]) -> None:
    el = E.Elements()
    history = _msgs(4)
    made = 4
    for op, at, edit in ops:
        i = at % len(history) if history else 0
        if op == "append":
            history = [*history, *_msgs(1 + at % 2, made)]
            made += 2
        elif op == "edit" and history:
            _EDITS[edit](history[i])
        elif op == "replace" and history:
            history = [*history[:i], copy.deepcopy(history[i]), *history[i + 1 :]]
        elif op == "remove" and history:
            history = history[:i] + history[i + 1 :]
        elif op == "swap" and len(history) > 1:
            history = [*history]
            history[0], history[i] = history[i], history[0]
        elif op == "dup" and history:
            history = [*history, history[i]]  # the same object twice
        elif op == "copy":
            history = copy.deepcopy(history)
        elif op == "trim":
            history = history[i:]
        if not history:
            assert el.dumps("k", history) is None
            continue
        assert el.dumps("k", history) == _msgpack_enc(history), (op, i, edit)


def _graph(saver: Any, edit: bool) -> Any:
    from langgraph.graph import START, MessagesState, StateGraph

    def step(state: MessagesState) -> dict[str, Any]:
        n = len(state["messages"])
        if edit and n > 2:
            # changed in place, and a message added in the same step
            state["messages"][0].content += f" (seen at {n})"
            state["messages"][1].additional_kwargs["seen"] = n
        return {"messages": [AIMessage(content=f"reply {n}", id=f"r{n}")]}

    g = StateGraph(MessagesState)
    g.add_node("step", step)
    g.add_edge(START, "step")
    return g.compile(checkpointer=saver)


@pytest.mark.parametrize("edit", [False, True])
def test_a_graph_that_edits_messages_in_place_stores_what_inmemorysaver_stores(
    edit: bool,
) -> None:
    results = []
    for saver in (InMemorySaver(), KVSaver(":memory:")):
        graph = _graph(saver, edit)
        cfg: Any = {"configurable": {"thread_id": "t"}}
        for i in range(6):
            # "sync": under "async" the put of a step runs beside the next
            # step, and may see its in-place change, with any saver.
            msg = HumanMessage(content=f"hi {i}", id=f"u{i}")
            graph.invoke({"messages": [msg]}, cfg, durability="sync")
        history = [
            [m.model_dump() for m in s.values["messages"]] for s in graph.get_state_history(cfg)
        ]
        results.append(history)
    assert results[0] == results[1]
    if edit:
        assert "(seen at" in results[1][0][0]["content"]


def test_a_serializer_subclass_with_its_own_dumps_gets_no_element_cache() -> None:
    from kvsaver import delta as D

    class Own(JsonPlusSerializer):
        def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
            return super().dumps_typed(obj)

    assert D.codec(Own()).elements is None
    assert D.codec(JsonPlusSerializer()).elements is not None


def test_remove_message_lists_still_round_trip() -> None:
    el = E.Elements()
    history = [*_msgs(3), RemoveMessage(id="h0")]
    assert el.dumps("k", history) == _msgpack_enc(history)


class _Tagged(HumanMessage):
    """A user's subclass with the same fields: only its name differs."""


def test_a_class_assigned_in_place_is_another_element() -> None:
    for reorder in (False, True):  # the extension's path, then the element-wise one
        el = E.Elements()
        history = _msgs(4)
        el.dumps("k", history)
        history[0].__class__ = _Tagged
        if reorder:
            history = history[::-1]
        assert el.dumps("k", history) == _msgpack_enc(history)
        assert b"_Tagged" in el.dumps("k", history)


def test_user_classes_that_serialize_by_their_own_code_are_not_made() -> None:
    from typing import Annotated

    from pydantic import Field, PlainSerializer, PrivateAttr

    mode = {"upper": False, "hide": False}

    class Redacting(AIMessage):
        _show: bool = PrivateAttr(default=True)

        def model_dump(self, **kw: Any) -> dict[str, Any]:
            d = super().model_dump(**kw)
            if not self._show:
                d["content"] = "[redacted]"
            return d

    def shout(v: str) -> str:
        return v.upper() if mode["upper"] else v

    class Shouty(AIMessage):
        mood: Annotated[str, PlainSerializer(shout)] = "calm"

    classes: list[Any] = [Redacting, Shouty]
    try:

        class Hiding(AIMessage):
            note: str = Field(default="n", exclude_if=lambda v: mode["hide"])  # type: ignore[call-overload]

        classes.append(Hiding)
    except TypeError:  # a pydantic without exclude_if
        pass
    for cls in classes:
        assert not E._plain_model(cls), cls
        assert E.Elements().dumps("k", [cls(content="x", id="1")]) is None
    from langchain_core import messages as M

    for name in M.__all__:
        c = getattr(M, name)
        if isinstance(c, type) and issubclass(c, M.BaseMessage) and c is not M.BaseMessage:
            assert E._plain_model(c), name  # LangChain's own messages are made


def test_a_message_changed_while_it_is_serialized_is_not_kept(monkeypatch: Any) -> None:
    # A put of durability "async" runs beside the next step, which may edit a
    # message between its fingerprint and its serialization.
    m = HumanMessage(content="original", id="1")

    def editing(value: Any) -> bytes:
        if value is m or (type(value) is list and any(x is m for x in value)):
            m.content = "edited meanwhile"
        return _msgpack_enc(value)

    el = E.Elements()
    monkeypatch.setattr(E, "_enc", editing)
    el.dumps("k", [m])
    monkeypatch.setattr(E, "_enc", _msgpack_enc)
    m.content = "original"  # back to the state fingerprinted first
    assert el.dumps("k", [m]) == _msgpack_enc([m])
    el = E.Elements()  # the extension's path: the message is a new element
    el.dumps("k", _msgs(2))
    base = el.lists["k"].objs
    monkeypatch.setattr(E, "_enc", editing)
    el.dumps("k", [*base, m])
    monkeypatch.setattr(E, "_enc", _msgpack_enc)
    m.content = "original"
    assert el.dumps("k", [*base, m]) == _msgpack_enc([*base, m])


def test_a_list_changed_in_place_after_it_was_made() -> None:
    el = E.Elements()
    history = _msgs(5)
    el.dumps("k", history)
    history.append(_msgs(1, 5)[0])  # the same list object, grown
    history[1] = AIMessage(content="swapped")
    del history[0]
    assert el.dumps("k", history) == _msgpack_enc(history)
    assert len(el.lists["k"].objs) == len(history)


def test_without_the_serializers_options_the_module_is_off(monkeypatch: Any) -> None:
    assert E._probe()
    monkeypatch.setattr(E, "_option", None)
    assert not E._probe()
    monkeypatch.setattr(E, "_option", 0)
    monkeypatch.setattr(E, "_enc", None)
    assert not E._probe()
