"""Worker code for the process and fault tests.

Used by ``test_processes.py``, ``test_crash.py``, ``test_capacity.py`` and
``test_async_load.py``. Children are fresh interpreters: multiprocessing's
"spawn" method (module-level functions with picklable arguments, importable
as ``procs_helpers`` since pytest puts ``tests/`` on ``sys.path`` and spawn
passes it on), or, for the many short-lived processes of the kill -9 tests,
``python tests/procs_helpers.py <worker> <json kwargs>`` (see ``Child``).
Only the fork tests fork, on purpose.

Workers never raise into the parent. They report through files:

* an *ack file* per writer: one line per acknowledged put, appended only
  after ``put`` and both ``put_writes`` calls returned (flushed, and fsynced
  where the test kills the writer), so every complete line names a
  checkpoint that must be in the store;
* a *status/result file*: JSON lines (flushed and fsynced) with counts, and
  the problems or traceback of a failure.

The checkpoints the loop writers produce are self-checking: channel
``payload`` holds random bytes, ``digest`` their SHA-256 (with the thread
and sequence number), ``seq`` the sequence number, ``static`` a value
written once at ``seq == 0`` and never again (its blob comes from an older
``put``). Each put is followed by ``put_writes`` of three writes of task
"task" (one transaction) and then by a "marker" write (another transaction),
so a reader that sees the marker must see all three task writes.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import mmap
import operator
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

from kvsaver import KVSaver
from kvsaver import schema as S
from kvsaver.kv import ReadOnlyError
from langgraph.checkpoint.base import CheckpointTuple, empty_checkpoint

CHANNELS = ("payload", "digest", "seq")
TASK_CHANNELS = ("a", "b", "c")


# -- small utilities ------------------------------------------------------------


def static_value(thread: str) -> str:
    return f"written once for {thread}"


def digest_of(thread: str, seq: int, payload: bytes) -> str:
    return hashlib.sha256(f"{thread}/{seq}/".encode() + payload).hexdigest()


def append_line(path: str | os.PathLike[str], line: str, *, fsync: bool) -> None:
    """Append one line; flushed (and fsynced) before returning."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(line.rstrip("\n") + "\n")
        f.flush()
        if fsync:
            os.fsync(f.fileno())


def report(path: str | os.PathLike[str], **fields: Any) -> None:
    """Append one JSON status line (flushed and fsynced: it must survive a kill)."""
    fields.setdefault("pid", os.getpid())
    append_line(path, json.dumps(fields, sort_keys=True), fsync=True)


