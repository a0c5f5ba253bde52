"""Helpers for the migration tests (test_migrate*.py): real graphs that leave
every kind of checkpoint behind (long chats, pending interrupts, a subgraph,
Send fan-out, an update_state fork), the continuation of each, and a fast
synthetic SqliteSaver database for the larger runs."""

from __future__ import annotations

import operator
import os
import sqlite3
import subprocess
import sys
from collections.abc import Mapping
from typing import Annotated, Any, TypedDict

from kvsaver import schema as S
from kvsaver.kv import Store
from kvsaver.kv.keys import prefix_range
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, Interrupt, Send, interrupt
from saver_helpers_graphs import chain

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # tools/ is not an installed package: import it from the checkout
    sys.path.insert(0, ROOT)

# -- the graphs -------------------------------------------------------------------


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    facts: dict[str, str]


def _remember(state: Chat) -> dict[str, Any]:
    text = str(state["messages"][-1].content)
    facts = dict(state.get("facts") or {})
    for word in text.split():
        if word.startswith("#"):
            facts[word[1:]] = str(len(state["messages"]))
    return {"facts": facts}


def _reply(state: Chat) -> dict[str, Any]:
    n = len(state["messages"])
    facts = state.get("facts") or {}
    text = f"reply {n}: I know {sorted(facts)}. " + "lorem ipsum dolor sit amet " * 8
    return {"messages": [AIMessage(text, id=f"ai-{n}")]}


def chat_graph(saver: BaseCheckpointSaver) -> Any:
    g = StateGraph(Chat)
    g.add_node("remember", _remember)
    g.add_node("reply", _reply)
    chain(g, "remember", "reply")
    return g.compile(checkpointer=saver)


class Approval(TypedDict):
    request: str
    decision: str


def _decide(state: Approval) -> dict[str, Any]:
    answer = interrupt({"question": f"approve {state['request']}?"})
    return {"decision": f"{state['request']}: {answer}"}


def approval_graph(saver: BaseCheckpointSaver) -> Any:
    g = StateGraph(Approval)
    g.add_node("decide", _decide)
    chain(g, "decide")
    return g.compile(checkpointer=saver)


class Outer(TypedDict):
    log: Annotated[list[str], operator.add]
    name: str


def _ask_name(state: Outer) -> dict[str, Any]:
    name = interrupt("what is your name?")
    return {"name": name, "log": [f"child asked, got {name}"]}


def _greet(state: Outer) -> dict[str, Any]:
    return {"log": [f"hello {state['name']}"]}


def subgraph_graph(saver: BaseCheckpointSaver) -> Any:
    child = StateGraph(Outer)
    child.add_node("ask", _ask_name)
    child.add_node("greet", _greet)
    chain(child, "ask", "greet")
    g = StateGraph(Outer)
    g.add_node("prep", lambda s: {"log": ["prep"]})
    g.add_node("child", child.compile())
    g.add_node("done", lambda s: {"log": ["done"]})
    chain(g, "prep", "child", "done")
    return g.compile(checkpointer=saver)


class Fan(TypedDict):
    items: list[int]
    results: Annotated[list[str], operator.add]
    total: str


def _work(arg: dict[str, Any]) -> dict[str, Any]:
    item = arg["item"]
    if item % 4 == 2:  # one branch waits for a person; its siblings' writes stay pending
        ok = interrupt(f"check item {item}?")
        return {"results": [f"item {item} checked: {ok}"]}
    return {"results": [f"item {item} squared: {item * item}"]}


def fanout_graph(saver: BaseCheckpointSaver) -> Any:
    g = StateGraph(Fan)
    g.add_node("split", lambda s: {"results": ["split"]})
    g.add_node("work", _work)
    g.add_node("join", lambda s: {"total": " | ".join(s["results"])})
    g.add_edge(START, "split")
    g.add_conditional_edges("split", lambda s: [Send("work", {"item": i}) for i in s["items"]])
    g.add_edge("work", "join")
    g.add_edge("join", END)
    return g.compile(checkpointer=saver)


def cfg(thread: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread}
    if checkpoint_id:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def human(text: str, i: int) -> HumanMessage:
    return HumanMessage(text, id=f"human-{i}")


CHAT_TURNS = 12


def populate(saver: BaseCheckpointSaver, *, chat_threads: int = 2) -> None:
    """Run every scenario on ``saver``, leaving interrupts pending and a fork."""
    chat = chat_graph(saver)
    for t in range(chat_threads):
        for i in range(CHAT_TURNS):
            words = " ".join(["some words about the day"] * 10)
            message = human(f"turn {i} #topic{i % 5} {words}", i)
            chat.invoke({"messages": [message]}, cfg(f"chat-{t}"))
    # A fork: update_state on an older checkpoint makes a branch in chat-0.
    history = list(chat.get_state_history(cfg("chat-0")))
    older = next(s for s in history if s.metadata and s.metadata.get("step") == 7)
    chat.update_state(older.config, {"messages": [human("a different turn #fork", 100)]})

    approval_graph(saver).invoke({"request": "refund 42"}, cfg("approval"))
    subgraph_graph(saver).invoke({"log": ["start"]}, cfg("sub"))
    fanout_graph(saver).invoke({"items": list(range(7)), "results": []}, cfg("fanout"))


def _plain(value: Any) -> Any:
    """Comparable form of graph output: Interrupt ids depend on checkpoint ids,
    which differ between two runs of the same continuation."""
    if isinstance(value, Interrupt):
        return ("Interrupt", _plain(value.value))
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _state(graph: Any, config: dict[str, Any]) -> dict[str, Any]:
    snap = graph.get_state(config)
    history = list(graph.get_state_history(config))
    return {
        "values": _plain(snap.values),
        "next": snap.next,
        "interrupts": _plain([i for t in snap.tasks for i in t.interrupts]),
        "history": [
            (_plain(s.values), s.next, s.metadata.get("step"), s.metadata.get("source"))
            for s in history
        ],
    }


