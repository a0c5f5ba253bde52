"""Many processes on one directory, read-only readers, and fork.

Real processes (spawn, except where fork is what is tested), several threads
in each, one store. Readers must only ever see whole checkpoints, no
"locked"/"busy" error may reach a caller, and every acknowledged put must be
in the store afterwards (checked by a fresh process). Workers live in
``procs_helpers.py``; every process is killed and reaped on the way out.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import select
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kvsaver.kv.lmdb.environment as lmdb_environment
import procs_helpers as H
import pytest
from kvsaver import KVSaver
from kvsaver.kv import KVError

SPAWN = mp.get_context("spawn")
pytestmark = pytest.mark.timeout(180)


def test_many_processes_one_directory(tmp_path: Path) -> None:
    """2 writer processes x 2 threads and 3 reader processes x 2 threads for a
    few seconds; then a fresh process checks every acknowledged put."""
    store = str(tmp_path / "store")
    KVSaver(store).close()  # read-only readers need the store to exist
    duration = 4.0
    writer_threads = [["w0-0", "w0-1"], ["w1-0", "w1-1"]]
    all_threads = [t for ts in writer_threads for t in ts]
    barrier = SPAWN.Barrier(len(writer_threads) + 3 + 1)
    results: list[Path] = []
    procs: list[Any] = []
    with H.reaped(procs):
        for i, threads in enumerate(writer_threads):
            res = tmp_path / f"writer-{i}.jsonl"
            results.append(res)
            args = (store, threads, str(tmp_path / f"ack-{i}"), str(res), barrier, duration)
            procs.append(SPAWN.Process(target=H.mp_writer, args=args))
        for i in range(3):
            res = tmp_path / f"reader-{i}.jsonl"
            results.append(res)
            readonly = i != 0  # one reader opens the store read-write, two read-only
            args = (store, all_threads, str(res), barrier, duration, readonly, 2)
            procs.append(SPAWN.Process(target=H.mp_reader, args=args))
        for p in procs:
            p.start()
        barrier.wait(120)  # everyone opened the store: start the clock together
        for p in procs:
            p.join(duration + 60)
        reports = [H.read_reports(r) for r in results]
        for rep, p in zip(reports, procs):
            assert rep, f"no report from pid {p.pid} (exit code {p.exitcode})"
            assert rep[-1]["ok"], json.dumps(rep[-1], indent=1)[:4000]
            assert p.exitcode == 0
        puts = sum(r[-1]["puts"] for r in reports[:2])
        reads = sum(r[-1]["reads"] for r in reports[2:])
        # Every writer thread and every reader made progress under contention.
        for path in tmp_path.glob("ack-*"):
            assert len(H.read_acks([path])) > 0, path
        assert all(r[-1]["reads"] > 0 for r in reports[2:])

        acks = sorted(str(p) for p in tmp_path.glob("ack-*"))
        final = tmp_path / "verify.jsonl"
        verifier = SPAWN.Process(target=H.verify_worker, args=(store, acks, str(final)))
        procs.append(verifier)
        verifier.start()
        verifier.join(120)
        result = H.read_reports(final)[-1]
    assert result["ok"], result
    assert result["acked"] == puts == len(H.read_acks(acks))
    print(
        f"\n4 writer threads (2 processes), 6 reader threads (3 processes): "
        f"{puts} acknowledged puts, {reads} reads, all checked, 0 lost, 0 errors"
    )


def test_readonly_reader_sees_commits_as_they_happen(tmp_path: Path) -> None:
    """A read-only saver in another process, opened before the writer starts,
    sees each new checkpoint as it is committed, across several growths of
    the writer's map (the reader adopts them)."""
    store = str(tmp_path / "store")
    KVSaver(store, map_size=64 * 1024).close()
    n = 60
    ready, go = SPAWN.Event(), SPAWN.Event()
    reader_res, writer_res = tmp_path / "reader.jsonl", tmp_path / "writer.jsonl"
    reader = SPAWN.Process(
        target=H.ro_reader, args=(store, "t", n - 1, 90.0, str(reader_res), ready)
    )
    writer = SPAWN.Process(
        target=H.paced_writer,
        args=(store, "t", n, 0.02, str(tmp_path / "ack"), str(writer_res), go),
    )
    procs = [reader, writer]
    with H.reaped(procs):
        reader.start()
        writer.start()
        assert ready.wait(120), "the reader did not open the store"
        go.set()
        writer.join(120)
        reader.join(120)
        w = H.read_reports(writer_res)[-1]
        r = H.read_reports(reader_res)[-1]
    assert w["ok"], w
    assert r["ok"], r
    seen = r["seen"]
    assert seen[-1] == n - 1  # it saw the last commit
    assert seen == sorted(seen)  # never an older one after a newer one
    # It saw them one by one while they were committed, not all at the end.
    assert len(seen) >= n // 3, seen
    # The writer's map grew past the reader's initial one (adopted by the reader).
    assert w["info"]["map_size"] > 64 * 1024
    print(
        f"\nread-only reader saw {len(seen)} of {n} checkpoints as they were committed; "
        f"writer map grew to {w['info']['map_size']:,} bytes"
    )


