"""SqliteSaver -> KVSaver migration (saver.migrate, tools.migrate_from_sqlite):
real graphs migrated, verified and resumed on both savers; old schemas, bad
sources, empty sources, re-runs, a SIGKILL mid-run, dry runs, refusals."""

from __future__ import annotations

import io
import os
import re
import signal
import sqlite3
import subprocess
import sys
from typing import Any

import pytest
from crafted_helpers import plant
from kvsaver import EncryptedValueError, KVSaver
from kvsaver import schema as S
from kvsaver.kv.keys import pack, prefix_range
from kvsaver.migrate import (
    MigrationError,
    VerificationError,
    copy_all,
    migrate_from_sqlite,
    open_sqlite_saver,
    verify,
)
from kvsaver.tools.migrate_from_sqlite import Progress, main
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver
from migrate_helpers import (
    ROOT,
    build_synthetic_sqlite,
    checkpoint_count,
    drop_task_path,
    fanout_graph,
    populate,
    resume_all,
    run_cli,
    sqlite_saver,
    store_image,
)


@pytest.fixture(scope="module")
def graphs_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SqliteSaver database made by running the real graphs (read-only use)."""
    path = str(tmp_path_factory.mktemp("graphs") / "graphs.sqlite")
    saver = sqlite_saver(path)
    populate(saver)
    saver.conn.close()
    return path


def _copy(path: str, tmp_path) -> str:
    dst = str(tmp_path / os.path.basename(path))
    src = sqlite3.connect(path)
    out = sqlite3.connect(dst)
    src.backup(out)
    src.close()
    out.close()
    return dst


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """tools.migrate_from_sqlite in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _write_records(store) -> list[S.WriteRecord]:
    with store.read() as txn:
        return [w for _, v in txn.scan(*prefix_range((S.WRITE,))) for w in S.decode_writes(v)]


# -- the main job ------------------------------------------------------------------


def test_real_graphs_migrate_verify_and_resume_identically(graphs_db, tmp_path):
    source = _copy(graphs_db, tmp_path)  # resumed below, so a copy of its own
    dest = str(tmp_path / "state")
    rc = main([source, dest, "--quiet"])
    assert rc == 0

    src = open_sqlite_saver(source)
    with KVSaver(dest) as kv:
        # Every thread and namespace (subgraph namespaces included) is there.
        nss = {
            (t.config["configurable"]["thread_id"], t.config["configurable"]["checkpoint_ns"])
            for t in src.list(None)
        }
        assert ("sub", "") in nss and any(t == "sub" and ns for t, ns in nss)
        assert verify(src, kv, sorted(nss)) == sum(1 for _ in src.list(None))
        # The global listing matches too (SqliteSaver orders it by checkpoint id).
        assert [t.config for t in kv.list(None)] == [t.config for t in src.list(None)]
        # Pending writes kept task_id, task_path, idx and channel; values the
        # destination would not compress are the source's bytes as they were.
        rows = sorted(
            src.conn.execute("SELECT task_id, task_path, idx, channel, type, value FROM writes")
        )
        recs = sorted(
            (w.task_id, w.task_path, w.idx, w.channel, *w.value) for w in _write_records(kv.store)
        )
        assert [r[:4] for r in recs] == [r[:4] for r in rows]
        for r, w in zip(rows, recs):
            assert kv.serde.loads_typed(w[4:]) == src.serde.loads_typed(r[4:])
            assert w[4:] == r[4:] or w[4].endswith((".zst", ".zd1"))
        assert any(path for _, path, *_ in rows) and any(idx < 0 for _, _, idx, *_ in rows)
        # Metadata is exactly SqliteSaver's (no config value merged in).
        for a, b in zip(src.list(None), kv.list(None)):
            assert a.metadata == b.metadata
        from_kv = resume_all(kv)
    src.conn.close()

    from_sqlite = resume_all(sqlite_saver(source))
    assert from_kv == from_sqlite
    # The continuations really ran: interrupts answered, the fork continued.
    assert from_kv["approval"]["decision"] == "refund 42: granted"
    assert from_kv["sub"]["name"] == "Ada"
    assert len(from_kv["fanout-pending"]) == 2
    assert "ok for check item 6?" in from_kv["fanout"]["total"]
    assert any(m.content == "after the fork" for m in from_kv["chat-fork"]["messages"])


