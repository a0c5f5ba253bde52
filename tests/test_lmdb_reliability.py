"""LMDBStore under failures: interrupts inside a write, a reader
killed mid-read, a store directory deleted under an open handle, damaged files,
and stores created by two processes at once.

Everything that could hang or kill a process (a lost wake-up, SIGBUS on a
truncated map) runs in a child process with a timeout, so a regression fails
the test instead of the test run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
CHILD_ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def run_child(code: str, *args: Any, timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    """``python -c code args...`` in a fresh interpreter; killed after ``timeout``."""
    try:
        return subprocess.run(
            [sys.executable, "-c", code, *map(str, args)],
            env=CHILD_ENV,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(
            f"the child did not finish in {timeout} s (a hang): {e.stderr!r}"
        ) from None


# -- 1. interrupts (Ctrl-C, a SIGALRM timeout) anywhere inside a write ------------------

_INTERRUPTED_PUTS = r"""
import ctypes, random, signal, sys, threading, time
from kvsaver import KVSaver
from langgraph.checkpoint.base import empty_checkpoint

path, durability, rounds, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
saver = KVSaver(path, durability=durability)
store = saver.store
armed = [False]

def on_alarm(signum, frame):
    # At most one interrupt per arming, however late the signal is handled.
    if armed[0]:
        armed[0] = False
        raise KeyboardInterrupt

signal.signal(signal.SIGALRM, on_alarm)

# Helper threads commit through transact() meanwhile, so the main thread often
# leads a batch holding their functions: none of them may see its interrupts.
stop = threading.Event()
helper_errors, helper_done = [], []

def helper(h):
    n = 0
    while not stop.is_set():
        key = b"helper-%d-%06d" % (h, n)
        try:
            store.transact(lambda txn, key=key: txn.put(key, b"x" * 300))
        except BaseException as e:
            helper_errors.append(repr(e))
            return
        helper_done.append(key)
        n += 1

helpers = [threading.Thread(target=helper, args=(h,), daemon=True) for h in range(2)]
for t in helpers:
    t.start()

# Victim threads also write through transact() (waiting in a batch, promoted
# to lead, leading), and get KeyboardInterrupts raised asynchronously in them
# (PyThreadState_SetAsyncExc), one at a time: each must reach its own thread.
victim_stop, victim_errors = threading.Event(), []
victim_hits = [0, 0]

victim_written = [0, 0]

def victim_writes(v):
    while True:
        try:
            if victim_stop.is_set():
                return
            key = b"victim-%d-%06d" % (v, victim_written[v])
            store.transact(lambda txn, key=key: txn.put(key, b"v" * 200))
            victim_written[v] += 1
        except KeyboardInterrupt:
            victim_hits[v] += 1

def victim(v):
    # An asynchronous exception can also land on the loop's back edge, outside
    # its try: the outer loop counts that one too, and goes on writing.
    while True:
        try:
            victim_writes(v)
            return
        except KeyboardInterrupt:
            victim_hits[v] += 1
        except BaseException as e:
            victim_errors.append(repr(e))
            return

victims = [threading.Thread(target=victim, args=(v,), daemon=True) for v in range(2)]
for t in victims:
    t.start()

def interrupter():
    vrng = random.Random(seed + 1)
    while not stop.is_set():
        v = vrng.randrange(2)
        before = victim_hits[v]
        time.sleep(vrng.uniform(0, 0.003))
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(victims[v].ident), ctypes.py_object(KeyboardInterrupt)
        )
        deadline = time.monotonic() + 30
        while victim_hits[v] == before and time.monotonic() < deadline:
            time.sleep(0.0005)  # delivered and counted before the next one
        if victim_hits[v] == before:
            victim_errors.append(f"victim {v} never got its interrupt (hangs?)")
            return

sender = threading.Thread(target=interrupter, daemon=True)
sender.start()

