"""The Store protocol: ONE shared suite run against every backend, then small
backend-specific tests (LMDB, file) at the end of this module.

The shared suite compares each backend with a plain dict model: whatever a
dict and ``sorted`` say a scan returns, every backend must return.
"""

from __future__ import annotations

import ast
import os
import pickle
import random
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import ormsgpack
import pytest
from kv_helpers import batch_sizes
from kvsaver import kv
from kvsaver.kv import (
    CorruptStoreError,
    FileStore,
    FormatVersionError,
    KeyTooLongError,
    KVError,
    LMDBStore,
    MemoryStore,
    PostgresStore,
    ReadOnlyError,
    Store,
    StoreClosedError,
    StoreFullError,
    Txn,
    group_commit,
)

REPO = Path(__file__).resolve().parents[1]
CHILD_ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def child_output(code: str, *args: Any) -> str:
    """What ``python -c code args...`` prints, run in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        env=CHILD_ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


class Backend:
    """Opens stores of one kind, always at the same place (so a second open is a
    reopen), and closes every store it opened at teardown. PostgreSQL: a table
    of this test's own on the session's server."""

    def __init__(self, name: str, tmp_path: Path, postgres_url: str | None = None) -> None:
        self.name = name
        self.persistent = name != "memory"
        self.url = postgres_url
        if name == "postgres":
            from pg_helpers import unique_table

            self.path: Any = unique_table("store")
        else:
            self.path = {"memory": None, "file": tmp_path / "s.kvs", "lmdb": tmp_path / "l"}[name]
        self._opened: list[Any] = []

    def open(self, **options: Any) -> Any:
        if self.name == "memory":
            store: Any = MemoryStore(**options)
        elif self.name == "file":
            store = FileStore(self.path, **options)
        elif self.name == "postgres":
            store = PostgresStore(self.url, table=self.path, max_size=4, **options)
        else:
            store = LMDBStore(self.path, **options)
        self._opened.append(store)
        return store

    def close_all(self) -> None:
        for store in reversed(self._opened):
            store.close()
        if self.name == "postgres":
            from pg_helpers import drop_tables

            drop_tables(self.url, [self.path])


def _backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    return Backend(request.param, tmp_path, url)


@pytest.fixture(params=["memory", "file", "lmdb", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b = _backend(request, tmp_path)
    yield b
    b.close_all()


@pytest.fixture(params=["file", "lmdb", "postgres"])
def persistent(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b = _backend(request, tmp_path)
    yield b
    b.close_all()


@pytest.fixture
def store(backend: Backend) -> Any:
    return backend.open()


# -- helpers ------------------------------------------------------------------------


class Rollback(Exception):
    """Raised inside a write transaction to roll it back on purpose."""


def put_all(store: Any, items: Iterable[tuple[bytes, bytes]]) -> None:
    with store.write() as txn:
        for k, v in items:
            txn.put(k, v)


def dump(store: Any) -> list[tuple[bytes, bytes]]:
    with store.read() as txn:
        return list(txn.scan())


def expected_scan(
    model: dict[bytes, bytes], start: bytes | None, stop: bytes | None, reverse: bool
) -> list[tuple[bytes, bytes]]:
    keys = sorted(k for k in model if (start is None or k >= start) and (stop is None or k < stop))
    if reverse:
        keys.reverse()
    return [(k, model[k]) for k in keys]


def run_in_thread(fn: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Run fn in a daemon thread; its exception (or None) is returned. A thread
    still running after timeout is a deadlock: fail instead of hanging."""
    outcome: list[Any] = []

    def target() -> None:
        try:
            fn()
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{fn} did not finish in {timeout} s (deadlock?)"
    return outcome[0]


def _wait_child(pid: int, timeout: float = 30.0) -> int:
    """waitpid with a deadline; a child still running after it is killed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"child {pid} did not finish in {timeout} s")


def fork_and_run(child: Callable[[], None], timeout: float = 30.0) -> tuple[int, str]:
    """Run child() in a forked process; (exit code, its traceback if any)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # never return into pytest from here
        code = 1
        try:
            os.close(r)
            child()
            code = 0
        except BaseException:
            os.write(w, traceback.format_exc().encode())
        finally:
            os._exit(code)
    os.close(w)
    try:
        code = _wait_child(pid, timeout)
        with os.fdopen(r, "rb") as f:
            return code, f.read().decode()
    except BaseException:
        os.close(r)
        raise


LONG = b"m" * 511  # the longest key LMDB accepts
KEY_SETS = {
    "empty": [],
    "single": [b"k"],
    "several": [
        b"\x00",
        b"\x00\x00",
        b"a",
        b"a\x00",
        b"a\xff",
        b"ab",
        b"b",
        b"c\x00\xff",
        b"k",
        b"\xff",
        b"\xff\xff",
    ],
    "long_keys": [b"m" * 509 + b"nn", b"m" * 510 + b"l", LONG, b"m" * 510 + b"n", b"n"],
}
BOUNDS = [
    None,
    b"",
    b"\x00",
    b"\x00\x00",
    b"\x00\x01",
    b"a",
    b"a\x00",
    b"a\x00\x00",
    b"aa",
    b"b",
    b"ba",
    b"k",
    b"k\x00",
    b"m",
    b"\xff",
    b"\xff\xff",
    b"\xff\xff\xff",
    LONG,
    LONG + b"\x00",
    LONG + b"x" * 89,
    b"m" * 510 + b"l" + b"z" * 100,
    b"m" * 600,
    b"n" * 600,
    b"\x00" * 600,
    b"\xff" * 600,
]


# == the shared suite ===================================================================


def test_implements_the_protocol(store: Any) -> None:
    assert isinstance(store, Store)
    with store.read() as txn:
        assert isinstance(txn, Txn)
    with store.write() as txn:
        assert isinstance(txn, Txn)


def test_empty_store(store: Any) -> None:
    with store.read() as txn:
        assert txn.get(b"k") is None
        for reverse in (False, True):
            assert list(txn.scan(reverse=reverse)) == []
            assert list(txn.scan(b"a", b"z", reverse=reverse)) == []
            assert list(txn.scan(None, b"z", reverse=reverse)) == []
            assert list(txn.scan(b"a", None, reverse=reverse)) == []
    with store.write() as txn:
        assert txn.get(b"k") is None
        assert txn.delete(b"k") is False
        assert txn.delete_range(None, None) == 0
        assert list(txn.scan(reverse=True)) == []
    assert dump(store) == []


