"""A chat graph whose memory survives process restarts, with KVSaver.

No network, no API key: the "assistant" is a deterministic node that
remembers what you told it. Run:  python examples/chat_demo.py [STATE_DIR]

1. process A talks for two turns and exits;
2. process B (a new interpreter) opens the same directory and continues;
3. the thread's history is listed, checkpoint by checkpoint;
4. the conversation is forked from an older checkpoint into a new branch.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from typing import Annotated, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from kvsaver import KVSaver

THREAD = {"configurable": {"thread_id": "demo-chat"}}


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    facts: dict[str, str]


def remember(state: State) -> dict:
    """Pick facts like 'my name is Ada' or 'I like tea' out of the last message."""
    text = state["messages"][-1].content
    facts = dict(state.get("facts") or {})
    if m := re.search(r"my name is (\w+)", text, re.I):
        facts["name"] = m.group(1)
    if m := re.search(r"i like (\w+)", text, re.I):
        facts["likes"] = m.group(1)
    return {"facts": facts}


def reply(state: State) -> dict:
    facts = state.get("facts") or {}
    turns = sum(isinstance(m, HumanMessage) for m in state["messages"])
    name = facts.get("name", "stranger")
    likes = f" You like {facts['likes']}." if "likes" in facts else ""
    text = f"(turn {turns}, pid {os.getpid()}) Hello {name}.{likes}"
    return {"messages": [AIMessage(text)]}


def build(saver: KVSaver):
    g = StateGraph(State)
    g.add_node("remember", remember)
    g.add_node("reply", reply)
    g.add_edge(START, "remember")
    g.add_edge("remember", "reply")
    g.add_edge("reply", END)
    return g.compile(checkpointer=saver)


def say(graph, text: str, config=THREAD) -> None:
    out = graph.invoke({"messages": [HumanMessage(text)]}, config)
    print(f"  you: {text}\n  bot: {out['messages'][-1].content}")


def phase(state_dir: str, name: str) -> None:
    with KVSaver(state_dir) as saver:
        graph = build(saver)
        if name == "a":
            print(f"[process A, pid {os.getpid()}] a new conversation")
            say(graph, "Hi, my name is Ada.")
            say(graph, "I like tea.")
        else:
            before = graph.get_state(THREAD).values["messages"]
            print(
                f"[process B, pid {os.getpid()}] reopened {state_dir}: "
                f"{len(before)} messages were on disk"
            )
            say(graph, "Do you still know me?")


def main() -> None:
    state_dir = sys.argv[1] if len(sys.argv) > 1 else "./demo-state"
    if len(sys.argv) > 2:  # a child process: run one phase
        phase(state_dir, sys.argv[2])
        return
    shutil.rmtree(state_dir, ignore_errors=True)
    for name in ("a", "b"):  # two separate interpreters: a real restart
        subprocess.run([sys.executable, os.path.abspath(__file__), state_dir, name], check=True)

    with KVSaver(state_dir) as saver:
        graph = build(saver)
        print(f"\n[parent, pid {os.getpid()}] the thread's history, newest first:")
        history = list(graph.get_state_history(THREAD))
        for snap in history:
            msgs = snap.values.get("messages", [])
            last = msgs[-1].content if msgs else "-"
            print(
                f"  step {snap.metadata.get('step'):>2}  "
                f"{snap.config['configurable']['checkpoint_id']}"
                f"  next={list(snap.next)}  last: {last[:50]!r}"
            )

        # Fork: continue from the checkpoint after the first turn, as if the
        # user had said something else the second time.
        first_turn = next(
            s for s in reversed(history) if len(s.values.get("messages", [])) == 2 and not s.next
        )
        print(
            "\n[fork] from the checkpoint after turn 1 "
            f"({first_turn.config['configurable']['checkpoint_id']}):"
        )
        say(graph, "I like coffee.", first_turn.config)
        main_branch = graph.get_state(THREAD).values
        print(
            f"\n  the new branch is now the latest: {len(main_branch['messages'])} messages, "
            f"facts={main_branch['facts']}"
        )
        old = graph.get_state(history[0].config).values
        print(f"  the old branch is kept: {len(old['messages'])} messages, facts={old['facts']}")
        print(f"  checkpoints stored for the thread: {len(list(saver.list(THREAD)))}")
        size = sum(os.path.getsize(os.path.join(state_dir, f)) for f in os.listdir(state_dir))
        print(f"\nEverything above lives in {os.path.abspath(state_dir)} ({size:,} bytes).")


if __name__ == "__main__":
    main()