def read_reports(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Complete JSON lines of a status file (a torn last line is ignored)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


DELETED = "deleted"  # ack line of a windowed writer's delete_for_runs


def _ack_lines(paths: Iterable[str | os.PathLike[str]]) -> list[list[str]]:
    """Complete lines of ack files, split on spaces (a torn last line is ignored:
    the writer died while acknowledging, so that was not acknowledged)."""
    out = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        out.extend(line.split() for line in text.splitlines(keepends=True) if line.endswith("\n"))
    return out


def read_acks(paths: Iterable[str | os.PathLike[str]]) -> list[list[str]]:
    """Acknowledged puts: [thread, checkpoint id, seq] (or what the writer wrote)."""
    return [line for line in _ack_lines(paths) if line[0] != DELETED]


def read_deletions(paths: Iterable[str | os.PathLike[str]]) -> dict[str, int]:
    """thread -> the last run bucket whose deletion was acknowledged."""
    out: dict[str, int] = {}
    for line in _ack_lines(paths):
        if line[0] == DELETED:
            out[line[1]] = max(out.get(line[1], -1), int(line[2]))
    return out


def run_id(thread: str, bucket: int) -> str:
    return f"{thread}:{bucket}"


def thread_config(thread: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def wait_for(predicate: Any, timeout: float, what: str, proc: Any = None) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``
    or as soon as ``proc`` (a multiprocessing.Process) has exited."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if proc is not None and not proc.is_alive():
            value = predicate()
            if value:
                return value
            raise AssertionError(f"{what}: the child exited with code {proc.exitcode} first")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not done after {timeout:.0f} s")
        time.sleep(0.01)


@contextmanager
def reaped(procs: list[Any]) -> Iterator[list[Any]]:
    """Kill (SIGKILL) and join every process still alive on the way out."""
    try:
        yield procs
    finally:
        for p in procs:
            if p.pid is not None and p.is_alive():
                p.kill()
        for p in procs:
            if p.pid is not None:
                p.join(30)


def _fail(path: str | os.PathLike[str] | None, **fields: Any) -> None:
    if path is not None:
        report(path, ok=False, error=traceback.format_exc(), **fields)


# -- self-checking checkpoints ----------------------------------------------------


def build_checkpoint(
    saver: KVSaver,
    thread: str,
    seq: int,
    versions: dict[str, Any],
    rng: random.Random,
    payload_size: tuple[int, int] = (64, 2048),
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(checkpoint, metadata, new_versions) for step ``seq`` of ``thread``."""
    payload = rng.randbytes(rng.randint(*payload_size))
    new_versions = {ch: saver.get_next_version(versions.get(ch), None) for ch in CHANNELS}
    if seq == 0 or "static" not in versions:
        new_versions["static"] = saver.get_next_version(None, None)
    cp: dict[str, Any] = dict(empty_checkpoint())
    cp["channel_values"] = {
        "payload": payload,
        "digest": digest_of(thread, seq, payload),
        "seq": seq,
        "static": static_value(thread),
    }
    cp["channel_versions"] = {**versions, **new_versions}
    metadata = {"source": "loop", "step": seq, "writer": thread}
    return cp, metadata, new_versions


class LoopWriter:
    """One thread id written by one OS thread: put, put_writes, marker, ack.

    With ``window``, the store stays bounded however fast the disk: the puts
    of seq ``b*window .. (b+1)*window-1`` belong to run ``thread:b``, and at
    the first put of run ``b`` the writer deletes run ``b-2`` with
    ``delete_for_runs`` (one transaction) and acknowledges that too."""

    def __init__(
        self,
        saver: KVSaver,
        thread: str,
        ack_path: str | os.PathLike[str],
        *,
        fsync_ack: bool,
        payload_size: tuple[int, int] = (64, 2048),
        window: int | None = None,
    ) -> None:
        self.saver = saver
        self.thread = thread
        self.ack_path = ack_path
        self.fsync_ack = fsync_ack
        self.payload_size = payload_size
        self.window = window
        self.rng = random.Random()
        latest = saver.get_tuple(thread_config(thread))  # resume after a kill
        if latest is None:
            self.seq, self.versions, self.parent = 0, {}, thread_config(thread)
        else:
            self.seq = int(latest.metadata["step"]) + 1
            self.versions = dict(latest.checkpoint["channel_versions"])
            self.parent = latest.config
        self.acked = 0

    def step(self) -> str:
        w = self.window
        if w and self.seq % w == 0 and self.seq // w >= 2:
            old = self.seq // w - 2
            self.saver.delete_for_runs([run_id(self.thread, old)])
            append_line(self.ack_path, f"{DELETED} {self.thread} {old}", fsync=self.fsync_ack)
        cp, metadata, new_versions = build_checkpoint(
            self.saver, self.thread, self.seq, self.versions, self.rng, self.payload_size
        )
        if w:
            metadata["run_id"] = run_id(self.thread, self.seq // w)
        cfg = self.saver.put(self.parent, cp, metadata, new_versions)  # type: ignore[arg-type]
        cid = cfg["configurable"]["checkpoint_id"]
        self.saver.put_writes(cfg, [(ch, f"{cid}:{ch}") for ch in TASK_CHANNELS], "task")
        self.saver.put_writes(cfg, [("done", cid)], "marker")
        append_line(self.ack_path, f"{self.thread} {cid} {self.seq}", fsync=self.fsync_ack)
        self.acked += 1
        self.versions = dict(cp["channel_versions"])
        self.parent = cfg
        self.seq += 1
        return cid


def check_tuple(tup: CheckpointTuple, *, expect_marker: bool = False) -> list[str]:
    """Problems with a checkpoint written by LoopWriter (empty list: whole)."""
    problems: list[str] = []
    cid = tup.config["configurable"]["checkpoint_id"]
    cp = tup.checkpoint
    values, versions = cp["channel_values"], cp["channel_versions"]
    missing = sorted(ch for ch in versions if ch not in values)
    if missing:
        problems.append(f"{cid}: channel values missing for {missing}")
    thread, seq = tup.metadata.get("writer"), tup.metadata.get("step")
    if not missing:
        if values["seq"] != seq:
            problems.append(f"{cid}: seq {values['seq']} != metadata step {seq}")
        if values["digest"] != digest_of(str(thread), int(seq), values["payload"]):
            problems.append(f"{cid}: payload does not match its digest")
        if values["static"] != static_value(str(thread)):
            problems.append(f"{cid}: static channel holds {values['static']!r}")
    task = {ch: v for t, ch, v in tup.pending_writes if t == "task"}
    marker = [v for t, ch, v in tup.pending_writes if t == "marker" and ch == "done"]
    if task and task != {ch: f"{cid}:{ch}" for ch in TASK_CHANNELS}:
        problems.append(f"{cid}: partial or wrong task writes {task}")
    if marker and (marker != [cid] or len(task) != len(TASK_CHANNELS)):
        problems.append(f"{cid}: marker {marker} present but task writes are {task}")
    if expect_marker and not marker:
        problems.append(f"{cid}: acknowledged but its writes are missing")
    return problems


def missing_blobs(saver: KVSaver, tup: CheckpointTuple) -> list[str]:
    """Versions of the graph's state channels (``count``, ``log``: they
    always hold a value once written) with neither a blob record in the store
    nor a value in the checkpoint's record (format 6 keeps small values
    there): a half-written checkpoint has some. LangGraph's own channels are
    not checked: a consumed input or trigger has no value, and since format 4
    no record either (absent reads as empty)."""
    conf = tup.config["configurable"]
    thread, ns, cid = conf["thread_id"], conf.get("checkpoint_ns", ""), conf["checkpoint_id"]
    with saver.store.read() as txn:
        raw = txn.get(S.checkpoint_key(thread, ns, cid))
        if raw is None:
            return [f"{cid}: no record"]
        in_record = (
            saver.serde.loads_typed(S.decode_checkpoint(raw).checkpoint).get("channel_values") or {}
        )
        return [
            f"{cid}: no blob for {ch}@{ver}"
            for ch, ver in tup.checkpoint["channel_versions"].items()
            if ch in ("count", "log")
            and ch not in in_record
            and txn.get(S.blob_key(thread, ns, ch, ver)) is None
        ]


def verify_loop_store(
    saver: KVSaver,
    ack_paths: Iterable[str | os.PathLike[str]],
    window: int | None = None,
    own: str | None = None,
) -> dict:
    """Every stored checkpoint (``list(None)``) loads whole; every acknowledged
    put is among them, with its writes; no thread's latest is older than its
    last acknowledged put. For writers with a ``window``: a run whose deletion
    was acknowledged is gone entirely; a run whose deletion may have been in
    flight at a kill is there entirely or gone entirely (one transaction).

    ``own``: the thread of the (killed) writer this check is for; the other
    threads' writers may be alive, putting and deleting while this runs (and
    ``list`` reads in several transactions), so of theirs only the runs they
    cannot have deleted by the end of the check must be there."""
    problems: list[str] = []
    # Acks first: each names a commit made before it was written, hence before
    # the listing below starts (a live writer may commit and ack meanwhile).
    paths = list(ack_paths)
    acks = read_acks(paths)
    deleted = read_deletions(paths)
    stored: dict[tuple[str, str], CheckpointTuple] = {}
    for tup in saver.list(None):
        conf = tup.config["configurable"]
        stored[(conf["thread_id"], conf["checkpoint_id"])] = tup
        # check_tuple finds a value for every channel version: no missing blob.
        problems += check_tuple(tup)
    max_seq: dict[str, int] = {}
    for thread, _, seq in acks:
        max_seq[thread] = max(max_seq.get(thread, -1), int(seq))
    max_seq_after = dict(max_seq)
    if own is not None:
        for thread, _, seq in read_acks(paths):
            max_seq_after[thread] = max(max_seq_after.get(thread, -1), int(seq))
    maybe_deleted: dict[tuple[str, int], set[bool]] = {}
    checked = 0
    for thread, cid, seq in acks:
        found = stored.get((thread, cid))
        if window:
            bucket = int(seq) // window
            if bucket <= deleted.get(thread, -1):
                if found is not None:
                    problems.append(f"{cid}: its run {bucket} was deleted (acked) but it is there")
                continue
            # Run b is deleted just before seq (b+2)*window is put, after seq
            # (b+2)*window-1 was acknowledged.
            live = own is not None and thread != own
            top = max_seq_after[thread] if live else max_seq[thread]
            if bucket <= (top + 1) // window - 2:
                if not live:
                    maybe_deleted.setdefault((thread, bucket), set()).add(found is not None)
                if found is None:
                    continue
        checked += 1
        if found is None:
            problems.append(f"acknowledged checkpoint {thread}/{cid} (seq {seq}) is missing")
            continue
        if found.metadata.get("step") != int(seq):
            problems.append(f"{cid}: stored step {found.metadata.get('step')} != acked {seq}")
        if not any(t == "marker" for t, _, _ in found.pending_writes):
            problems.append(f"{cid}: acknowledged but its writes are missing")
    for (thread, bucket), present in maybe_deleted.items():
        if len(present) > 1:
            problems.append(f"{thread}: run {bucket} is partly deleted")
    for thread, seq in max_seq.items():
        latest = saver.get_tuple(thread_config(thread))
        if latest is None or latest.metadata["step"] < seq:
            problems.append(f"{thread}: latest checkpoint is older than acknowledged seq {seq}")
    return {
        "acked": len(acks),
        "checked": checked,
        "listed": len(stored),
        "problems": problems[:20],
        "n": len(problems),
    }


# -- workers: many processes on one directory -------------------------------------


def mp_writer(
    store_dir: str,
    threads: list[str],
    ack_path: str,
    result_path: str,
    barrier: Any,
    duration: float,
) -> None:
    """Writer process: one OS thread per thread id, each writing until the deadline."""
    try:
        saver = KVSaver(store_dir)
        writers = [LoopWriter(saver, t, f"{ack_path}.{t}", fsync_ack=False) for t in threads]
        errors: list[str] = []
        barrier.wait(120)
        deadline = time.monotonic() + duration

        def run(w: LoopWriter) -> None:
            try:
                while time.monotonic() < deadline:
                    w.step()
            except BaseException:
                errors.append(traceback.format_exc())

        workers = [threading.Thread(target=run, args=(w,)) for w in writers]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        report(result_path, ok=not errors, puts=sum(w.acked for w in writers), errors=errors)
    except BaseException:
        _fail(result_path)
        raise


def mp_reader(
    store_dir: str,
    threads: list[str],
    result_path: str,
    barrier: Any,
    duration: float,
    readonly: bool,
    n_threads: int,
) -> None:
    """Reader process: ``n_threads`` threads reading the writers' threads until the
    deadline. Every checkpoint must be whole; a thread's latest never goes back."""
    try:
        saver = KVSaver(store_dir, readonly=readonly)
        problems: list[str] = []
        errors: list[str] = []
        counts = [0] * n_threads
        barrier.wait(120)
        deadline = time.monotonic() + duration

        def run(i: int) -> None:
            rng = random.Random()
            last: dict[str, int] = {}
            try:
                while time.monotonic() < deadline:
                    thread = rng.choice(threads)
                    tup = saver.get_tuple(thread_config(thread))
                    counts[i] += 1
                    if tup is None:
                        if thread in last:
                            problems.append(f"{thread}: latest checkpoint vanished")
                        continue
                    problems.extend(check_tuple(tup))
                    seq = int(tup.metadata["step"])
                    if seq < last.get(thread, -1):
                        problems.append(f"{thread}: latest went back from {last[thread]} to {seq}")
                    last[thread] = seq
                    if counts[i] % 8 == 0:  # older checkpoints, through list()
                        for old in saver.list(thread_config(thread), limit=4):
                            counts[i] += 1
                            problems.extend(check_tuple(old))
            except BaseException:
                errors.append(traceback.format_exc())

        workers = [threading.Thread(target=run, args=(i,)) for i in range(n_threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        report(
            result_path,
            ok=not (errors or problems),
            reads=sum(counts),
            problems=problems[:20],
            n_problems=len(problems),
            errors=errors,
        )
    except BaseException:
        _fail(result_path)
        raise


def verify_worker(
    store_dir: str, ack_paths: list[str], result_path: str, window: int | None = None
) -> None:
    """A fresh process that opens the store read-only and checks it."""
    try:
        with KVSaver(store_dir, readonly=True) as saver:
            result = verify_loop_store(saver, ack_paths, window)
        report(result_path, ok=result["n"] == 0, **result)
    except BaseException:
        _fail(result_path)
        raise


# -- workers: read-only reader beside a writer --------------------------------------


def paced_writer(
    store_dir: str, thread: str, n: int, interval: float, ack_path: str, result_path: str, go: Any
) -> None:
    """Write ``n`` checkpoints of ~16 KiB, one every ``interval`` seconds. The
    store's map starts tiny, so it grows several times during the run."""
    try:
        saver = KVSaver(store_dir, map_size=64 * 1024)
        w = LoopWriter(saver, thread, ack_path, fsync_ack=False, payload_size=(12_000, 20_000))
        go.wait(120)
        for _ in range(n):
            w.step()
            time.sleep(interval)
        report(result_path, ok=True, puts=w.acked, info=saver.store.info())
    except BaseException:
        _fail(result_path)
        raise


def ro_reader(
    store_dir: str, thread: str, final_seq: int, timeout: float, result_path: str, ready: Any
) -> None:
    """A read-only reader, opened before the writer starts (with a map smaller
    than the writer will grow to): polls the thread's latest checkpoint and
    records every new one it sees, until the last one."""
    try:
        saver = KVSaver(store_dir, readonly=True, map_size=32 * 1024)
        seen: list[int] = []
        problems: list[str] = []
        try:
            saver.delete_thread(thread)
            problems.append("a write on a read-only saver did not raise")
        except ReadOnlyError:
            pass
        ready.set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            tup = saver.get_tuple(thread_config(thread))
            if tup is not None:
                seq = int(tup.metadata["step"])
                if not seen or seq != seen[-1]:
                    seen.append(seq)
                    problems.extend(check_tuple(tup))
                if seq >= final_seq:
                    break
            time.sleep(0.001)
        report(result_path, ok=not problems, seen=seen, problems=problems[:20])
    except BaseException:
        _fail(result_path)
        raise


# -- workers: kill -9 ---------------------------------------------------------------


def crash_loop_writer(
    store_dir: str,
    thread: str,
    ack_dir: str,
    status_path: str,
    durability: str | None = None,
    go: Any = None,
    window: int | None = None,
) -> None:
    """Wait for ``go`` (the test starts the next writer while the previous one
    still runs, to hide interpreter start-up), then open the store after the
    previous writer was killed, check it, and put/put_writes in a tight loop
    until killed. Acks are fsynced. ``store_dir``: also a postgresql:// URL
    (``durability`` None: the store's default)."""
    try:
        if go is not None and not go.wait(300):
            raise TimeoutError("no go signal")
        saver = KVSaver(store_dir, durability=durability)  # type: ignore[arg-type]
        acks = sorted(Path(ack_dir).glob("*.ack"))
        result = verify_loop_store(saver, acks, window, own=thread)
        if result["n"]:
            report(status_path, ok=False, **result)
            sys.exit(1)
        ack_path = Path(ack_dir) / f"{thread}.ack"
        writer = LoopWriter(saver, thread, ack_path, fsync_ack=True, window=window)
        report(status_path, ok=True, writing=True, **result)
        while True:
            writer.step()
    except SystemExit:
        raise
    except BaseException:
        _fail(status_path)
        raise


def commit_then_wait(
    store_dir: str, thread: str, ack_dir: str, status_path: str, n: int, durability: str, sync: bool
) -> None:
    """``n`` acknowledged puts with ``durability``, then (if ``sync``)
    ``store.sync()``; report, and wait to be killed."""
    try:
        saver = KVSaver(store_dir, durability=durability)  # type: ignore[arg-type]
        writer = LoopWriter(saver, thread, Path(ack_dir) / f"{thread}.ack", fsync_ack=True)
        for _ in range(n):
            writer.step()
        if sync:
            saver.store.sync()  # type: ignore[attr-defined]
        report(status_path, ok=True, acked=writer.acked)
        while True:
            time.sleep(1)
    except BaseException:
        _fail(status_path)
        raise


class GraphState(TypedDict, total=False):
    count: int
    log: Annotated[list[int], operator.add]


GRAPH_RUN = 5  # steps per invoke


def build_graph(saver: KVSaver) -> Any:
    """count += 1 and log.append(count), GRAPH_RUN times per invoke."""
    from langgraph.graph import END, START, StateGraph

    def step(state: GraphState) -> GraphState:
        time.sleep(0.005)  # a node does some work; checkpoints are saved meanwhile
        count = state.get("count", 0) + 1
        return {"count": count, "log": [count]}

    def route(state: GraphState) -> str:
        return END if state["count"] % GRAPH_RUN == 0 else "step"

    builder = StateGraph(GraphState)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", route)
    return builder.compile(checkpointer=saver)


def _state_problems(values: dict[str, Any], where: str) -> list[str]:
    count = values.get("count", 0)
    log = values.get("log", [])
    if log != list(range(1, count + 1)):
        return [f"{where}: count {count} but log {log[:3]}...{log[-3:]} ({len(log)} items)"]
    return []


def verify_graph_thread(
    saver: KVSaver, graph: Any, thread: str, ack_path: str, recent: int | None = None
) -> dict:
    """Acknowledged runs are there; every checkpoint of the thread loads (a blob
    record for every channel version) and holds a consistent state. With
    ``recent``, only that many of the newest checkpoints and acknowledged runs
    (and as many older runs, sampled) are checked, so the check stays quick
    however long the thread; the final check of a test checks everything."""
    problems: list[str] = []
    acks = read_acks([ack_path])
    to_check = acks
    if recent is not None and len(acks) > recent:
        older = acks[:-recent]
        to_check = random.sample(older, min(recent, len(older))) + acks[-recent:]
    for cid, count in to_check:
        snap = graph.get_state(thread_config(thread, cid))
        if snap.values.get("count") != int(count) or snap.next:
            problems.append(f"acknowledged run {cid} (count {count}) is missing or incomplete")
        problems += _state_problems(snap.values, cid)
    n = 0
    for tup in saver.list(thread_config(thread), limit=recent):
        n += 1
        problems += missing_blobs(saver, tup)
    for snap in graph.get_state_history(thread_config(thread), limit=recent):
        problems += _state_problems(snap.values, snap.config["configurable"]["checkpoint_id"])
    latest = graph.get_state(thread_config(thread))
    top = max((int(c) for _, c in acks), default=0)
    if latest.values.get("count", 0) < top:
        problems.append(f"latest count {latest.values.get('count')} < acknowledged {top}")
    return {
        "acked": len(acks),
        "checked": len(to_check),
        "listed": n,
        "problems": problems[:20],
        "n": len(problems),
    }


def crash_graph_writer(
    store_dir: str,
    thread: str,
    ack_path: str,
    status_path: str,
    go: Any = None,
    max_runs: int | None = None,
    recent: int | None = 200,
) -> None:
    """Wait for ``go``; check the thread (``recent``: see verify_graph_thread),
    resume an interrupted run, then invoke the graph in a loop (until killed,
    or ``max_runs`` runs), acknowledging each finished run (checkpoint id,
    count)."""
    try:
        import langgraph.graph  # noqa: F401  (imported before the go signal)

        if go is not None and not go.wait(300):
            raise TimeoutError("no go signal")
        saver = KVSaver(store_dir)
        graph = build_graph(saver)
        result = verify_graph_thread(saver, graph, thread, ack_path, recent)
        resumed = False
        before = graph.get_state(thread_config(thread))
        if before.next:  # killed mid-run: invoke(None) continues from the latest checkpoint
            out = graph.invoke(None, thread_config(thread))
            resumed = True
            if out["count"] % GRAPH_RUN or out["count"] <= before.values.get("count", 0):
                result["problems"].append(f"resume from {before.values} ended at {out}")
            result["problems"] += _state_problems(out, "resumed run")
            result["n"] = len(result["problems"])
        report(status_path, ok=result["n"] == 0, resumed=resumed, **result)
        if result["n"]:
            sys.exit(1)
        runs = 0
        while max_runs is None or runs < max_runs:
            out = graph.invoke({"log": []}, thread_config(thread))
            snap = graph.get_state(thread_config(thread))
            if snap.values != out or out["count"] % GRAPH_RUN:
                report(status_path, ok=False, error=f"run ended with {out}, state {snap.values}")
                sys.exit(1)
            cid = snap.config["configurable"]["checkpoint_id"]
            append_line(ack_path, f"{cid} {out['count']}", fsync=True)
            runs += 1
        report(status_path, ok=True, done=True, runs=runs)
    except SystemExit:
        raise
    except BaseException:
        _fail(status_path)
        raise


# -- fork ---------------------------------------------------------------------------

FORK_SAVER: KVSaver | None = None  # set by the test before a "fork" Pool starts


def fork_pool_task(task: int) -> list[str]:
    """In a forked Pool worker: two threads each put and read back 5 checkpoints
    with the saver inherited from the parent."""
    saver = FORK_SAVER
    assert saver is not None
    out: list[str] = []
    errors: list[str] = []

    def run(t: int) -> None:
        try:
            w = LoopWriter(saver, f"pool-{task}-{t}", os.devnull, fsync_ack=False)
            for _ in range(5):
                cid = w.step()
                tup = saver.get_tuple(thread_config(w.thread, cid))
                if tup is None or check_tuple(tup, expect_marker=True):
                    errors.append(f"{cid} did not read back whole in pid {os.getpid()}")
                out.append(f"{w.thread} {cid}")
        except BaseException:
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=run, args=(t,)) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise RuntimeError("\n".join(errors))
    return out


# -- page cache probe (durability) ------------------------------------------------------


_KPF_DIRTY, _KPF_WRITEBACK = 1 << 4, 1 << 8  # bits of /proc/kpageflags


def unwritten_pages(path: str | os.PathLike[str]) -> list[int] | None:
    """Pages of a file whose data is not on the disk yet: dirty, or being
    written back, in the page cache. Read from the kernel's page flags
    (/proc/self/pagemap gives each mapped page's frame, /proc/kpageflags its
    flags; root only); None where they are not readable. Observing changes
    nothing: an earlier version asked the kernel to drop the file's clean
    pages (POSIX_FADV_DONTNEED) and kept what stayed, but that call also
    starts writing dirty pages back, so a quick disk cleaned a page before
    it was looked at (a CI failure). Nobody may write the file meanwhile."""
    page = os.sysconf("SC_PAGE_SIZE")
    try:
        pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)
    except OSError:
        return None
    try:
        kflags = os.open("/proc/kpageflags", os.O_RDONLY)
    except OSError:
        os.close(pagemap)
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return []
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        try:
            out = []
            for i in range((size + page - 1) // page):
                ctypes.string_at(addr + i * page, 1)  # fault it in: cached, or read clean
                entry = int.from_bytes(os.pread(pagemap, 8, (addr // page + i) * 8), "little")
                pfn = entry & ((1 << 55) - 1)
                if not entry >> 63 or pfn == 0:
                    return None  # not present, or frame numbers hidden (no CAP_SYS_ADMIN)
                flags = int.from_bytes(os.pread(kflags, 8, pfn * 8), "little")
                if flags & (_KPF_DIRTY | _KPF_WRITEBACK):
                    out.append(i)
            return out
        finally:
            libc.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)
        os.close(pagemap)
        os.close(kflags)


def page_cache_probe_works(directory: str | os.PathLike[str]) -> bool:
    """On a disk-backed filesystem, a freshly written file's pages are
    unwritten and an fsynced one's are not. Not so on tmpfs, nor where the
    kernel's page flags cannot be read."""
    synced, dirty = Path(directory) / "probe-synced", Path(directory) / "probe-dirty"
    try:
        with open(synced, "wb") as f:
            f.write(os.urandom(64 * 1024))
            f.flush()
            os.fsync(f.fileno())
        with open(dirty, "wb") as f:
            f.write(os.urandom(64 * 1024))
        return unwritten_pages(synced) == [] and bool(unwritten_pages(dirty))
    except OSError:
        return False
    finally:
        for p in (synced, dirty):
            p.unlink(missing_ok=True)


def real_disk_dir(preferred: str | os.PathLike[str]) -> Path | None:
    """A new directory on a disk-backed filesystem, where fsync does real work
    and the page cache can be observed: under ``preferred`` if it is one (the
    suite's temporary directories are on tmpfs when /dev/shm exists, see
    conftest.py), else under /var/tmp or the home directory; None if none is.
    The caller removes it."""
    for base in (Path(preferred), Path("/var/tmp"), Path.home()):
        try:
            d = Path(tempfile.mkdtemp(prefix="kvsaver-disk-", dir=base))
        except OSError:
            continue
        if page_cache_probe_works(d):
            return d
        shutil.rmtree(d, ignore_errors=True)
    return None


# -- running a worker as a plain subprocess ---------------------------------------------
#
# The kill -9 tests start dozens of processes; ``python procs_helpers.py`` costs
# only the imports the worker needs (a multiprocessing "spawn" child also
# re-imports pytest, the parent's __main__). The go signal is a line on stdin.


class StdinGo:
    """``go`` for a worker run by ``main``: set when the parent writes a line."""

    def wait(self, timeout: float | None = None) -> bool:
        return bool(sys.stdin.readline())


class Child:
    """A worker in a subprocess, with the bits of multiprocessing.Process the
    tests use (``is_alive``, ``kill``, ``join``, ``exitcode``) and a go signal."""

    def __init__(self, worker: str, **kwargs: Any) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, worker, json.dumps(kwargs)], stdin=subprocess.PIPE
        )
        self.pid = self.proc.pid
        self._go = False

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()
        self._go = True

    def gone(self) -> bool:
        return self._go

    def is_alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        self.proc.kill()

    def join(self, timeout: float | None = None) -> None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        if self.proc.returncode is not None and self.proc.stdin is not None:
            self.proc.stdin.close()

    @property
    def exitcode(self) -> int | None:
        return self.proc.poll()


WORKERS = {
    "crash_loop_writer": crash_loop_writer,
    "crash_graph_writer": crash_graph_writer,
    "commit_then_wait": commit_then_wait,
    "verify_worker": verify_worker,
}


def main(argv: list[str]) -> None:
    worker, kwargs = WORKERS[argv[1]], json.loads(argv[2])
    if kwargs.pop("go", False):
        kwargs["go"] = StdinGo()
    worker(**kwargs)


if __name__ == "__main__":
    main(sys.argv)