def test_migrate_to_a_postgres_url(graphs_db, tmp_path, postgres_url, capsys):
    """python -m tools.migrate_from_sqlite SRC postgresql://... (verified)."""
    from pg_helpers import fresh_database

    url = fresh_database(postgres_url)
    rc, out, err = cli(capsys, graphs_db, url, "--quiet")
    assert rc == 0, err
    assert "verified" in out or "migrated" in out
    src = open_sqlite_saver(graphs_db)
    try:
        with KVSaver(url) as kv:
            assert [t.config for t in kv.list(None)] == [t.config for t in src.list(None)]
            assert kv.stats().disk_bytes > 0
    finally:
        src.conn.close()
    rc, out, err = cli(capsys, graphs_db, url, "--quiet")  # a re-run adds nothing
    assert rc == 0, err


def test_migrated_store_is_what_put_and_put_writes_make(graphs_db, tmp_path):
    """The migration writes records through saver.schema itself; this pins it,
    byte for byte, to what KVSaver.put/put_writes store for the same data."""
    dest = str(tmp_path / "state")
    migrate_from_sqlite(graphs_db, dest, verify=False)
    src = open_sqlite_saver(graphs_db)
    try:
        with KVSaver(":memory:") as ref:
            for t in sorted(
                src.list(None), key=lambda t: t.config["configurable"]["checkpoint_id"]
            ):
                conf = t.config["configurable"]
                where = (conf["thread_id"], conf["checkpoint_ns"], conf["checkpoint_id"])
                parent = (
                    t.parent_config["configurable"]["checkpoint_id"] if t.parent_config else None
                )
                put_cfg = {"configurable": {"thread_id": where[0], "checkpoint_ns": where[1]}}
                if parent:
                    put_cfg["configurable"]["checkpoint_id"] = parent
                versions = t.checkpoint["channel_versions"]
                saved = ref.put(put_cfg, t.checkpoint, t.metadata, versions)
                rows = src.conn.execute(
                    "SELECT task_id, task_path, idx, channel, type, value FROM writes WHERE "
                    "thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ? ORDER BY idx",
                    where,
                ).fetchall()
                calls: dict[tuple[str, str, bool], list[tuple[str, object]]] = {}
                for task_id, task_path, idx, channel, type_, value in rows:
                    key = (task_id, task_path, idx < 0)
                    calls.setdefault(key, []).append(
                        (channel, src.serde.loads_typed((type_, value)))
                    )
                for (task_id, task_path, _), writes in calls.items():
                    ref.put_writes(saved, writes, task_id, task_path)
            with KVSaver(dest) as kv:
                migrated = store_image(kv.store)
            # put()/put_writes() also stamp the thread's activity with "now";
            # a migrated thread was not active now, so the migration leaves
            # that to retention, which dates such threads by their latest
            # checkpoint's ts (saver/retention.py). Everything else is equal.
            # Nor does it write head records (saver/heads.py): a
            # thread's head is made at its next put; reads before that are
            # served by the blobs (test_migrated_threads_read_without_heads).
            stamped = (pack((S.ACTIVITY,)), pack((S.IDLE,)), pack((S.HEAD,)))
            made_by_put = {
                k: v for k, v in store_image(ref.store).items() if not k.startswith(stamped)
            }
            assert len(made_by_put) < len(store_image(ref.store))  # the stamps were there
            assert migrated == made_by_put
    finally:
        src.conn.close()


def test_migrated_threads_read_without_heads_then_get_one(graphs_db, tmp_path):
    """A migrated store has no head records; every thread reads the same as
    in SqliteSaver, and its next put with whole_latest makes its head."""
    dest = str(tmp_path / "state")
    migrate_from_sqlite(graphs_db, dest, verify=False)
    src = open_sqlite_saver(graphs_db)
    try:
        with KVSaver(dest, whole_latest=True) as kv:
            with kv.store.read() as txn:
                assert next(iter(txn.scan(*S.heads_range())), None) is None
            latest = src.get_tuple({"configurable": {"thread_id": "chat-1", "checkpoint_ns": ""}})
            assert latest is not None
            got = kv.get_tuple(latest.config)
            assert got is not None and got.checkpoint == latest.checkpoint
            conf = dict(latest.config["configurable"])
            cp = {**latest.checkpoint, "id": latest.checkpoint["id"][:-1] + "z"}
            kv.put({"configurable": conf}, cp, latest.metadata, {})
            with kv.store.read() as txn:
                assert [k for k, _ in txn.scan(*S.heads_range())] == [S.head_key("chat-1", "")]
            got = kv.get_tuple({"configurable": {"thread_id": "chat-1", "checkpoint_ns": ""}})
            assert got is not None
            assert got.checkpoint["channel_values"] == latest.checkpoint["channel_values"]
    finally:
        src.conn.close()