# At least `rounds` rounds, and on until both outcomes were seen often enough:
# how many timers fire inside a write depends on how fast this machine writes.
interrupted = completed = i = 0
config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
while i < 8 * rounds and (i < rounds or min(interrupted, completed) < 150):
    i += 1
    cp = empty_checkpoint()
    cp["channel_values"] = {"v": "x" * rng.randrange(10, 3000)}
    cp["channel_versions"] = {"v": i + 1}
    try:
        armed[0] = True
        signal.setitimer(signal.ITIMER_REAL, rng.uniform(0, 0.004))
        if i % 3 == 0:
            with store.write() as txn:
                txn.put(b"w-%06d" % i, b"y" * rng.randrange(1, 5000))
        else:
            saver.put(config, cp, {"step": i}, {"v": i + 1})
        completed += 1
    except KeyboardInterrupt:
        interrupted += 1
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)

stop.set()
sender.join(60)
assert not sender.is_alive(), "the interrupter hangs"
victim_stop.set()
for t in helpers + victims:
    t.join(30)
    assert not t.is_alive(), "a helper or victim thread hangs"
assert victim_errors == [], victim_errors[:3]
assert min(victim_hits) > 20, victim_hits

# Every later write of the process completes, from another thread and this one.
t = threading.Thread(target=store.transact, args=(lambda txn: txn.put(b"after", b"1"),))
t.start()
t.join(30)
assert not t.is_alive(), "a write after the interrupts hangs"
with store.write() as txn:
    txn.put(b"after-write", b"1")
with store.read() as txn:
    assert txn.get(b"after") == b"1"
gate = store._env.gate
assert (gate._shared, gate._exclusive) == (0, False), (gate._shared, gate._exclusive)
assert helper_errors == [], helper_errors[:3]
with store.read() as txn:
    missing = [k for k in helper_done if txn.get(k) is None]
assert missing == [], missing[:3]
print(interrupted, completed, len(helper_done), sum(victim_hits))
"""


@pytest.mark.parametrize("durability", ["none", "full"])
def test_interrupts_anywhere_in_writes_never_hang_later_writes(
    tmp_path: Path, durability: str
) -> None:
    """A KeyboardInterrupt raised from a timer at random moments of
    many puts and writes (while two threads commit through transact(), often in
    a batch the interrupted thread leads), and KeyboardInterrupts raised
    asynchronously in two more writing threads. Then writes from another
    thread and this one must finish, the gate must be free, and the helper
    threads must have seen no interrupt and lost no acknowledged write."""
    out = run_child(_INTERRUPTED_PUTS, tmp_path / "s", durability, 1500, 11, timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    interrupted, completed, helper_writes, victim_hits = map(int, out.stdout.split())
    assert interrupted > 100 and completed > 100 and helper_writes > 100, out.stdout
    assert victim_hits > 40, out.stdout


# -- 2. a reader killed inside a read transaction ---------------------------------------

_HOLD_A_READ = """
import sys, time
from kvsaver import KVSaver
saver = KVSaver(sys.argv[1], readonly=True)
with saver.store.read() as txn:
    txn.get(b"anything")
    print("reading", flush=True)
    time.sleep(120)
