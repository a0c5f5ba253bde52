"""saver/whole/idle.py: work for a key once it is left alone (the heads of idle
threads). No assertion on time: waits are bounded polls."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from typing import Any

import pytest
from kvsaver.whole.idle import BATCH, IdleWork


class _Owner:
    """What an IdleWork's owner stands for here (a saver): held by the test."""


OWNER = _Owner()


def make(delay: float, fn: Any) -> IdleWork:
    return IdleWork(delay, lambda owner, keys: fn(keys), OWNER)


def _until(cond: Any, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_keys_are_done_once_left_alone_oldest_first() -> None:
    done: list[Any] = []
    work = make(3600, done.extend)
    try:
        for k in ("a", "b", "c"):
            work.note(k)
        work.note("a")  # noted again: after b and c
        work.flush()
        assert done == ["b", "c", "a"]
        assert work.pending() == 0
    finally:
        work.close()


def test_keys_are_done_by_the_thread_after_the_delay() -> None:
    done: list[Any] = []
    work = make(0.02, done.extend)
    try:
        for k in ("a", "b"):
            work.note(k)
        assert _until(lambda: sorted(done) == ["a", "b"])
        assert work.pending() == 0
    finally:
        work.close()


def test_nothing_is_done_before_the_delay_and_flush_does_it_now() -> None:
    done: list[Any] = []
    work = make(3600, done.extend)
    try:
        work.note(1)
        work.note(2)
        time.sleep(0.05)
        assert done == [] and work.pending() == 2
        work.flush()
        assert done == [1, 2] and work.pending() == 0
    finally:
        work.close()


def test_batches_are_bounded() -> None:
    calls: list[list[Any]] = []
    work = make(3600, calls.append)
    for k in range(BATCH * 2 + 1):
        work.note(k)
    work.close(flush=True)
    assert [len(c) for c in calls] == [BATCH, BATCH, 1]


def test_a_failing_action_does_not_stop_the_thread() -> None:
    seen: list[Any] = []

    def action(keys: list[Any]) -> None:
        seen.extend(keys)
        if keys == ["bad"]:
            raise RuntimeError("boom")

    work = make(0.01, action)
    try:
        work.note("bad")
        assert _until(lambda: seen == ["bad"])
        work.note("good")
        assert _until(lambda: seen == ["bad", "good"])
    finally:
        work.close()


def test_close_stops_the_thread_and_with_flush_does_what_waits() -> None:
    done: list[Any] = []
    work = make(3600, done.extend)
    work.note("x")
    thread = work._thread
    assert thread is not None and thread.is_alive()
    work.close(flush=True)
    assert done == ["x"]
    assert not thread.is_alive()
    work.note("y")  # after close: ignored
    work.close()
    assert done == ["x"] and work.pending() == 0


def test_the_thread_ends_when_its_owner_is_gone() -> None:
    """A saver never closed is freed: the thread holds it weakly, and ends."""
    import gc

    class Owner:
        pass

    done: list[Any] = []
    owner = Owner()
    work = IdleWork(0.01, lambda o, keys: done.extend(keys), owner)
    work.note("k")
    assert _until(lambda: done == ["k"])
    thread = work._thread
    assert thread is not None
    del owner
    gc.collect()
    assert _until(lambda: not thread.is_alive())


def test_close_waits_for_an_action_in_progress() -> None:
    started, release = threading.Event(), threading.Event()
    finished: list[bool] = []

    def action(keys: list[Any]) -> None:
        started.set()
        release.wait(10)
        finished.append(True)

    work = make(0.0, action)
    work.note("k")
    assert started.wait(10)
    threading.Timer(0.05, release.set).start()
    work.close()
    assert finished == [True]


def _child(conn: Any) -> None:
    done: list[Any] = []
    work = _PARENT_WORK
    work.action = lambda owner, keys: done.extend(keys)
    before = work.pending()  # the parent's keys are not inherited
    work.note("child")
    work.flush()
    conn.send((before, done))


_PARENT_WORK: IdleWork


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="no fork")
def test_a_forked_child_starts_afresh() -> None:
    global _PARENT_WORK
    parent_done: list[Any] = []
    _PARENT_WORK = make(3600, parent_done.extend)
    try:
        _PARENT_WORK.note("parent")
        ctx = mp.get_context("fork")
        a, b = ctx.Pipe()
        p = ctx.Process(target=_child, args=(b,))
        p.start()
        before, done = a.recv()
        p.join(30)
        assert p.exitcode == 0
        assert done == ["child"]
        assert before == 0
        _PARENT_WORK.flush()
        assert parent_done == ["parent"]
    finally:
        _PARENT_WORK.close()