@pytest.mark.parametrize("keys", KEY_SETS.values(), ids=KEY_SETS.keys())
def test_scan_bounds_matrix(store: Any, keys: list[bytes]) -> None:
    """Every (start, stop) pair of BOUNDS, both directions: empty ranges,
    start == stop, start > stop, ranges past the end or before the start,
    unbounded sides, bounds that are not keys, bounds longer than 511 bytes."""
    model = {k: b"v" + k[:8] for k in keys}
    put_all(store, model.items())
    with store.read() as txn:
        for start in BOUNDS:
            for stop in BOUNDS:
                for reverse in (False, True):
                    got = list(txn.scan(start, stop, reverse=reverse))
                    assert got == expected_scan(model, start, stop, reverse), (
                        start,
                        stop,
                        reverse,
                    )
        assert list(txn.scan()) == expected_scan(model, None, None, False)
        assert list(txn.scan(reverse=True)) == expected_scan(model, None, None, True)
        for k in keys:
            assert txn.get(k) == model[k]
        for b in BOUNDS:
            if b is not None and b not in model:
                assert txn.get(b) is None


@pytest.mark.parametrize("keys", KEY_SETS.values(), ids=KEY_SETS.keys())
def test_delete_range_bounds_matrix(store: Any, keys: list[bytes]) -> None:
    """delete_range(start, stop) removes exactly [start, stop) and counts it,
    for every pair of BOUNDS; each attempt is rolled back."""
    model = {k: b"v" for k in keys}
    put_all(store, model.items())
    for start in BOUNDS:
        for stop in BOUNDS:
            doomed = expected_scan(model, start, stop, False)
            rest = {k: v for k, v in model.items() if (k, v) not in doomed}
            with pytest.raises(Rollback), store.write() as txn:
                assert txn.delete_range(start, stop) == len(doomed), (start, stop)
                assert list(txn.scan()) == expected_scan(rest, None, None, False)
                assert list(txn.scan(reverse=True)) == expected_scan(rest, None, None, True)
                assert txn.delete_range(start, stop) == 0
                raise Rollback
    assert dump(store) == expected_scan(model, None, None, False)


def test_delete_range_counts_and_exclusive_stop(store: Any) -> None:
    put_all(store, [(b"k%d" % i, b"v%d" % i) for i in range(10)])
    with store.write() as txn:
        assert txn.delete_range(b"k3", b"k7") == 4
    assert [k for k, _ in dump(store)] == [b"k0", b"k1", b"k2", b"k7", b"k8", b"k9"]
    with store.write() as txn:
        assert txn.delete_range(b"k8", None) == 2  # through the last key
    with store.write() as txn:
        assert txn.delete_range(None, b"k1") == 1
    assert [k for k, _ in dump(store)] == [b"k1", b"k2", b"k7"]
    with store.write() as txn:
        assert txn.delete_range(None, None) == 3
        assert txn.delete_range(None, None) == 0
    assert dump(store) == []


def test_many_random_keys_are_ordered(store: Any) -> None:
    rng = random.Random(7)
    alphabet = b"\x00\x01ab\x7f\xfe\xff"
    model: dict[bytes, bytes] = {}
    while len(model) < 3000:
        n = rng.randint(1, 40)
        k = bytes(
            rng.choice(alphabet) if rng.random() < 0.5 else rng.randrange(256) for _ in range(n)
        )
        model[k] = rng.randbytes(rng.randint(0, 64))
    items = list(model.items())
    rng.shuffle(items)
    for i in range(0, len(items), 300):  # several transactions
        put_all(store, items[i : i + 300])
    with store.read() as txn:
        assert list(txn.scan()) == expected_scan(model, None, None, False)
        assert list(txn.scan(reverse=True)) == expected_scan(model, None, None, True)
        for k, v in items[:500]:
            assert txn.get(k) == v
        keys = sorted(model)
        for _ in range(300):
            start = rng.choice(
                [
                    None,
                    rng.choice(keys),
                    rng.choice(keys) + b"\x00",
                    rng.randbytes(rng.randint(1, 3)),
                ]
            )
            stop = rng.choice([None, rng.choice(keys), rng.randbytes(rng.randint(1, 3))])
            reverse = rng.random() < 0.5
            assert list(txn.scan(start, stop, reverse=reverse)) == expected_scan(
                model, start, stop, reverse
            )


def test_get_put_delete(store: Any) -> None:
    with store.write() as txn:
        txn.put(b"a", b"1")
        txn.put(b"b", b"")  # an empty value is a value, not a missing key
        txn.put(b"c", b"3")
        txn.put(b"c", b"33")  # overwrite
    with store.read() as txn:
        assert txn.get(b"a") == b"1"
        assert txn.get(b"b") == b""
        assert txn.get(b"c") == b"33"
        assert txn.get(b"d") is None
        assert txn.get(b"a\x00") is None
        assert txn.get(b"x" * 600) is None  # longer than any key may be: just missing
    with store.write() as txn:
        assert txn.delete(b"a") is True
        assert txn.delete(b"a") is False
        assert txn.delete(b"missing") is False
        assert txn.delete(b"x" * 600) is False
        assert txn.get(b"a") is None
    assert dump(store) == [(b"b", b""), (b"c", b"33")]


@pytest.mark.parametrize("keys", KEY_SETS.values(), ids=KEY_SETS.keys())
def test_get_many_and_scan_with_a_limit(store: Any, keys: list[bytes]) -> None:
    """The batched operations: get_many is [get(k) for k in keys]
    (order kept, repeats and missing keys included); scan(limit=n) is the
    first n pairs of the same scan, in both directions, in read and write
    transactions (there over the transaction's own changes too)."""
    model = {k: b"v" + k[:8] for k in keys}
    put_all(store, model.items())
    probe = [*keys, b"missing", *keys[:2], b"x" * 600]
    for limit in (0, 1, 2, 5, 100):
        with store.read() as txn:
            assert txn.get_many(probe) == [model.get(k) for k in probe]
            assert txn.get_many([]) == []
            for start in BOUNDS[::3]:
                for stop in BOUNDS[::4]:
                    for reverse in (False, True):
                        want = expected_scan(model, start, stop, reverse)[:limit]
                        got = list(txn.scan(start, stop, reverse=reverse, limit=limit))
                        assert got == want, (start, stop, reverse, limit)
    with pytest.raises(Rollback), store.write() as txn:
        txn.put(b"a\x00", b"new")
        local = {**model, b"a\x00": b"new"}
        if keys:
            assert txn.delete(keys[0]) is True
            del local[keys[0]]
        assert txn.get_many([b"a\x00", *keys]) == [local.get(k) for k in [b"a\x00", *keys]]
        for reverse in (False, True):
            assert (
                list(txn.scan(reverse=reverse, limit=2))
                == expected_scan(local, None, None, reverse)[:2]
            )
        raise Rollback
    assert dump(store) == expected_scan(model, None, None, False)


