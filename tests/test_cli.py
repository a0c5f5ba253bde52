"""The ``kvsaver`` command: threads, history, show, diff over
stores made by real LangGraph graphs (LMDB, FileStore, SqliteSaver), checked
against what the savers themselves return; strict decoding; read-only use
beside a running writer; errors; the installed entry points."""

from __future__ import annotations

import dataclasses
import json
import os
import pty
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import Any

import pytest
from click.testing import CliRunner
from kvsaver import KVSaver
from kvsaver.tools.cli import cli, jsonable
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import StateGraph
from saver_helpers_graphs import (
    approval_graph,
    chain,
    chat_graph,
    counter_graph,
    human,
    nested_graph,
)
from typing_extensions import TypedDict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ["lmdb", "file", "sqlite"]


# -- a class outside LangGraph's msgpack allowlist -------------------------------------

CONSTRUCTED: list[str] = []


@dataclasses.dataclass
class Secret:
    """Stored in a channel; building it has a visible side effect."""

    payload: str

    def __post_init__(self) -> None:
        CONSTRUCTED.append(self.payload)


class SecretState(TypedDict):
    secret: Any
    note: str


def secret_graph(checkpointer: Any) -> Any:
    builder = StateGraph(SecretState)
    builder.add_node("hide", lambda s: {"secret": Secret("rm -rf"), "note": "hidden"})
    chain(builder, "hide")
    return builder.compile(checkpointer=checkpointer)


# -- the stores ------------------------------------------------------------------------


def cfg(thread: str, **extra: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, **extra}}


def build(saver: BaseCheckpointSaver[Any]) -> None:
    """Threads: a chat, an interrupted approval, a subgraph paused inside
    its namespace, a counter forked by update_state on an old checkpoint,
    and a channel holding a class outside the allowlist."""
    chat = chat_graph(saver)
    for i in range(3):
        chat.invoke(human(i), cfg("chat"))
    approval_graph(saver).invoke({"request": "deploy", "log": []}, cfg("approval"))
    nested_graph(saver).invoke({"items": []}, cfg("nested"))
    counter = counter_graph(saver)
    counter.invoke({"value": 1, "trail": []}, cfg("counter"))
    old = list(counter.get_state_history(cfg("counter")))[-3]  # after "double"
    fork = counter.update_state(old.config, {"value": 100})
    counter.invoke(None, fork)
    secret_graph(saver).invoke({"secret": None, "note": ""}, cfg("secret"))


def open_saver(kind: str, path: str, readonly: bool = False) -> BaseCheckpointSaver[Any]:
    if kind == "sqlite":
        return SqliteSaver(sqlite3.connect(path, check_same_thread=False))
    return KVSaver(path, backend="file" if kind == "file" else "lmdb", readonly=readonly)


def close(saver: Any) -> None:
    if isinstance(saver, SqliteSaver):
        saver.conn.close()
    else:
        saver.close()


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    base = tmp_path_factory.mktemp("cli")
    paths = {
        "lmdb": str(base / "state"),
        "file": str(base / "state.kvs"),
        "sqlite": str(base / "checkpoints.sqlite"),
    }
    for kind, path in paths.items():
        saver = open_saver(kind, path)
        try:
            build(saver)
        finally:
            close(saver)
    CONSTRUCTED.clear()  # the graph built its Secret; reads must not
    yield paths


@pytest.fixture
def ref(stores: dict[str, str], request: pytest.FixtureRequest) -> Iterator[Any]:
    """(store path, a saver on it) for the kind the test is parametrized with."""
    kind = request.param
    saver = open_saver(kind, stores[kind], readonly=True)
    yield stores[kind], saver
    close(saver)


