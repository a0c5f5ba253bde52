"""The memory graph of the KVStore graph and process tests: a real LangGraph
StateGraph whose nodes write and read long-term memories through the store
LangGraph injects (``Runtime.store`` in one node, the ``store`` keyword in
the other)."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.store.base import BaseStore


@dataclass
class Context:
    user: str


class State(TypedDict, total=False):
    text: str
    recalled: list[str]
    turns: Annotated[list[str], operator.add]


def remember(state: State, runtime: Runtime[Context]) -> State:
    """Write this turn's text as a memory of the user (keyed by its turn)."""
    assert runtime.store is not None
    n = len(state.get("turns", []))
    runtime.store.put(
        ("memories", runtime.context.user), f"turn-{n}", {"text": state["text"], "n": n}
    )
    return {"turns": [state["text"]]}


def recall(state: State, *, store: BaseStore, runtime: Runtime[Context]) -> State:
    """Every memory of the user, from every thread, in the order written."""
    found = store.search(("memories", runtime.context.user), limit=1000)
    return {"recalled": [i.value["text"] for i in found]}


def build(saver: Any, store: BaseStore) -> Any:
    builder = StateGraph(State, context_schema=Context)
    builder.add_node("remember", remember)
    builder.add_node("recall", recall)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", "recall")
    builder.add_edge("recall", END)
    return builder.compile(checkpointer=saver, store=store)