def test_large_value(store: Any) -> None:
    big = random.Random(1).randbytes(3 << 20)
    put_all(store, [(b"big", big), (b"small", b"s")])
    with store.read() as txn:
        assert txn.get(b"big") == big
        assert list(txn.scan()) == [(b"big", big), (b"small", b"s")]


def test_bytes_like_keys_and_values_are_copied(store: Any) -> None:
    key, value = bytearray(b"key"), bytearray(b"value")
    with store.write() as txn:
        txn.put(key, value)
        key[0:1] = b"X"
        value[0:1] = b"X"
    assert dump(store) == [(b"key", b"value")]
    with store.read() as txn:
        assert all(type(k) is bytes and type(v) is bytes for k, v in txn.scan())


@pytest.mark.parametrize("exc", [Rollback, KeyboardInterrupt], ids=["Exception", "BaseException"])
def test_rollback_on_exception(backend: Backend, exc: type[BaseException]) -> None:
    store = backend.open()
    before = [(b"k%02d" % i, b"v%d" % i) for i in range(20)]
    put_all(store, before)
    with pytest.raises(exc), store.write() as txn:
        txn.put(b"a-new", b"n")
        txn.put(b"k01", b"overwritten")
        assert txn.delete(b"k02") is True
        assert txn.delete_range(b"k10", b"k15") == 5
        assert txn.delete_range(b"k18", None) == 2
        assert txn.get(b"a-new") == b"n"  # visible inside, until the exception
        raise exc
    assert dump(store) == before
    if backend.persistent:
        store.close()
        assert dump(backend.open()) == before


def test_transaction_failing_on_a_store_error_rolls_back(store: Any) -> None:
    put_all(store, [(b"a", b"1")])
    with pytest.raises(ReadOnlyError), store.write() as txn:
        txn.put(b"b", b"2")
        with store.read() as inner:
            inner.put(b"c", b"3")  # a write in a read transaction: error, whole txn undone
    assert dump(store) == [(b"a", b"1")]


def test_writes_inside_a_read_transaction_raise(store: Any) -> None:
    put_all(store, [(b"a", b"1"), (b"b", b"2")])
    with store.read() as txn:
        with pytest.raises(ReadOnlyError):
            txn.put(b"c", b"3")
        with pytest.raises(ReadOnlyError):
            txn.delete(b"a")
        with pytest.raises(ReadOnlyError):
            txn.delete_range(None, None)
        assert txn.get(b"a") == b"1"  # the transaction is still usable
    assert dump(store) == [(b"a", b"1"), (b"b", b"2")]


@pytest.mark.parametrize("writer", ["same-thread", "other-thread"])
def test_read_transaction_is_a_snapshot_even_mid_scan(store: Any, writer: str) -> None:
    base = {b"k%02d" % i: b"v%d" % i for i in range(40)}
    put_all(store, base.items())

    def mutate() -> None:
        for round_ in range(2):  # two commits while the snapshot is open
            with store.write() as txn:
                txn.put(b"k05a", b"inserted %d" % round_)
                txn.put(b"k30", b"changed %d" % round_)
                txn.delete(b"k%02d" % (35 + round_))
                txn.delete_range(b"k37", b"k39")
                txn.put(b"a", b"new head")
                txn.put(b"z", b"new tail")

    with store.read() as snap:
        forward = snap.scan()
        backward = snap.scan(reverse=True)
        head = [next(forward) for _ in range(3)]
        tail = [next(backward) for _ in range(3)]
        if writer == "same-thread":
            mutate()
        else:
            assert run_in_thread(mutate) is None
        assert head + list(forward) == expected_scan(base, None, None, False)
        assert tail + list(backward) == expected_scan(base, None, None, True)
        assert snap.get(b"k30") == b"v30"
        assert snap.get(b"k36") == b"v36"
        assert snap.get(b"z") is None
        assert list(snap.scan(b"k3", b"k4", reverse=True)) == expected_scan(
            base, b"k3", b"k4", True
        )
    after = dict(base)
    after.update(
        {b"k05a": b"inserted 1", b"k30": b"changed 1", b"a": b"new head", b"z": b"new tail"}
    )
    for k in (b"k35", b"k36", b"k37", b"k38"):
        del after[k]
    assert dump(store) == expected_scan(after, None, None, False)


def test_a_reader_opened_after_a_commit_sees_it(store: Any) -> None:
    put_all(store, [(b"a", b"1")])
    with store.read() as old:
        # The snapshot is taken no later than the first read (PostgreSQL
        # takes it there, the local stores at read()).
        assert old.get(b"a") == b"1"
        put_all(store, [(b"b", b"2")])
        with store.read() as new:
            assert new.get(b"b") == b"2"
        assert old.get(b"b") is None


def test_read_your_writes_inside_a_write_transaction(store: Any) -> None:
    put_all(store, [(b"a", b"1"), (b"c", b"3"), (b"e", b"5"), (b"f", b"6"), (b"g", b"7")])
    with store.write() as txn:
        txn.put(b"b", b"2")
        txn.put(b"a", b"1 new")
        assert txn.delete(b"c") is True
        assert txn.delete_range(b"e", b"g") == 2
        txn.put(b"f", b"6 again")  # re-put inside the deleted range
        txn.put(b"h", b"8")
        assert txn.delete(b"h") is True  # put then delete in one txn
        expect = [(b"a", b"1 new"), (b"b", b"2"), (b"f", b"6 again"), (b"g", b"7")]
        assert txn.get(b"c") is None and txn.get(b"e") is None and txn.get(b"h") is None
        assert txn.get(b"f") == b"6 again"
        assert list(txn.scan()) == expect
        assert list(txn.scan(reverse=True)) == expect[::-1]
        assert list(txn.scan(b"b", b"g")) == expect[1:3]
        assert list(txn.scan(b"b", b"g", reverse=True)) == expect[1:3][::-1]
        assert list(txn.scan(b"c", b"f")) == []
        assert txn.delete_range(b"a", b"c") == 2  # counts its own puts too
        assert list(txn.scan()) == expect[2:]
    assert dump(store) == [(b"f", b"6 again"), (b"g", b"7")]