def run(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == code, (result.output, result.stderr)
    return result.stdout


def run_json(*args: str) -> Any:
    return json.loads(run(*args, "--json"))


def fail(*args: str) -> str:
    """A command that must exit 2 with one line on stderr; the line."""
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 2, (result.output, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def versions_changed(saver: Any, t: Any) -> list[str]:
    parent = saver.get_tuple(t.parent_config) if t.parent_config else None
    before = parent.checkpoint["channel_versions"] if parent else {}
    now = t.checkpoint["channel_versions"]
    return sorted(ch for ch, v in now.items() if before.get(ch) != v)


# -- threads ---------------------------------------------------------------------------


@pytest.mark.parametrize("ref", KINDS, indirect=True)
def test_threads_json_matches_the_saver(ref: Any) -> None:
    path, saver = ref
    doc = run_json("threads", path)
    assert sorted(t["thread_id"] for t in doc) == [
        "approval",
        "chat",
        "counter",
        "nested",
        "secret",
    ]
    for t in doc:
        thread = t["thread_id"]
        tuples = list(saver.list(cfg(thread)))
        assert t["checkpoints"] == len(tuples)
        assert t["namespaces"] == sorted(
            {x.config["configurable"]["checkpoint_ns"] for x in tuples}
        )
        latest = saver.get_tuple(cfg(thread, checkpoint_ns=""))
        assert t["last_checkpoint_id"] == latest.checkpoint["id"]
        assert t["last_ts"] == latest.checkpoint["ts"]
        assert (t["bytes"] is None) == path.endswith(".sqlite")
    assert any(ns.startswith("child:") for t in doc for ns in t["namespaces"])
    # Most recently active first: the graphs ran in this order.
    assert [t["thread_id"] for t in doc] == ["secret", "counter", "nested", "approval", "chat"]
    assert [t["thread_id"] for t in run_json("threads", path, "--limit", "2")] == [
        "secret",
        "counter",
    ]
    assert [t["thread_id"] for t in run_json("threads", path, "--match", "co")] == ["counter"]


def test_threads_bytes_are_the_stats(stores: dict[str, str]) -> None:
    with KVSaver(stores["lmdb"], readonly=True) as saver:
        stats = {t.thread_id: t for t in saver.stats().threads}
    for t in run_json("threads", stores["lmdb"]):
        assert t["bytes"] == stats[t["thread_id"]].bytes
        assert t["writes"] == stats[t["thread_id"]].writes


def test_threads_table(stores: dict[str, str]) -> None:
    out = run("threads", stores["lmdb"], "--full").splitlines()
    assert out[0].split() == [
        "thread",
        "checkpoints",
        "namespaces",
        "last",
        "checkpoint",
        "last",
        "activity",
        "bytes",
    ]
    assert [line.split()[0] for line in out[1:-1]] == [
        "secret",
        "counter",
        "nested",
        "approval",
        "chat",
    ]
    assert out[-1] == "5 threads"


# -- history ---------------------------------------------------------------------------


@pytest.mark.parametrize("ref", KINDS, indirect=True)
@pytest.mark.parametrize("thread", ["chat", "approval", "counter", "nested"])
def test_history_json_is_the_state_history(ref: Any, thread: str) -> None:
    path, saver = ref
    graph = counter_graph(saver)  # any graph: get_state_history reads the saver
    expected = list(graph.get_state_history(cfg(thread)))
    doc = run_json("history", path, thread, "--ns", "")
    assert [h["checkpoint_id"] for h in doc] == [
        s.config["configurable"]["checkpoint_id"] for s in expected
    ]
    for h, s in zip(doc, expected):
        t = saver.get_tuple(s.config)
        assert h["checkpoint_ns"] == ""
        assert h["step"] == s.metadata["step"] and h["source"] == s.metadata["source"]
        parent = s.parent_config["configurable"]["checkpoint_id"] if s.parent_config else None
        assert h["parent_checkpoint_id"] == parent
        assert h["pending_writes"] == len(t.pending_writes)
        assert h["changed"] == versions_changed(saver, t)
    # Without --ns: every namespace, newest first, as list() gives them.
    every = run_json("history", path, thread)
    assert [(h["checkpoint_ns"], h["checkpoint_id"]) for h in every] == [
        (x.config["configurable"]["checkpoint_ns"], x.config["configurable"]["checkpoint_id"])
        for x in saver.list(cfg(thread))
    ]
    assert run_json("history", path, thread, "--limit", "2") == every[:2]


def test_history_shows_the_fork_and_the_interrupt(stores: dict[str, str]) -> None:
    doc = run_json("history", stores["lmdb"], "counter", "--ns", "")
    update = [h for h in doc if h["source"] == "update"]
    assert len(update) == 1 and "value" in update[0]["changed"]
    assert "trail" not in update[0]["changed"]
    parents = [h["parent_checkpoint_id"] for h in doc]
    assert parents.count(update[0]["parent_checkpoint_id"]) == 2  # two children: a fork
    approval = run_json("history", stores["lmdb"], "approval")
    assert approval[0]["pending_writes"] >= 1  # the interrupt, waiting for an answer
    nested = run_json("history", stores["lmdb"], "nested")
    assert {h["checkpoint_ns"].split(":")[0] for h in nested} == {"", "child"}


def test_history_table(stores: dict[str, str]) -> None:
    out = run("history", stores["lmdb"], "chat", "--full").splitlines()
    assert out[0].split() == ["checkpoint", "step", "source", "writes", "parent", "changed"]
    rows = run_json("history", stores["lmdb"], "chat")
    assert len(out) == 1 + len(rows)
    first = out[1].split()
    assert first[:4] == [rows[0]["checkpoint_id"], str(rows[0]["step"]), "loop", "0"]
    assert out[1].endswith(", ".join(rows[0]["changed"]))
    assert out[-1].split()[4] == "-"  # the first checkpoint has no parent


# -- show ------------------------------------------------------------------------------


@pytest.mark.parametrize("ref", KINDS, indirect=True)
def test_show_json_is_get_tuple(ref: Any) -> None:
    path, saver = ref
    t = saver.get_tuple(cfg("chat", checkpoint_ns=""))
    doc = run_json("show", path, "chat")
    assert doc["checkpoint_id"] == t.checkpoint["id"]
    assert doc["parent_checkpoint_id"] == t.parent_config["configurable"]["checkpoint_id"]
    assert doc["metadata"]["step"] == t.metadata["step"]
    assert doc["metadata"]["source"] == t.metadata["source"]
    messages = t.checkpoint["channel_values"]["messages"]
    assert [(m["type"], m["content"], m["id"]) for m in doc["channel_values"]["messages"]] == [
        (m.type, m.content, m.id) for m in messages
    ]
    assert doc["channel_values"]["turns"] == 3
    assert doc["pending_writes"] == []
    # An older checkpoint, by id; the interrupted thread's pending writes.
    old = list(saver.list(cfg("chat"), limit=4))[-1]
    doc = run_json("show", path, "chat", old.checkpoint["id"])
    assert doc["checkpoint_id"] == old.checkpoint["id"]
    assert run_json("show", path, "chat", old.checkpoint["id"][:-4]) == doc  # a unique prefix
    assert len(doc["channel_values"]["messages"]) == len(
        old.checkpoint["channel_values"]["messages"]
    )
    t = saver.get_tuple(cfg("approval", checkpoint_ns=""))
    doc = run_json("show", path, "approval")
    assert [(w["task_id"], w["channel"]) for w in doc["pending_writes"]] == [
        (task, ch) for task, ch, _ in t.pending_writes
    ]
    interrupts = [w["value"] for w in doc["pending_writes"] if w["channel"] == "__interrupt__"]
    assert interrupts and interrupts[0][0]["value"] == {"question": "approve deploy?"}
    assert doc["channel_values"]["request"] == "deploy"
    assert doc["channel_values"]["log"] == t.checkpoint["channel_values"]["log"]


@pytest.mark.parametrize("ref", KINDS, indirect=True)
def test_show_a_subgraph_checkpoint_by_id(ref: Any) -> None:
    path, saver = ref
    sub = next(t for t in saver.list(cfg("nested")) if t.config["configurable"]["checkpoint_ns"])
    doc = run_json("show", path, "nested", sub.checkpoint["id"])  # found in any namespace
    assert doc["checkpoint_ns"] == sub.config["configurable"]["checkpoint_ns"]
    assert doc["channel_values"]["items"] == sub.checkpoint["channel_values"]["items"]
    ns_doc = run_json("show", path, "nested", "--ns", doc["checkpoint_ns"])
    latest = saver.get_tuple(cfg("nested", checkpoint_ns=doc["checkpoint_ns"]))
    assert ns_doc["checkpoint_id"] == latest.checkpoint["id"]


def test_show_channel_and_text(stores: dict[str, str]) -> None:
    doc = run_json("show", stores["lmdb"], "chat", "--channel", "turns")
    assert doc["channel_values"] == {"turns": 3}
    out = run("show", stores["lmdb"], "chat", "--full")
    assert "  messages  6 messages\n    human: turn 0\n    ai: echo 1: turn 0\n" in out
    assert "  turns     3\n" in out
    assert "\nmetadata\n" in out and "pending writes (0)" in out
    out = run("show", stores["lmdb"], "approval", "--full")
    assert "pending writes (1)" in out and '"question": "approve deploy?"' in out


def test_strict_decoding_never_builds_unallowed_classes(stores: dict[str, str]) -> None:
    name = f"{Secret.__module__}.Secret"
    CONSTRUCTED.clear()  # reference savers of other tests build it
    for kind in KINDS:
        out = run("show", stores[kind], "secret", "--full")
        assert f"  secret  <unallowed type {name}>" in out
        doc = run_json("show", stores[kind], "secret")
        assert doc["channel_values"]["secret"] == {
            "unallowed_type": name,
            "data": {"payload": "rm -rf"},
        }
        run_json("threads", stores[kind])
        run_json("history", stores[kind], "secret")
    assert CONSTRUCTED == []
    # The test can fail: LangGraph's default serializer builds it.
    with KVSaver(stores["lmdb"], readonly=True) as saver:
        value = saver.get_tuple(cfg("secret"))
    assert isinstance(value.checkpoint["channel_values"]["secret"], Secret)
    assert CONSTRUCTED == ["rm -rf"]
    CONSTRUCTED.clear()


def test_long_values_are_cut_on_a_terminal(stores: dict[str, str], tmp_path: Any) -> None:
    """In a real pseudo-terminal, 50 columns wide: lines are cut to 50 with a
    '…'; --full shows them whole; a pipe gets them whole."""

    def on_terminal(*args: str) -> list[str]:
        master, slave = pty.openpty()
        env = {**os.environ, "COLUMNS": "50", "LINES": "40"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvsaver", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            cwd=tmp_path,
        )
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        os.close(master)
        assert proc.wait(timeout=120) == 0
        return b"".join(chunks).decode().replace("\r\n", "\n").splitlines()

    cut = on_terminal("show", stores["lmdb"], "chat")
    assert max(len(line) for line in cut) == 50
    assert any(line.endswith("…") for line in cut)
    assert "    human: turn 0" in cut
    whole = on_terminal("show", stores["lmdb"], "chat", "--full")
    assert max(len(line) for line in whole) > 50 and not any(line.endswith("…") for line in whole)
    piped = run("show", stores["lmdb"], "chat").splitlines()
    assert piped == whole


# -- diff ------------------------------------------------------------------------------


@pytest.mark.parametrize("ref", KINDS, indirect=True)
def test_diff_json(ref: Any) -> None:
    path, saver = ref
    chat = list(saver.list(cfg("chat", checkpoint_ns="")))
    a, b = chat[-1], chat[0]  # the first checkpoint and the last
    doc = run_json("diff", path, "chat", a.checkpoint["id"], b.checkpoint["id"])
    va, vb = a.checkpoint["channel_values"], b.checkpoint["channel_values"]
    assert doc["added"] == sorted(set(vb) - set(va))
    assert doc["removed"] == sorted(set(va) - set(vb))
    assert "messages" in doc["added"]
    assert [m["id"] for m in doc["messages"]["messages"]["added"]] == [m.id for m in vb["messages"]]
    # Between two turns: messages added, nothing removed; turns changed.
    after1 = next(  # the oldest with the first turn's two messages: no __start__ value
        t for t in reversed(chat) if len(t.checkpoint["channel_values"].get("messages", [])) == 2
    )
    doc = run_json("diff", path, "chat", after1.checkpoint["id"], b.checkpoint["id"])
    assert doc["added"] == [] and doc["removed"] == []
    assert doc["changed"] == ["messages", "turns"]
    assert doc["values"]["turns"] == {"a": 1, "b": 3}
    moved = doc["messages"]["messages"]
    assert [m["id"] for m in moved["added"]] == ["h-1", "ai-3", "h-2", "ai-5"]
    assert moved["removed"] == []
    # The fork: the two latest leaves of the counter differ in value and trail.
    counter = list(saver.list(cfg("counter", checkpoint_ns="")))
    leaves = [t for t in counter if t.metadata["source"] == "loop" and not _children(counter, t)]
    assert len(leaves) == 2
    x, y = leaves
    doc = run_json("diff", path, "counter", x.checkpoint["id"], y.checkpoint["id"])
    vx, vy = x.checkpoint["channel_values"], y.checkpoint["channel_values"]
    assert doc["changed"] == sorted(c for c in set(vx) & set(vy) if vx[c] != vy[c])
    assert doc["values"]["value"] == {"a": vx["value"], "b": vy["value"]}


def _children(tuples: list[Any], t: Any) -> list[Any]:
    cid = t.checkpoint["id"]
    return [
        x
        for x in tuples
        if x.parent_config and x.parent_config["configurable"]["checkpoint_id"] == cid
    ]


def test_diff_text(stores: dict[str, str]) -> None:
    path = stores["lmdb"]
    doc = run_json("history", path, "chat", "--ns", "")
    turn2 = next(h for h in doc if h["step"] == 4)  # after the second reply
    out = run("diff", path, "chat", turn2["checkpoint_id"], doc[0]["checkpoint_id"], "--full")
    lines = out.splitlines()
    assert lines[0].startswith("A  " + turn2["checkpoint_id"])
    assert "~ messages  +2 -0 messages" in lines
    assert "    + human: turn 2" in lines and "    + ai: echo 5: turn 2" in lines
    assert "~ turns     2  ->  3" in lines
    same = run("diff", path, "chat", doc[0]["checkpoint_id"], doc[0]["checkpoint_id"])
    assert same.splitlines()[-1] == "no differences in channel values"


# -- the existing commands, as subcommands ------------------------------------------------


def test_migrate_stats_sweep_compact_subcommands(stores: dict[str, str], tmp_path: Any) -> None:
    dest = str(tmp_path / "migrated")
    result = run_json("migrate", stores["sqlite"], dest, "--quiet")
    assert result["verified"] == result["checkpoints"] > 0
    fields = ("thread_id", "checkpoints", "namespaces", "last_checkpoint_id", "last_ts")
    pick = lambda doc: sorted([{k: t[k] for k in fields} for t in doc], key=str)  # noqa: E731
    assert pick(run_json("threads", dest)) == pick(run_json("threads", stores["sqlite"]))
    stats = run_json("stats", dest)
    assert stats["checkpoints"] == result["checkpoints"]
    swept = run_json("sweep", dest, "--keep-last", "1", "--quiet")
    assert swept["checkpoints_deleted"] > 0
    assert run_json("compact", dest, "--quiet")["compacted"] is True
    assert all(t["checkpoints"] <= 2 for t in run_json("threads", dest))  # 1 per namespace


# -- beside a running writer ---------------------------------------------------------------

WRITER = """
import sys
sys.path.insert(0, {tests!r})
from kvsaver import KVSaver
from saver_helpers_graphs import chat_graph, human
with KVSaver({path!r}) as saver:
    graph = chat_graph(saver)
    for i in range({turns}):
        graph.invoke(human(i), {{"configurable": {{"thread_id": "live"}}}})
        print(i, flush=True)
"""


def test_reads_beside_a_running_writer_process(tmp_path: Any) -> None:
    """A writer process keeps invoking a graph while the command reads the
    same store again and again: the writer never stops making progress (LMDB
    readers take no lock a writer waits for), every read is a consistent
    prefix of the thread, and the writer finishes with every turn stored."""
    path = str(tmp_path / "live")
    turns = 400
    code = WRITER.format(tests=os.path.join(ROOT, "tests"), path=path, turns=turns)
    writer = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    assert writer.stdout is not None
    try:
        for line in writer.stdout:  # wait for a few committed turns
            if int(line) >= 3:
                break
        progressed_during_reads = False
        first_seen = None
        for _ in range(100):
            history = run_json("history", path, "live", "--ns", "")
            steps = [h["step"] for h in history]
            assert steps == sorted(steps, reverse=True) and steps[-1] == -1
            shown = run_json("show", path, "live")
            values = shown["channel_values"]
            # A whole step: the human message alone (an input checkpoint) or
            # with the bot's answer, never half of a checkpoint.
            assert len(values["messages"]) - 2 * values.get("turns", 0) in (0, 1)
            threads = run_json("threads", path)
            assert threads[0]["thread_id"] == "live"
            first_seen = first_seen or threads[0]["checkpoints"]
            if threads[0]["checkpoints"] >= first_seen + 12:
                progressed_during_reads = True
                break
        assert progressed_during_reads, "the writer made no progress while the command read"
        for _ in writer.stdout:
            pass
        assert writer.wait(timeout=300) == 0
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    final = run_json("show", path, "live")
    assert final["channel_values"]["turns"] == turns


# -- the SqliteSaver source ---------------------------------------------------------------


def test_sqlite_source_needs_langgraph_checkpoint_sqlite(
    stores: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "langgraph.checkpoint.sqlite", None)
    line = fail("threads", stores["sqlite"])
    assert "pip install 'kvsaver[tools]'" in line


@pytest.mark.parametrize("command", ["threads", "compact"])
def test_postgres_url_without_psycopg_names_the_extra(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    line = fail(command, "postgresql://nobody@127.0.0.1:1/none")
    assert "pip install 'kvsaver[postgres]'" in line


def test_encrypted_without_pycryptodome_names_the_extra(
    stores: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("Crypto", "Crypto.Cipher", "Crypto.Cipher.AES"):  # imported or not
        monkeypatch.setitem(sys.modules, name, None)
    line = fail("threads", stores["lmdb"], "--encrypted")
    assert "pip install 'kvsaver[tools]'" in line


def test_sqlite_source_is_opened_read_only(stores: dict[str, str], tmp_path: Any) -> None:
    """SqliteSaver.setup() would switch the file to WAL (header bytes 18-19)
    and create tables; reading through the command changes no byte."""
    copy = str(tmp_path / "copy.sqlite")
    shutil.copy(stores["sqlite"], copy)
    conn = sqlite3.connect(copy)
    assert conn.execute("PRAGMA journal_mode=DELETE").fetchone() == ("delete",)
    conn.close()
    before = open(copy, "rb").read()
    assert run_json("threads", copy)[0]["thread_id"] == "secret"
    run_json("history", copy, "chat")
    run_json("show", copy, "chat")
    assert open(copy, "rb").read() == before
    assert sorted(os.listdir(tmp_path)) == ["copy.sqlite"]


# -- errors: exit status 2, one line -------------------------------------------------------


def test_errors(stores: dict[str, str], tmp_path: Any) -> None:
    path = stores["lmdb"]
    assert "no thread 'ghost'" in fail("show", path, "ghost")
    assert "no thread 'ghost'" in fail("history", path, "ghost")
    assert "no thread 'ghost'" in fail("diff", path, "ghost", "a", "b")
    assert "no checkpoint 'nope' in thread 'chat'" in fail("show", path, "chat", "nope")
    latest = run_json("show", path, "chat")["checkpoint_id"]
    assert "no checkpoint 'nope'" in fail("diff", path, "chat", latest, "nope")
    assert "no channel 'ghost'" in fail("show", path, "chat", "--channel", "ghost")
    assert "is the start of 9 checkpoint ids" in fail("show", path, "chat", latest[:4])
    assert "namespace 'x'" in fail("history", path, "chat", "--ns", "x")
    # Bad stores.
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "empty").mkdir()
    sqlite3.connect(str(tmp_path / "other.db")).execute("create table t (a)").connection.close()
    assert "not a store kvsaver reads" in fail("threads", str(tmp_path / "notes.txt"))
    assert "no such file or directory" in fail("threads", str(tmp_path / "missing"))
    assert "without data.mdb" in fail("threads", str(tmp_path / "empty"))
    assert "not a SqliteSaver one" in fail("threads", str(tmp_path / "other.db"))
    assert "PostgreSQL" in fail("threads", "postgresql://me:secret@127.0.0.1:9/app")
    assert "secret" not in fail("threads", "postgresql://me:secret@127.0.0.1:9/app")
    # Bad arguments.
    assert "--limit" in fail("history", path, "chat", "--limit", "0")
    assert "--bogus" in fail("threads", path, "--bogus")
    assert "Missing argument" in fail("show", path)
    assert os.listdir(tmp_path / "empty") == []  # nothing created by a refused open


# -- the real command ------------------------------------------------------------------------


def test_python_dash_m_kvsaver(stores: dict[str, str], tmp_path: Any) -> None:
    """From outside the clone: the installed package, not the source tree."""
    out = subprocess.run(
        [sys.executable, "-m", "kvsaver", "history", stores["lmdb"], "chat", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert [h["checkpoint_id"] for h in json.loads(out.stdout)] == [
        h["checkpoint_id"] for h in run_json("history", stores["lmdb"], "chat")
    ]
    bad = subprocess.run(
        [sys.executable, "-m", "kvsaver", "show", stores["lmdb"], "ghost"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.splitlines() == [f"error: no thread 'ghost' in {stores['lmdb']}"]
    # Nothing listens there: one line, the server's refusal, not psycopg_pool's
    # warnings (a line per attempt, 30 s of them before).
    down = subprocess.run(
        [sys.executable, "-m", "kvsaver", "threads", "postgresql://me:secret@127.0.0.1:9/app"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert down.returncode == 2 and down.stdout == ""
    (line,) = down.stderr.splitlines()
    assert line.startswith("error: ") and "cannot connect to PostgreSQL" in line, line
    assert "refused" in line
    assert "secret" not in line


def test_console_script_is_installed(stores: dict[str, str], tmp_path: Any) -> None:
    (ep,) = entry_points(group="console_scripts", name="kvsaver")
    assert ep.value == "kvsaver.tools.cli:main"
    script = shutil.which("kvsaver", path=os.path.dirname(sys.executable))
    assert script is not None
    out = subprocess.run(
        [script, "threads", stores["file"], "--limit", "1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1].split()[0] == "secret"
    assert subprocess.run([script, "--help"], capture_output=True, timeout=120).returncode == 0


def test_jsonable_forms() -> None:
    from decimal import Decimal
    from uuid import UUID

    from langchain_core.messages import AIMessage

    msg = AIMessage("hi", id="a1", tool_calls=[{"name": "f", "args": {"x": 1}, "id": "c1"}])
    form = jsonable({"m": msg, "b": b"\x00\x01", "d": Decimal("1.5"), "u": UUID(int=1)})
    assert form["m"]["type"] == "ai" and form["m"]["content"] == "hi"
    assert form["m"]["tool_calls"][0]["name"] == "f"
    assert form["b"] == {"bytes_base64": "AAE="}
    assert form["d"] == "1.5" and form["u"] == str(UUID(int=1))
    assert jsonable(msg, human=True) == "ai: hi"
    json.dumps(form)  # all of it is JSON


def test_kvsaver_stores_are_opened_read_only(stores: dict[str, str]) -> None:
    from kvsaver.kv import ReadOnlyError
    from kvsaver.tools.sources import open_source

    for kind in ("lmdb", "file"):
        with open_source(stores[kind]) as src:
            assert src.saver.store.readonly
            with pytest.raises(ReadOnlyError):
                src.saver.delete_thread("chat")


def test_encrypted_store(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    path = str(tmp_path / "secret-state")
    monkeypatch.setenv("LANGGRAPH_AES_KEY", "0123456789abcdef0123456789abcdef")
    with KVSaver(path, serde=EncryptedSerializer.from_pycryptodome_aes()) as saver:
        chat_graph(saver).invoke(human(0), cfg("t"))
    doc = run_json("show", path, "t", "--encrypted")
    assert [m["content"] for m in doc["channel_values"]["messages"]] == ["turn 0", "echo 1: turn 0"]
    assert run_json("threads", path, "--encrypted")[0]["thread_id"] == "t"
    assert "add --encrypted" in fail("show", path, "t")
    monkeypatch.setenv("LANGGRAPH_AES_KEY", "1123456789abcdef0123456789abcdef")
    assert "cannot decode" in fail("history", path, "t", "--encrypted")
    monkeypatch.delenv("LANGGRAPH_AES_KEY")
    assert "LANGGRAPH_AES_KEY" in fail("show", path, "t", "--encrypted")


def test_the_readme_names_every_command_and_option() -> None:
    """Docs that match the code: each command of ``kvsaver`` and each of its
    long options appears in README.md (an option added without a word there
    fails here)."""
    import re

    import click

    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()

    def named(word: str) -> bool:  # the whole word: --batch is not --batch-size
        return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", readme) is not None

    missing = []
    for name, command in cli.commands.items():
        if not named(f"kvsaver {name}"):
            missing.append(f"kvsaver {name}")
        for param in [*cli.params, *command.params]:
            if not isinstance(param, click.Option):
                continue
            for opt in param.opts + param.secondary_opts:
                if opt.startswith("--") and opt != "--help" and not named(opt):
                    missing.append(f"kvsaver {name} {opt}")
    assert missing == []