# -- fork -----------------------------------------------------------------------------


def _child(fn: Any, timeout: float = 60.0) -> tuple[int, dict[str, Any]]:
    """Fork; run ``fn()`` in the child, which reports a JSON dict through a pipe
    and _exits. Returns (exit status, report); a child still running after
    ``timeout`` is killed and reported as hung."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 1
        try:
            os.close(r)
            out = fn()
            os.write(w, json.dumps(out).encode())
            code = 0
        except BaseException as e:
            os.write(w, json.dumps({"error": repr(e)}).encode())
        finally:
            os._exit(code)
    os.close(w)
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    try:
        while time.monotonic() < deadline:
            if select.select([r], [], [], 0.1)[0]:
                chunk = os.read(r, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
        else:
            os.kill(pid, signal.SIGKILL)
            chunks = [json.dumps({"error": f"child hung for {timeout:.0f} s"}).encode()]
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), json.loads(b"".join(chunks) or b"{}")


def _put(saver: KVSaver, thread: str, n: int) -> list[str]:
    w = H.LoopWriter(saver, thread, os.devnull, fsync_ack=False)
    return [w.step() for _ in range(n)]


def _whole(saver: KVSaver, thread: str, ids: list[str]) -> bool:
    tups = [saver.get_tuple(H.thread_config(thread, cid)) for cid in ids]
    return all(t is not None and not H.check_tuple(t, expect_marker=True) for t in tups)


def test_saver_created_before_fork_works_in_child_and_parent(tmp_path: Path) -> None:
    saver = KVSaver(tmp_path / "store")
    try:
        before = _put(saver, "parent", 3)

        def child() -> dict[str, Any]:
            assert _whole(saver, "parent", before)  # inherited data readable
            ids = _put(saver, "child", 5)
            assert _whole(saver, "child", ids)
            return {"ids": ids, "pid": os.getpid()}

        # The parent keeps writing and reading while the child runs.
        stop = threading.Event()
        parent_ids: list[str] = []

        def parent_work() -> None:
            w = H.LoopWriter(saver, "parent-bg", os.devnull, fsync_ack=False)
            while not stop.is_set():
                parent_ids.append(w.step())

        bg = threading.Thread(target=parent_work)
        bg.start()
        children = []
        try:
            # Several forks, each landing at some moment of the parent's writes.
            for _ in range(10):
                children.append(_child(child, timeout=30))
        finally:
            stop.set()
            bg.join()
        for code, out in children:
            assert code == 0, out
            assert out["pid"] != os.getpid()
            assert _whole(saver, "child", out["ids"])  # the parent sees the child's puts
        assert _whole(saver, "parent", before) and _whole(saver, "parent-bg", parent_ids)
        assert _whole(saver, "parent", _put(saver, "parent", 2))  # and still works
    finally:
        saver.close()
    with KVSaver(tmp_path / "store", readonly=True) as fresh:
        assert len(list(fresh.list(None))) == 3 + 10 * 5 + len(parent_ids) + 2


def test_fork_pool_workers_use_inherited_saver(tmp_path: Path) -> None:
    """A multiprocessing Pool with the "fork" start method: each task runs two
    threads that put and read back with the saver created in the parent,
    while a parent thread keeps reading (forks wait for its reads)."""
    saver = KVSaver(tmp_path / "store")
    H.FORK_SAVER = saver
    stop = threading.Event()
    reads = [0]

    def parent_reader() -> None:
        while not stop.is_set():
            saver.get_tuple(H.thread_config("pool-0-0"))
            reads[0] += 1

    bg = threading.Thread(target=parent_reader)
    try:
        _put(saver, "before-fork", 2)
        bg.start()
        with mp.get_context("fork").Pool(3) as pool:
            results = pool.map(H.fork_pool_task, range(6), chunksize=1)
        stop.set()
        bg.join()
        stored = {(t, c) for r in results for t, c in (x.split() for x in r)}
        assert len(stored) == 6 * 2 * 5
        for thread, cid in stored:
            tup = saver.get_tuple(H.thread_config(thread, cid))
            assert tup is not None and not H.check_tuple(tup, expect_marker=True)
        assert reads[0] > 0
    finally:
        stop.set()
        if bg.is_alive():
            bg.join()
        H.FORK_SAVER = None
        saver.close()


@contextmanager
def _read_held(saver: KVSaver) -> Iterator[threading.Event]:
    """A read transaction of ``saver`` held open in another thread until the
    yielded event is set (or the block ends); the thread is joined on exit."""
    opened, release = threading.Event(), threading.Event()

    def hold() -> None:
        with saver.store.read():
            opened.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    opened.wait(10)
    try:
        yield release
    finally:
        release.set()
        holder.join()


def test_fork_waits_for_a_short_read_in_another_thread(tmp_path: Path) -> None:
    saver = KVSaver(tmp_path / "store")
    try:
        ids = _put(saver, "t", 2)
        with _read_held(saver) as release:
            t0 = time.monotonic()  # before the timer: its 0.3 s cannot end before t0 + 0.3
            threading.Timer(0.3, release.set).start()
            code, out = _child(lambda: {"ok": _whole(saver, "t", ids), "new": _put(saver, "c", 1)})
            waited = time.monotonic() - t0
        assert code == 0 and out["ok"], out
        assert waited >= 0.29  # fork() waited for the read to finish
        assert _whole(saver, "c", out["new"])
    finally:
        saver.close()


def test_fork_during_a_long_read_gives_the_child_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read held longer than the fork wait (shortened here from 5 s): in the
    child, the inherited saver and a saver opened anew on the same directory
    (py-lmdb refuses to open the same files twice in a process) both raise a
    clear KVError naming the store; the parent is unaffected."""
    monkeypatch.setattr(lmdb_environment, "_FORK_WAIT_SECONDS", 0.2)
    path = tmp_path / "store"
    saver = KVSaver(path)
    try:
        ids = _put(saver, "t", 2)

        def child() -> dict[str, Any]:
            out: dict[str, Any] = {}
            try:
                saver.get_tuple(H.thread_config("t"))
                out["inherited"] = "no error"
            except KVError as e:
                out["inherited"] = str(e)
            try:
                KVSaver(path).close()
                out["fresh"] = "no error"
            except KVError as e:
                out["fresh"] = str(e)
            return out

        with _read_held(saver):
            code, out = _child(child)
        assert code == 0, out
        for what in ("inherited", "fresh"):
            message = out[what]
            assert str(path) in message and "forked" in message and "spawn" in message, out
        assert _whole(saver, "t", ids) and _whole(saver, "t2", _put(saver, "t2", 1))

        # The thread that forks while itself inside a read: the same clear error.
        with saver.store.read():
            code, out = _child(child)
        assert code == 0 and "forked" in out["inherited"] and "forked" in out["fresh"], out
        assert _whole(saver, "t3", _put(saver, "t3", 1))
    finally:
        saver.close()