def test_old_schema_without_task_path(graphs_db, tmp_path):
    source = _copy(graphs_db, tmp_path)
    drop_task_path(source)
    con = sqlite3.connect(source)
    assert "task_path" not in {r[1] for r in con.execute("PRAGMA table_info(writes)")}
    n_writes = con.execute("SELECT COUNT(*) FROM writes").fetchone()[0]
    con.close()
    dest = str(tmp_path / "state")

    stats = migrate_from_sqlite(source, dest)  # verify=True against SqliteSaver, read-only
    assert stats.verified == stats.checkpoints > 0
    assert stats.writes_copied == n_writes > 0
    with KVSaver(dest) as kv:
        assert {w.task_path for w in _write_records(kv.store)} == {""}
        # The old database still resumes the same way from KVSaver.
        fan = fanout_graph(kv)
        pending = fan.get_state({"configurable": {"thread_id": "fanout"}}).interrupts
        assert len(pending) == 2
    con = sqlite3.connect(source)  # the source was not migrated in place
    assert "task_path" not in {r[1] for r in con.execute("PRAGMA table_info(writes)")}
    con.close()


# -- bad sources: a clear error, nothing written -------------------------------------


def _random_bytes(tmp_path) -> str:
    path = tmp_path / "junk.db"
    path.write_bytes(os.urandom(8192))
    return str(path)


def _text(tmp_path) -> str:
    path = tmp_path / "text.db"
    path.write_text("checkpoints\n" * 200)
    return str(path)


def _damaged(tmp_path) -> str:
    path = str(tmp_path / "damaged.sqlite")
    build_synthetic_sqlite(path, threads=3, per_thread=40)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:  # keep the first page (the schema), scribble over the rest
        f.seek(4096)
        f.write(os.urandom(size // 2))
    return path


def _other_app(tmp_path) -> str:
    path = str(tmp_path / "notes.sqlite")
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    con.commit()
    con.close()
    return path


def _missing(tmp_path) -> str:
    return str(tmp_path / "missing.sqlite")


def _directory(tmp_path) -> str:
    return str(tmp_path)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_random_bytes, "is not a readable SQLite database"),
        (_text, "is not a readable SQLite database"),
        (_damaged, "is damaged|malformed"),
        (_other_app, "without a 'checkpoints' table: not a SqliteSaver database"),
        (_missing, "no such file"),
        (_directory, "is not a file"),
    ],
    ids=lambda v: getattr(v, "__name__", "")[1:] or None,
)
def test_bad_source_clear_error_nothing_written(tmp_path, capsys, make, message):
    source = make(tmp_path)
    dest = tmp_path / "out" / "state"
    rc, _, err = cli(capsys, source, str(dest))
    assert rc == 2, err
    assert re.search(message, err) and err.startswith("error: ")
    assert not dest.exists() and not dest.parent.exists()
    # An existing, empty destination directory is left empty.
    dest.mkdir(parents=True)
    with pytest.raises(MigrationError, match=message):
        migrate_from_sqlite(source, dest)
    assert list(dest.iterdir()) == []


def test_empty_source(tmp_path):
    source = str(tmp_path / "empty.sqlite")
    saver = sqlite_saver(source)
    saver.setup()
    saver.conn.close()
    dest = tmp_path / "state"
    proc = run_cli(source, str(dest))
    assert proc.returncode == 0, proc.stderr
    assert "0 copied" in proc.stdout and "verified     0 checkpoints" in proc.stdout
    with KVSaver(str(dest)) as kv:
        assert list(kv.list(None)) == []
        assert list(store_image(kv.store)) == [S.SCHEMA_KEY]


def test_checkpoint_with_unversioned_value_is_refused(tmp_path):
    source = str(tmp_path / "odd.sqlite")
    saver = sqlite_saver(source)
    cp = empty_checkpoint()
    cp["channel_values"] = {"orphan": 1}  # a value whose channel has no version
    saver.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, cp, {}, {})
    saver.conn.close()
    with pytest.raises(MigrationError, match=r"\['orphan'\] have no entry in channel_versions"):
        migrate_from_sqlite(source, tmp_path / "state")
    with KVSaver(str(tmp_path / "state")) as kv:  # the batch was rolled back
        assert checkpoint_count(kv.store) == 0


