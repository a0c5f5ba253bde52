"""The wheel alone: run by .ci/run in a fresh venv holding kvsaver and exactly
its declared dependencies (no extra, no langgraph), from a directory outside
the clone. Every module of the wheel imports; both local backends, the saver
on each, the store (KVStore, without an index), the command line and a
migration work; each optional feature names the extra that brings it.

    python .ci/bare_install.py
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import pkgutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import kvsaver

# Packages the wheel must not need: none is a declared dependency.
UNDECLARED = [
    "langgraph.graph",  # the langgraph package (langgraph.checkpoint is declared)
    "langgraph.constants",
    "langgraph.checkpoint.sqlite",
    "langgraph.checkpoint.postgres",
    "psycopg",
    "psycopg_pool",
    "tqdm",
    "Crypto",
    "aiosqlite",
    "pytest",
    "numpy",  # the vector extra
]


def _absent(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except ModuleNotFoundError:  # a parent package is missing
        return True


def check_environment() -> None:
    present = [n for n in UNDECLARED if not _absent(n)]
    assert not present, f"not a bare install: {present} importable"
    here = Path(kvsaver.__file__).resolve()
    assert "site-packages" in here.parts, f"kvsaver from {here}, not the installed wheel"


def import_every_module() -> list[str]:
    names = [m.name for m in pkgutil.walk_packages(kvsaver.__path__, "kvsaver.")]
    for name in names:
        importlib.import_module(name)
    return names


def kv_backends(tmp: Path) -> None:
    from kvsaver.kv import FileStore, LMDBStore, MemoryStore, pack

    for store in (MemoryStore(), LMDBStore(str(tmp / "lmdb")), FileStore(str(tmp / "file.kv"))):
        with store:
            with store.write() as txn:
                txn.put(pack(("k", 1)), b"v1")
                txn.put(pack(("k", 2)), b"v2")
            with store.read() as txn:
                assert txn.get(pack(("k", 1))) == b"v1", type(store).__name__
                assert [v for _, v in txn.scan(pack(("k",)), pack(("l",)))] == [b"v1", b"v2"]


def _checkpoint(i: int, parent: str | None) -> tuple[dict, dict]:
    from langgraph.checkpoint.base import empty_checkpoint

    cp = empty_checkpoint()
    cp["id"] = f"1ef{i:05d}-0000-6000-8000-000000000000"
    cp["channel_values"] = {"messages": [f"message {j}" for j in range(i + 1)], "n": i}
    cp["channel_versions"] = {"messages": i + 1, "n": i + 1}
    return cp, {"source": "loop", "step": i, "parents": {}, "note": "bare"}


def saver_roundtrip(where: str, thread: str = "t\x00\U0001f600") -> None:
    from kvsaver import KVSaver

    cfg: dict = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    with KVSaver(where) as saver:
        for i in range(5):
            cp, meta = _checkpoint(i, None)
            versions = {"messages": i + 1, "n": i + 1}
            cfg = saver.put(cfg, cp, meta, versions)
            saver.put_writes(cfg, [("messages", f"pending {i}")], task_id="task-1")
        got = saver.get_tuple({"configurable": {"thread_id": thread}})
        assert got is not None and got.checkpoint["id"] == cp["id"], got
        assert got.checkpoint["channel_values"]["n"] == 4
        assert got.pending_writes == [("task-1", "messages", "pending 4")], got.pending_writes
        assert len(list(saver.list(None))) == 5
    if where != ":memory:":
        with KVSaver(where, readonly=True) as saver:  # reopened: nothing lost
            assert len(list(saver.list({"configurable": {"thread_id": thread}}))) == 5


def store_roundtrip(where: str) -> None:
    """KVStore without an index: put, get, a filtered search, delete."""
    from kvsaver import KVStore

    ns = ("users", "\U0001f600")
    with KVStore(where) as store:
        for i in range(5):
            store.put(ns, f"k\x00{i}", {"n": i, "text": f"note {i}"})
        item = store.get(ns, "k\x003")
        assert item is not None and item.value == {"n": 3, "text": "note 3"}, item
        found = store.search(("users",), filter={"n": {"$gte": 2}}, limit=10)
        assert [i.key for i in found] == [f"k\x00{i}" for i in (2, 3, 4)], found
        store.delete(ns, "k\x000")
        assert store.get(ns, "k\x000") is None
        assert store.list_namespaces() == [ns]
    if where != ":memory:":
        with KVStore(where, readonly=True) as store:  # reopened: nothing lost
            assert len(store.search(ns, limit=10)) == 4


def extras_are_named(tmp: Path) -> None:
    from kvsaver import KVSaver, KVStore
    from kvsaver.kv import MissingDependencyError, PostgresStore

    url = "postgresql://nobody@127.0.0.1:1/none"
    for opening in (KVSaver, PostgresStore):
        try:
            opening(url)
        except MissingDependencyError as e:  # an ImportError too
            assert isinstance(e, ImportError) and "kvsaver[postgres]" in str(e), e
        else:
            raise AssertionError(f"{opening.__name__}(postgresql://...) opened without psycopg")
    index = {"dims": 4, "embed": lambda texts: [[1.0, 0.0, 0.0, 0.0] for _ in texts]}
    try:
        KVStore(str(tmp / "vector-store"), index=index)  # type: ignore[arg-type]
    except MissingDependencyError as e:
        assert isinstance(e, ImportError) and "pip install 'kvsaver[vector]'" in str(e), e
    else:
        raise AssertionError("KVStore(index=...) opened without numpy")


def _sqlite_source(path: Path) -> None:
    """A SqliteSaver database written by hand (SqliteSaver is not installed):
    its two tables as langgraph-checkpoint-sqlite creates them."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    serde = JsonPlusSerializer()
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE checkpoints (thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL
            DEFAULT '', checkpoint_id TEXT NOT NULL, parent_checkpoint_id TEXT, type TEXT,
            checkpoint BLOB, metadata BLOB, PRIMARY KEY (thread_id, checkpoint_ns,
            checkpoint_id));
        CREATE TABLE writes (thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL
            DEFAULT '', checkpoint_id TEXT NOT NULL, task_id TEXT NOT NULL, idx INTEGER
            NOT NULL, channel TEXT NOT NULL, type TEXT, value BLOB, task_path TEXT NOT NULL
            DEFAULT '', PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx));
        """
    )
    parent = None
    for i in range(3):
        cp, meta = _checkpoint(i, parent)
        typ, data = serde.dumps_typed(cp)
        conn.execute(
            "INSERT INTO checkpoints VALUES (?, '', ?, ?, ?, ?, ?)",
            ("chat", cp["id"], parent, typ, data, json.dumps(meta).encode()),
        )
        parent = cp["id"]
    typ, data = serde.dumps_typed("a pending write")
    conn.execute(
        "INSERT INTO writes VALUES ('chat', '', ?, 'task', 0, 'messages', ?, ?, '')",
        (parent, typ, data),
    )
    conn.commit()
    conn.close()


def command_line(tmp: Path) -> None:
    exe = Path(sys.executable).with_name("kvsaver")

    def run(*args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == code, (args, out.returncode, out.stdout, out.stderr)
        return out

    assert "Usage: kvsaver" in run("--help").stdout
    store = str(tmp / "cli-store")
    thread = "chat \U0001f600"  # argv holds no NUL
    saver_roundtrip(store, thread)
    threads = json.loads(run("threads", store, "--json").stdout)
    assert len(threads) == 1, threads
    shown = json.loads(run("show", store, thread, "--json").stdout)
    assert shown["channel_values"]["n"] == 4 and shown["pending_writes"], shown
    run("history", store, thread, "--json")
    run("stats", store, "--json", "--quiet")
    run("sweep", store, "--keep-last", "2", "--json", "--quiet")
    run("compact", store, "--json", "--quiet")
    assert len(json.loads(run("history", store, thread, "--json").stdout)) == 2

    source = tmp / "source.sqlite"
    _sqlite_source(source)
    dest = str(tmp / "migrated")
    run("migrate", str(source), dest, "--no-verify", "--quiet")
    assert json.loads(run("show", dest, "chat", "--json").stdout)["pending_writes"], dest
    # what needs an extra says which one, in one line, exit 2
    assert "kvsaver[tools]" in run("migrate", str(source), dest + "2", "--quiet", code=2).stderr
    assert "kvsaver[tools]" in run("threads", str(source), code=2).stderr
    assert "kvsaver[tools]" in run("threads", store, "--encrypted", code=2).stderr
    url = "postgresql://nobody@127.0.0.1:1/none"
    for args in (["threads", url], ["compact", url], ["migrate", str(source), url, "--quiet"]):
        err = run(*args, code=2).stderr
        assert "kvsaver[postgres]" in err and len(err.splitlines()) == 1, (args, err)


def main() -> None:
    check_environment()
    names = import_every_module()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        kv_backends(tmp)
        saver_roundtrip(":memory:")
        saver_roundtrip(str(tmp / "saver-dir"))
        store_roundtrip(":memory:")
        store_roundtrip(str(tmp / "store-dir"))
        store_roundtrip(str(tmp / "saver-dir"))  # beside the saver's checkpoints
        extras_are_named(tmp)
        command_line(tmp)
    print(f"bare install: {len(names)} modules import; memory, LMDB and file stores, the saver,")
    print("  the store, the kvsaver command and a migration work with only the declared")
    print("  dependencies")


if __name__ == "__main__":
    os.environ.pop("PYTHONPATH", None)
    main()
