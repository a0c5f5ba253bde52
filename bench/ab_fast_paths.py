"""``KVSaver(fast_paths=False)`` (the default) against ``fast_paths=True``
in one process, each workload on a fresh ``KVSaver(":memory:")``: the ops
row's puts and get_tuple(latest) (dict values), the graph row's agent loop,
a long chat's puts and its get_tuple(latest), warm and through a fresh
saver (cold). docs/performance.md has the figures.

    valgrind --tool=callgrind --dump-before=getppid \\
        .venv/bin/python bench/ab_fast_paths.py cg     # a dump per workload
    .venv/bin/python bench/ab_fast_paths.py wall [ROUNDS]  # process CPU, on / off

``cg``: a warm-up pass of both modes, then off's workloads and on's, an
``os.getppid()`` before each (the dumps, in that order, after the first);
``wall``: rounds in rotating order, the median of per-round ratios.
``SCALE=0.5`` halves every workload; ``WL=false`` runs without heads.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from _workloads import LOOP_TURNS, ThreadGen, build_agent, human
from kvsaver import KVSaver
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

SCALE = float(os.environ.get("SCALE", "1"))
WHOLE_LATEST: Any = "idle" if os.environ.get("WL", "idle") == "idle" else False


class Chat(TypedDict, total=False):
    messages: Annotated[list, add_messages]


def chat_graph(saver: KVSaver) -> Any:
    def assistant(state: Chat) -> dict[str, Any]:
        n = len(state["messages"])
        return {"messages": [AIMessage(f"reply {n} " * 40, id=f"a-{n}")]}

    b = StateGraph(Chat)
    b.add_node("assistant", assistant)
    b.add_edge(START, "assistant")
    return b.compile(checkpointer=saver)


def workloads(fast: bool, tag: str) -> list[tuple[str, Callable[[], None]]]:
    s = KVSaver(":memory:", fast_paths=fast, whole_latest=WHOLE_LATEST)
    gens = [ThreadGen(s, f"{tag}-t{i}", msg_chars=300, window=20) for i in range(10)]
    args = [gens[i % 10].next() for i in range(int(200 * SCALE))]
    cfgs = [{"configurable": {"thread_id": g.thread_id, "checkpoint_ns": ""}} for g in gens]
    agent = build_agent(s)
    chat = chat_graph(s)
    chat_cfg: Any = {"configurable": {"thread_id": f"{tag}-chat"}}

    def put() -> None:
        for a in args:
            s.put(a.config, a.checkpoint, a.metadata, a.new_versions)  # type: ignore[arg-type]

    def get() -> None:
        for i in range(int(300 * SCALE)):
            s.get_tuple(cfgs[i % 10])  # type: ignore[arg-type]

    def graph() -> None:
        for t in range(max(1, int(2 * SCALE))):
            cfg = {"recursion_limit": 200, "configurable": {"thread_id": f"{tag}-g{t}"}}
            agent.invoke({"messages": [human(t)], "turns": 0, "max_turns": LOOP_TURNS}, cfg)

    def chat_puts() -> None:
        for i in range(int(120 * SCALE)):
            chat.invoke({"messages": [HumanMessage(f"ask {i} " * 30, id=f"h-{i}")]}, chat_cfg)

    def warm() -> None:
        for _ in range(int(50 * SCALE)):
            s.get_tuple(chat_cfg)

    def cold() -> None:
        for _ in range(int(20 * SCALE)):
            with KVSaver(s.store, fast_paths=fast, whole_latest=WHOLE_LATEST) as c:
                c.get_tuple(chat_cfg)

    return [
        ("put", put),
        ("get_latest", get),
        ("graph_loop", graph),
        ("chat_puts", chat_puts),
        ("chat_warm", warm),
        ("chat_cold", cold),
    ]


def main() -> None:
    if sys.argv[1] == "cg":
        for fast in (False, True):
            for _, f in workloads(fast, f"w{fast}"):
                f()
        measured = [workloads(fast, f"m{fast}") for fast in (False, True)]
        for ws in measured:
            for _, f in ws:
                os.getppid()
                f()
        os.getppid()
        return
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    res: dict[str, list[tuple[float, float, float]]] = {}
    for r in range(rounds + 1):
        t: dict[tuple[str, bool], float] = {}
        for fast in (False, True) if r % 2 else (True, False):
            for name, f in workloads(fast, f"r{r}{fast}"):
                gc.collect()
                c0 = time.process_time()
                f()
                t[name, fast] = time.process_time() - c0
        if r:  # round 0: the warm-up
            for name in dict.fromkeys(n for n, _ in t):
                on, off = t[name, True], t[name, False]
                res.setdefault(name, []).append((on / off, off, on))
    for name, v in res.items():
        print(
            name,
            "CPU on/off",
            round(statistics.median(x[0] for x in v), 3),
            "off s",
            round(statistics.median(x[1] for x in v), 4),
            "on s",
            round(statistics.median(x[2] for x in v), 4),
            [round(x[0], 3) for x in v],
        )


if __name__ == "__main__":
    main()
