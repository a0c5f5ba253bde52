"""KVStore across processes on one LMDB directory: several writers at once
while readers read (never blocked, always a consistent prefix of each
writer's puts), and writers killed with SIGKILL mid-write: every
acknowledged put is there, the records agree, and writing goes on."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

from kvsaver import KVStore
from kvstore_helpers import problems
from langgraph.store.base import SearchOp

HELPERS = str(Path(__file__).parent / "kvstore_helpers.py")


def _start(worker: str, **kwargs: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, HELPERS, worker, json.dumps(kwargs)])


def _acks(path: Path) -> list[int]:
    if not path.exists():
        return []
    lines = path.read_text().split("\n")
    return [int(line.split()[1]) for line in lines[:-1] if line]  # the last: unfinished


def _check_prefixes(store: KVStore, names: list[str]) -> dict[str, int]:
    """Each writer's items are k0..k(m-1) in insertion order (its puts commit
    in order), and ("shared",) holds the same m of it: m per writer."""
    seen = {}
    ops = [SearchOp(("shared",), limit=10**6)] + [
        SearchOp(("w", name), limit=10**6) for name in names
    ]
    found = store.batch(ops)  # one batch: one snapshot
    shared = [i.key for i in found[0]]
    for name, items in zip(names, found[1:], strict=True):
        keys = [i.key for i in items]
        assert keys == [f"k{i}" for i in range(len(keys))], name
        mine = [k for k in shared if k.startswith(f"{name}-")]
        assert mine == [f"{name}-{i}" for i in range(len(keys))], name
        seen[name] = len(keys)
    return seen


def test_several_writers_and_readers_on_one_directory(tmp_path: Path) -> None:
    path = tmp_path / "state"
    KVStore(path).close()
    names = ["a", "b", "c"]
    n = 120
    procs = [
        _start("writer", path=str(path), name=name, n=n, ack=str(tmp_path / f"{name}.ack"))
        for name in names
    ]
    try:
        reads = 0
        with KVStore(path, readonly=True) as reader:
            while any(p.poll() is None for p in procs):
                _check_prefixes(reader, names)  # never blocked, never a torn batch
                reads += 1
        for p in procs:
            assert p.wait(timeout=120) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert reads > 0
    with KVStore(path) as store:
        assert _check_prefixes(store, names) == {name: n for name in names}
        assert problems(store) == []
        assert store.list_namespaces() == [("shared",), ("w", "a"), ("w", "b"), ("w", "c")]


def test_kill_9_mid_write_loses_nothing_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "state"
    KVStore(path).close()
    rng = random.Random(7)
    names = []
    for round_ in range(4):
        name = f"r{round_}"
        names.append(name)
        ack = tmp_path / f"{name}.ack"
        proc = _start("writer", path=str(path), name=name, n=10**6, ack=str(ack))
        try:
            want = rng.randint(5, 60)
            deadline = time.time() + 60
            while len(_acks(ack)) < want and time.time() < deadline and proc.poll() is None:
                time.sleep(0.002)
            time.sleep(rng.random() * 0.05)  # somewhere inside a later batch
        finally:
            proc.kill()
            proc.wait()
        acked = _acks(ack)
        assert len(acked) >= want
        with KVStore(path) as store:
            assert problems(store) == []
            seen = _check_prefixes(store, names)
            assert seen[name] >= len(acked)  # every acknowledged batch is there
            for i in acked:
                item = store.get(("w", name), f"k{i}")
                assert item is not None and item.value["i"] == i
            store.put(("after",), name, {"ok": True})  # and the store takes writes
    with KVStore(path) as store:
        assert [i.key for i in store.search(("after",))] == names