def test_random_transactions_against_a_model(backend: Backend) -> None:
    """Random put/delete/delete_range with scans inside the write transaction
    (overlay merging), a third of the transactions rolled back."""
    store = backend.open()
    rng = random.Random(f"model-{backend.name}")
    alphabet = b"\x00ab\xff"

    def key() -> bytes:
        return bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 3)))

    def bound() -> bytes | None:
        return None if rng.random() < 0.15 else key()

    committed: dict[bytes, bytes] = {}
    for round_ in range(80):
        local = dict(committed)
        rollback = rng.random() < 0.33
        try:
            with store.write() as txn:
                for _ in range(rng.randint(1, 25)):
                    op = rng.random()
                    if op < 0.5:
                        k, v = key(), b"%d" % rng.randrange(1000)
                        txn.put(k, v)
                        local[k] = v
                    elif op < 0.7:
                        k = key()
                        assert txn.delete(k) is (k in local)
                        local.pop(k, None)
                    elif op < 0.8:
                        a, b = bound(), bound()
                        doomed = [k for k, _ in expected_scan(local, a, b, False)]
                        assert txn.delete_range(a, b) == len(doomed)
                        for k in doomed:
                            del local[k]
                    else:
                        a, b, rev = bound(), bound(), rng.random() < 0.5
                        assert list(txn.scan(a, b, reverse=rev)) == expected_scan(local, a, b, rev)
                        k = key()
                        assert txn.get(k) == local.get(k)
                assert list(txn.scan()) == expected_scan(local, None, None, False)
                if rollback:
                    raise Rollback
        except Rollback:
            pass
        else:
            committed = local
        with store.read() as txn:
            assert list(txn.scan()) == expected_scan(committed, None, None, False), round_
            a, b, rev = bound(), bound(), rng.random() < 0.5
            assert list(txn.scan(a, b, reverse=rev)) == expected_scan(committed, a, b, rev)
    if backend.persistent:
        store.close()
        assert dump(backend.open()) == expected_scan(committed, None, None, False)


def test_concurrent_writers_lose_no_update(store: Any) -> None:
    put_all(store, [(b"n", b"0")])

    def work() -> None:
        for _ in range(25):
            with store.write() as txn:
                txn.put(b"n", b"%d" % (int(txn.get(b"n")) + 1))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert dump(store) == [(b"n", b"100")]


def test_transact_commits_and_returns(store: Any) -> None:
    def fn(txn: Any) -> str:
        txn.put(b"a", b"1")
        assert txn.get(b"a") == b"1"
        return "result"

    assert store.transact(fn) == "result"
    assert dump(store) == [(b"a", b"1")]


def test_transact_exception_rolls_back_and_reaches_the_caller(store: Any) -> None:
    put_all(store, [(b"a", b"1")])

    def fn(txn: Any) -> None:
        txn.put(b"b", b"2")
        txn.delete(b"a")
        raise Rollback("mine")

    with pytest.raises(Rollback, match="mine"):
        store.transact(fn)
    assert dump(store) == [(b"a", b"1")]


