"""KVStore under a real LangGraph graph: nodes write memories through the
injected store, another thread reads them, and so does another process on
the same directory (and this one what that process wrote)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from kvsaver import KVSaver, KVStore
from kvstore_graph import build

HELPERS = str(Path(__file__).parent / "kvstore_helpers.py")


def _run(worker: str, **kwargs: object) -> None:
    subprocess.run([sys.executable, HELPERS, worker, json.dumps(kwargs)], check=True, timeout=120)


def _cfg(thread: str) -> dict:
    return {"configurable": {"thread_id": thread}}


def test_memories_written_in_one_thread_are_read_in_another(tmp_path: Path) -> None:
    path = tmp_path / "state"
    with KVSaver(path) as saver, KVStore(path) as store:
        graph = build(saver, store)
        out = graph.invoke({"text": "likes tea"}, _cfg("t1"), context={"user": "ada"})
        assert out["recalled"] == ["likes tea"]
        graph.invoke({"text": "lives in Paris"}, _cfg("t1"), context={"user": "ada"})
        other = graph.invoke({"text": "asks about trains"}, _cfg("t2"), context={"user": "ada"})
        # t2 is a new thread (its first turn overwrites "turn-0"), and it sees
        # every memory of the user, whichever thread wrote it
        assert other["recalled"] == ["asks about trains", "lives in Paris"]
        assert graph.invoke({"text": "x"}, _cfg("t3"), context={"user": "bob"})["recalled"] == ["x"]
        assert saver.get_tuple(_cfg("t1")) is not None  # the checkpoints are the saver's
        assert {i.namespace for i in store.search(("memories",), limit=100)} == {
            ("memories", "ada"),
            ("memories", "bob"),
        }


def test_another_process_reads_and_writes_the_same_memories(tmp_path: Path) -> None:
    path = tmp_path / "state"
    with KVSaver(path) as saver, KVStore(path) as store:
        build(saver, store).invoke({"text": "from here"}, _cfg("t1"), context={"user": "ada"})
    _run("graph_writer", path=str(path), user="ada", text="from there", thread="p1")
    out = tmp_path / "read.json"
    _run("reader", path=str(path), out=str(out))
    seen = json.loads(out.read_text())
    assert seen["memories"] == {"memories.ada": {"text": "from there", "n": 0}}  # turn-0 rewritten
    with KVSaver(path) as saver, KVStore(path) as store:
        graph = build(saver, store)
        again = graph.invoke({"text": "and again"}, _cfg("t1"), context={"user": "ada"})
        assert again["recalled"] == ["from there", "and again"]
        # the other process's checkpoints are here too
        assert saver.get_tuple(_cfg("p1")).checkpoint["channel_values"]["turns"] == ["from there"]


def test_the_graph_runs_async_on_the_same_store(tmp_path: Path) -> None:
    path = tmp_path / "state"

    async def run() -> list[str]:
        async with KVSaver.from_conn_string(str(path)) as saver, KVStore(path) as store:
            graph = build(saver, store)
            await asyncio.gather(
                *(
                    graph.ainvoke({"text": f"note {i}"}, _cfg(f"a{i}"), context={"user": f"u{i}"})
                    for i in range(8)
                )
            )
            out = await graph.ainvoke({"text": "last"}, _cfg("a0"), context={"user": "u0"})
            return list(out["recalled"])

    assert asyncio.run(run()) == ["note 0", "last"]