# -- re-runs, interruption, dry runs, refusals ----------------------------------------


def test_rerun_adds_nothing(graphs_db, tmp_path):
    dest = str(tmp_path / "state")
    first = migrate_from_sqlite(graphs_db, dest)
    assert first.checkpoints_copied == first.checkpoints > 0
    with KVSaver(dest) as kv:
        image = store_image(kv.store)
    second = migrate_from_sqlite(graphs_db, dest)
    assert (second.checkpoints_copied, second.writes_copied, second.blobs_written) == (0, 0, 0)
    assert second.checkpoints_present == first.checkpoints
    assert second.writes_present == first.writes_copied
    assert second.bytes_written == 0
    with KVSaver(dest) as kv:
        assert store_image(kv.store) == image


def test_sigkill_midway_then_rerun_finishes(tmp_path, capsys):
    source = str(tmp_path / "big.sqlite")
    total = build_synthetic_sqlite(source, threads=12, per_thread=100)
    # The kill must land before the tool ends (about a second after its first
    # progress line): a parent held up that long on a loaded machine tries
    # again, on a fresh destination, up to 3 times.
    done = total
    for attempt in range(3):
        dest = str(tmp_path / f"state-{attempt}")
        rc, _ = _signalled_cli(source, dest, "copy", signal.SIGKILL)
        if rc == 0:
            continue  # it ended before the kill
        with KVSaver(dest) as kv:
            done = checkpoint_count(kv.store)
        if done < total:
            break
    assert rc == -signal.SIGKILL
    assert 0 < done < total  # killed midway, with whole batches committed

    rc, out, err = cli(capsys, source, dest)
    assert rc == 0, err
    assert f"{total - done:,} copied, {done:,} already there" in out
    assert f"verified     {total:,} checkpoints" in out
    with KVSaver(dest) as kv:
        assert checkpoint_count(kv.store) == total
        image = store_image(kv.store)
    rc, out, _ = cli(capsys, source, dest, "--no-verify")
    assert rc == 0 and f"0 copied, {total:,} already there" in out
    with KVSaver(dest) as kv:
        assert store_image(kv.store) == image


def test_dry_run_writes_nothing(graphs_db, tmp_path, capsys):
    dest = tmp_path / "state"
    rc, out, err = cli(capsys, graphs_db, str(dest), "--dry-run")
    assert rc == 0, err
    stats = migrate_from_sqlite(graphs_db, dest, dry_run=True)
    assert f"{stats.checkpoints:,} would copy, 0 already there" in out
    assert stats.checkpoints_copied == stats.checkpoints > 0
    assert stats.writes_copied == stats.writes > 0
    assert not dest.exists()

    # On a partly migrated destination: counts what is left, changes nothing.
    with KVSaver(str(dest)) as kv:
        kv.delete_thread("nothing")  # just create the store
    src = sqlite3.connect(graphs_db)
    chat0 = src.execute("SELECT COUNT(*) FROM checkpoints WHERE thread_id='chat-0'").fetchone()[0]
    src.close()
    part = _copy(graphs_db, tmp_path)
    con = sqlite3.connect(part)
    con.execute("DELETE FROM checkpoints WHERE thread_id != 'chat-0'")
    con.execute("DELETE FROM writes WHERE thread_id != 'chat-0'")
    con.commit()
    con.close()
    migrate_from_sqlite(part, dest)
    with KVSaver(str(dest)) as kv:
        image = store_image(kv.store)
    stats = migrate_from_sqlite(graphs_db, dest, dry_run=True)
    assert stats.checkpoints_present == chat0
    assert stats.checkpoints_copied == stats.checkpoints - chat0
    with KVSaver(str(dest)) as kv:
        assert store_image(kv.store) == image