"""


def _kill_a_reader_inside_its_read(path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD_A_READ, str(path)], stdout=subprocess.PIPE, env=CHILD_ENV
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"reading"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()


def _churn(saver: Any, rounds: int) -> None:
    """Put about 1 MB into a thread, delete the thread; ``rounds`` times."""
    from langgraph.checkpoint.base import empty_checkpoint

    for i in range(rounds):
        config = {"configurable": {"thread_id": f"t{i}", "checkpoint_ns": ""}}
        cp = empty_checkpoint()
        cp["channel_values"] = {"v": os.urandom(1 << 20)}
        cp["channel_versions"] = {"v": 1}
        saver.put(config, cp, {}, {"v": 1})
        saver.delete_thread(f"t{i}")


@pytest.mark.parametrize(
    "durability,max_size", [("full", None), ("none", 16 << 20), ("none", 4 << 20)]
)
def test_a_reader_killed_mid_read_does_not_make_the_store_grow(
    tmp_path: Path, durability: str, max_size: int | None
) -> None:
    """The killed reader's slot pins its snapshot, so no page freed after it
    could be reused, until the writer clears dead readers: 40 rounds of 1 MB
    put + delete_thread grew the file by about their whole size (or ended in
    StoreFullError under a 16 MB cap). The writer checks as the file grows
    (every write where commits sync, every 16 writes otherwise) and before
    refusing a write at the cap."""
    from kvsaver import KVSaver

    path = tmp_path / "s"
    with KVSaver(path, durability=durability, max_size=max_size) as saver:
        _churn(saver, 1)  # the store exists, and the writer keeps it open
        _kill_a_reader_inside_its_read(path)
        _churn(saver, 40)
        info = saver.store.info()
    limit = 12 << 20 if max_size is None or max_size > 4 << 20 else 4 << 20
    if durability == "full":
        limit = 5 << 20
    assert info["file_bytes"] <= limit, info


# -- 3. the store's directory deleted and opened again in the same process -----------------

_LIST_THREADS = """
import sys
from kvsaver import KVSaver
with KVSaver(sys.argv[1], readonly=True) as saver:
    for t in ("old", "new"):
        config = {"configurable": {"thread_id": t, "checkpoint_ns": ""}}
        print(t, saver.get_tuple(config) is not None)
"""


def _put(saver: Any, thread: str, value: Any = None) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    cp = empty_checkpoint()
    cp["channel_values"] = {"v": thread if value is None else value}
    cp["channel_versions"] = {"v": 1}
    saver.put(config, cp, {}, {"v": 1})


@pytest.mark.parametrize("old_use", ["after", "never"])
def test_rmtree_and_reopen_in_one_process_gives_a_fresh_store(tmp_path: Path, old_use: str) -> None:
    """With an old saver still open, ``rmtree(path); KVSaver(path)``
    reused the process's environment on the deleted files: the new saver saw
    the deleted thread and its writes went nowhere."""
    import shutil

    from kvsaver import KVSaver
    from kvsaver.kv import StoreClosedError

    path = tmp_path / "s"
    old = KVSaver(path)
    _put(old, "old")
    shutil.rmtree(path)
    new = KVSaver(path)
    config = {"configurable": {"thread_id": "old", "checkpoint_ns": ""}}
    assert new.get_tuple(config) is None  # a fresh store
    _put(new, "new")
    if old_use == "after":
        with pytest.raises(StoreClosedError, match="deleted or replaced"):
            old.get_tuple(config)
        with pytest.raises(StoreClosedError, match="deleted or replaced"):
            _put(old, "old")
    old.close()
    with KVSaver(path) as again:  # closing the old one left the new one working
        _put(again, "new")
    new.close()
    out = run_child(_LIST_THREADS, path, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["old", "False", "new", "True"]


# -- 4. damaged data files: an exception naming the file, never a signal ------------------

_OPEN = """
import sys
from kvsaver import KVSaver
from kvsaver.kv import CorruptStoreError
try:
    with KVSaver(sys.argv[1], readonly=sys.argv[2] == "ro") as saver:
        print("threads", saver.stats().threads)
        if sys.argv[2] == "rw":
            saver.delete_thread("thread-3")
except CorruptStoreError as e:
    print("CorruptStoreError", e)
