"""``kvsaver store ls|get|search`` and the KVStore part of ``kvsaver sweep``,
run as the real command (click's CliRunner, and one run in a process of its
own beside a writer) over KVStores on LMDB, a FileStore file and PostgreSQL,
checked against what KVStore itself returns."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from typing import Any

import pytest
from click.testing import CliRunner
from kvsaver import KVSaver, KVStore
from kvsaver.kvstore.keyspace import SCHEMA_KEY, store_range
from kvsaver.tools.cli import cli
from kvsaver.tools.store_cli import format_namespace, parse_namespace, store_group
from langgraph.checkpoint.base import empty_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.dirname(os.path.abspath(__file__))
DIMS = 16


def embed(texts: list[str]) -> list[list[float]]:
    """A deterministic embedder (``--embed test_cli_store:embed``): each word
    a fixed pseudo-random vector, a text the sum of its words'."""
    out = []
    for t in texts:
        v = [0.0] * DIMS
        for w in t.lower().split():
            h = hashlib.sha256(w.encode()).digest()
            for i in range(DIMS):
                v[i] += h[i] / 255 - 0.5
        out.append(v)
    return out


NOTES = {
    "n0": "pears are sweet and ripe",
    "n1": "iron ore from the mine",
    "n2": "ripe pears in a bowl",
    "n3": "the mine closed early",
}


def fill(store: KVStore) -> None:
    """Three users' memories (four notes each, two kinds), a docs namespace,
    and a namespace five labels deep."""
    for u in range(3):
        for i, (key, note) in enumerate(NOTES.items()):
            value = {"text": note, "kind": "fruit" if "pears" in note else "metal", "n": i}
            store.put(("users", f"u{u}", "memories"), key, value)
    store.put(("docs",), "readme", {"text": "hello", "tags": ["a", "b"], "nested": {"x": 1}})
    store.put(("a", "b", "c", "d", "e"), "deep", {"text": "deep down"})


@pytest.fixture
def lmdb_store(tmp_path: Any) -> str:
    path = str(tmp_path / "state")
    with KVStore(path, index={"dims": DIMS, "embed": embed, "fields": ["text"]}) as store:
        fill(store)
    return path


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def run(*args: str) -> str:
    result = invoke(*args)
    assert result.exit_code == 0, (result.output, result.stderr)
    return str(result.stdout)


def run_json(*args: str) -> Any:
    return json.loads(run(*args, "--json"))