def test_file_backend_fork_keeps_every_acknowledged_put(tmp_path: Path) -> None:
    """With backend="file", forked children inherited the writer's
    lock, and each process rewrote the whole file from its own copy at every
    commit, so puts acknowledged in one process vanished. Here a fork Pool's
    workers (two threads each) and a thread of the parent put at the same
    time; a fresh read-only saver then finds every acknowledged checkpoint."""
    path = tmp_path / "state.kvs"
    saver = KVSaver(path, backend="file")
    H.FORK_SAVER = saver
    stop = threading.Event()
    parent_ids: list[str] = []
    child_ids: list[str] = []

    def parent_writer() -> None:
        w = H.LoopWriter(saver, "parent-bg", os.devnull, fsync_ack=False)
        while not stop.is_set():
            parent_ids.append(w.step())

    bg = threading.Thread(target=parent_writer)
    try:
        before = _put(saver, "before-fork", 3)
        # One child at a time, the parent writing after each: the parent's
        # next commit used to rewrite the file without the child's puts.
        for _ in range(3):
            code, out = _child(lambda: {"ids": _put(saver, "child", 2)}, timeout=60)
            assert code == 0, out
            before += _put(saver, "before-fork", 1)
            child_ids += out["ids"]
            assert _whole(saver, "child", out["ids"])  # the parent sees them
        # Then children and a parent thread at the same time.
        bg.start()
        with mp.get_context("fork").Pool(3) as pool:
            results = pool.map_async(H.fork_pool_task, range(6), chunksize=1).get(120)
        stop.set()
        bg.join()
        after = _put(saver, "after-fork", 2)
    finally:
        stop.set()
        if bg.is_alive():
            bg.join()
        H.FORK_SAVER = None
        saver.close()
    acked = [("before-fork", c) for c in before] + [("after-fork", c) for c in after]
    acked += [("parent-bg", c) for c in parent_ids]
    acked += [tuple(x.split()) for r in results for x in r]
    acked += [("child", c) for c in child_ids]
    assert len(acked) == 6 + 2 + len(parent_ids) + 6 * 2 * 5 + 6 and parent_ids
    with KVSaver(path, backend="file", readonly=True) as fresh:
        missing = [(t, c) for t, c in acked if fresh.get_tuple(H.thread_config(t, c)) is None]
        assert not missing, f"{len(missing)} of {len(acked)} acknowledged puts lost"
        for thread, cid in acked:
            tup = fresh.get_tuple(H.thread_config(thread, cid))
            assert tup is not None and not H.check_tuple(tup, expect_marker=True)
        assert len(list(fresh.list(None))) == len(acked)