def test_destination_with_other_data_needs_merge(graphs_db, tmp_path, capsys):
    dest = str(tmp_path / "state")
    with KVSaver(dest) as kv:  # someone else's conversation
        graph = fanout_graph(kv)
        graph.invoke({"items": [1, 3], "results": []}, {"configurable": {"thread_id": "mine"}})
        mine_count = checkpoint_count(kv.store)
    with KVSaver(dest, readonly=True) as kv:  # as closed (with the heads close wrote)
        image = store_image(kv.store)
    rc, _, err = cli(capsys, graphs_db, dest)
    assert rc == 2
    assert "not in" in err and "--merge" in err and "'mine'" in err
    rc, _, err = cli(capsys, graphs_db, dest, "--dry-run")
    assert rc == 2 and "--merge" in err
    with KVSaver(dest) as kv:
        assert store_image(kv.store) == image

    rc, out, err = cli(capsys, graphs_db, dest, "--merge")
    assert rc == 0, err
    assert "verified" in out
    with KVSaver(dest) as kv:
        mine = list(kv.list({"configurable": {"thread_id": "mine"}}))
        assert len(mine) == mine_count > 0
        assert mine[0].checkpoint["channel_values"]["total"].startswith("split")
        assert checkpoint_count(kv.store) > mine_count


def test_destination_that_is_not_a_store_is_refused(graphs_db, tmp_path, capsys):
    dest = tmp_path / "photos"
    dest.mkdir()
    (dest / "cat.jpg").write_bytes(b"\xff\xd8 not a store")
    for extra in ([], ["--dry-run"]):
        rc, _, err = cli(capsys, graphs_db, str(dest), *extra)
        assert rc == 2 and f"cannot open the destination {dest}" in err
    assert sorted(p.name for p in dest.iterdir()) == ["cat.jpg"]


def test_an_option_the_destination_refuses_is_a_refusal(graphs_db, capsys):
    """``--durability`` is an LMDB option: with a PostgreSQL URL KVSaver
    raised TypeError, which escaped as a traceback and exit 1, the code of a
    verification that found a difference. Refused before any connection."""
    url = "postgresql://nobody@127.0.0.1:1/none"
    for extra in ([], ["--dry-run"]):
        rc, _, err = cli(capsys, graphs_db, url, "--durability", "meta", *extra)
        assert rc == 2, err
        assert f"cannot open the destination {url}" in err
        assert "'durability' applies only to the lmdb backend" in err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_bug_while_opening_the_destination_is_not_a_refusal(graphs_db, tmp_path, monkeypatch):
    """Only KVSaver's own OptionError is a refusal: a TypeError from
    anywhere else in opening the store (a bug) keeps its type and traceback."""

    def broken(self: Any) -> None:
        raise TypeError("a bug in opening")

    monkeypatch.setattr(KVSaver, "_check_schema", broken)
    with pytest.raises(TypeError, match="a bug in opening"):
        migrate_from_sqlite(graphs_db, str(tmp_path / "state"))


def test_verification_mismatch_shows_first_difference(graphs_db, tmp_path, capsys):
    dest = str(tmp_path / "state")
    migrate_from_sqlite(graphs_db, dest, verify=False)
    with KVSaver(dest) as kv:  # a write the source does not have
        latest = kv.get_tuple({"configurable": {"thread_id": "approval", "checkpoint_ns": ""}})
        assert latest is not None
        kv.put_writes(latest.config, [("decision", "forged")], task_id="intruder")
    rc, out, err = cli(capsys, graphs_db, dest)
    assert rc == 1
    assert "verification failed: thread 'approval' namespace '': list()[0].pending_writes" in err
    assert "destination 'intruder'" in err
    assert "copied" in out  # the summary of the copy is still printed
    with pytest.raises(VerificationError, match=r"pending_writes"):
        migrate_from_sqlite(graphs_db, dest)


def test_verify_reports_missing_and_extra_checkpoints(graphs_db, tmp_path):
    dest = str(tmp_path / "state")
    migrate_from_sqlite(graphs_db, dest)
    src = open_sqlite_saver(graphs_db)
    approval = {"configurable": {"thread_id": "approval", "checkpoint_ns": ""}}
    n = sum(1 for _ in src.list(approval))
    try:
        with KVSaver(dest) as kv:
            latest = kv.get_tuple(approval)
            assert latest is not None
            newer = {**latest.checkpoint, "id": str(uuid6(clock_seq=-1))}
            kv.put(latest.config, newer, {"source": "elsewhere"}, {})  # type: ignore[arg-type]
            with pytest.raises(VerificationError, match=r"list\(\)\[0\] is checkpoint .+ on the"):
                verify(src, kv, [("approval", "")])
            # After a merge, checkpoints only the destination has are not compared.
            assert verify(src, kv, [("approval", "")], exact=False) == n
            kv.delete_thread("approval")
            with pytest.raises(VerificationError, match=r"destination's list\(\) has ended"):
                verify(src, kv, [("approval", "")], exact=False)
    finally:
        src.conn.close()


