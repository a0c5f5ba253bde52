"""Issue #13: heads wanted by readers of other processes (saver/whole/hints.py and
KVSaver's use of it with whole_latest="idle").

A reader that finds a thread's latest checkpoint without its head (the put
came less than a second ago, before the writer's idle thread) marks it; the
writer's next puts of that thread write the head in their transaction. The
writer's own reads mark nothing; a hint is advice: a lost one costs speed,
never data, and no hint ever fails a call.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kvsaver.whole.hints as hints_mod
import pytest
from kvsaver import KVSaver
from kvsaver import heads as H
from kvsaver import schema as S
from kvsaver import threads as TH
from kvsaver import whole as W
from kvsaver.whole.hints import HINTS_FILE, SLOTS, Hints
from saver_helpers import config, make_checkpoint, tuple_dict

HOSTILE = ["t", "", "a\x00b", "emoji 🧵", "x" * 10_000]


@pytest.fixture(autouse=True)
def read_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table's copy is read again at most every 0.1 s; these tests mark
    and look within a millisecond."""
    monkeypatch.setattr(hints_mod, "_REFRESH", 0.0)


def put(saver: KVSaver, thread: str, n: int, ns: str = "") -> None:
    """Checkpoint ``n`` of ``thread`` (ids in put order, as LangGraph's
    are): a growing list and a changing string."""
    values = {"a": list(range(n)), "b": f"v{n}"}
    versions = {"a": str(n), "b": str(n)}
    parent = f"{n - 1:06d}" if n > 1 else None
    cp = make_checkpoint(f"{n:06d}", values, versions)
    saver.put(config(thread, ns, parent), cp, {"source": "loop", "step": n}, versions)


def head_is_current(saver: KVSaver, thread: str, ns: str = "") -> bool:
    with saver.store.read() as txn:
        raw = TH.find_record(txn, thread, ns, None)
        return raw is not None and H.payload(txn.get(S.head_key(thread, ns)), raw) is not None


def read_often(saver: KVSaver, thread: str) -> None:
    """Reads of the latest, enough to mark a thread found without its head."""
    for _ in range(W.WANT_AFTER):
        assert saver.get_tuple(config(thread)) is not None


def writer(path: Path, **options: Any) -> KVSaver:
    """A saver whose idle thread waits an hour: heads here come from puts."""
    saver = KVSaver(path, **options)
    assert saver._heads.idle is not None
    saver._heads.idle.delay = 3600
    return saver


# -- the table ------------------------------------------------------------------------


def test_a_mark_is_seen_by_another_table_of_the_same_store(tmp_path: Path) -> None:
    a, b = Hints(str(tmp_path)), Hints(str(tmp_path))
    assert not (tmp_path / HINTS_FILE).exists()  # nobody marked: no file
    assert not b.recent(b"k", 10)
    a.mark(b"k")
    assert (tmp_path / HINTS_FILE).stat().st_size == SLOTS * 4
    assert b.recent(b"k", 10)
    assert not b.recent(b"other key", 10)
    a.close()
    b.close()


def test_a_mark_ages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h = Hints(str(tmp_path))
    now = 1_800_000_000
    monkeypatch.setattr(hints_mod, "_now", lambda: now)
    h.mark(b"k")
    assert h.recent(b"k", 10)
    now += 10
    assert h.recent(b"k", 10)
    now += 1
    assert not h.recent(b"k", 10)
    now = 5  # the wall clock set back past the mark: not recent either
    assert not h.recent(b"k", 10)
    h.close()