def test_async_calls_in_a_forked_child_after_the_parent_made_its_pool(tmp_path: Path) -> None:
    """Async calls run in the saver's own thread pool, made at the
    first one. A child forked after that has the pool object but none of its
    threads: its async calls get a pool of their own instead of waiting
    forever on the parent's."""
    saver = KVSaver(tmp_path / "store")
    try:
        cfg = H.thread_config("parent")
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.base.id import uuid6

        def checkpoint() -> Any:
            c = empty_checkpoint()
            c["id"] = str(uuid6())
            return c

        asyncio.run(saver.aput(cfg, checkpoint(), {}, {}))  # the parent's pool exists now

        def child() -> dict[str, Any]:
            async def main() -> str:
                out = await saver.aput(H.thread_config("child"), checkpoint(), {}, {})
                got = await saver.aget_tuple(H.thread_config("child"))
                assert got is not None
                return str(out["configurable"]["checkpoint_id"])

            return {"id": asyncio.run(main())}

        code, out = _child(child, timeout=30)
        assert code == 0, out
        got = saver.get_tuple(H.thread_config("child"))
        assert got is not None and got.config["configurable"]["checkpoint_id"] == out["id"]
        asyncio.run(saver.aput(cfg, checkpoint(), {}, {}))  # the parent's pool still works
    finally:
        saver.close()