def test_concurrent_transact_isolates_failures(store: Any) -> None:
    """Many threads; every 4th function raises. Its changes vanish and its caller
    (only) gets the exception; everyone else's changes and results survive,
    including a shared read-modify-write counter."""
    put_all(store, [(b"n", b"0")])
    outcomes: dict[tuple[int, int], Any] = {}

    def work(t: int) -> None:
        for i in range(20):

            def fn(txn: Any, t: int = t, i: int = i) -> tuple[int, int]:
                txn.put(b"t%d-%02d" % (t, i), b"x")
                txn.put(b"n", b"%d" % (int(txn.get(b"n")) + 1))
                if i % 4 == 3:
                    raise Rollback(f"{t}-{i}")
                return (t, i)

            try:
                outcomes[(t, i)] = store.transact(fn)
            except Rollback as e:
                outcomes[(t, i)] = str(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not any(th.is_alive() for th in threads)
    for (t, i), outcome in outcomes.items():
        assert outcome == (f"{t}-{i}" if i % 4 == 3 else (t, i))
    data = dict(dump(store))
    ok = [(t, i) for t in range(6) for i in range(20) if i % 4 != 3]
    assert data.pop(b"n") == b"%d" % len(ok)
    assert sorted(data) == sorted(b"t%d-%02d" % ti for ti in ok)


def test_lmdb_group_commit_gathers_concurrent_writers_but_never_a_lone_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After batches of two, a leader waits for a second request (the wait is
    made long here, so the test does not depend on timing) and commits both
    together; a writer that then writes alone stops expecting company after
    two commits."""
    store = LMDBStore(str(tmp_path / "g"))
    env = store._env
    sizes = batch_sizes(store)
    monkeypatch.setattr(group_commit, "_GATHER_MAX_SECONDS", 60.0)
    env.batch_sizes, env.commit_seconds = (2, 2), 120.0
    first = threading.Thread(target=store.transact, args=(lambda txn: txn.put(b"a", b"1"),))
    first.start()
    while not env.queue:  # the first request is queued; its leader gathers
        time.sleep(0.001)
    store.transact(lambda txn: txn.put(b"b", b"2"))
    first.join(60)
    assert sizes == [2]
    assert dict(dump(store)) == {b"a": b"1", b"b": b"2"}
    for i in range(2):  # each waits at most as long as the last (real) commit
        store.transact(lambda txn, i=i: txn.put(b"alone-%d" % i, b"x"))
    assert sizes == [2, 1, 1]
    assert env.batch_sizes == (1, 1)  # the next lone write will not wait at all
    store.close()


def test_lmdb_gathering_leader_is_woken_by_the_request_that_fills_its_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader waiting for its batch to fill is woken by the request that
    fills it; it does not poll. Each poll (a sleep, then a look at the queue)
    gave the GIL to the writer threads preparing their requests and waited to
    get it back, on the path of every batch."""
    store = LMDBStore(str(tmp_path / "g"))
    env = store._env
    sizes = batch_sizes(store)
    sleeps: list[float] = []
    real_sleep = time.sleep

    class Clock:  # group_commit's ``time``, with its sleeps counted
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        @staticmethod
        def sleep(seconds: float) -> None:
            if threading.current_thread() is first:
                sleeps.append(seconds)
            real_sleep(seconds)

    monkeypatch.setattr(group_commit, "time", Clock())
    monkeypatch.setattr(group_commit, "_GATHER_MAX_SECONDS", 60.0)
    env.batch_sizes, env.commit_seconds = (2, 2), 120.0
    first = threading.Thread(target=store.transact, args=(lambda txn: txn.put(b"a", b"1"),))
    first.start()
    while not env.queue:  # the first request is queued; its leader gathers
        real_sleep(0.001)
    started = time.monotonic()
    store.transact(lambda txn: txn.put(b"b", b"2"))
    first.join(60)
    assert sizes == [2]
    assert sleeps == []
    assert time.monotonic() - started < 30  # not the wait's timeout (60 s)
    assert dict(dump(store)) == {b"a": b"1", b"b": b"2"}
    store.close()


def test_lmdb_gathering_leader_waits_for_company_as_long_as_a_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that misses a batch waits for the whole next commit anyway,
    so the leader waits for it up to a commit's time, not half of one: with
    half, batches of many writer threads often went short by a request or
    two, each straggler then costing a flush. Only a lower
    bound is checked: a timed wait never ends early."""
    store = LMDBStore(str(tmp_path / "g"))
    env = store._env
    monkeypatch.setattr(group_commit, "_GATHER_MAX_SECONDS", 60.0)
    env.batch_sizes, env.commit_seconds = (2, 2), 0.3
    started = time.monotonic()
    store.transact(lambda txn: txn.put(b"a", b"1"))  # company expected; none comes
    assert time.monotonic() - started >= 0.3
    assert dump(store) == [(b"a", b"1")]
    store.close()


@pytest.mark.parametrize(
    "nesting", ["write-in-write", "transact-in-write", "write-in-transact", "transact-in-transact"]
)
def test_nested_write_in_one_thread_raises_instead_of_deadlocking(store: Any, nesting: str) -> None:
    outer, inner = nesting.split("-in-")

    def inner_call() -> None:
        if inner == "write":
            with store.write() as txn:
                txn.put(b"inner", b"1")
        else:
            store.transact(lambda txn: txn.put(b"inner", b"1"))

    def outer_call() -> None:
        if outer == "write":
            with store.write() as txn:
                txn.put(b"outer", b"1")
                inner_call()
        else:
            store.transact(lambda txn: (txn.put(b"outer", b"1"), inner_call()))

    def child() -> None:
        with pytest.raises(RuntimeError, match="already open in this thread"):
            outer_call()
        assert dump(store) == []
        put_all(store, [(b"after", b"1")])  # the store is still usable
        assert dump(store) == [(b"after", b"1")]

    # In a forked child: a regression deadlocks, and only a process can be killed.
    code, err = fork_and_run(child, timeout=20)
    assert code == 0, err


def test_use_after_close_raises(store: Any) -> None:
    put_all(store, [(b"a", b"1")])
    store.close()
    with pytest.raises(StoreClosedError), store.read():
        pass
    with pytest.raises(StoreClosedError), store.write():
        pass
    with pytest.raises(StoreClosedError):
        store.transact(lambda txn: None)
    store.close()  # closing twice is fine


def test_context_manager_closes(backend: Backend) -> None:
    with backend.open() as store:
        put_all(store, [(b"a", b"1")])
    with pytest.raises(StoreClosedError), store.read():
        pass
    if backend.persistent:
        with backend.open() as again:
            assert dump(again) == [(b"a", b"1")]


def test_readonly_store_rejects_writes(backend: Backend) -> None:
    with backend.open() as writer:
        put_all(writer, [(b"a", b"1")])
    ro = backend.open(readonly=True)
    assert ro.readonly is True
    with pytest.raises(ReadOnlyError), ro.write():
        pass
    with pytest.raises(ReadOnlyError):
        ro.transact(lambda txn: txn.put(b"b", b"2"))
    assert dump(ro) == ([(b"a", b"1")] if backend.persistent else [])


def test_reopen_after_close_keeps_data(persistent: Backend) -> None:
    store = persistent.open()
    put_all(store, [(b"k%d" % i, b"v%d" % i) for i in range(10)])
    with store.write() as txn:
        txn.delete(b"k0")
        txn.delete_range(b"k5", b"k8")
        txn.put(b"k9", b"nine")
    with pytest.raises(Rollback), store.write() as txn:
        txn.put(b"k1", b"rolled back")
        raise Rollback
    expect = [
        (b"k1", b"v1"),
        (b"k2", b"v2"),
        (b"k3", b"v3"),
        (b"k4", b"v4"),
        (b"k8", b"v8"),
        (b"k9", b"nine"),
    ]
    assert dump(store) == expect
    store.close()
    again = persistent.open()
    assert dump(again) == expect
    put_all(again, [(b"k0", b"back")])
    again.close()
    assert dump(persistent.open()) == [(b"k0", b"back"), *expect]


# == LMDB ==============================================================================


def reader_pids(store: LMDBStore) -> set[int]:
    """PIDs in the LMDB reader table (env.readers(): a header line, then
    "pid thread txnid" rows)."""
    lines = store._env.env.readers().splitlines()[1:]
    return {int(line.split()[0]) for line in lines if line.split()}


def test_lmdb_key_too_long(tmp_path: Path) -> None:
    with LMDBStore(tmp_path / "l") as store:
        assert store.max_key_size == 511
        with store.write() as txn:
            with pytest.raises(KeyTooLongError, match="511") as info:
                txn.put(b"k" * 600, b"v")
            assert "600" in str(info.value)
            assert isinstance(info.value, ValueError)
            with pytest.raises(KeyTooLongError):
                txn.put(b"k" * 512, b"v")
            with pytest.raises(KeyTooLongError):
                txn.put(b"", b"v")  # LMDB has no empty keys
            txn.put(LONG, b"longest")  # the transaction goes on
        assert dump(store) == [(LONG, b"longest")]


def test_lmdb_map_grows_over_many_small_transactions(tmp_path: Path) -> None:
    with LMDBStore(tmp_path / "l", map_size=32768, durability="none") as store:
        assert store.info()["map_size"] == 32768
        chunk = 16 << 10
        n = (21 << 20) // chunk  # > 20 MiB in total
        for i in range(n):
            with store.write() as txn:
                txn.put(b"k%05d" % i, random.Random(i).randbytes(chunk))
        assert store.info()["map_size"] > 20 << 20
        with store.read() as txn:
            assert sum(1 for _ in txn.scan()) == n
            for i in range(0, n, 97):
                assert txn.get(b"k%05d" % i) == random.Random(i).randbytes(chunk)


def test_lmdb_map_grows_inside_one_big_transaction(tmp_path: Path) -> None:
    with LMDBStore(tmp_path / "l", map_size=32768, durability="none") as store:
        put_all(store, [(b"before", b"b")])
        value = random.Random(3).randbytes(64 << 10)
        n = (21 << 20) // len(value)
        with store.write() as txn:
            for i in range(n):
                txn.put(b"k%05d" % i, value)
                if i % 50 == 0:  # reads stay right across the replays after growth
                    assert txn.get(b"k00000") == value
                    assert txn.get(b"before") == b"b"
                    # get_many reads through the transaction's cursor, which
                    # each replay into a new transaction must replace
                    assert txn.get_many([b"before", b"k00000", b"none"]) == [b"b", value, None]
            txn.delete(b"before")
            assert sum(1 for _ in txn.scan()) == n
        assert store.info()["map_size"] > 20 << 20
        with store.read() as txn:
            keys = [k for k, _ in txn.scan()]
            assert keys == [b"k%05d" % i for i in range(n)]
            assert txn.get(b"k%05d" % (n - 1)) == value


def test_lmdb_big_transaction_rolled_back_after_growth_leaves_nothing(tmp_path: Path) -> None:
    with LMDBStore(tmp_path / "l", map_size=32768, durability="none") as store:
        put_all(store, [(b"keep", b"1")])
        with pytest.raises(Rollback), store.write() as txn:
            for i in range(200):
                txn.put(b"k%05d" % i, b"x" * 20000)
            txn.delete(b"keep")
            raise Rollback
        assert store.info()["map_size"] > 32768  # it did grow
        assert dump(store) == [(b"keep", b"1")]


def test_lmdb_durability_option(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="durability") as info:
        LMDBStore(tmp_path / "bad", durability="fast")  # type: ignore[arg-type]
    for choice in ("full", "meta", "none"):
        assert choice in str(info.value)
    assert not (tmp_path / "bad").exists()
    for i, choice in enumerate(("full", "meta", "none")):
        with LMDBStore(tmp_path / f"l{i}", durability=choice) as store:  # type: ignore[arg-type]
            assert store.durability == choice
            put_all(store, [(b"a", b"1")])
            store.sync()
            assert dump(store) == [(b"a", b"1")]


def _file_tail(path: Path, start: int) -> bytes:
    with open(path / "data.mdb", "rb") as f:
        f.seek(start)
        return f.read()


def test_lmdb_zeroes_the_file_ahead_of_its_pages_where_commits_sync(tmp_path: Path) -> None:
    """durability full/meta: the data file is written (zeros) ahead of LMDB's
    last page, so a commit overwrites blocks instead of extending the file;
    never at "none" (no fsync to spare) and never read-only."""
    value = os.urandom(3000)
    for durability in ("full", "meta", "none"):
        path = tmp_path / durability
        with LMDBStore(path, durability=durability) as store:  # type: ignore[arg-type]
            for i in range(40):
                store.transact(lambda txn, i=i: txn.put(b"k%03d" % i, value))
            info = store.info()
            if durability == "none":
                assert info["file_bytes"] == info["used_bytes"]
            else:
                assert info["file_bytes"] >= info["used_bytes"] + (128 << 10)
                assert set(_file_tail(path, info["used_bytes"])) == {0}
        # A fresh process sees every record: the zeros are past every page.
        code = (
            "import sys; from kvsaver.kv import LMDBStore\n"
            "s = LMDBStore(sys.argv[1], readonly=True)\n"
            "with s.read() as t: print(len(list(t.scan(None, None))))"
        )
        assert child_output(code, path).strip() == "40"
    before = os.path.getsize(tmp_path / "none" / "data.mdb")
    with LMDBStore(tmp_path / "none", readonly=True) as ro:
        with ro.read() as txn:
            assert txn.get(b"k000") == value
    assert os.path.getsize(tmp_path / "none" / "data.mdb") == before


def test_lmdb_zeroing_ahead_never_passes_the_cap_nor_outlives_a_write_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cap = 1 << 20
    with LMDBStore(tmp_path / "cap", max_size=cap, map_size=32768) as store:
        with pytest.raises(StoreFullError):
            for i in range(1000):
                store.transact(lambda txn, i=i: txn.put(b"k%04d" % i, b"v" * 8000))
        assert os.path.getsize(tmp_path / "cap" / "data.mdb") <= cap
    # A failing zero write (a full disk) is cut back off the file, zeroing
    # stops, and the transaction it ran in commits as if nothing happened.
    import kvsaver.kv.lmdb.growth as lmdb_growth

    calls = []

    def failing(fd: int, data: bytes, offset: int) -> int:
        calls.append(offset)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(lmdb_growth.os, "pwrite", failing)
    path = tmp_path / "enospc"
    with LMDBStore(path) as store:
        for i in range(20):
            store.transact(lambda txn, i=i: txn.put(b"k%03d" % i, b"v" * 3000))
        info = store.info()
        assert len(calls) == 1  # tried once, then left alone
        assert info["file_bytes"] == info["used_bytes"]
        assert len(dump(store)) == 20


def test_lmdb_path_that_is_a_file_is_not_a_store(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"my notes\n")
    with pytest.raises(CorruptStoreError, match="not a directory"):
        LMDBStore(path)
    assert path.read_bytes() == b"my notes\n"


def test_lmdb_nonempty_directory_without_data_mdb_is_not_a_store(tmp_path: Path) -> None:
    d = tmp_path / "project"
    d.mkdir()
    (d / "README").write_text("hello")
    with pytest.raises(CorruptStoreError, match=r"data\.mdb"):
        LMDBStore(d)
    assert sorted(os.listdir(d)) == ["README"]  # nothing created among the user's files


def test_lmdb_garbage_data_file_is_corrupt(tmp_path: Path) -> None:
    d = tmp_path / "l"
    d.mkdir()
    junk = random.Random(5).randbytes(16 << 10)
    (d / "data.mdb").write_bytes(junk)
    with pytest.raises(CorruptStoreError, match="valid LMDB"):
        LMDBStore(d)
    assert (d / "data.mdb").read_bytes() == junk


def test_lmdb_readonly_open_does_not_create(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        LMDBStore(tmp_path / "missing", readonly=True)
    assert not (tmp_path / "missing").exists()


def test_lmdb_stores_on_one_directory_share_the_environment(tmp_path: Path) -> None:
    a = LMDBStore(tmp_path / "l")
    b = LMDBStore(tmp_path / "l")
    put_all(a, [(b"x", b"1")])
    assert dump(b) == [(b"x", b"1")]
    a.close()
    put_all(b, [(b"y", b"2")])  # closing one leaves the other working
    assert dump(b) == [(b"x", b"1"), (b"y", b"2")]
    b.close()


def test_lmdb_size_cap(tmp_path: Path) -> None:
    cap = 1 << 20
    store = LMDBStore(tmp_path / "l", max_size=cap, map_size=32768, durability="none")
    value = b"v" * 8000
    committed = 0
    with pytest.raises(StoreFullError) as info:
        for i in range(10_000):
            with store.write() as txn:
                txn.put(b"k%05d" % i, value)
            committed += 1
    message = str(info.value)
    assert f"{cap:,}" in message and "max_size" in message
    assert committed > 50
    assert store.info()["file_bytes"] <= cap
    expect = [(b"k%05d" % i, value) for i in range(committed)]
    assert dump(store) == expect  # the failed write left no trace, the rest is intact
    with pytest.raises(StoreFullError):  # one transaction that cannot fit at all
        with store.write() as txn:
            for i in range(200):
                txn.put(b"big%05d" % i, value)
    with pytest.raises(StoreFullError):
        store.transact(lambda txn: txn.put(b"one more", value))
    assert dump(store) == expect
    # Deleting makes room again: the very next write of the same size fits.
    with store.write() as txn:
        assert txn.delete_range(None, None) == committed
    with store.write() as txn:
        txn.put(b"after", value)
    store.transact(lambda txn: txn.put(b"after2", value))
    for i in range(committed // 2):
        with store.write() as txn:
            txn.put(b"again%05d" % i, value)
    assert len(dump(store)) == 2 + committed // 2
    store.close()


def test_lmdb_size_cap_after_delete_with_transact(tmp_path: Path) -> None:
    store = LMDBStore(tmp_path / "l", max_size=1 << 20, map_size=32768, durability="none")
    value = b"w" * 8000
    with pytest.raises(StoreFullError):
        for i in range(10_000):
            store.transact(lambda txn, i=i: txn.put(b"k%05d" % i, value))
    store.transact(lambda txn: txn.delete_range(None, None))
    store.transact(lambda txn: txn.put(b"after", value))
    assert dump(store) == [(b"after", value)]
    store.close()


def test_lmdb_store_used_in_a_forked_child(tmp_path: Path) -> None:
    store = LMDBStore(tmp_path / "l")
    put_all(store, [(b"parent", b"1")])

    def child() -> None:
        assert dump(store) == [(b"parent", b"1")]  # the inherited store object
        put_all(store, [(b"child", b"2")])
        other = LMDBStore(tmp_path / "l")  # and a store opened in the child
        assert dump(other) == [(b"child", b"2"), (b"parent", b"1")]
        store.transact(lambda txn: txn.put(b"child-transact", b"3"))
        other.close()

    code, err = fork_and_run(child)
    assert code == 0, err
    assert dump(store) == [(b"child", b"2"), (b"child-transact", b"3"), (b"parent", b"1")]
    put_all(store, [(b"parent-after", b"4")])  # the parent's handle is unharmed
    with store.read() as txn:
        assert txn.get(b"parent-after") == b"4"
    store.close()


def test_lmdb_fork_with_an_open_transaction_gives_the_child_a_clear_error(
    tmp_path: Path,
) -> None:
    store = LMDBStore(tmp_path / "l")
    put_all(store, [(b"a", b"1")])

    def child() -> None:
        with pytest.raises(KVError, match="forked"):
            dump(store)

    with store.read() as txn:
        code, err = fork_and_run(child)
        assert txn.get(b"a") == b"1"  # the parent's open transaction is fine
    assert code == 0, err
    put_all(store, [(b"b", b"2")])
    assert dump(store) == [(b"a", b"1"), (b"b", b"2")]
    store.close()


_HOLD_READERS = """
import sys, time
from kvsaver.kv import LMDBStore
store = LMDBStore(sys.argv[1])
with store.read() as a, store.read() as b:   # two reader slots
    assert a.get(b"k") == b"v" and b.get(b"k") == b"v"
    print("ready", flush=True)
    time.sleep(120)
"""

_SHOW_READERS = """
import sys
from kvsaver.kv import LMDBStore
store = LMDBStore(sys.argv[1])   # opening clears dead readers
print(store._env.env.readers())
"""


def _kill_reader_holder(path: Path) -> int:
    """Start a process that holds two read transactions, SIGKILL it; its pid."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD_READERS, str(path)],
        stdout=subprocess.PIPE,
        env=CHILD_ENV,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the child prints within a second or two
        assert line.strip() == b"ready", line
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
    return proc.pid


def test_lmdb_dead_readers_cleared_when_the_table_is_full(tmp_path: Path) -> None:
    # The parent keeps the environment open, so LMDB does not reset the reader
    # table on the next open: only reader_check() can clear the dead slots.
    store = LMDBStore(tmp_path / "l", max_readers=2)
    put_all(store, [(b"k", b"v")])
    dead = _kill_reader_holder(tmp_path / "l")
    assert dead in reader_pids(store)  # the killed child left its slots behind
    with store.read() as txn:  # every slot is taken by the dead: cleared, then works
        assert txn.get(b"k") == b"v"
    assert dead not in reader_pids(store)
    store.close()


def test_lmdb_dead_readers_cleared_at_open(tmp_path: Path) -> None:
    store = LMDBStore(tmp_path / "l")
    put_all(store, [(b"k", b"v")])
    dead = _kill_reader_holder(tmp_path / "l")
    assert dead in reader_pids(store)
    shown = child_output(_SHOW_READERS, tmp_path / "l")
    assert str(dead) not in shown.split()
    assert dead not in reader_pids(store)  # cleared in the shared lock file
    store.close()


# == FileStore ===========================================================================

_HEADER = struct.Struct(">8sIIQ")  # magic, format version, crc32(body), len(body)


def make_file(path: Path, items: list[tuple[bytes, bytes]]) -> bytes:
    with FileStore(path) as store:
        put_all(store, items)
    return path.read_bytes()


def craft(body: bytes, version: int = 1, magic: bytes = b"KVSFILE\x00") -> bytes:
    return _HEADER.pack(magic, version, zlib.crc32(body), len(body)) + body


def open_fails(path: Path, error: type[Exception]) -> Exception:
    before = path.read_bytes()
    with pytest.raises(error) as info:
        FileStore(path)
    assert path.read_bytes() == before  # left exactly as it was
    with pytest.raises(error):
        FileStore(path, readonly=True)
    assert path.read_bytes() == before
    assert str(path) in str(info.value)  # the message names the file
    return info.value


def test_file_layout_is_the_documented_one(tmp_path: Path) -> None:
    items = [(b"a", b"1"), (b"b\x00", b"")]
    raw = make_file(tmp_path / "s.kvs", items)
    magic, version, crc, length = _HEADER.unpack_from(raw)
    body = raw[_HEADER.size :]
    assert (magic, version, length, crc) == (b"KVSFILE\x00", 1, len(body), zlib.crc32(body))
    assert ormsgpack.unpackb(body) == [b"a", b"1", b"b\x00", b""]
    assert raw == craft(ormsgpack.packb([b"a", b"1", b"b\x00", b""]))


def test_file_truncated_at_every_length(tmp_path: Path) -> None:
    path = tmp_path / "s.kvs"
    raw = make_file(path, [(b"a", b"1"), (b"bb", b"22")])
    for n in range(len(raw)):
        path.write_bytes(raw[:n])
        open_fails(path, CorruptStoreError)
    path.write_bytes(raw + b"\x00")  # trailing garbage
    open_fails(path, CorruptStoreError)


def test_file_every_corrupted_byte_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "s.kvs"
    raw = make_file(path, [(b"a", b"1"), (b"bb", b"22"), (b"c" * 40, b"3" * 40)])
    for i in range(len(raw)):
        damaged = bytearray(raw)
        damaged[i] ^= 0xFF
        path.write_bytes(bytes(damaged))
        # The version field reads as a newer format; anything else is damage.
        open_fails(path, FormatVersionError if 8 <= i < 12 else CorruptStoreError)


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"SQLite format 3\x00" + b"\x00" * 84,
        b'{"a": 1}',
        b"\x80\x04\x95\x0b\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01a\x94K\x01s.",  # a pickle
        b"a,1\nb,2\n",  # PersistentDict's csv format
        b"KVSFILE",
        b"KVSFILE\x01" + b"\x00" * 40,
    ],
    ids=["empty", "sqlite", "json", "pickle", "csv", "short-magic", "other-magic"],
)
def test_foreign_file_is_corrupt(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "s.kvs"
    path.write_bytes(content)
    open_fails(path, CorruptStoreError)


@pytest.mark.parametrize(
    "body",
    [
        ormsgpack.packb({"a": 1}),
        ormsgpack.packb([b"k"]),  # odd length
        ormsgpack.packb([1, 2]),  # not bytes
        ormsgpack.packb(["k", "v"]),  # str, not bytes
        ormsgpack.packb([b"k", None]),
        b"\xc1",  # never valid msgpack
    ],
    ids=["map", "odd", "ints", "strs", "none", "invalid"],
)
def test_valid_checksum_but_bad_body_is_corrupt(tmp_path: Path, body: bytes) -> None:
    path = tmp_path / "s.kvs"
    path.write_bytes(craft(body))
    open_fails(path, CorruptStoreError)


def test_newer_format_version(tmp_path: Path) -> None:
    path = tmp_path / "s.kvs"
    path.write_bytes(craft(ormsgpack.packb([b"k", b"v"]), version=2))
    error = open_fails(path, FormatVersionError)
    assert "format 2" in str(error) and "Upgrade" in str(error)


def test_file_path_that_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(CorruptStoreError, match="directory"):
        FileStore(tmp_path)


def test_file_two_writers_and_readers_see_each_other(tmp_path: Path) -> None:
    """Writers in several processes (or one, twice) each take the
    lock per transaction and read the other's commits first; nothing is lost,
    and a reader sees every commit made before its transaction began."""
    path = tmp_path / "s.kvs"
    first = FileStore(path)
    put_all(first, [(b"a", b"1")])
    second = FileStore(path)
    reader = FileStore(path, readonly=True)
    put_all(second, [(b"b", b"2")])
    put_all(first, [(b"c", b"3")])  # first reads b before it writes c
    add = (
        "import sys\nfrom kvsaver.kv import FileStore\n"
        "with FileStore(sys.argv[1]) as s, s.write() as txn:\n"
        "    txn.put(b'd', b'4')\n"
        "    print(sorted(k.decode() for k, _ in txn.scan()))\n"
    )
    assert child_output(add, path).strip() == "['a', 'b', 'c', 'd']"
    expected = [(b"a", b"1"), (b"b", b"2"), (b"c", b"3"), (b"d", b"4")]
    assert dump(first) == dump(second) == dump(reader) == expected
    with pytest.raises(ReadOnlyError):
        put_all(reader, [(b"e", b"5")])
    for store in (first, second, reader):
        store.close()
    with FileStore(path, readonly=True) as again:
        assert dump(again) == expected


def test_file_commit_does_not_follow_a_planted_symlink(tmp_path: Path) -> None:
    """The temp file was "<path>.tmp.<pid>", opened following
    symlinks, so a planted link redirected the whole store elsewhere."""
    path = tmp_path / "s.kvs"
    store = FileStore(path)
    victim = tmp_path / "victim"
    victim.write_bytes(b"not yours")
    # Every name the old code could pick in this process (and a few neighbours).
    for pid in range(os.getpid() - 2, os.getpid() + 3):
        os.symlink(victim, f"{path}.tmp.{pid}")
    put_all(store, [(b"k", b"v")])
    store.close()
    assert victim.read_bytes() == b"not yours"
    assert not path.is_symlink()
    with FileStore(path, readonly=True) as again:
        assert dump(again) == [(b"k", b"v")]
    leftovers = sorted(p.name for p in tmp_path.iterdir() if not p.is_symlink())
    assert leftovers == ["s.kvs", "s.kvs.lock", "victim"]  # no temp file left either


def test_file_readonly_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        FileStore(tmp_path / "missing.kvs", readonly=True)
    assert not (tmp_path / "missing.kvs").exists()


def test_file_failed_commit_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.kvs"
    store = FileStore(path)
    put_all(store, [(b"a", b"1")])
    before = path.read_bytes()

    def disk_error(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(os, "replace", disk_error)
        with pytest.raises(OSError, match="No space"), store.write() as txn:
            txn.put(b"b", b"2")
            txn.delete(b"a")
    assert path.read_bytes() == before
    assert dump(store) == [(b"a", b"1")]  # memory and disk agree
    assert sorted(os.listdir(tmp_path)) == ["s.kvs", "s.kvs.lock"]  # no temp file left
    put_all(store, [(b"b", b"2")])
    store.close()
    with FileStore(path) as again:
        assert dump(again) == [(b"a", b"1"), (b"b", b"2")]


_UNSAFE_MODULES = {
    "pickle",
    "_pickle",
    "cPickle",
    "dill",
    "cloudpickle",
    "shelve",
    "marshal",
    "jsonpickle",
}


def test_no_pickle_in_kv() -> None:
    package = Path(kv.__file__).parent
    sources = sorted(package.glob("*.py"))
    assert len(sources) >= 5
    for source in sources:
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                names = {(node.module or "").split(".")[0]}
            else:
                continue
            assert not names & _UNSAFE_MODULES, f"{source.name} imports {names}"


def test_file_store_round_trip_never_touches_pickle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def forbidden(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("pickle used")

    for name in ("dumps", "loads", "dump", "load", "Pickler", "Unpickler"):
        monkeypatch.setattr(pickle, name, forbidden)
    path = tmp_path / "s.kvs"
    with FileStore(path) as store:
        put_all(store, [(b"k", b"\x80\x04 looks like a pickle, is bytes")])
    with FileStore(path, readonly=True) as store:
        assert dump(store) == [(b"k", b"\x80\x04 looks like a pickle, is bytes")]
    assert path.read_bytes().startswith(b"KVSFILE\x00")
