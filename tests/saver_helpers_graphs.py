"""Deterministic LangGraph graphs for the saver tests, and a normal form of
their state snapshots so a run on KVSaver can be compared with the same run
on SqliteSaver (checkpoint ids, task ids and timestamps differ between runs;
everything else must not).

Importable from a subprocess too (test_saver_restart.py): it depends only on
langgraph and the standard library.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Annotated, Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, Send, StateSnapshot, interrupt
from typing_extensions import TypedDict

# -- graphs -------------------------------------------------------------------


class ChatState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    turns: int


def _bot(state: ChatState) -> dict[str, Any]:
    msgs = state["messages"]
    n = len(msgs)
    text = f"echo {n}: {msgs[-1].content}" if msgs else "hello"
    return {"messages": [AIMessage(content=text, id=f"ai-{n}")], "turns": state.get("turns", 0) + 1}


def chain(builder: Any, *nodes: str) -> None:
    """Edges START -> nodes[0] -> ... -> nodes[-1] -> END."""
    for a, b in zip((START, *nodes), (*nodes, END)):
        builder.add_edge(a, b)


def chat_graph(checkpointer: Any) -> Any:
    """A chat loop: each invoke adds a human message and one bot reply."""
    builder = StateGraph(ChatState)
    builder.add_node("bot", _bot)
    chain(builder, "bot")
    return builder.compile(checkpointer=checkpointer)


def human(i: int, text: str | None = None) -> dict[str, Any]:
    return {"messages": [HumanMessage(content=text or f"turn {i}", id=f"h-{i}")]}


class ApprovalState(TypedDict):
    request: str
    answer: str
    log: Annotated[list[str], operator.add]


def _ask(state: ApprovalState) -> dict[str, Any]:
    answer = interrupt({"question": f"approve {state['request']}?"})
    return {"answer": answer, "log": [f"asked:{answer}"]}


def _act(state: ApprovalState) -> dict[str, Any]:
    return {"log": [f"acted:{state['answer']}"]}


def approval_graph(checkpointer: Any) -> Any:
    builder = StateGraph(ApprovalState)
    builder.add_node("prepare", lambda s: {"log": ["prepared"]})
    builder.add_node("ask", _ask)
    builder.add_node("act", _act)
    chain(builder, "prepare", "ask", "act")
    return builder.compile(checkpointer=checkpointer)


class SubState(TypedDict):
    items: Annotated[list[str], operator.add]


def _sub_review(state: SubState) -> dict[str, Any]:
    ok = interrupt("review the items")
    return {"items": [f"reviewed:{ok}"]}


def nested_graph(checkpointer: Any) -> Any:
    """A parent graph whose middle node is a compiled subgraph that pauses."""
    sub = StateGraph(SubState)
    sub.add_node("sub_a", lambda s: {"items": ["sub_a"]})
    sub.add_node("sub_review", _sub_review)
    sub.add_node("sub_b", lambda s: {"items": ["sub_b"]})
    chain(sub, "sub_a", "sub_review", "sub_b")
    parent = StateGraph(SubState)
    parent.add_node("first", lambda s: {"items": ["first"]})
    parent.add_node("child", sub.compile())
    parent.add_node("last", lambda s: {"items": ["last"]})
    chain(parent, "first", "child", "last")
    return parent.compile(checkpointer=checkpointer)


class MapState(TypedDict):
    topics: list[str]
    results: Annotated[list[str], operator.add]
    summary: str


class WorkState(TypedDict):
    topic: str


def _fan_out(state: MapState) -> list[Send]:
    return [Send("work", {"topic": t}) for t in state["topics"]]


def mapreduce_graph(checkpointer: Any) -> Any:
    builder = StateGraph(MapState)
    builder.add_node("plan", lambda s: {"results": ["plan"]})
    builder.add_node("work", lambda s: {"results": [s["topic"].upper()]})
    builder.add_node("reduce", lambda s: {"summary": "+".join(s["results"])})
    builder.add_edge(START, "plan")
    builder.add_conditional_edges("plan", _fan_out, ["work"])
    builder.add_edge("work", "reduce")
    builder.add_edge("reduce", END)
    return builder.compile(checkpointer=checkpointer)


class CountState(TypedDict):
    value: int
    trail: Annotated[list[str], operator.add]


def counter_graph(checkpointer: Any) -> Any:
    """Three steps that each add to a value; for time travel and forks."""
    builder = StateGraph(CountState)
    builder.add_node("double", lambda s: {"value": s["value"] * 2, "trail": ["double"]})
    builder.add_node("inc", lambda s: {"value": s["value"] + 1, "trail": ["inc"]})
    builder.add_node("square", lambda s: {"value": s["value"] ** 2, "trail": ["square"]})
    chain(builder, "double", "inc", "square")
    return builder.compile(checkpointer=checkpointer)


class LogState(TypedDict):
    log: Annotated[list[str], operator.add]


def flaky_graph(
    checkpointer: Any,
    calls: list[str],
    fail: list[bool],
    before_failing: Callable[[], None] | None = None,
) -> Any:
    """Two parallel nodes, one of which fails while ``fail[0]``; then a join.
    ``before_failing`` runs in the flaky node before it fails (and before it
    records its call), e.g. to wait until the good node's write is saved."""

    def good(state: LogState) -> dict[str, Any]:
        calls.append("good")
        return {"log": ["good"]}

    def flaky(state: LogState) -> dict[str, Any]:
        if fail[0] and before_failing is not None:
            before_failing()
        calls.append("flaky")
        if fail[0]:
            raise RuntimeError("flaky failed")
        return {"log": ["flaky"]}

    builder = StateGraph(LogState)
    builder.add_node("good", good)
    builder.add_node("flaky", flaky)
    builder.add_node("join", lambda s: {"log": ["join"]})
    builder.add_edge(START, "good")
    builder.add_edge(START, "flaky")
    builder.add_edge(["good", "flaky"], "join")
    builder.add_edge("join", END)
    return builder.compile(checkpointer=checkpointer)


