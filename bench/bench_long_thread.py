"""Latest-checkpoint lookup on a thread of 100,000 checkpoints against one of 100
(issue #6): KVSaver (LMDB) and SqliteSaver, both threads in the same store, so
only the thread's length differs.

Building 100,000 checkpoints through ``put`` would take minutes, so all but the
last checkpoint of each thread are written in big batches:

* KVSaver: a real ``put`` of a typical step (1-2 changed channels) is recorded
  (``Recorder``: a KVSaver over a recording MemoryStore, so the bytes are
  whatever the saver writes today, index entries included); the records are
  cloned with each new checkpoint id substituted and written with
  ``saver.store.write()``, 10,000 per transaction.
* SqliteSaver: ``executemany`` of rows holding the same serialized checkpoint.

The last checkpoint of each thread is then written by the saver's own ``put``
(all channels), so the lookup returns a complete, real checkpoint.
"""

from __future__ import annotations

import json
import shutil
import time
from typing import Any

import pytest
from _workloads import (
    DISK_SAVERS,
    KV_LMDB,
    Recorder,
    ThreadGen,
    chunks,
    close_saver,
    disk_bytes,
    label,
    make_saver,
)
from langgraph.checkpoint.base import get_checkpoint_metadata
from langgraph.checkpoint.base.id import uuid6

LONG = 100_000
SHORT = 100
BATCH = 10_000


def _gen(saver: Any, thread: str) -> ThreadGen:
    return ThreadGen(saver, thread, msg_chars=60, field_chars=40, window=5)


def _bulk_kv(saver: Any, thread: str, n: int) -> str:
    """n checkpoints on ``thread``; returns the last id."""
    rec = Recorder()
    gen = _gen(rec.saver, thread)
    first = rec.put(gen.next())  # all channels, source "input"
    step = gen.next()  # a typical step
    template = rec.put(step)
    tid = step.checkpoint["id"].encode()
    with saver.store.write() as txn:
        for k, v in first:
            txn.put(k, v)
    ids = [str(uuid6(clock_seq=i)) for i in range(n - 1)]
    for batch in chunks(ids, BATCH):
        with saver.store.write() as txn:
            for cid in batch:
                b = cid.encode()
                for k, v in template:
                    txn.put(k.replace(tid, b), v.replace(tid, b))
    return ids[-1]


def _bulk_sqlite(saver: Any, thread: str, n: int) -> str:
    gen = _gen(saver, thread)
    gen.next()
    step = gen.next()
    ctype, cbytes = saver.serde.dumps_typed(step.checkpoint)
    meta = json.dumps(get_checkpoint_metadata(step.config, step.metadata)).encode()
    ids = [str(uuid6(clock_seq=i)) for i in range(n - 1)]
    saver.setup()
    with saver.cursor() as cur:
        cur.executemany(
            "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, "
            "parent_checkpoint_id, type, checkpoint, metadata) VALUES (?, '', ?, ?, ?, ?, ?)",
            [
                (thread, cid, ids[i - 1] if i else None, ctype, cbytes, meta)
                for i, cid in enumerate(ids)
            ],
        )
    return ids[-1]


def _finish(saver: Any, thread: str, parent: str) -> tuple[dict[str, Any], str]:
    """The last checkpoint, through the saver's own put (all channels)."""
    gen = _gen(saver, thread)
    gen.parent_id = parent
    a = gen.next()
    saver.put(a.config, a.checkpoint, a.metadata, a.new_versions)
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}, a.checkpoint["id"]


@pytest.fixture(scope="module", params=DISK_SAVERS)
def long_store(request: pytest.FixtureRequest, tmp_path_factory: Any) -> Any:
    name = request.param
    workdir = str(tmp_path_factory.mktemp(f"long-{name}"))
    t0 = time.perf_counter()
    saver = make_saver(name, workdir)
    bulk = _bulk_kv if name == KV_LMDB else _bulk_sqlite
    configs = {}
    for n in (LONG, SHORT):
        thread = f"long-{n}"
        configs[n] = _finish(saver, thread, bulk(saver, thread, n))
    build = time.perf_counter() - t0
    yield name, saver, configs, build, disk_bytes(workdir)
    close_saver(saver)
    shutil.rmtree(workdir, ignore_errors=True)  # ~0.1-0.8 GB; pytest keeps old temp dirs


@pytest.mark.parametrize("length", [SHORT, LONG])
def test_latest_long_thread(benchmark: Any, long_store: Any, length: int) -> None:
    name, saver, configs, build, size = long_store
    config, latest_id = configs[length]
    label(benchmark, f"long_thread:latest_of_{length}", name, 1)
    benchmark.extra_info.update(
        thread_checkpoints=length, build_seconds=round(build, 1), store_bytes=size
    )
    tup = benchmark.pedantic(
        saver.get_tuple, args=(config,), rounds=60, iterations=10, warmup_rounds=5
    )
    assert tup.checkpoint["id"] == latest_id
    assert len(tup.checkpoint["channel_values"]) == 10
