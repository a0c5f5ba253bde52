"""put CPU of a chat's checkpoint sequence, for paired A/B runs of two
checkouts (issue #15: delta storage must not cost put more CPU than before).

    for i in 1 2 3 4; do
        /path/to/A/.venv/bin/python bench/put_cpu_chat.py
        /path/to/B/.venv/bin/python bench/put_cpu_chat.py
    done

Prints the thread CPU seconds spent inside ``put`` and the store's live bytes
for 3 threads x 120 turns of the long chat (``bench_long_chat``: ~45-word
messages, a summary every 10 turns), three puts a turn with the channels a
graph step changes, into an in-memory store (no disk sync to hide CPU behind).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_storage import text
from kvsaver import KVSaver
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint


def run(turns: int, threads: int) -> tuple[float, int]:
    saver = KVSaver(":memory:")
    cpu = 0.0
    n = 0
    state: dict[str, Any] = {}
    for turn in range(turns):
        for th in range(threads):
            t = f"t{th}"
            msgs, versions, parent = state.get(t, ([], {}, None))
            h = HumanMessage(text(f"h/{t}/{turn}", 290, 340), id=f"h{turn}")
            a = AIMessage(text(f"a/{t}/{turn}", 290, 340), id=f"a{turn}")
            steps: list[tuple[dict[str, Any], list[str]]] = [
                ({"__start__": {"messages": [h]}}, ["__start__"]),
                (
                    {"messages": [*msgs, h], "branch:to:assistant": None},
                    ["messages", "__start__", "branch:to:assistant"],
                ),
                ({"messages": [*msgs, h, a]}, ["messages", "branch:to:assistant"]),
            ]
            if turn % 10 == 9:
                steps[2][0]["summary"] = text(f"s/{t}/{turn}", 550, 650)
                steps[2][1].append("summary")
            values: dict[str, Any] = {}
            for update, changed in steps:
                values.update(update)
                for ch in changed:
                    versions[ch] = saver.get_next_version(versions.get(ch), None)
                n += 1
                cp = empty_checkpoint()
                cp["id"] = f"{n:012}"
                cp["channel_versions"] = dict(versions)
                cp["channel_values"] = {
                    k: v for k, v in values.items() if v is not None and k in versions
                }
                conf = {"thread_id": t, "checkpoint_ns": ""}
                if parent:
                    conf["checkpoint_id"] = parent
                new_versions = {ch: versions[ch] for ch in changed}
                t0 = time.thread_time()
                saver.put({"configurable": conf}, cp, {"source": "loop"}, new_versions)
                cpu += time.thread_time() - t0
                parent = cp["id"]
            state[t] = ([*msgs, h, a], versions, parent)
    return cpu, saver.stats().live_bytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=120)
    parser.add_argument("--threads", type=int, default=3)
    args = parser.parse_args(argv)
    cpu, live = run(args.turns, args.threads)
    print(f"put_cpu_seconds={cpu:.4f} live_bytes={live}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