class NoteState(TypedDict):
    notes: Annotated[list[str], operator.add]
    summary: str


def memory_subgraph_graph(checkpointer: Any) -> Any:
    """A subgraph compiled with checkpointer=True keeps its own state across
    the parent's runs, in a stable namespace ("call")."""
    sub = StateGraph(LogState)
    sub.add_node("remember", lambda s: {"log": [f"n{len(s['log'])}"]})
    chain(sub, "remember")
    subgraph = sub.compile(checkpointer=True)

    def call(state: NoteState) -> dict[str, Any]:
        return {"summary": ",".join(subgraph.invoke({"log": []})["log"])}

    builder = StateGraph(NoteState)
    builder.add_node("agent", lambda s: {"notes": ["p"]})
    builder.add_node("call", call)
    chain(builder, "agent", "call")
    return builder.compile(checkpointer=checkpointer)


__all__ = [
    "Command",
    "approval_graph",
    "chat_graph",
    "counter_graph",
    "flaky_graph",
    "human",
    "mapreduce_graph",
    "memory_subgraph_graph",
    "nested_graph",
]

# -- normal form of snapshots ----------------------------------------------------


def _ns_shape(ns: str | None) -> str | None:
    """'child:<task id>|x:<task id>' -> 'child|x' (task ids differ per run)."""
    if ns is None:
        return None
    return "|".join(part.split(":")[0] for part in ns.split("|")) if ns else ""


def _message_form(value: Any) -> Any:
    if isinstance(value, list):
        return [_message_form(v) for v in value]
    if isinstance(value, dict):
        return {k: _message_form(v) for k, v in value.items()}
    if hasattr(value, "content") and hasattr(value, "type"):
        return (value.type, value.id, value.content)
    return value


def snap(s: StateSnapshot) -> dict[str, Any]:
    """Everything about a snapshot that must not depend on the saver."""
    meta = s.metadata or {}
    return {
        "values": _message_form(s.values),
        "next": s.next,
        "step": meta.get("step"),
        "source": meta.get("source"),
        "parents": sorted(_ns_shape(k) for k in (meta.get("parents") or {})),
        "ns": _ns_shape(s.config["configurable"].get("checkpoint_ns")),
        "has_parent": s.parent_config is not None,
        "tasks": [
            {
                "name": t.name,
                "path": t.path,
                "error": repr(t.error) if t.error else None,
                "interrupts": [i.value for i in t.interrupts],
                "result": _message_form(t.result),
                "state": snap(t.state)
                if isinstance(t.state, StateSnapshot)
                else _ns_shape((t.state or {}).get("configurable", {}).get("checkpoint_ns")),
            }
            for t in s.tasks
        ],
        "interrupts": [i.value for i in s.interrupts],
    }


def history(graph: Any, config: dict[str, Any]) -> list[dict[str, Any]]:
    """The state history, newest first, with each entry's parent given as a
    position in the same list (the shape of the tree, without the ids)."""
    return _tree(list(graph.get_state_history(config)))


async def ahistory(graph: Any, config: dict[str, Any]) -> list[dict[str, Any]]:
    return _tree([s async for s in graph.aget_state_history(config)])


def _tree(items: list[Any]) -> list[dict[str, Any]]:
    pos = {s.config["configurable"]["checkpoint_id"]: i for i, s in enumerate(items)}
    out = []
    for s in items:
        entry = snap(s)
        parent = s.parent_config["configurable"]["checkpoint_id"] if s.parent_config else None
        entry["parent_pos"] = pos.get(parent) if parent else None
        out.append(entry)
    return out