"""


def _store_with_data(path: Path) -> Path:
    from kvsaver import KVSaver

    with KVSaver(path) as saver:
        for t in range(20):
            _put(saver, f"thread-{t}", os.urandom(20_000))
    return path / "data.mdb"


def _assert_refused(path: Path, data: Path) -> None:
    """Every way of opening the damaged store gives a Python exception (a
    SIGBUS would be returncode -7), naming the file."""
    for mode in ("rw", "ro"):
        out = run_child(_OPEN, path, mode, timeout=60)
        assert out.returncode == 0, (mode, out.returncode, out.stderr[-2000:])
        assert out.stdout.startswith("CorruptStoreError"), (mode, out.stdout)
        assert str(data) in out.stdout, out.stdout
    for command in ("stats", "compact"):
        out = subprocess.run(
            [sys.executable, "-m", "tools.storage", command, str(path), "--quiet"],
            cwd=REPO,
            env=CHILD_ENV,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2, (command, out.returncode, out.stderr[-2000:])
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and str(data) in lines[0], (command, out.stderr)


def test_a_truncated_data_file_is_corrupt_not_a_crash(tmp_path: Path) -> None:
    """A truncated data.mdb killed the process with SIGBUS, for
    writable and read-only opens, ``tools.storage stats`` and ``compact``."""
    path = tmp_path / "s"
    data = _store_with_data(path)
    before = data.stat().st_size
    os.truncate(data, before // 2)
    _assert_refused(path, data)
    assert data.stat().st_size == before // 2  # left as it was


def test_a_damaged_meta_page_is_corrupt(tmp_path: Path) -> None:
    """The newest meta page's last page number or main root flipped: refused
    at open, not an OverflowError, MemoryError or SIGBUS later."""
    import struct

    path = tmp_path / "s"
    data = _store_with_data(path)
    raw = bytearray(data.read_bytes())
    metas = [16, 4096 + 16]
    newest = max(metas, key=lambda at: struct.unpack_from("<Q", raw, at + 128)[0])
    for field in (120, 24 + 48 + 40):  # last page, root of the main DB
        damaged = bytearray(raw)
        value = struct.unpack_from("<Q", damaged, newest + field)[0]
        struct.pack_into("<Q", damaged, newest + field, value + 100_000)
        data.write_bytes(damaged)
        _assert_refused(path, data)


@pytest.mark.parametrize("content", [b"", b"not an lmdb file at all\n" * 1000])
def test_an_empty_or_foreign_data_file_is_corrupt(tmp_path: Path, content: bytes) -> None:
    """A 0-byte data.mdb opened read-only (was ``lmdb.Error: Bad file
    descriptor``) and ``compact`` of a data.mdb that is not LMDB (was a
    traceback): CorruptStoreError naming the file, exit status 2."""
    from kvsaver.kv import CorruptStoreError, LMDBStore
    from kvsaver.kv.lmdb.compact import compact_lmdb

    path = tmp_path / "s"
    path.mkdir()
    data = path / "data.mdb"
    data.write_bytes(content)
    with pytest.raises(CorruptStoreError, match=str(data)):
        LMDBStore(path, readonly=True)
    with pytest.raises(CorruptStoreError, match=str(data)):
        compact_lmdb(path)
    for command in ("stats", "compact"):
        out = subprocess.run(
            [sys.executable, "-m", "tools.storage", command, str(path), "--quiet"],
            cwd=REPO,
            env=CHILD_ENV,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2, (command, out.stderr[-2000:])
        assert len(out.stderr.strip().splitlines()) == 1 and str(data) in out.stderr
    assert data.read_bytes() == content


# -- two processes creating one store at the same moment ----------------------------------

_CREATE_RACE = """
import json, sys, time
from kvsaver.kv import LMDBStore
base, role, start, count = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
problems = []
for k in range(count):
    path = f"{base}/store-{k}"
    go = start + k * 0.015  # every process goes at the same moment
    time.sleep(max(0.0, go - time.time() - 0.003))
    while time.time() < go:
        pass
    try:
        if role == "reader":  # polls for the store another process is creating
            deadline = time.monotonic() + 20
            while True:
                try:
                    store = LMDBStore(path, readonly=True)
                    break
                except FileNotFoundError:
                    if time.monotonic() > deadline:
                        raise
            store.close()
        else:
            with LMDBStore(path, durability="none") as store:
                store.transact(lambda txn: txn.put(role.encode(), b"1"))
    except Exception as e:
        problems.append(f"{k}: {type(e).__name__}: {e}")
