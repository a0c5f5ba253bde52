"""Make the kvsaver 0.1.0 store fixtures that tests/test_upgrade_0_1_0.py opens.

Run ONCE with the 0.1.0 code (commit 2ddca5a, before the ``kvsaver`` import
name, when pending writes were keyed by (task_path, task_id, idx)), from a
clone, with any venv that has this project's test dependencies:

    git worktree add --detach /tmp/old 2ddca5a
    PYTHONPATH=/tmp/old .venv/bin/python tests/data/make_store_0_1_0.py tests/data
    git worktree remove /tmp/old

It writes, in the given directory:

* ``store_0_1_0.kvs``: a FileStore (``backend="file"``, one msgpack file);
* ``store_0_1_0_lmdb.tar.gz``: an LMDB store directory (``data.mdb`` only:
  LMDB recreates ``lock.mdb``), gzipped: the file is mostly zeros;
* ``store_0_1_0.json``: the calls that made both stores (``put`` and
  ``put_writes``, in order; the same calls on both), and what SqliteSaver
  returns after the same calls: ``get_tuple`` of every checkpoint
  (channel values, metadata, parent, pending writes in order).

Both stores hold two threads (one id too long for a key, so stored through
its surrogate) with two namespaces each, parent chains, a compressed value,
pending writes of regular and special channels (ERROR, INTERRUPT, RESUME,
SCHEDULED), retries, and one task id under two
task paths (with regular writes, with special ones, and with a task id and
a task path too long for a key). The collisions are arranged so that the
upgrade rule (of two old writes with the same (task_id, idx), keep the one
with the smallest task_path) and SqliteSaver (the first regular write, the
last special one) agree; tests/test_upgrade_0_1_0.py pins the rule where
they cannot (the 0.1.0 store does not know which write came first).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys
import tarfile
import tempfile
from typing import Any

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT, RESUME, SCHEDULED
from langgraph.checkpoint.sqlite import SqliteSaver

from saver import KVSaver  # the 0.1.0 import name: run with PYTHONPATH=<0.1.0 clone>
from saver import schema as old_schema

LONG_THREAD = "thread-" + "L" * 120
LONG_TASK = "task-" + "x" * 110
LONG_PATH = "~__pregel_push, " + "p" * 110
TS = "2025-06-01T12:00:00.000000+00:00"


def calls() -> list[list[Any]]:
    """Every put / put_writes, as JSON: ["put", thread, ns, parent id,
    checkpoint, metadata, new_versions] and ["put_writes", thread, ns,
    checkpoint id, [[channel, value], ...], task_id, task_path]."""
    out: list[list[Any]] = []
    n = 0
    for thread in ("thread-1", LONG_THREAD):
        for ns in ("", "child:1"):
            parent = None
            messages: list[str] = []
            for step in range(3):
                n += 1
                cid = f"1f0b0000-0000-6000-8000-{n:012d}"
                messages = [*messages, f"{thread[:8]}/{ns}/{step}"]
                values: dict[str, Any] = {"messages": messages, "count": step}
                versions = {"messages": f"{step + 1:032}.0", "count": f"{step + 1:032}.0"}
                if step == 1:
                    values["big"] = "zstd " * 120  # compressed by 0.1.0 (>= 512 bytes)
                    versions["big"] = f"{1:032}.0"
                elif step == 2:
                    values["big"] = "zstd " * 120
                    versions["big"] = f"{1:032}.0"  # unchanged: not in new_versions
                cp = dict(empty_checkpoint())
                cp.update(id=cid, ts=TS, channel_values=values, channel_versions=versions)
                cp["versions_seen"] = {"agent": dict(versions)}
                new_versions = {ch: v for ch, v in versions.items() if ch != "big" or step == 1}
                metadata = {"source": "loop", "step": step, "run_id": f"run-{step % 2}"}
                out.append(["put", thread, ns, parent, cp, metadata, new_versions])
                w = ["put_writes", thread, ns, cid]
                agent = "~__pregel_pull, agent"
                out.append([*w, [["messages", "hi"], ["count", 1]], "task-a", agent])
                out.append([*w, [["messages", "retried"]], "task-a", agent])
                if step >= 1:
                    out.append([*w, [[ERROR, "boom"]], "task-b", "~__pregel_pull, tools"])
                    out.append([*w, [[ERROR, "boom again"]], "task-b", "~__pregel_pull, tools"])
                    out.append([*w, [[INTERRUPT, {"value": "ask"}]], "task-b", ""])
                    out.append([*w, [[RESUME, "yes"], [SCHEDULED, None]], "task-r", ""])
                    out.append([*w, [["count", 7], [ERROR, "mixed"]], "task-m", "m"])
                if step == 2:
                    # One task id under two paths: regular writes (first kept) ...
                    out.append([*w, [["messages", "x"]], "task-c", "path-1"])
                    out.append([*w, [["messages", "y"], ["count", 2]], "task-c", "path-2"])
                    # ... special ones (last kept; written so the rule agrees) ...
                    out.append([*w, [[INTERRUPT, "i-first"]], "task-d", "path-2"])
                    out.append([*w, [[INTERRUPT, "i-last"]], "task-d", "path-1"])
                    # ... and ids too long for a key (surrogates in 0.1.0's keys).
                    out.append([*w, [["messages", "long-1"]], LONG_TASK, LONG_PATH])
                    more = [["messages", "long-2"], ["count", 3]]
                    out.append([*w, more, LONG_TASK, LONG_PATH + "~"])
                parent = cid
    return out


def config(thread: str, ns: str, cid: str | None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if cid is not None:
        conf["checkpoint_id"] = cid
    return {"configurable": conf}


def apply(saver: Any, log: list[list[Any]]) -> None:
    for call in log:
        if call[0] == "put":
            _, thread, ns, parent, cp, metadata, new_versions = call
            saver.put(config(thread, ns, parent), cp, metadata, new_versions)
        else:
            _, thread, ns, cid, writes, task_id, task_path = call
            pairs = [(ch, value) for ch, value in writes]
            saver.put_writes(config(thread, ns, cid), pairs, task_id, task_path)


def expected(log: list[list[Any]]) -> list[dict[str, Any]]:
    ref = SqliteSaver(sqlite3.connect(":memory:"))
    apply(ref, log)
    out = []
    for call in log:
        if call[0] != "put":
            continue
        _, thread, ns, parent, cp, _, _ = call
        t = ref.get_tuple(config(thread, ns, cp["id"]))
        assert t is not None
        out.append(
            {
                "thread_id": thread,
                "checkpoint_ns": ns,
                "checkpoint_id": cp["id"],
                "parent_id": parent,
                "channel_values": t.checkpoint["channel_values"],
                "metadata": t.metadata,
                "pending_writes": [list(w) for w in t.pending_writes or []],
            }
        )
    return out


def main(out_dir: str) -> None:
    if "task_path" not in old_schema.write_key.__code__.co_varnames:
        sys.exit("run this with the 0.1.0 code on PYTHONPATH (see the docstring)")
    log = calls()
    with open(os.path.join(out_dir, "store_0_1_0.json"), "w") as f:
        json.dump({"calls": log, "expected": expected(log)}, f, sort_keys=True)
        f.write("\n")
    file_path = os.path.join(out_dir, "store_0_1_0.kvs")
    if os.path.exists(file_path):
        os.remove(file_path)
    with KVSaver(file_path, backend="file") as saver:
        apply(saver, log)
    os.remove(file_path + ".lock")  # FileStore's lock file: not part of the store
    tmp = tempfile.mkdtemp()
    try:
        with KVSaver(os.path.join(tmp, "store"), durability="none") as saver:
            apply(saver, log)
        with tarfile.open(os.path.join(out_dir, "store_0_1_0_lmdb.tar.gz"), "w:gz") as tar:
            info = tar.gettarinfo(os.path.join(tmp, "store", "data.mdb"), "store/data.mdb")
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with open(os.path.join(tmp, "store", "data.mdb"), "rb") as data:
                tar.addfile(info, data)
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