def test_encrypted_destination_reencodes(graphs_db, tmp_path):
    serde = EncryptedSerializer.from_pycryptodome_aes(key=b"0123456789abcdef")
    with KVSaver(str(tmp_path / "state"), serde=serde) as kv:
        stats = migrate_from_sqlite(graphs_db, kv)
        assert stats.verified == stats.checkpoints
        types = {w.value[0] for w in _write_records(kv.store)}
        assert types and all(t.endswith("+aes") for t in types)
    with KVSaver(str(tmp_path / "state")) as plain:  # without the key nothing decodes
        with pytest.raises(EncryptedValueError, match=r"type 'msgpack(\.zst|\.zd1)?\+aes'"):
            list(plain.list(None))


def _pickled_source(path: str, *, checkpoint: bool = True) -> int:
    """A real SqliteSaver with pickle_fallback=True, holding an int too large
    for msgpack (so it falls back to pickle) as a small pending write, and
    (``checkpoint``) a whole checkpoint that had to be pickled. Returns the int."""
    big = 2**70 + 3
    saver = SqliteSaver(
        sqlite3.connect(path, check_same_thread=False),
        serde=JsonPlusSerializer(pickle_fallback=True),
    )
    v = {"n": saver.get_next_version(None, None)}
    plain = empty_checkpoint()
    plain["channel_values"], plain["channel_versions"] = {"n": 1}, dict(v)
    saved = saver.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, plain, {}, v)
    saver.put_writes(saved, [("n", big)], "task-1")
    if checkpoint:
        v2 = {"n": saver.get_next_version(v["n"], None)}
        pickled = empty_checkpoint()
        pickled["channel_values"], pickled["channel_versions"] = {"n": big}, dict(v2)
        saver.put(saved, pickled, {}, v2)
    q = saver.conn.execute
    assert [r[0] for r in q("SELECT type FROM writes")] == ["pickle"]  # by SqliteSaver itself
    expected = ["msgpack", "pickle"] if checkpoint else ["msgpack"]
    assert sorted(r[0] for r in q("SELECT type FROM checkpoints")) == expected
    saver.conn.close()
    return big


@pytest.mark.parametrize("checkpoint", [False, True], ids=["write", "write+checkpoint"])
@pytest.mark.parametrize("verify_", [True, False])
def test_pickled_source_values_are_refused_up_front(tmp_path, verify_, checkpoint):
    """Small pickled writes were copied as they were, type "pickle",
    which KVSaver cannot read: verify=False reported success, verify=True
    ended in an uncaught NotImplementedError."""
    source = str(tmp_path / "pickled.sqlite")
    _pickled_source(source, checkpoint=checkpoint)
    dest = str(tmp_path / "state")
    with pytest.raises(MigrationError, match="pickle") as info:
        migrate_from_sqlite(
            source,
            dest,
            verify=verify_,
            source_serde=JsonPlusSerializer(pickle_fallback=True),
        )
    assert "nothing was copied" in str(info.value) and "thread 't'" in str(info.value)
    with KVSaver(dest) as kv:
        assert checkpoint_count(kv.store) == 0
    # Without a source serializer that reads pickles: refused as well, saying how.
    with pytest.raises(MigrationError, match="pickle_fallback=True"):
        migrate_from_sqlite(source, dest, verify=verify_)


def test_pickled_source_values_are_reencoded_for_the_destination(tmp_path):
    """A destination whose serializer can store the value gets it re-encoded
    by that serializer (not the source's bytes), and reads it back."""
    source = str(tmp_path / "pickled.sqlite")
    big = _pickled_source(source)
    with KVSaver(str(tmp_path / "state"), serde=JsonPlusSerializer(pickle_fallback=True)) as kv:
        stats = migrate_from_sqlite(
            source, kv, source_serde=JsonPlusSerializer(pickle_fallback=True)
        )
        assert stats.verified == stats.checkpoints == 2
        tuples = list(kv.list({"configurable": {"thread_id": "t"}}))
        assert tuples[0].checkpoint["channel_values"] == {"n": big}
        assert tuples[1].pending_writes == [("task-1", "n", big)]