print(json.dumps(problems))
"""


def test_processes_creating_one_store_at_the_same_moment(tmp_path: Path) -> None:
    """Two writers create each of many new stores at the same moment while a
    read-only opener polls for it: one writer could fail with "non-empty
    directory without data.mdb" (LMDB's lock.mdb, made first), and the
    poller got that error instead of FileNotFoundError."""
    import json
    import time

    count = 300
    start = time.time() + 3.0  # after the interpreters have started
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CREATE_RACE, str(tmp_path), role, str(start), str(count)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=CHILD_ENV,
            text=True,
        )
        for role in ("a", "b", "reader")
    ]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        assert json.loads(out) == [], out
    from kvsaver.kv import LMDBStore

    for k in range(count):
        with LMDBStore(tmp_path / f"store-{k}", readonly=True) as store, store.read() as txn:
            assert (txn.get(b"a"), txn.get(b"b")) == (b"1", b"1")


# -- damaged pages and records: CorruptStoreError, not an error from deep inside --------


def test_a_damaged_page_is_corrupt_in_reads_writes_and_transact(tmp_path: Path) -> None:
    """LMDB's MDB_CORRUPTED / MDB_PAGE_NOTFOUND (flipped bytes in data.mdb)
    reach the caller as CorruptStoreError naming the file."""
    import struct

    from kvsaver import KVSaver
    from kvsaver.kv import CorruptStoreError, LMDBStore

    path = tmp_path / "s"
    data = _store_with_data(path)
    raw = bytearray(data.read_bytes())
    newest = max((16, 4096 + 16), key=lambda at: struct.unpack_from("<Q", raw, at + 128)[0])
    root = struct.unpack_from("<Q", raw, newest + 24 + 48 + 40)[0]
    struct.pack_into("<H", raw, root * 4096 + 10, 0)  # the root page: neither branch nor leaf
    data.write_bytes(raw)
    with pytest.raises(CorruptStoreError, match=str(data)):
        KVSaver(path)  # its first read (the schema record) meets the damage
    with LMDBStore(path) as store:
        with pytest.raises(CorruptStoreError, match=str(data)), store.read() as txn:
            list(txn.scan())
        with pytest.raises(CorruptStoreError, match=str(data)):
            store.transact(lambda txn: txn.get(b"k"))
        with pytest.raises(CorruptStoreError, match=str(data)), store.write() as txn:
            txn.put(b"k", b"v")


@pytest.mark.parametrize("damage", ["checkpoint", "blob", "write", "activity", "key"])
def test_a_damaged_record_is_corrupt(tmp_path: Path, damage: str) -> None:
    """A record of the saver's own that does not decode (bytes flipped in a
    value or a key; was ValueError: invalid UTF-8, a bare ValueError, or a
    TypeError from unpacking) is a CorruptStoreError."""
    from kvsaver import KVSaver
    from kvsaver import schema as S
    from kvsaver.kv import CorruptStoreError
    from kvsaver.kv.keys import pack, prefix_range

    path = tmp_path / "s"
    with KVSaver(path) as saver:
        _put(saver, "t", ["t"])  # a list: a blob (a short str would be in the record)
        config = saver.list({"configurable": {"thread_id": "t"}}).__next__().config
        saver.put_writes(config, [("v", "pending")], "task")
        kind = {"checkpoint": "c", "blob": "b", "write": "w", "activity": "a", "key": "c"}[damage]
        with saver.store.write() as txn:
            key, _ = next(txn.scan(*prefix_range((kind,))))
            if damage == "key":  # a thread id element that is not UTF-8
                txn.put(pack(("c",)) + b"\x02\xff\xfe\x00\x02\x00\x02x\x00", b"")
            else:
                txn.put(key, b"\x93\xa1x")  # msgpack of a short list: the wrong shape
                if damage == "blob":
                    txn.put(key, b"no type separator")
        with pytest.raises(CorruptStoreError):
            if damage in ("activity", "key"):
                saver.stats()  # decodes every key, and the activity records
            else:
                saver.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})
    assert S.FORMAT_VERSION  # the schema module is the one that decodes
