"""Restart: a conversation split across two processes on one store directory
gives exactly what one process gives with SqliteSaver.

Process A (a fresh interpreter) runs the first half of a chat and pauses an
approval graph at its interrupt, then exits. Process B opens the same
directory, checks it sees A's state, continues the chat and resumes the
approval. The parent then compares the stored result, message by message and
checkpoint by checkpoint, with the whole run done in-process on SqliteSaver.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kvsaver import KVSaver
from saver_helpers import sqlite_saver
from saver_helpers_graphs import Command, approval_graph, chat_graph, history, human, snap

ROOT = Path(__file__).resolve().parent.parent
TURNS = 20
HALF = TURNS // 2

CHILD = r"""
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
from kvsaver import KVSaver
from saver_helpers_graphs import Command, approval_graph, chat_graph, human

args = json.loads(sys.argv[2])
kwargs = {"backend": "file"} if args["backend"] == "file" else {}
out = {}
with KVSaver(args["path"], **kwargs) as saver:
    chat = chat_graph(saver)
    conf = {"configurable": {"thread_id": "chat"}}
    before = chat.get_state(conf).values.get("messages", [])
    out["seen_at_start"] = [m.content for m in before]
    for i in range(*args["turns"]):
        chat.invoke(human(i), conf)
    out["messages"] = [m.content for m in chat.get_state(conf).values["messages"]]
    approval = approval_graph(saver)
    aconf = {"configurable": {"thread_id": "approval"}}
    if args["approval"] == "start":
        approval.invoke({"request": "deploy", "log": []}, aconf)
    else:
        approval.invoke(Command(resume="yes"), aconf)
    state = approval.get_state(aconf)
    out["approval_next"] = list(state.next)
    out["approval_log"] = state.values["log"]
print(json.dumps(out))
"""


def run_child(path: Path, backend: str, turns: tuple[int, int], approval: str) -> dict[str, Any]:
    args = {"path": str(path), "backend": backend, "turns": list(turns), "approval": approval}
    # subprocess.run kills and reaps the child if it outlives the timeout.
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, f"child failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("backend", ["lmdb", "file"])
def test_conversation_survives_a_restart(backend: str, tmp_path: Path) -> None:
    path = tmp_path / ("state" if backend == "lmdb" else "state.kvs")
    first = run_child(path, backend, (0, HALF), "start")
    second = run_child(path, backend, (HALF, TURNS), "resume")

    # Process B saw exactly what process A left behind.
    assert second["seen_at_start"] == first["messages"]
    assert len(first["messages"]) == 2 * HALF
    assert first["approval_next"] == ["ask"]
    assert second["approval_next"] == []

    # The same conversation, in one process, on the reference saver.
    ref = sqlite_saver()
    chat_ref, approval_ref = chat_graph(ref), approval_graph(ref)
    conf = {"configurable": {"thread_id": "chat"}}
    aconf = {"configurable": {"thread_id": "approval"}}
    for i in range(TURNS):
        chat_ref.invoke(human(i), conf)
    approval_ref.invoke({"request": "deploy", "log": []}, aconf)
    approval_ref.invoke(Command(resume="yes"), aconf)
    want = [m.content for m in chat_ref.get_state(conf).values["messages"]]
    assert second["messages"] == want
    assert second["approval_log"] == ["prepared", "asked:yes", "acted:yes"]

    # And the stored checkpoints, read back here, match checkpoint by checkpoint.
    kwargs: dict[str, Any] = {"backend": "file"} if backend == "file" else {}
    with KVSaver(path, **kwargs) as saver:
        chat_kv, approval_kv = chat_graph(saver), approval_graph(saver)
        assert snap(chat_kv.get_state(conf)) == snap(chat_ref.get_state(conf))
        assert history(chat_kv, conf) == history(chat_ref, conf)
        assert history(approval_kv, aconf) == history(approval_ref, aconf)
        assert len(history(chat_kv, conf)) >= 2 * TURNS
    ref.conn.close()