# -- copy_all through public methods (no server needed) -------------------------------


def test_copy_all_public_path_from_inmemory(tmp_path):
    mem = InMemorySaver()
    populate(mem)
    with KVSaver(":memory:") as kv:
        stats = copy_all(mem, kv)
        assert stats.checkpoints_copied == stats.checkpoints == stats.verified > 0
        # Public pending writes carry no task_path: stored as "" (documented).
        assert {w.task_path for w in _write_records(kv.store)} == {""}
        again = copy_all(mem, kv)
        assert again.checkpoints_copied == 0 and again.checkpoints_present == stats.checkpoints
        assert resume_all(kv) == resume_all(mem)


def test_copy_all_refuses_foreign_destination():
    mem = InMemorySaver()
    fanout_graph(mem).invoke({"items": [2], "results": []}, {"configurable": {"thread_id": "a"}})
    with KVSaver(":memory:") as kv:
        fanout_graph(kv).invoke({"items": [1], "results": []}, {"configurable": {"thread_id": "b"}})
        with pytest.raises(MigrationError, match="thread 'b'"):
            copy_all(mem, kv)
        stats = copy_all(mem, kv, merge=True)
        assert stats.verified == stats.checkpoints > 0


# -- the progress bar -----------------------------------------------------------------


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_terminal_and_plain_lines_elsewhere():
    tty = _Tty()
    bar = Progress(tty)
    for done in (0, 50, 100):
        bar("copy", done, 100)
    bar.finish()
    out = tty.getvalue()
    assert out.startswith("\rcopy   [") and "100% 100/100 checkpoints" in out
    assert out.count("\n") == 1 and "#" * Progress.WIDTH in out

    log = io.StringIO()
    plain = Progress(log)
    for done in range(0, 101):
        plain("copy", done, 100)
    lines = log.getvalue().splitlines()
    assert len(lines) == 11 and "\r" not in log.getvalue()
    assert lines[0].startswith("copy: 0/100") and lines[-1].startswith("copy: 100/100 checkpoints")

    unknown = io.StringIO()  # copy_all does not know its total ahead
    counter = Progress(unknown)
    counter("copy", 5, 0)
    counter("copy", 6, 0)  # within the same second: not printed
    assert unknown.getvalue().startswith("copy: 5 checkpoints, ")
    assert unknown.getvalue().count("\n") == 1


# -- Ctrl-C ----------------------------------------------------------------------------


def _ctrl_c_inside_a_hook(armed: list[bool]) -> JsonPlusSerializer:
    """LangGraph's serializer whose msgpack ext_hook, once ``armed``, sends this
    process SIGINT and lets the handler run right there, inside the hook: the
    KeyboardInterrupt that ormsgpack used to turn into ValueError('ext_hook failed')."""
    real = JsonPlusSerializer()._unpack_ext_hook

    def hook(code: int, data: bytes) -> Any:
        if armed[0]:
            armed[0] = False
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the Python handler runs at a bytecode boundary here
                pass
        return real(code, data)

    return JsonPlusSerializer(__unpack_ext_hook__=hook)