def resume_all(saver: BaseCheckpointSaver) -> dict[str, Any]:
    """Continue every scenario left by ``populate``; everything observable."""
    out: dict[str, Any] = {}
    chat = chat_graph(saver)
    # The latest checkpoint of chat-0 is the fork: continue the branch.
    fork_input = {"messages": [human("after the fork", 200)]}
    out["chat-fork"] = _plain(chat.invoke(fork_input, cfg("chat-0")))
    # Time travel: replay from an old checkpoint of chat-1.
    old = next(s for s in chat.get_state_history(cfg("chat-1")) if s.metadata.get("step") == 4)
    out["chat-replay"] = _plain(chat.invoke(None, old.config))
    out["chat-next"] = _plain(chat.invoke({"messages": [human("one more", 300)]}, cfg("chat-1")))
    approval = approval_graph(saver)
    out["approval"] = _plain(approval.invoke(Command(resume="granted"), cfg("approval")))
    out["sub"] = _plain(subgraph_graph(saver).invoke(Command(resume="Ada"), cfg("sub")))
    fan = fanout_graph(saver)
    # Two branches wait; each interrupt is answered by its id (ids come from
    # the migrated checkpoint and task ids, so they match on both savers).
    pending = fan.get_state(cfg("fanout")).interrupts
    out["fanout-pending"] = sorted(str(i.value) for i in pending)
    answers = {i.id: f"ok for {i.value}" for i in pending}
    out["fanout"] = _plain(fan.invoke(Command(resume=answers), cfg("fanout")))
    out["states"] = {
        "chat-0": _state(chat, cfg("chat-0")),
        "chat-1": _state(chat, cfg("chat-1")),
        "approval": _state(approval_graph(saver), cfg("approval")),
        "sub": _state(subgraph_graph(saver), cfg("sub")),
        "fanout": _state(fan, cfg("fanout")),
    }
    return out


# -- sqlite sources ---------------------------------------------------------------


def sqlite_saver(path: str | os.PathLike[str]) -> SqliteSaver:
    return SqliteSaver(sqlite3.connect(os.fspath(path), check_same_thread=False))


def build_synthetic_sqlite(
    path: str | os.PathLike[str], *, threads: int, per_thread: int, chars: int = 300
) -> int:
    """A SqliteSaver database of chat-like checkpoints written through
    SqliteSaver.put/put_writes (much faster than running graphs): a message
    list that grows (last 20 kept), a counter, pending writes on every third
    checkpoint. Returns the number of checkpoints."""
    saver = sqlite_saver(path)
    saver.setup()
    saver.conn.execute("PRAGMA synchronous=OFF")
    body = ("lorem ipsum dolor sit amet " * (chars // 27 + 1))[:chars]
    for t in range(threads):
        thread = f"thread-{t:04d}"
        messages: list[AnyMessage] = []
        versions: dict[str, Any] = {}
        parent: str | None = None
        for i in range(per_thread):
            cls = HumanMessage if i % 2 == 0 else AIMessage
            messages = [*messages[-19:], cls(f"{i}: {body}", id=f"{thread}-m{i}")]
            new = {
                "messages": saver.get_next_version(versions.get("messages"), None),
                "turn": saver.get_next_version(versions.get("turn"), None),
            }
            versions.update(new)
            cp = empty_checkpoint()
            cp["id"] = str(uuid6(clock_seq=i))
            cp["channel_values"] = {"messages": list(messages), "turn": i}
            cp["channel_versions"] = dict(versions)
            cp["updated_channels"] = sorted(new)
            conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
            if parent:
                conf["checkpoint_id"] = parent
            meta = {"source": "loop", "step": i, "parents": {}, "note": f"turn {i}"}
            saved = saver.put({"configurable": conf}, cp, meta, new)  # type: ignore[arg-type]
            parent = saved["configurable"]["checkpoint_id"]
            if i % 3 == 0:
                saver.put_writes(
                    saved,
                    [("messages", [AIMessage(f"pending {i}", id=f"{thread}-p{i}")]), ("turn", i)],
                    task_id=f"task-{i}",
                    task_path="~__pregel_pull, reply",
                )
    saver.conn.close()
    return threads * per_thread


def drop_task_path(path: str | os.PathLike[str]) -> None:
    """Rewrite the writes table as SqliteSaver made it before task_path existed."""
    conn = sqlite3.connect(os.fspath(path))
    conn.executescript(
        """
        CREATE TABLE writes_old (
            thread_id TEXT NOT NULL,
            checkpoint_ns TEXT NOT NULL DEFAULT '',
            checkpoint_id TEXT NOT NULL,
            task_id TEXT NOT NULL,
            idx INTEGER NOT NULL,
            channel TEXT NOT NULL,
            type TEXT,
            value BLOB,
            PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
        );
        INSERT INTO writes_old SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, idx,
            channel, type, value FROM writes;
        DROP TABLE writes;
        ALTER TABLE writes_old RENAME TO writes;
        """
    )
    conn.commit()
    conn.close()


# -- destination helpers -------------------------------------------------------------


def store_image(store: Store) -> dict[bytes, bytes]:
    """Every key and value of a store."""
    with store.read() as txn:
        return dict(txn.scan(None, None))


def checkpoint_count(store: Store) -> int:
    with store.read() as txn:
        return sum(1 for _ in txn.scan(*prefix_range((S.CHECKPOINT,))))


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.migrate_from_sqlite", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