def fail(*args: str) -> str:
    """A command that must exit 2 with one line on stderr; the line."""
    result = invoke(*args)
    assert result.exit_code == 2, (result.output, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return str(lines[0])


# -- ls ------------------------------------------------------------------------------


def test_ls_lists_what_list_namespaces_returns(lmdb_store: str) -> None:
    with KVStore(lmdb_store, readonly=True) as store:
        every = store.list_namespaces(limit=1000)
        users2 = store.list_namespaces(prefix=("users",), max_depth=2)
        deep3 = store.list_namespaces(max_depth=3, limit=2)
    assert len(every) == 5
    assert run_json("store", "ls", lmdb_store) == [list(ns) for ns in every]
    assert run_json("store", "ls", lmdb_store, "users", "--max-depth", "2") == [
        list(ns) for ns in users2
    ]
    assert run_json("store", "ls", lmdb_store, "--max-depth", "3", "--limit", "2") == [
        list(ns) for ns in deep3
    ]
    assert run_json("store", "ls", lmdb_store, "users.u1") == [["users", "u1", "memories"]]
    assert run_json("store", "ls", lmdb_store, '["users", "u1"]') == [["users", "u1", "memories"]]
    assert run_json("store", "ls", lmdb_store, "nobody") == []
    text = run("store", "ls", lmdb_store)
    assert text.splitlines() == [*(".".join(ns) for ns in every), "5 namespaces"]
    assert run("store", "ls", lmdb_store, "docs").splitlines() == ["docs", "1 namespace"]


# -- get -----------------------------------------------------------------------------


def test_get_shows_one_item(lmdb_store: str) -> None:
    with KVStore(lmdb_store, readonly=True) as store:
        item = store.get(("docs",), "readme")
        memory = store.get(("users", "u2", "memories"), "n1")
    assert item is not None and memory is not None
    doc = run_json("store", "get", lmdb_store, "docs", "readme")
    assert doc == {
        "namespace": ["docs"],
        "key": "readme",
        "value": item.value,
        "created_at": item.created_at.isoformat(),
        "updated_at": item.updated_at.isoformat(),
    }
    for ns in ("users.u2.memories", '["users","u2","memories"]'):
        assert run_json("store", "get", lmdb_store, ns, "n1")["value"] == memory.value
    text = run("store", "get", lmdb_store, "users.u2.memories", "n1")
    lines = text.splitlines()
    assert lines[0] == "namespace  users.u2.memories" and lines[1] == "key        n1"
    assert lines[2].startswith("created    ") and lines[4] == "value"
    assert json.loads("\n".join(lines[5:])) == memory.value


def test_get_refuses_in_one_line(lmdb_store: str, tmp_path: Any) -> None:
    assert "no item 'nope' in namespace docs" in fail("store", "get", lmdb_store, "docs", "nope")
    assert "no item 'n1' in namespace users.u9.memories" in fail(
        "store", "get", lmdb_store, "users.u9.memories", "n1"
    )
    assert "NAMESPACE is empty" in fail("store", "get", lmdb_store, "", "k")
    assert "not a JSON array" in fail("store", "get", lmdb_store, "[docs", "k")
    assert "array of strings" in fail("store", "get", lmdb_store, "[1, 2]", "k")
    # A label LangGraph refuses (a "." or a NUL) is reached through JSON and
    # refused by the store with its reason, not a traceback.
    assert "period" in fail("store", "get", lmdb_store, '["a.b"]', "k")
    assert "NUL" in fail("store", "get", lmdb_store, '["a\\u0000b"]', "k")
    assert "no such file or directory" in fail("store", "ls", str(tmp_path / "none"))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "without data.mdb" in fail("store", "ls", str(empty))
    other = tmp_path / "other.txt"
    other.write_text("hello")
    assert "is not a store KVStore opens" in fail("store", "ls", str(other))


@pytest.mark.parametrize(
    "labels",
    [
        ("users", "u1", "memories"),
        ("a.b",),
        ("x", "a\x00b"),
        ("[odd", "ok"),
        ("", "empty"),
        ("émoji 🎉", "spaces in it"),
    ],
)
def test_namespaces_read_back_as_themselves(labels: tuple[str, ...]) -> None:
    written = format_namespace(labels)
    assert parse_namespace(written) == labels
    plain = all(x and "." not in x and "\x00" not in x for x in labels)
    dotted = plain and not labels[0].startswith("[")
    assert (written == ".".join(labels)) == dotted


# -- search --------------------------------------------------------------------------


def test_search_filters_and_pages_as_the_store_does(lmdb_store: str) -> None:
    with KVStore(lmdb_store, readonly=True) as store:
        fruit = store.search(("users",), filter={"kind": "fruit"}, limit=4, offset=1)
        every = store.search((), limit=100)
        above = store.search(("users", "u0"), filter={"n": {"$gte": 2}})
    got = run_json(
        "store", "search", lmdb_store, "users", "--filter", '{"kind": "fruit"}', "--limit", "4",
        "--offset", "1",
    )  # fmt: skip
    assert [(tuple(d["namespace"]), d["key"]) for d in got] == [(i.namespace, i.key) for i in fruit]
    assert all(d["value"]["kind"] == "fruit" and d["score"] is None for d in got)
    assert len(run_json("store", "search", lmdb_store, "--limit", "100")) == len(every) == 14
    assert len(run_json("store", "search", lmdb_store)) == 10  # the default limit
    got = run_json("store", "search", lmdb_store, "users.u0", "--filter", '{"n": {"$gte": 2}}')
    assert [d["key"] for d in got] == [i.key for i in above] == ["n2", "n3"]
    text = run("store", "search", lmdb_store, "docs")
    lines = text.splitlines()
    assert re.split(r"\s{2,}", lines[0]) == ["namespace", "key", "updated", "value"]
    assert lines[1].startswith("docs") and '"tags": ["a", "b"]' in lines[1]
    assert lines[-1] == "1 item"


def test_search_by_query_ranks_as_the_store_does(
    lmdb_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = {"dims": DIMS, "embed": embed, "fields": ["text"]}
    with KVStore(lmdb_store, readonly=True, index=index) as store:  # type: ignore[arg-type]
        want = store.search(("users", "u1"), query="ripe pears", limit=3)
    monkeypatch.syspath_prepend(TESTS)
    got = run_json(
        "store", "search", lmdb_store, "users.u1", "--query", "ripe pears", "--embed",
        "test_cli_store:embed", "--limit", "3",
    )  # fmt: skip
    assert [d["key"] for d in got] == [i.key for i in want]
    assert [d["score"] for d in got] == pytest.approx([i.score for i in want])
    assert {d["key"] for d in got[:2]} == {"n0", "n2"}  # the two notes about pears
    text = run(
        "store", "search", lmdb_store, "users.u1", "--query", "ripe pears", "--embed",
        "test_cli_store:embed", "--limit", "3",
    )  # fmt: skip
    header = re.split(r"\s{2,}", text.splitlines()[0].strip())
    assert header == ["namespace", "key", "updated", "score", "value"]
    assert f"{want[0].score:.4f}" in text.splitlines()[1]


def test_search_refuses_in_one_line(lmdb_store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(TESTS)
    assert "--query needs --embed" in fail("store", "search", lmdb_store, "--query", "pears")
    assert "--embed is for --query" in fail(
        "store", "search", lmdb_store, "--embed", "test_cli_store:embed"
    )
    assert "has no nothing" in fail(
        "store", "search", lmdb_store, "--query", "x", "--embed", "test_cli_store:nothing"
    )
    assert "module:function or provider:model" in fail(
        "store", "search", lmdb_store, "--query", "x", "--embed", "nocolon"
    )
    assert "--filter is not JSON" in fail("store", "search", lmdb_store, "--filter", "{kind")
    assert "--filter is a JSON object" in fail("store", "search", lmdb_store, "--filter", "[1]")
    assert "Invalid value for '--limit'" in fail("store", "search", lmdb_store, "--limit", "-1")


# -- other backends ------------------------------------------------------------------


def test_a_filestore_file_and_a_postgres_url(tmp_path: Any, postgres_url: str) -> None:
    from pg_helpers import fresh_database

    path = str(tmp_path / "store.kv")
    url = fresh_database(postgres_url)
    for where, options in ((path, {"backend": "file"}), (url, {})):
        with KVStore(where, **options) as store:
            fill(store)
            want = [list(ns) for ns in store.list_namespaces()]
        assert run_json("store", "ls", where) == want
        assert run_json("store", "get", where, "docs", "readme")["value"]["tags"] == ["a", "b"]
        got = run_json("store", "search", where, "users", "--filter", '{"kind": "metal"}')
        assert len(got) == 6 and all(d["value"]["kind"] == "metal" for d in got)


# -- beside a running writer, in a process of its own ------------------------------------


def test_the_installed_command_reads_beside_a_writer(lmdb_store: str) -> None:
    """``python -m kvsaver store ...`` in another process while this one holds
    the store open and writes: it sees every committed item and never waits."""
    env = {**os.environ, "PYTHONPATH": TESTS}
    index: Any = {"dims": DIMS, "embed": embed, "fields": ["text"]}
    with KVStore(lmdb_store, index=index) as writer:
        writer.put(("live",), "k0", {"text": "written before"})
        cmd = [sys.executable, "-m", "kvsaver", "store"]
        out = subprocess.run(
            [*cmd, "ls", lmdb_store, "--json"], capture_output=True, text=True, env=env, timeout=120
        )
        assert out.returncode == 0, out.stderr
        assert ["live"] in json.loads(out.stdout)
        writer.put(("live",), "k1", {"text": "written after"})
        out = subprocess.run(
            [*cmd, "search", lmdb_store, "live", "--query", "written after", "--embed",
             "test_cli_store:embed", "--limit", "1"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines()[1].split()[:2] == ["live", "k1"]
        missing = subprocess.run(
            [*cmd, "get", lmdb_store, "live", "k9"], capture_output=True, text=True, timeout=120
        )
        assert missing.returncode == 2 and missing.stdout == ""
        assert missing.stderr.strip() == "error: no item 'k9' in namespace live"


# -- sweep -------------------------------------------------------------------------------


def _expiring(path: str, saver: bool) -> None:
    """Items of which three expire at once (a TTL of 6 ms), and, with
    ``saver``, a thread of checkpoints in the same directory."""
    if saver:
        with KVSaver(path) as s:
            config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
            for step in range(3):
                cp = empty_checkpoint()
                config = s.put(config, cp, {"step": step, "source": "loop"}, {})
    with KVStore(path) as store:
        for i in range(5):
            store.put(("a",), f"k{i}", {"v": i}, ttl=0.0001 if i < 3 else None)
    time.sleep(0.05)


def test_sweep_removes_a_kvstores_expired_items(tmp_path: Any) -> None:
    only_items = str(tmp_path / "items")
    _expiring(only_items, saver=False)
    text = run("sweep", only_items, "--quiet")
    assert "removed 3 expired store items (KVStore)" in text and "checked" not in text
    assert run_json("sweep", only_items, "--quiet")["items_expired"] == 0
    assert [d["key"] for d in run_json("store", "search", only_items, "a")] == ["k3", "k4"]

    both = str(tmp_path / "both")
    _expiring(both, saver=True)
    doc = run_json("sweep", both, "--keep-last", "1", "--quiet")
    assert doc["checkpoints_deleted"] == 2 and doc["items_expired"] == 3
    with KVSaver(both, readonly=True) as s:
        assert len(list(s.list({"configurable": {"thread_id": "t"}}))) == 1
    with KVStore(both, readonly=True) as store:
        assert [i.key for i in store.search(("a",))] == ["k3", "k4"]

    checkpoints_only = str(tmp_path / "checkpoints")
    KVSaver(checkpoints_only).close()
    assert "--keep-last" in fail("sweep", checkpoints_only)
    assert run_json("sweep", checkpoints_only, "--keep-last", "1")["items_expired"] is None
    with KVSaver(checkpoints_only, readonly=True) as s:  # the sweep wrote no store record
        with s.store.read() as txn:
            assert txn.get(SCHEMA_KEY) is None


def test_sweep_counts_a_kvstores_items_in_live_bytes(tmp_path: Any) -> None:
    """A store of KVStore items only: their bytes are the live bytes, so a
    dense file gets no compact hint, and one whose items were mostly deleted
    gets it."""
    from langgraph.store.base import PutOp

    path = str(tmp_path / "items")
    ops = [PutOp(("mem", "u"), f"k{i}", {"text": "x" * 400, "i": i}) for i in range(3000)]
    with KVStore(path) as store:
        store.batch(ops)
    doc = run_json("sweep", path, "--quiet")
    with KVStore(path, readonly=True) as store, store.store.read() as txn:
        live = sum(len(k) + len(v) for k, v in txn.scan(None, None))  # + the sweep's record
        raw = sum(len(k) + len(v) for k, v in txn.scan(*store_range()))
    assert (doc["store_items"], doc["store_bytes"], doc["live_bytes"]) == (3000, raw, live)
    assert doc["disk_bytes"] < 2 * raw
    text = run("sweep", path, "--quiet")
    assert f"live bytes now {live:,} (KVStore: 3,000 items, {raw:,} bytes)" in text
    assert "kvsaver compact" not in text
    with KVSaver(path, readonly=True) as saver:
        stats = saver.stats()
        assert (stats.store_items, stats.store_bytes, stats.live_bytes) == (3000, raw, live)
        assert stats.checkpoints == 0 and stats.threads == []
        assert "store items           3,000  (KVStore, " in stats.format()
    with KVStore(path) as store:
        for i in range(3000):
            if i % 10:
                store.delete(("mem", "u"), f"k{i}")
    doc = run_json("sweep", path, "--quiet")
    assert doc["store_items"] == 300 and doc["disk_bytes"] > 2 * doc["live_bytes"]
    assert f"kvsaver compact {path}" in run("sweep", path, "--quiet")


# -- docs ----------------------------------------------------------------------------


def test_the_docs_name_every_store_command_and_option() -> None:
    """README.md and docs/cli.md name each ``kvsaver store`` command and each
    of its long options."""
    import click

    missing = []
    for doc in ("README.md", os.path.join("docs", "cli.md")):
        with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
            body = f.read()
        for name, command in store_group.commands.items():
            if not re.search(rf"kvsaver store {name}(?![\w-])", body):
                missing.append(f"{doc}: kvsaver store {name}")
            for param in command.params:
                if isinstance(param, click.Option):
                    for opt in param.opts:
                        if opt.startswith("--") and not re.search(
                            rf"(?<![\w-]){re.escape(opt)}(?![\w-])", body
                        ):
                            missing.append(f"{doc}: kvsaver store {name} {opt}")
    assert missing == []
