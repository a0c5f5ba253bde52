"""LMDBStore's group commit: when a leader waits for its batch to fill.

A leader waits for company only while waiting pays, learned per kind of
leading request (its function's code): a sequence of writes that each depend
on the previous one returning (LangGraph's puts of one thread) never brings
company, and used to cost each of them a commit's time of waiting.

The waits here are made long (60 s), so that no assertion depends on timing:
a leader that waits when it should not is caught by its thread still running
after 30 s, never by a measured duration.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from kv_helpers import batch_sizes
from kvsaver.kv import LMDBStore, group_commit


def _put_a(txn: Any) -> None:  # one kind of request (one call site)
    txn.put(b"a", b"1")


def _put_b(txn: Any) -> None:  # another kind
    txn.put(b"b", b"1")


def _expect_company(env: Any, wait: float) -> None:
    """Make the next gather find its batch short (the last batches were
    shared) and wait at most ``wait`` seconds."""
    env.batch_sizes, env.commit_seconds = (2, 2), wait


def _finishes(fn: Any) -> bool:
    """Whether ``fn()`` returns within 30 s (a leader that waits when it
    should not waits 60 s)."""
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(30)
    return not t.is_alive()


def _paired(store: LMDBStore, first: Any, second: Any) -> None:
    """``first`` leads (waiting for company if it does), ``second`` joins."""
    env = store._env
    t = threading.Thread(target=store.transact, args=(first,))
    t.start()
    while not env.queue and t.is_alive():  # the first request is queued; its leader gathers
        threading.Event().wait(0.001)
    store.transact(second)
    t.join(60)


def test_lmdb_leader_stops_waiting_where_waits_gain_nothing_and_only_for_its_kind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LMDBStore(str(tmp_path / "g"))
    env = store._env
    sizes = batch_sizes(store)
    monkeypatch.setattr(group_commit, "_GATHER_MAX_SECONDS", 60.0)
    # Three lone requests of kind A expect company and wait (0.05 s) in vain.
    for _ in range(3):
        _expect_company(env, 0.05)
        store.transact(_put_a)
    assert sizes == [1, 1, 1]
    # The fourth would wait 60 s: it does not wait at all.
    _expect_company(env, 120.0)
    assert _finishes(lambda: store.transact(_put_a))
    assert env.gains[_put_a.__code__] < 0.5
    # Kind B learned nothing of A's: its leader still waits for company,
    # and commits both requests in one batch.
    _expect_company(env, 120.0)
    _paired(store, _put_b, _put_a)
    assert sizes[-1] == 2
    store.close()


def test_lmdb_leader_waits_again_when_requests_come_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not waiting, a leader's gather is still watched: a request that
    queues during its commit (within the wait's limit) shows that waiting
    would have paid, and the leaders of its kind wait again."""
    store = LMDBStore(str(tmp_path / "g"))
    env = store._env
    sizes = batch_sizes(store)
    monkeypatch.setattr(group_commit, "_GATHER_MAX_SECONDS", 60.0)
    events: dict[str, threading.Event] = {}

    def slow_a(txn: Any) -> None:  # one kind: the same code at every call
        events["running"].set()
        events["release"].wait(60)
        _put_a(txn)

    events.update(running=threading.Event(), release=threading.Event())
    events["release"].set()
    for _ in range(3):  # its waits gain nothing: 1 -> 0.75 -> 0.56 -> 0.42
        _expect_company(env, 0.05)
        store.transact(slow_a)
    # It leads without waiting; while its function runs (in its commit),
    # another request queues.
    events.update(running=threading.Event(), release=threading.Event())
    _expect_company(env, 120.0)
    t = threading.Thread(target=store.transact, args=(slow_a,))
    t.start()
    assert events["running"].wait(30)  # it did not wait for company
    joiner = threading.Thread(target=store.transact, args=(_put_b,))
    joiner.start()
    while len(env.queue) < 1:
        threading.Event().wait(0.001)
    events["release"].set()
    t.join(60)
    joiner.join(60)
    assert sizes == [1, 1, 1, 1, 1]  # 0.42 -> 0.57: waiting pays again
    _expect_company(env, 120.0)
    events["running"].set()
    events["release"].set()
    _paired(store, slow_a, _put_b)  # its kind waits for company again
    assert sizes[-1] == 2
    store.close()