@pytest.fixture
def sigint_default():
    """SIGINT raising KeyboardInterrupt, as in a terminal, for the test (a
    suite started in the background, ``pytest &``, inherits it ignored)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("phase", ["copy", "verify"])
def test_ctrl_c_inside_decoding_is_a_keyboard_interrupt(tmp_path, phase, sigint_default):
    source = str(tmp_path / "chat.sqlite")
    total = build_synthetic_sqlite(source, threads=3, per_thread=20)
    dest = str(tmp_path / "state")
    armed = [False]
    fired = []

    def progress(now: str, done: int, _total: int) -> None:
        # Once: mid-copy after the first batch, or as verification starts.
        if now == phase and (done > 0 or phase == "verify") and not fired:
            fired.append(done)
            armed[0] = True

    with pytest.raises(KeyboardInterrupt):
        migrate_from_sqlite(
            source,
            dest,
            batch_size=5,
            source_serde=_ctrl_c_inside_a_hook(armed),
            progress=progress,
            dest_options={"durability": "none"},
        )
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    with KVSaver(dest) as kv:
        copied = checkpoint_count(kv.store)
    if phase == "copy":
        assert 0 < copied < total and copied % 5 == 0  # whole batches only
    else:
        assert copied == total
    stats = migrate_from_sqlite(source, dest)  # resumes; what was committed verifies
    assert stats.checkpoints_present == copied and stats.verified == total


def _sigint_as_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _signalled_cli(source: str, dest: str, phase: str, sig: int, *options: str) -> tuple[int, str]:
    """The tool in a subprocess, sent ``sig`` once ``phase`` has made
    progress: (its return code, its stderr)."""
    args = [source, dest, "--batch-size", "10", *options]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.migrate_from_sqlite", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # SIGINT as a terminal leaves it: a suite started in the background
        # passes it on ignored, and the tool would never see the signal.
        preexec_fn=_sigint_as_default,
    )
    assert proc.stderr is not None
    lines = []
    try:
        for line in proc.stderr:  # plain progress lines: stderr is a pipe
            lines.append(line)
            if line.startswith(f"{phase}: ") and not line.startswith(f"{phase}: 0/"):
                proc.send_signal(sig)
                break
        lines.append(proc.stderr.read())
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait(timeout=30)
        proc.stderr.close()
    return proc.returncode, "".join(lines)


@pytest.mark.parametrize("phase", ["copy", "verify"])
def test_ctrl_c_in_the_tool_exits_130_and_rerun_resumes(tmp_path, capsys, phase):
    """It printed ValueError('ext_hook failed') and exited 2 (copy) or 1,
    "a difference was found" (verify)."""
    source = str(tmp_path / "big.sqlite")
    total = build_synthetic_sqlite(source, threads=12, per_thread=100)
    for attempt in range(3):  # the signal must land before the tool ends: see above
        dest = str(tmp_path / f"state-{attempt}")
        rc, err = _signalled_cli(source, dest, phase, signal.SIGINT, "--durability", "none")
        if rc != 0:
            break
    assert rc == 130, err
    assert err.rstrip().endswith("interrupted; re-run to resume"), err
    assert "Traceback" not in err and "ext_hook" not in err, err
    rc, out, err = cli(capsys, source, dest)
    assert rc == 0, err
    assert f"verified     {total:,} checkpoints" in out


# -- stored data that names code to run ------------------------------------------------


def test_verification_never_runs_code_named_in_stored_data(tmp_path):
    """A re-run copies nothing already there and verifies both sides: it finds
    the planted difference without running the call planted in the store."""
    source = str(tmp_path / "chat.sqlite")
    build_synthetic_sqlite(source, threads=2, per_thread=4)
    dest = str(tmp_path / "state")
    migrate_from_sqlite(source, dest)
    marker = tmp_path / "the-planted-call-ran"
    with KVSaver(dest) as kv:
        plant(kv.store, marker)
    with pytest.raises(VerificationError, match="planted"):
        migrate_from_sqlite(source, dest)
    assert not marker.exists()
    # The planted call is live: LangGraph's permissive mode runs it.
    permissive = JsonPlusSerializer(allowed_msgpack_modules=True)
    with KVSaver(dest, serde=permissive) as kv:
        kv.get_tuple({"configurable": {"thread_id": "thread-0000"}})
    assert marker.is_dir()


def test_one_encrypted_serializer_for_source_and_destination(tmp_path):
    """Writes copied as they are when the source's serializer is the
    destination's very object are stored bytes already (encrypted): they are
    not compressed or encrypted again (by the small-value compression)."""
    from kvsaver import CompressingSerializer

    serde = EncryptedSerializer.from_pycryptodome_aes(key=b"0123456789abcdef")
    serde.serde = CompressingSerializer(serde.serde)
    db = str(tmp_path / "enc.sqlite")
    src = SqliteSaver(sqlite3.connect(db, check_same_thread=False), serde=serde)
    v = {"messages": src.get_next_version(None, None)}
    cp = empty_checkpoint()
    cp["channel_values"], cp["channel_versions"] = {"messages": ["x"]}, dict(v)
    saved = src.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, cp, {}, v)
    value = "a pending write long enough to be compressed " * 8
    src.put_writes(saved, [("messages", value)], "task-1")
    src.conn.close()
    with KVSaver(str(tmp_path / "state"), serde=serde) as kv:
        assert kv.serde is serde
        migrate_from_sqlite(db, kv, source_serde=serde)
        [w] = _write_records(kv.store)
        assert w.value[0] == "msgpack+aes"
        t = kv.get_tuple({"configurable": {"thread_id": "t"}})
        assert t is not None and t.pending_writes == [("task-1", "messages", value)]
