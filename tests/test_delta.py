"""Delta storage of append-only channel values (``saver/delta.py``).

The state machine drives KVSaver and InMemorySaver with the same puts (list
histories: appends, RemoveMessage, replacement by id, trimming, type changes,
forks from old checkpoints, a version stored again with another value) and
the same deletes and copies (retention sweeps, prune, copy_thread,
delete_for_runs, delete_thread; applied to InMemorySaver's dicts where it has
no such method), and compares every state of every checkpoint, through the
saver that wrote them (its caches warm) and through a fresh one (cold: every
chain rebuilt from the store).
"""

from __future__ import annotations

import itertools
from typing import Any

import ormsgpack
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from kvsaver import KVSaver, Retention
from kvsaver import delta as D
from kvsaver import schema as S
from kvsaver.kv import FormatVersionError, MemoryStore
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.base import CipherProtocol, SerializerProtocol
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph.message import add_messages

THREADS = ["t1", "t2"]
CHANNELS = ["messages", "items"]
_ids = itertools.count()


def _cfg(thread: str, cid: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if cid is not None:
        conf["checkpoint_id"] = cid
    return {"configurable": conf}


def _small_chains(saver: KVSaver, k: int = 3, stride: int = D.STRIDE) -> KVSaver:
    """Deltas on every list however small, and chains of at most ``k``: every
    path (whole copy, delta, the K-th copy) is taken within a few steps; with
    a ``stride`` under ``k``, long steps too."""
    codec = D.codec(saver.serde)
    codec.min_bytes = 1
    codec.max_chain = k
    codec.stride = stride
    return saver


def _fresh(saver: KVSaver) -> KVSaver:
    """The same store through a new serializer: no cached value."""
    return KVSaver(saver.store)


def _records(saver: KVSaver, thread: str) -> dict[bytes, bytes]:
    with saver.store.read() as txn:
        return dict(txn.scan(*S.blobs_range(thread)))


def _message(i: int, long: bool) -> Any:
    cls = HumanMessage if i % 2 else AIMessage
    return cls(f"words of a message {i} " * (12 if long else 1), id=f"m{i}")


class Histories(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # Depths 0-4: 1 and 3 on the version before, 2 and 4 long steps (stride 2).
        self.kv = _small_chains(KVSaver(":memory:"), k=5, stride=2)
        self.mem = InMemorySaver()
        self.runs: dict[tuple[str, str], str] = {}  # (thread, cid) -> run id
        self.n = 0

    # -- helpers ------------------------------------------------------------------

    def _cids(self, thread: str) -> list[str]:
        return sorted(self.mem.storage.get(thread, {}).get("", {}))

    def _tuple(self, thread: str, cid: str) -> Any:
        return self.mem.get_tuple(_cfg(thread, cid))

    def _version(self) -> str:
        self.n += 1
        return f"{self.n:032}.{self.n % 7:016}"

    def _put(
        self,
        thread: str,
        parent: str | None,
        values: dict[str, Any],
        bump: set[str],
        versions: dict[str, str] | None = None,
        run: str = "r0",
    ) -> None:
        cp = empty_checkpoint()
        cid = f"{next(_ids):012}"
        cp["id"] = cid
        old = dict(self._tuple(thread, parent).checkpoint["channel_versions"]) if parent else {}
        new_versions = {ch: (versions or {}).get(ch) or self._version() for ch in bump}
        old.update(new_versions)
        cp["channel_versions"] = old
        cp["channel_values"] = values
        meta = {"source": "loop", "step": self.n, "run_id": run}
        for saver in (self.kv, self.mem):
            saver.put(_cfg(thread, parent), dict(cp), dict(meta), dict(new_versions))
        self.runs[thread, cid] = run

    # -- puts ---------------------------------------------------------------------------

    @rule(
        thread=st.sampled_from(THREADS),
        back=st.integers(0, 4),
        channel=st.sampled_from(CHANNELS),
        op=st.sampled_from(
            ["append", "append", "append", "remove", "replace", "trim", "type", "same"]
        ),
        k=st.integers(1, 3),
        long=st.booleans(),
        run=st.sampled_from(["r0", "r1", "r2"]),
    )
    def step(
        self, thread: str, back: int, channel: str, op: str, k: int, long: bool, run: str
    ) -> None:
        """A new checkpoint on the latest or an older one (a fork)."""
        cids = self._cids(thread)
        parent = cids[-1 - back] if len(cids) > back else (cids[-1] if cids else None)
        values = dict(self._tuple(thread, parent).checkpoint["channel_values"]) if parent else {}
        cur = values.get(channel, [])
        if not isinstance(cur, list):
            cur = []
        if channel == "messages":
            fresh = [_message(self.n * 10 + i, long) for i in range(k)]
            ids = [m.id for m in cur]
            if op == "append" or not ids:
                new: Any = add_messages(cur, fresh)
            elif op == "remove":
                new = add_messages(cur, [RemoveMessage(id=ids[len(ids) // 2])])
            elif op == "replace":
                new = add_messages(cur, [HumanMessage("replaced", id=ids[0])])
            elif op == "trim":
                new = cur[k:]
            elif op == "type":
                new = "a string now" if long else {"not": "a list"}
            else:
                new = list(cur)
        else:
            fresh = [("x" * (100 if long else 3), self.n, i) for i in range(k)]
            if op == "type":
                new = 42 if long else "text"
            elif op == "trim":
                new = cur[1:]
            elif op == "replace" and cur:
                new = [("other",), *cur[1:]]
            elif op == "same":
                new = list(cur)
            else:
                new = cur + [list(f) for f in fresh]
        values[channel] = new
        self._put(thread, parent, values, {channel}, run=run)

    @rule(
        thread=st.sampled_from(THREADS),
        back=st.integers(0, 2),
        puts=st.integers(2, 6),
        run=st.sampled_from(["r0", "r1", "r2"]),
    )
    def grow(self, thread: str, back: int, puts: int, run: str) -> None:
        """Appends in a row, the first maybe on an older checkpoint: chains
        deep enough for long steps and the K-th whole copy."""
        for _ in range(puts):
            self.step(thread, back, "messages", "append", 1, True, run)
            back = 0

    @precondition(lambda self: any(self._cids(t) for t in THREADS))
    @rule(thread=st.sampled_from(THREADS), data=st.data())
    def overwrite_version(self, thread: str, data: st.DataObject) -> None:
        """A put that stores an existing version again, with another value:
        every checkpoint of that version sees the new one, no other changes."""
        cids = self._cids(thread)
        if not cids:
            return
        parent = data.draw(st.sampled_from(cids))
        tup = self._tuple(thread, parent)
        ch = data.draw(st.sampled_from(CHANNELS))
        ver = tup.checkpoint["channel_versions"].get(ch)
        if ver is None or S.is_small(tup.checkpoint["channel_values"].get(ch, [])):
            # A small value is in each checkpoint's record (format 6): putting
            # its version again changes only the new checkpoint, as in
            # SqliteSaver, not every one (tests/test_small_values.py).
            return
        values = dict(tup.checkpoint["channel_values"])
        values[ch] = [_message(10_000 + self.n, False)]
        self._put(thread, parent, values, {ch}, versions={ch: ver})

    # -- deletes and copies ---------------------------------------------------------------

    @rule(keep=st.integers(1, 3))
    def sweep(self, keep: int) -> None:
        self.kv.sweep(Retention(keep_last=keep, sweep_interval_minutes=None))
        for t in THREADS:
            for cid in self._cids(t)[:-keep]:
                self._drop(t, cid)

    @rule(thread=st.sampled_from(THREADS))
    def prune(self, thread: str) -> None:
        self.kv.prune([thread])
        for cid in self._cids(thread)[:-1]:
            self._drop(thread, cid)

    @rule(run=st.sampled_from(["r1", "r2"]))
    def delete_for_runs(self, run: str) -> None:
        self.kv.delete_for_runs([run])
        for (t, cid), r in list(self.runs.items()):
            if r == run and cid in self._cids(t):
                self._drop(t, cid)

    @rule(src=st.sampled_from(THREADS), dst=st.sampled_from(THREADS))
    def copy_thread(self, src: str, dst: str) -> None:
        self.kv.copy_thread(src, dst)
        if src == dst:
            return
        # The checkpoints and the values they use (blobs no checkpoint uses
        # are garbage: KVSaver's deletes collect them, InMemorySaver's not).
        m = self.mem
        for cid, saved in list(m.storage.get(src, {}).get("", {}).items()):
            m.storage[dst][""][cid] = saved
            self.runs[dst, cid] = self.runs[src, cid]
            for ch, v in self._tuple(src, cid).checkpoint["channel_versions"].items():
                if (src, "", ch, v) in m.blobs:
                    m.blobs[(dst, "", ch, v)] = m.blobs[(src, "", ch, v)]

    @rule(thread=st.sampled_from(THREADS))
    def delete_thread(self, thread: str) -> None:
        self.kv.delete_thread(thread)
        self.mem.delete_thread(thread)

    def _drop(self, thread: str, cid: str) -> None:
        del self.mem.storage[thread][""][cid]

    # -- the comparison ----------------------------------------------------------------------

    @invariant()
    def every_state_equal(self) -> None:
        cold = _fresh(self.kv)
        for t in THREADS:
            cids = self._cids(t)
            listed = [tup.config["configurable"]["checkpoint_id"] for tup in self.kv.list(_cfg(t))]
            assert listed == cids[::-1]
            for cid in cids:
                want = self._tuple(t, cid).checkpoint["channel_values"]
                for saver in (self.kv, cold):
                    got = saver.get_tuple(_cfg(t, cid))
                    assert got is not None
                    assert got.checkpoint["channel_values"] == want, (t, cid)
            # The chain invariant: the base of every stored delta is stored.
            records = _records(self.kv, t)
            for key, raw in records.items():
                if D.is_delta(raw):
                    assert D.base_key(key, raw) in records


TestHistories = Histories.TestCase
TestHistories.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# -- targeted tests ---------------------------------------------------------------------


def _chat(
    saver: Any, thread: str, turns: int, start: int = 0, parent: str | None = None, run: str = "r"
) -> str:
    """``turns`` puts, each appending one message to "messages"; returns the last id."""
    tup = saver.get_tuple(_cfg(thread, parent)) if parent else saver.get_tuple(_cfg(thread))
    msgs = list(tup.checkpoint["channel_values"]["messages"]) if tup else []
    versions = dict(tup.checkpoint["channel_versions"]) if tup else {}
    parent = tup.config["configurable"]["checkpoint_id"] if tup else None
    for i in range(start, start + turns):
        msgs = [*msgs, _message(i, True)]
        cp = empty_checkpoint()
        cp["id"] = f"{next(_ids):012}"
        ver = saver.get_next_version(versions.get("messages"), None)
        versions["messages"] = ver
        cp["channel_versions"] = dict(versions)
        cp["channel_values"] = {"messages": msgs}
        saver.put(_cfg(thread, parent), cp, {"step": i, "run_id": run}, {"messages": ver})
        parent = cp["id"]
    assert parent is not None
    return parent


def _kinds(saver: KVSaver, thread: str) -> list[bool]:
    return [D.is_delta(v) for v in _records(saver, thread).values()]


def test_appends_are_stored_as_the_appended_bytes() -> None:
    saver = KVSaver(":memory:")
    _chat(saver, "t", 20)
    kinds = _kinds(saver, "t")
    # Whole every MAX_CHAIN versions, deltas in between.
    assert kinds.count(False) == -(-20 // D.MAX_CHAIN) and kinds.count(True) == 20 - kinds.count(
        False
    )
    codec = D.codec(saver.serde)
    with saver.store.read() as txn:
        items = list(txn.scan(*S.blobs_range("t")))
        refs = []
        for key, raw in items:
            if not D.is_delta(raw):
                continue
            rec = D.decode(raw)
            whole = JsonPlusSerializer().dumps_typed(
                saver.get_tuple(_cfg("t")).checkpoint["channel_values"]["messages"][: rec.n]
            )[1]
            base_key = S.sibling_blob_key(key, rec.ref)
            refs.append(items.index((base_key, txn.get(base_key))))
            base = codec.resolve(txn, base_key, txn.get(base_key))
            assert base is not None
            piece = codec.unwrap(rec.typ, rec.piece)[1]
            # new bytes = new header + old elements + appended elements
            head = D.header(base.plain)
            assert head is not None
            assert whole == D.make_header(rec.n) + base.plain[head[1] :] + piece
    # On the version before, but every STRIDE-th on the STRIDE-th before.
    assert refs == [i - D.STRIDE if i % D.STRIDE == 0 else i - 1 for i in range(1, 20)]


def _steps(txn: Any, key: bytes, raw: bytes) -> int:
    """How many delta records a read of ``key`` joins."""
    n = 0
    while D.is_delta(raw):
        key = D.base_key(key, raw)
        raw, n = txn.get(key), n + 1
    return n


def test_a_read_joins_few_pieces_whatever_the_depth() -> None:
    """A cold read: the version at depth d joins d % STRIDE short
    steps and d // STRIDE long ones (at most 14 at K = 64, not 63)."""
    saver = KVSaver(":memory:")
    _chat(saver, "t", D.MAX_CHAIN + 3)
    with saver.store.read() as txn:
        items = list(txn.scan(*S.blobs_range("t")))
        depths = [D.decode(raw).depth if D.is_delta(raw) else 0 for _, raw in items]
        steps = [_steps(txn, key, raw) for key, raw in items]
    assert depths == [*range(D.MAX_CHAIN), 0, 1, 2]
    assert steps == [d % D.STRIDE + d // D.STRIDE for d in depths]
    assert max(steps) == 14
    # Every version reads back whole, through a fresh serializer too.
    for saver_ in (saver, _fresh(saver)):
        msgs = saver_.get_tuple(_cfg("t")).checkpoint["channel_values"]["messages"]
        assert [m.id for m in msgs] == [f"m{i}" for i in range(D.MAX_CHAIN + 3)]


def test_a_linear_chain_of_an_older_kvsaver_reads_and_grows_long_steps() -> None:
    """A chain written before long steps (each version on the one before,
    ``stride`` 1 writes exactly that) reads as it is, and puts that follow on
    it take long steps over its records."""
    saver = KVSaver(":memory:")
    D.codec(saver.serde).stride = 1
    last = _chat(saver, "t", 12)
    with saver.store.read() as txn:
        items = list(txn.scan(*S.blobs_range("t")))
        assert [_steps(txn, k, r) for k, r in items] == list(range(12))
    new = KVSaver(saver.store)  # another serializer: the current layout, no cache
    _chat(new, "t", 6, start=12, parent=last)
    with new.store.read() as txn:
        items = list(txn.scan(*S.blobs_range("t")))
        steps = [_steps(txn, k, r) for k, r in items]
    # Depths 12-15 on the version before; 16 on depth 8 (8 old steps + 1), 17 on 16.
    assert steps == [*range(16), 9, 10]
    for s in (new, _fresh(new)):
        ids = [t.checkpoint["channel_values"]["messages"][-1].id for t in s.list(_cfg("t"))]
        assert ids == [f"m{i}" for i in reversed(range(18))]


def test_reads_join_at_most_max_chain_pieces() -> None:
    saver = _small_chains(KVSaver(":memory:"), k=4)
    _chat(saver, "t", 30)
    with saver.store.read() as txn:
        depths = [
            D.decode(v).depth for v in dict(txn.scan(*S.blobs_range("t"))).values() if D.is_delta(v)
        ]
    assert depths and max(depths) == 3


def test_old_format_store_reads_and_extends(tmp_path: Any) -> None:
    """A store written before deltas (every value whole, format 2) reads as it
    is, is marked format 3 when opened for writing, and its threads go on
    with deltas on the old whole values."""
    path = str(tmp_path / "s")
    with KVSaver(path) as old:
        D.codec(old.serde).enabled = False  # as kvsaver wrote before delta storage
        last = _chat(old, "t", 6)
        with old.store.write() as txn:
            txn.put(S.SCHEMA_KEY, ormsgpack.packb({"format": 2}))
        assert not any(_kinds(old, "t"))
        before = [t.checkpoint for t in old.list(_cfg("t"))]
    with KVSaver(path, readonly=True) as ro:
        assert [t.checkpoint for t in ro.list(_cfg("t"))] == before
        with ro.store.read() as txn:
            assert S.decode_schema(txn.get(S.SCHEMA_KEY)) == 2
    with KVSaver(path) as new:
        with new.store.read() as txn:
            record = S.decode_schema_record(txn.get(S.SCHEMA_KEY))
        assert record["format"] == S.FORMAT_VERSION == 6
        assert record["upgrades"] == [
            {"from": 2, "to": 3},
            {"from": 3, "to": 4},
            {"from": 4, "to": 5},
            {"from": 5, "to": 6},
        ]
        _chat(new, "t", 4, start=6, parent=last)
        assert any(_kinds(new, "t"))
        got = [t.checkpoint for t in new.list(_cfg("t"))][4:]
        assert got == before
        msgs = new.get_tuple(_cfg("t")).checkpoint["channel_values"]["messages"]
        assert [m.id for m in msgs] == [f"m{i}" for i in range(10)]
    with KVSaver(path) as again:
        assert again.get_tuple(_cfg("t")).checkpoint["channel_values"]["messages"] == msgs


def test_a_newer_format_is_refused() -> None:
    store = MemoryStore()
    with store.write() as txn:
        txn.put(S.SCHEMA_KEY, ormsgpack.packb({"format": S.FORMAT_VERSION + 1}))
    with pytest.raises(FormatVersionError):
        KVSaver(store)


class _Xor(CipherProtocol):
    def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
        return "xor", bytes(b ^ 0x5A for b in plaintext)

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        assert ciphername == "xor"
        return bytes(b ^ 0x5A for b in ciphertext)


@pytest.mark.parametrize("cipher", ["xor", "aes"])
def test_encrypted_round_trip(cipher: str) -> None:
    """Deltas are taken before encryption: pieces are encrypted, the text never
    appears in the store, every state reads back, also without the caches."""
    if cipher == "aes":
        serde = EncryptedSerializer.from_pycryptodome_aes(key=b"k" * 16)
    else:
        serde = EncryptedSerializer(_Xor())
    saver = KVSaver(":memory:", serde=serde)
    _chat(saver, "t", 12)
    records = _records(saver, "t")
    deltas = [D.decode(v) for v in records.values() if D.is_delta(v)]
    assert deltas and all(
        r.typ.endswith(f"+{cipher if cipher == 'xor' else 'aes'}") for r in deltas
    )
    with saver.store.read() as txn:
        assert not any(b"words of a message" in v for _, v in txn.scan(None, None))
    want = [t.checkpoint for t in saver.list(_cfg("t"))]
    assert len(want) == 12
    cold = KVSaver(saver.store, serde=serde)
    assert [t.checkpoint for t in cold.list(_cfg("t"))] == want
    msgs = want[0]["channel_values"]["messages"]
    assert [m.id for m in msgs] == [f"m{i}" for i in range(12)]


def test_unknown_serializer_stores_whole() -> None:
    class Opaque(SerializerProtocol):  # msgpack inside, but not a JsonPlusSerializer
        inner = JsonPlusSerializer()

        def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
            return self.inner.dumps_typed(obj)

        def loads_typed(self, data: tuple[str, bytes]) -> Any:
            return self.inner.loads_typed(data)

    saver = KVSaver(":memory:", serde=Opaque())
    _chat(saver, "t", 8)
    assert not any(_kinds(saver, "t"))
    assert len(saver.get_tuple(_cfg("t")).checkpoint["channel_values"]["messages"]) == 8


def test_prune_keeps_the_chain_of_the_latest_and_nothing_else() -> None:
    saver = _small_chains(KVSaver(":memory:"), k=5)
    _chat(saver, "t", 13)  # whole at 0, 5, 10; the latest (12) is a delta of depth 2
    want = saver.get_tuple(_cfg("t")).checkpoint
    saver.prune(["t"])
    records = _records(saver, "t")
    assert len(records) == 3 and sorted(_kinds(saver, "t")) == [False, True, True]
    assert _fresh(saver).get_tuple(_cfg("t")).checkpoint == want


def test_prune_and_copy_keep_the_long_steps_of_the_latest() -> None:
    """The latest of 20 versions (depth 19) reads over 19, 18, 17, 16, 8 and
    the whole 0: prune keeps exactly those, a copy reads the same."""
    saver = KVSaver(":memory:")
    _chat(saver, "t", 20)
    want = saver.get_tuple(_cfg("t")).checkpoint
    saver.prune(["t"])
    with saver.store.read() as txn:
        depths = sorted(
            D.decode(v).depth if D.is_delta(v) else 0 for _, v in txn.scan(*S.blobs_range("t"))
        )
    assert depths == [0, 8, 16, 17, 18, 19]
    saver.copy_thread("t", "u")
    for s in (saver, _fresh(saver)):
        assert s.get_tuple(_cfg("t")).checkpoint == want
        got = s.get_tuple(_cfg("u")).checkpoint
        assert got["channel_values"] == want["channel_values"]


def test_forks_share_their_base() -> None:
    saver = _small_chains(KVSaver(":memory:"), k=8)
    base = _chat(saver, "t", 3, run="x")
    a = _chat(saver, "t", 1, start=100, parent=_chat(saver, "t", 1, 99, base, "x"), run="a")
    b = _chat(saver, "t", 1, start=200, parent=_chat(saver, "t", 1, 199, base, "x"), run="b")
    ids = {
        cid: [
            m.id
            for m in _fresh(saver)
            .get_tuple(_cfg("t", cid))
            .checkpoint["channel_values"]["messages"]
        ]
        for cid in (a, b)
    }
    assert ids[a] == ["m0", "m1", "m2", "m99", "m100"]
    assert ids[b] == ["m0", "m1", "m2", "m199", "m200"]
    assert sum(_kinds(saver, "t")) == 6  # both branches are deltas on the same base
    # Keeping only the two branch tips keeps their chains, the shared base too.
    saver.delete_for_runs(["x"])
    assert len(list(saver.list(_cfg("t")))) == 2
    assert len(_records(saver, "t")) == 7
    for cid, want in ids.items():
        got = _fresh(saver).get_tuple(_cfg("t", cid)).checkpoint["channel_values"]["messages"]
        assert [m.id for m in got] == want


def test_copy_over_a_version_the_target_chains_on() -> None:
    """copy_thread overwrites a target blob (same version, other bytes) that a
    target-only delta is built on: that delta is rewritten whole first."""
    saver = _small_chains(KVSaver(":memory:"), k=8)
    mem = InMemorySaver()
    for s in (saver, mem):
        s.get_next_version = lambda cur, ch: (cur or 0) + 1  # int versions: they collide
    for s in (saver, mem):
        _chat(s, "src", 1, start=50)
        _chat(s, "dst", 3)
    want = [t.checkpoint["channel_values"] for t in saver.list(_cfg("dst"))]
    saver.copy_thread("src", "dst")
    got = {
        t.config["configurable"]["checkpoint_id"]: t.checkpoint["channel_values"]
        for t in _fresh(saver).list(_cfg("dst"))
    }
    src_ids = {t.config["configurable"]["checkpoint_id"] for t in saver.list(_cfg("src"))}
    dst_only = [v for cid, v in got.items() if cid not in src_ids]
    # Version 1 of "dst" now holds the source's value (as InMemorySaver would
    # after copying its blobs); versions 2 and 3 keep theirs.
    assert dst_only[:2] == want[:2]
    assert [m.id for m in dst_only[2]["messages"]] == ["m50"]


def test_put_over_a_stored_version_keeps_the_others() -> None:
    saver = _small_chains(KVSaver(":memory:"), k=8)
    saver.get_next_version = lambda cur, ch: (cur or 0) + 1
    first = _chat(saver, "t", 4)
    want = [t.checkpoint["channel_values"] for t in saver.list(_cfg("t"))]
    # Version 1 again, another value, on the first checkpoint's parent (none).
    cp = empty_checkpoint()
    cp["id"] = f"{next(_ids):012}"
    cp["channel_versions"] = {"messages": 1}
    cp["channel_values"] = {"messages": [_message(99, True)]}
    saver.put(_cfg("t"), cp, {}, {"messages": 1})
    got = [t.checkpoint["channel_values"] for t in _fresh(saver).list(_cfg("t"))]
    assert [m.id for m in got[0]["messages"]] == ["m99"]
    assert got[1:4] == want[:3]  # versions 4, 3, 2 as they were
    assert [m.id for m in got[4]["messages"]] == ["m99"]  # version 1 is the new value
    assert first


def test_an_unhashable_serializer_gets_deltas_and_one_without_attributes_works() -> None:
    """``delta.codec`` finds a serializer's codec by the serializer's
    identity: an unhashable one gets deltas like any other; one that cannot
    be weakly referenced (``__slots__``) gets a new codec at each call, with
    no cache to find a base in, and its values are stored whole."""

    class Unhashable(EncryptedSerializer):
        __hash__ = None  # type: ignore[assignment]

    saver = KVSaver(":memory:", serde=Unhashable(_Xor()))
    _chat(saver, "t", 6)
    assert any(_kinds(saver, "t"))
    msgs = saver.get_tuple(_cfg("t")).checkpoint["channel_values"]["messages"]
    assert [m.id for m in msgs] == [f"m{i}" for i in range(6)]

    class Slotted:  # no base class: no __dict__
        __slots__ = ("inner",)

        def __init__(self) -> None:
            self.inner = JsonPlusSerializer()

        def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
            return self.inner.dumps_typed(obj)

        def loads_typed(self, data: tuple[str, bytes]) -> Any:
            return self.inner.loads_typed(data)

    serde = Slotted()
    assert D.codec(serde).enabled is False and D.codec(serde) is not D.codec(serde)
    saver = KVSaver(":memory:", serde=serde)
    _chat(saver, "t", 6)
    assert not any(_kinds(saver, "t"))
    msgs = saver.get_tuple(_cfg("t")).checkpoint["channel_values"]["messages"]
    assert [m.id for m in msgs] == [f"m{i}" for i in range(6)]


def test_compaction_keeps_chains(tmp_path: Any) -> None:
    from kvsaver.kv.lmdb.compact import compact_lmdb

    path = str(tmp_path / "s")
    with KVSaver(path) as saver:
        _chat(saver, "t", 10)
        assert any(_kinds(saver, "t"))
        want = [t.checkpoint for t in saver.list(_cfg("t"))]
    compact_lmdb(path)
    with KVSaver(path) as saver:
        assert [t.checkpoint for t in saver.list(_cfg("t"))] == want
        _chat(saver, "t", 2, start=10, parent=want[0]["id"])
        msgs = saver.get_tuple(_cfg("t")).checkpoint["channel_values"]["messages"]
        assert [m.id for m in msgs] == [f"m{i}" for i in range(12)]


def test_a_chain_resolves_over_a_copys_source_records() -> None:
    """copy_thread plans from a dict of the source's records (``_Pairs``);
    reading a chain there takes the same reverse scan as over a store (a
    merge once left ``_Pairs`` without ``scan``: AttributeError in copies)."""
    saver = KVSaver(":memory:")
    _chat(saver, "t", 6)
    records = _records(saver, "t")
    top, raw = max((k, v) for k, v in records.items() if D.is_delta(v) and D.decode(v).depth > 1)
    fresh = D.Codec(saver.serde)  # no cache: the whole chain is read
    over_dict = fresh.resolve(D._Pairs(records), top, raw)
    with saver.store.read() as txn:
        over_store = D.Codec(saver.serde).resolve(txn, top, raw)
    assert over_dict is not None and over_store is not None
    assert over_dict.plain == over_store.plain


# -- small values with the dictionary (compression.SMALL_DICT) ---------------------------


def _chat_graph(saver: Any, thread: str, turns: int) -> Any:
    """A real chat graph (add_messages, a node answering each human message)."""
    from langgraph.graph import START, StateGraph
    from langgraph.graph.message import MessagesState

    def reply(state: MessagesState) -> dict[str, Any]:
        n = len(state["messages"])
        return {"messages": [AIMessage(f"an answer of some words {n} " * 12, id=f"a{n}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    graph = builder.compile(checkpointer=saver)
    cfg = {"configurable": {"thread_id": thread}}
    for i in range(turns):
        question = HumanMessage(f"a question of words {i} " * 12, id=f"h{i}")
        graph.invoke({"messages": [question]}, cfg)
    return graph


def _small_records(saver: KVSaver) -> dict[str, list[tuple[str, bytes, int]]]:
    """(serde type, stored bytes, depth) of every stored checkpoint, pending
    write of "messages", delta piece and ``__start__`` blob (depth: a
    piece's; 0 for the others)."""
    out: dict[str, list[tuple[str, bytes, int]]] = {
        "checkpoint": [],
        "write": [],
        "piece": [],
        "start": [],
    }
    with saver.store.read() as txn:
        for _, raw in txn.scan(*S.keyspace_range(S.CHECKPOINT)):
            out["checkpoint"].append((*S.decode_checkpoint(raw).checkpoint, 0))
        for _, raw in txn.scan(*S.keyspace_range(S.WRITE)):
            for w in S.decode_writes(raw):
                if w.channel == "messages":
                    out["write"].append((*w.value, 0))
        for key, raw in txn.scan(*S.keyspace_range(S.BLOB)):
            if D.is_delta(raw):
                rec = D.decode(raw)
                out["piece"].append((rec.typ, rec.piece, rec.depth))
            elif b"__start__" in key and (typed := S.decode_blob(raw)) is not None:
                out["start"].append((*typed, 0))
    return out


def _stored_types(saver: KVSaver) -> dict[str, list[str]]:
    """Serde types of every stored checkpoint, pending write of "messages",
    delta piece of one step (a long step's piece spans ``STRIDE`` versions:
    from 2 KiB it is compressed as any value is, ".zst") and non-empty
    ``__start__`` blob."""
    return {
        kind: [t for t, _, depth in recs if kind != "piece" or depth % D.STRIDE]
        for kind, recs in _small_records(saver).items()
    }


def test_small_records_are_compressed_with_the_dictionary() -> None:
    """Checkpoints, pending writes, delta pieces and the graph's
    input are a few hundred bytes each, under the 2 KiB threshold; they are
    stored zstd-compressed with the built-in dictionary (".zd1"), and every
    state reads back as InMemorySaver's, also through a fresh serializer."""
    saver = KVSaver(":memory:")
    graph = _chat_graph(saver, "t", 6)
    types = _stored_types(saver)
    assert all(v for v in types.values()), types
    assert all(t == "msgpack.zd1" for ts in types.values() for t in ts), types
    ref = _chat_graph(InMemorySaver(), "t", 6)
    cfg = {"configurable": {"thread_id": "t"}}
    want = [s.values for s in ref.get_state_history(cfg)]
    assert [s.values for s in graph.get_state_history(cfg)] == want
    fresh = _chat_graph(_fresh(saver), "u", 0)
    assert [s.values for s in fresh.get_state_history(cfg)] == want


def test_only_checkpoint_records_enter_the_small_frame_cache() -> None:
    """A put or put_writes does not pay the decompression cache's
    lock, insertion and evictions for frames no read looks up there: delta
    pieces (read by the delta layer, into its own cache) and pending writes
    (read only when their checkpoint is resumed). A checkpoint record, which
    the next get_tuple of the thread reads, is still kept; and every state
    reads back the same, also through a fresh serializer."""
    saver = KVSaver(":memory:")
    graph = _chat_graph(saver, "t", 6)
    cached = saver.serde._inflated_small.items  # type: ignore[attr-defined]
    frames = {k: [b for _, b, _ in v] for k, v in _small_records(saver).items() if k != "start"}
    assert all(frames.values()), {k: len(v) for k, v in frames.items()}
    assert all(f in cached for f in frames["checkpoint"])
    assert not any(f in cached for f in frames["write"] + frames["piece"])
    cfg = {"configurable": {"thread_id": "t"}}
    want = [s.values for s in _chat_graph(InMemorySaver(), "t", 6).get_state_history(cfg)]
    assert [s.values for s in graph.get_state_history(cfg)] == want
    fresh = _chat_graph(_fresh(saver), "u", 0)
    assert [s.values for s in fresh.get_state_history(cfg)] == want


def _list_puts(saver: KVSaver, thread: str, lists: list[list[Any]], start: int = 0) -> None:
    """One checkpoint per list (ids and versions from ``start``), each the
    child of the one before, the list as its "messages" channel."""
    for i, msgs in enumerate(lists, start):
        cp = empty_checkpoint()
        cp["id"] = f"{i:012}"
        version = f"{i + 1:032}.{0:016}"
        cp["channel_versions"] = {"messages": version}
        cp["channel_values"] = {"messages": msgs}
        parent = f"{i - 1:012}" if i else None
        saver.put(_cfg(thread, parent), cp, {"source": "loop", "step": i}, {"messages": version})


def _counting_deltas(saver: KVSaver) -> list[int]:
    """Counts the deltas made inside put's transaction (``Codec._delta``)."""
    codec = D.codec(saver.serde)
    made = [0]
    inner = codec._delta

    def counted(*args: Any) -> Any:
        made[0] += 1
        return inner(*args)

    codec._delta = counted  # type: ignore[method-assign]
    return made


def test_a_put_makes_its_delta_before_the_transaction_from_its_own_cache() -> None:
    """The delta of a list that extends the version this process
    put at the parent checkpoint is made before the transaction, from the
    codec's cache (so its zstd call is not made inside the transaction), and
    it is the same record, byte for byte, as the one made in the transaction.
    A long step (every STRIDE-th depth: its base is read from the store) is
    still made in the transaction."""
    lists = [[_message(j, True) for j in range(i + 2)] for i in range(20)]
    ahead, inside = KVSaver(":memory:"), KVSaver(":memory:")
    D.codec(inside.serde)._speculate = lambda *a: None  # type: ignore[method-assign]
    made_ahead, made_inside = _counting_deltas(ahead), _counting_deltas(inside)
    _list_puts(ahead, "t", lists)
    _list_puts(inside, "t", lists)
    with ahead.store.read() as a, inside.store.read() as b:
        blobs = list(a.scan(*S.keyspace_range(S.BLOB)))
        assert blobs == list(b.scan(*S.keyspace_range(S.BLOB)))
    assert sum(D.is_delta(raw) for _, raw in blobs) >= 18
    long_steps = made_inside[0] // D.STRIDE
    assert made_inside[0] >= 18 and made_ahead[0] == long_steps >= 1
    for i, msgs in enumerate(lists):
        got = _fresh(ahead).get_tuple(_cfg("t", f"{i:012}"))
        assert got is not None and got.checkpoint["channel_values"]["messages"] == msgs


def test_a_delta_made_ahead_is_not_used_on_a_base_stored_since_by_another_saver() -> None:
    """The delta made before the transaction rests on this process's cache;
    when another saver (another process) has since stored other content at
    that base version, the transaction sees a different base record and
    makes the delta again on what is stored (here: stores the list whole)."""
    a = KVSaver(":memory:")
    b = KVSaver(a.store)  # its own serializer, so its own codec and cache
    first = [_message(j, True) for j in range(3)]
    _list_puts(a, "t", [first, [*first, _message(3, True)]])
    other = [*first, _message(30, True)]  # the same version 2, other content
    _list_puts(b, "t", [other], start=1)
    made = _counting_deltas(a)
    third = [*first, _message(3, True), _message(4, True)]  # extends a's version 2 only
    _list_puts(a, "t", [third], start=2)
    assert made[0] == 1  # made again in the transaction, on the stored base
    fresh = _fresh(a)
    for i, msgs in enumerate([first, other, third]):
        got = fresh.get_tuple(_cfg("t", f"{i:012}"))
        assert got is not None and got.checkpoint["channel_values"]["messages"] == msgs


def test_small_records_with_encryption_and_without_compression() -> None:
    serde = EncryptedSerializer(_Xor())
    enc = KVSaver(":memory:", serde=serde)
    _chat_graph(enc, "t", 3)
    types = _stored_types(enc)
    assert all(t == "msgpack.zd1+xor" for ts in types.values() for t in ts), types
    cfg = {"configurable": {"thread_id": "t"}}
    cold = _chat_graph(KVSaver(enc.store, serde=EncryptedSerializer(_Xor())), "u", 0)
    assert len(cold.get_state(cfg).values["messages"]) == 6
    plain = KVSaver(":memory:", compress=False)
    _chat_graph(plain, "t", 3)
    assert not any(t.endswith(".zd1") for ts in _stored_types(plain).values() for t in ts)


def test_a_version_without_a_value_stores_no_record() -> None:
    """A channel version without a value (a graph's consumed input and
    triggers) is stored as no record at all, which reads as the "empty"
    marker did; a stored value overwritten by no value at the same version
    is deleted, as InMemorySaver's overwrite makes both read empty."""
    saver = KVSaver(":memory:")
    _chat_graph(saver, "t", 3)
    with saver.store.read() as txn:
        blobs = list(txn.scan(*S.keyspace_range(S.BLOB)))
    assert blobs and all(D.is_delta(raw) or S.decode_blob(raw) is not None for _, raw in blobs)
    cfg = {"configurable": {"thread_id": "t"}}
    tup = saver.get_tuple(cfg)
    assert tup is not None
    assert set(tup.checkpoint["channel_versions"]) > set(tup.checkpoint["channel_values"])

    for s in (KVSaver(":memory:"), InMemorySaver()):
        v = {"x": s.get_next_version(None, None)}
        first = empty_checkpoint()
        first["id"] = "1"
        first["channel_values"], first["channel_versions"] = {"x": [1, 2]}, dict(v)
        s.put(_cfg("u"), first, {}, v)
        again = empty_checkpoint()
        again["id"] = "2"
        again["channel_values"], again["channel_versions"] = {}, dict(v)
        s.put(_cfg("u", "1"), again, {}, v)
        for cid in ("1", "2"):
            got = s.get_tuple(_cfg("u", cid))
            assert got is not None and got.checkpoint["channel_values"] == {}, (s, cid)
        if isinstance(s, KVSaver):
            with s.store.read() as txn:
                assert list(txn.scan(*S.blobs_range("u"))) == []


def test_a_closed_saver_leaves_no_codec_or_serializer_behind() -> None:
    """A serializer's codec lives as long as its holder (the saver): the map
    that finds a serializer's codec holds codecs weakly, so neither the codec
    and its caches nor the serializer it holds outlive the saver."""
    import copy
    import gc
    import weakref

    gone = []
    for i in range(5):
        saver = KVSaver(":memory:")
        cfg = {"configurable": {"thread_id": f"t{i}", "checkpoint_ns": ""}}
        chk = empty_checkpoint()
        chk["channel_values"] = {"m": ["x" * 600]}
        chk["channel_versions"] = {"m": saver.get_next_version(None, None)}
        saver.put(cfg, chk, {}, chk["channel_versions"])
        assert saver.get_tuple(cfg) is not None
        assert D.codec(saver.serde) is D.codec(saver.serde)
        assert D.codec(copy.copy(saver.serde)).serde is not saver.serde  # its own
        gone.append(weakref.ref(saver.serde))
        saver.close()
        del saver
    gc.collect()
    assert [r() for r in gone] == [None] * 5
    plain = JsonPlusSerializer()
    twin = copy.deepcopy(plain)  # a deep copy (or a pickle) carries no codec
    assert D.codec(plain) is not D.codec(twin) and D.codec(twin).serde is twin
    assert copy.deepcopy(plain).__dict__.get("_kvsaver_codec") is None