def test_the_table_never_fails_a_caller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h = Hints(str(tmp_path))

    def full(*a: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(hints_mod.os, "pwrite", full)
        h.mark(b"k")  # a full disk: the mark is dropped
    assert not h.recent(b"k", 10)
    gone = Hints(str(tmp_path / "no such directory"))
    gone.mark(b"k")  # a directory it cannot write: dropped
    assert not gone.recent(b"k", 10)
    h.mark(b"k")
    assert h.recent(b"k", 10)
    h.close()
    h.mark(b"j")  # closed: nothing, no error
    assert not h.recent(b"k", 10)


def test_a_table_cut_short_or_replaced_under_its_readers(tmp_path: Path) -> None:
    """No descriptor or mapping is kept: a file truncated under a reader reads
    as zeros (a mapping would have been a SIGBUS), one deleted and made again
    is the one read next."""
    a, b = Hints(str(tmp_path)), Hints(str(tmp_path))
    a.mark(b"k")
    assert b.recent(b"k", 10)
    os.truncate(tmp_path / HINTS_FILE, 0)
    assert not b.recent(b"k", 10)
    os.truncate(tmp_path / HINTS_FILE, 6)  # cut inside a slot
    assert not b.recent(b"k", 10)
    (tmp_path / HINTS_FILE).unlink()
    assert not b.recent(b"k", 10)
    a.mark(b"k")
    assert b.recent(b"k", 10)


def test_a_mark_is_seen_within_the_refresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The asking side reads a copy of the table at most every _REFRESH
    seconds (a put asks at each call: no system call each time)."""
    monkeypatch.setattr(hints_mod, "_REFRESH", 3600.0)
    a, b = Hints(str(tmp_path)), Hints(str(tmp_path))
    assert not b.recent(b"k", 10)  # reads: no file yet
    a.mark(b"k")
    assert not b.recent(b"k", 10)  # its copy, read just now
    b._read_at -= 3600
    assert b.recent(b"k", 10)


# -- KVSaver --------------------------------------------------------------------------


@pytest.mark.parametrize("thread", HOSTILE)
def test_a_reader_elsewhere_gets_heads_from_the_next_puts(tmp_path: Path, thread: str) -> None:
    path = tmp_path / "s"
    with writer(path) as w, KVSaver(path) as r:
        put(w, thread, 1)
        read_often(r, thread)  # no head: marks the thread
        put(w, thread, 2)
        assert head_is_current(w, thread)
        got = r.get_tuple(config(thread))
        with KVSaver(path, whole_latest=False) as plain:  # the same tuple from the blobs
            assert tuple_dict(got) == tuple_dict(plain.get_tuple(config(thread)))
        assert got is not None and got.checkpoint["channel_values"] == {"a": [0, 1], "b": "v2"}
        put(w, thread, 3)  # and the puts after it, while the mark is recent
        assert head_is_current(w, thread)
        put(w, "another thread", 1)  # not the threads nobody marked
        assert not head_is_current(w, "another thread")


def test_a_reader_in_another_process(tmp_path: Path) -> None:
    """The issue's setting: a read-only reader process, a writer process."""
    path = tmp_path / "s"
    with writer(path) as w:
        put(w, "t", 1)
        code = textwrap.dedent(
            f"""
            from kvsaver import KVSaver
            with KVSaver({str(path)!r}, readonly=True) as r:
                for _ in range({W.WANT_AFTER}):
                    got = r.get_tuple({{"configurable": {{"thread_id": "t", "checkpoint_ns": ""}}}})
                    assert got.checkpoint["channel_values"]["b"] == "v1"
            """
        )
        subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
        put(w, "t", 2)
        assert head_is_current(w, "t")


def test_the_writers_own_reads_want_no_heads(tmp_path: Path) -> None:
    """A graph reads its thread at each invoke: its puts stay without heads
    (its idle thread writes them once the thread is left alone)."""
    path = tmp_path / "s"
    with writer(path) as w:
        for n in range(1, 4):
            put(w, "t", n)
            read_often(w, "t")
        assert not head_is_current(w, "t")
        assert not (path / HINTS_FILE).exists()


@pytest.mark.parametrize("side", ["writer", "reader"])
def test_whole_latest_false_neither_marks_nor_writes(tmp_path: Path, side: str) -> None:
    path = tmp_path / "s"
    w = KVSaver(path, whole_latest=False) if side == "writer" else writer(path)
    r = KVSaver(path, whole_latest=False if side == "reader" else "idle")
    with w, r:
        put(w, "t", 1)
        read_often(r, "t")
        put(w, "t", 2)
        assert not head_is_current(w, "t")


def test_an_old_mark_is_let_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s"
    now = 1_800_000_000
    monkeypatch.setattr(hints_mod, "_now", lambda: now)
    with writer(path) as w, KVSaver(path) as r:
        put(w, "t", 1)
        read_often(r, "t")
        now += W.WANTED_SECONDS + 1
        put(w, "t", 2)
        assert not head_is_current(w, "t")


def test_a_cap_the_store_cannot_tell_means_no_head_not_a_failed_put(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s"
    with writer(path, max_size=1 << 20) as w, KVSaver(path) as r:
        put(w, "t", 1)
        read_often(r, "t")

        def broken() -> int:
            raise OSError("cannot tell")

        monkeypatch.setattr(w.store, "used_bytes", broken)
        put(w, "t", 2)
        assert not head_is_current(w, "t")
        assert w.get_tuple(config("t")) is not None


def test_a_saver_made_before_fork_writes_wanted_heads_in_the_child(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with writer(path) as w, KVSaver(path) as r:
        put(w, "t", 1)
        pid = os.fork()
        if pid == 0:  # the child: marks and puts through the parent's savers
            code = 1
            try:
                read_often(r, "t")
                put(w, "t", 2)
                code = 0 if head_is_current(w, "t") else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert head_is_current(w, "t")


def test_no_wanted_heads_near_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with writer(path, max_size=1 << 20) as w, KVSaver(path) as r:
        put(w, "t", 1)
        read_often(r, "t")
        used = w.store.info()["used_bytes"]  # type: ignore[attr-defined]
        w.store.max_size = used + used // 4  # type: ignore[attr-defined]
        put(w, "t", 2)
        assert not head_is_current(w, "t")
        w.store.max_size = 1 << 20  # type: ignore[attr-defined]
        put(w, "t", 3)
        assert head_is_current(w, "t")


def test_only_a_thread_read_often_is_marked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WANT_AFTER reads without a head within MARK_SECONDS mark it, once;
    fewer (a poller) do not: a head costs the writer."""
    path = tmp_path / "s"
    marks: list[bytes] = []
    clock = [1000.0]
    monkeypatch.setattr(W, "_monotonic", lambda: clock[0])
    with writer(path) as w, KVSaver(path) as r:
        put(w, "t", 1)
        clock[0] += 10  # (r is another saver: w's idle thread, not r's, waits for "t")
        monkeypatch.setattr(r._heads.hints, "mark", marks.append)
        for _ in range(W.WANT_AFTER - 1):  # polled: each read a window apart
            r.get_tuple(config("t"))
            clock[0] += W.MARK_SECONDS + 0.1
        assert marks == []
        for _ in range(W.WANT_AFTER - 1):  # the poller's reads are not counted now
            r.get_tuple(config("t"))
        assert marks == []
        for _ in range(2 * W.WANT_AFTER):  # read often: one mark per window
            r.get_tuple(config("t"))
        assert marks == [S.head_key("t", "")]
        clock[0] += W.MARK_SECONDS + 0.1  # and again in the next window
        for _ in range(W.WANT_AFTER):
            r.get_tuple(config("t"))
        assert marks == [S.head_key("t", "")] * 2


@contextlib.contextmanager
def _killed_at_exit(proc: subprocess.Popen[str]) -> Iterator[None]:
    try:
        yield
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_readers_of_threads_being_written_see_whole_states_in_order(tmp_path: Path) -> None:
    """A writer process puts checkpoints 1..N of five threads as fast as it
    can while this process reads their latest: every state read is one
    checkpoint's whole state (values and id agree), each thread's never goes
    back, and the writer's last puts wrote the heads this reader wanted."""
    path = tmp_path / "s"
    threads = [f"t{i}" for i in range(5)]
    with KVSaver(path) as w:
        for t in threads:
            put(w, t, 1)
    code = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_hints import head_is_current, put, writer
        from pathlib import Path
        import time
        with writer(Path({str(path)!r})) as w:
            n, deadline = 1, time.monotonic() + 60
            while True:  # 160 rounds at least; then until its puts write the heads
                n += 1
                for t in {threads!r}:
                    put(w, t, n)
                heads = [head_is_current(w, t) for t in {threads!r}]
                if n >= 160 and (all(heads) or time.monotonic() > deadline):
                    break
            print(json.dumps([n, heads]))
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    seen = dict.fromkeys(threads, 1)
    reads = 0
    with KVSaver(path, readonly=True) as r, _killed_at_exit(proc):
        while proc.poll() is None or reads == 0:
            t = threads[reads % len(threads)]
            got = r.get_tuple(config(t))
            assert got is not None
            n = int(got.checkpoint["id"])
            assert got.checkpoint["channel_values"] == {"a": list(range(n)), "b": f"v{n}"}
            assert got.metadata["step"] == n
            assert n >= seen[t]
            seen[t] = n
            reads += 1
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        last, heads = json.loads(out)
        assert heads == [True] * len(threads)
        for t in threads:  # the newest, read once the writer is gone
            got = r.get_tuple(config(t))
            assert got is not None and int(got.checkpoint["id"]) == last >= seen[t]
