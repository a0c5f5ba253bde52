"""Compression of stored values: saver/compression.py and KVSaver's
``compress=`` option. What is stored is checked on the raw store records."""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
import threading
import types
from typing import Any

import pytest
import zstandard
from kvsaver import CompressingSerializer, KVSaver
from kvsaver import compression as C
from kvsaver import schema as S
from kvsaver.kv.keys import unpack
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from saver_helpers import damage_zstd_blob

KEY = b"0123456789abcdef"


def words(n: int, seed: int = 0) -> str:
    rnd = random.Random(seed)
    vocab = ["state", "graph", "node", "edge", "message", "tool", "answer", "plan", "step"]
    return " ".join(rnd.choice(vocab) for _ in range(n))


def put(saver: KVSaver, thread: str, values: dict[str, Any], parent: str | None = None) -> str:
    """One checkpoint with new versions of every channel in ``values``."""
    cp = empty_checkpoint()
    cp["id"] = str(uuid6())
    versions = {ch: saver.get_next_version(None, None) for ch in values}
    cp["channel_values"] = dict(values)
    cp["channel_versions"] = versions
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if parent is not None:
        conf["checkpoint_id"] = parent
    saver.put({"configurable": conf}, cp, {"source": "loop", "step": 0}, versions)
    return cp["id"]


def stored_blobs(saver: KVSaver) -> dict[str, S.Typed]:
    """channel -> the serde-typed pair exactly as stored (latest version)."""
    out: dict[str, S.Typed] = {}
    with saver.store.read() as txn:
        for key, raw in txn.scan(*S.keyspace_range(S.BLOB)):
            typed = S.decode_blob(raw)
            assert typed is not None
            out[unpack(key)[3]] = typed
    return out


def latest_values(saver: KVSaver, thread: str) -> dict[str, Any]:
    t = saver.get_tuple({"configurable": {"thread_id": thread}})
    assert t is not None
    return t.checkpoint["channel_values"]


# -- the serializer on its own --------------------------------------------------------


def test_large_compressible_values_are_compressed_and_marked() -> None:
    serde = CompressingSerializer(threshold=100)
    value = {"text": words(2000)}
    typ, data = serde.dumps_typed(value)
    plain_typ, plain = JsonPlusSerializer().dumps_typed(value)
    assert typ == plain_typ + C.SUFFIX == "msgpack.zst"
    assert len(data) < len(plain) // 3
    assert serde.loads_typed((typ, data)) == value


def test_small_values_stay_as_the_inner_serializer_made_them() -> None:
    serde = CompressingSerializer(threshold=1024)
    value = {"text": words(20)}
    assert serde.dumps_typed(value) == JsonPlusSerializer().dumps_typed(value)


def test_incompressible_values_are_stored_raw() -> None:
    serde = CompressingSerializer(threshold=16)
    blob = os.urandom(50_000)
    assert serde.dumps_typed(blob) == ("bytes", blob)
    assert serde.loads_typed(serde.dumps_typed(blob)) == blob


def test_threshold_none_never_compresses_but_still_loads() -> None:
    writer = CompressingSerializer(threshold=0)
    reader = CompressingSerializer(threshold=None)
    value = words(3000)
    typed = writer.dumps_typed(value)
    assert typed[0].endswith(C.SUFFIX)
    assert reader.dumps_typed(value)[0] == "msgpack"
    assert reader.loads_typed(typed) == value


@pytest.mark.parametrize(
    "bad", [{"threshold": -1}, {"threshold": 1.5}, {"level": 0}, {"level": 99}]
)
def test_bad_settings_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        CompressingSerializer(**bad)


def test_wrap_puts_compression_inside_encryption_and_never_twice() -> None:
    enc = EncryptedSerializer.from_pycryptodome_aes(key=KEY)
    wrapped = C.wrap(enc)
    assert isinstance(wrapped, EncryptedSerializer)
    assert isinstance(wrapped.serde, CompressingSerializer)
    assert wrapped.cipher is enc.cipher
    assert enc.serde.__class__ is JsonPlusSerializer  # the user's object is not modified
    assert C.wrap(wrapped) is wrapped
    plain = C.wrap(JsonPlusSerializer())
    assert isinstance(plain, CompressingSerializer) and C.wrap(plain) is plain


class _Counting:
    """A zstd decompressor that counts its calls."""

    def __init__(self) -> None:
        import zstandard

        self.inner = zstandard.ZstdDecompressor()
        self.calls = 0

    def decompress(self, data: bytes) -> bytes:
        self.calls += 1
        return self.inner.decompress(data)


def test_decompressed_bytes_are_cached_by_the_compressed_bytes() -> None:
    writer = CompressingSerializer(threshold=100)
    value = {"text": words(3000)}
    typed = writer.dumps_typed(value)
    assert typed[0].endswith(C.SUFFIX)
    counting = _Counting()
    writer._decompressor = lambda: counting  # type: ignore[method-assign]
    assert writer.loads_typed(typed) == value
    assert counting.calls == 0  # dumps_typed filled the cache: the next read is a hit
    reader = CompressingSerializer(threshold=100)
    reader._decompressor = lambda: counting  # type: ignore[method-assign]
    # A value read (not written) here is kept from its second read on.
    first, second = reader.loads_typed(typed), reader.loads_typed((typed[0], bytes(typed[1])))
    assert first == second == value and counting.calls == 2
    third = reader.loads_typed(typed)
    assert third == value and counting.calls == 2
    third["text"] = "changed by the caller"  # loaded objects are the caller's own
    assert reader.loads_typed(typed) == value
    assert reader.loads_typed((typed[0], memoryview(typed[1]))) == value  # unhashable: no cache
    other = writer.dumps_typed({"text": words(3000, seed=1)})
    assert reader.loads_typed(other) == {"text": words(3000, seed=1)}
    assert reader.loads_typed(other) == {"text": words(3000, seed=1)}
    assert counting.calls == 5  # other bytes, another entry: never a stale value


@pytest.mark.parametrize("small", [False, True])
def test_values_read_once_do_not_flush_the_cache(small: bool) -> None:
    """A scan of history (list, other threads read once) keeps none of what
    it decompressed: what a put wrote, and what is read again, stays."""
    serde = CompressingSerializer(cache_bytes=256 << 10)
    other_process = CompressingSerializer()
    cache = serde._inflated_small if small else serde._inflated

    def typed_of(writer: CompressingSerializer, i: int) -> tuple[str, bytes]:
        value = {"i": i, "text": words(40 if small else 1200, seed=i)}
        dumped = writer.serde.dumps_typed(value)
        return writer.compress_small(*dumped) if small else writer.compress_typed(*dumped)

    kept = typed_of(serde, 0)  # written here: kept at once
    assert kept[0].endswith(C.DICT_SUFFIX if small else C.SUFFIX) and kept[1] in cache.items
    again = typed_of(other_process, 1)
    serde.loads_typed(again)
    assert again[1] not in cache.items  # read once
    size = cache.size
    for i in range(2, 400):
        serde.loads_typed(typed_of(other_process, i))  # each read once
    assert cache.size == size and kept[1] in cache.items
    serde.loads_typed(again)  # its second read: kept from now on
    assert again[1] in cache.items


@pytest.mark.parametrize("cache_bytes", [0, 64 << 10])
def test_the_cache_stays_within_its_bytes(cache_bytes: int) -> None:
    serde = CompressingSerializer(threshold=100, cache_bytes=cache_bytes)
    for i in range(200):
        value = {"i": i, "text": words(1000 + i, seed=i)}
        typed = serde.dumps_typed(value)
        assert serde.loads_typed(typed) == value
        assert serde._inflated.size <= cache_bytes
    if cache_bytes:
        assert len(serde._inflated.items) > 5  # it does keep the recent ones
        assert serde._inflated.size == sum(
            len(k) + len(v) for k, v in serde._inflated.items.items()
        )
    else:
        assert not serde._inflated.items
    with pytest.raises(ValueError, match="cache_bytes"):
        CompressingSerializer(cache_bytes=-1)


@pytest.mark.parametrize("cache_bytes", [C.DEFAULT_CACHE_BYTES, 32 << 10])
def test_concurrent_threads_round_trip(cache_bytes: int) -> None:
    serde = CompressingSerializer(threshold=64, cache_bytes=cache_bytes)
    values = [{"i": i, "text": words(500 + i, seed=i)} for i in range(64)]
    errors: list[BaseException] = []

    def work(chunk: list[dict[str, Any]]) -> None:
        try:
            for _ in range(20):
                for v in chunk:
                    assert serde.loads_typed(serde.dumps_typed(v)) == v
        except BaseException as e:  # reported below, in the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(values[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# -- through KVSaver ----------------------------------------------------------------------


def _caches(saver: KVSaver) -> tuple[int, int, int | None]:
    """(decompressed values, rebuilt lists, elements' bytes): each cache's bound."""
    from kvsaver import delta as D

    codec = D.codec(saver.serde)
    assert codec.comp is not None
    elements = codec.elements.max_bytes if codec.elements is not None else None
    return codec.comp._inflated.max_bytes, codec.recent.max_bytes, elements


def _chat(saver: KVSaver, turns: int = 12) -> Any:
    """A real chat graph growing a message history: what the caches serve."""
    from saver_helpers_graphs import chat_graph, human

    graph = chat_graph(saver)
    cfg: Any = {"configurable": {"thread_id": "chat"}}
    for i in range(turns):
        graph.invoke(human(i, words(40, seed=1000 + i)), cfg, durability="sync")
    return [[m.model_dump() for m in s.values["messages"]] for s in graph.get_state_history(cfg)]


def test_cache_bytes_bounds_every_cache_of_values(tmp_path: Any) -> None:
    with KVSaver(str(tmp_path / "default")) as saver:
        assert _caches(saver) == (8 << 20, 8 << 20, 16 << 20)  # 32 MiB in all
    # (the elements' cache fills with fast_paths only)
    with KVSaver(str(tmp_path / "small"), cache_bytes=4 << 20, fast_paths=True) as saver:
        assert _caches(saver) == (1 << 20, 1 << 20, 2 << 20)
        _chat(saver)
        from kvsaver import delta as D

        codec = D.codec(saver.serde)
        assert codec.recent.items and codec.elements is not None and codec.elements.items
        assert codec.recent.size <= 1 << 20 and codec.elements.size <= 2 << 20
    # Encrypted: the compressor inside the encryption gets the budget too.
    enc = EncryptedSerializer.from_pycryptodome_aes(key=KEY)
    with KVSaver(str(tmp_path / "enc"), serde=enc, cache_bytes=8 << 20) as saver:
        assert _caches(saver) == (2 << 20, 2 << 20, 4 << 20)


def test_cache_bytes_zero_keeps_nothing_and_changes_nothing_stored(
    tmp_path: Any, monkeypatch: Any
) -> None:
    stores = {}
    blobs: dict[str, dict[bytes, bytes]] = {}
    for name, cache in (("cached", None), ("none", 0)):
        # Versions end in random.random(): the same sequence for both runs,
        # so both stores key (and digest) the same channel versions.
        counter = iter(range(1, 1_000_000))
        monkeypatch.setattr("random.random", lambda c=counter: next(c) / 1e6)
        with KVSaver(str(tmp_path / name), cache_bytes=cache) as saver:
            history = _chat(saver)
            from kvsaver import delta as D

            codec = D.codec(saver.serde)
            if cache == 0:
                assert _caches(saver) == (0, 0, None)
                assert not codec.recent.items and not codec.comp._inflated.items
            marks: dict[str, list[bytes]] = {}  # channel -> each version's first byte
            with saver.store.read() as txn:
                start, stop = S.checkpoints_range("chat")
                n_cp = sum(1 for _ in txn.scan(start, stop))
                for key, value in txn.scan(b"", b"\xff"):
                    if unpack(key)[0] == S.BLOB:
                        marks.setdefault(unpack(key)[3], []).append(value[:1])
                        blobs.setdefault(name, {})[key] = value
            stores[name] = (history, n_cp, marks)
    # The same states read back; the same kinds of records, version by
    # version (deltas included: a delta's base is read from the store when
    # no cache holds it).
    assert stores["none"][0] == stores["cached"][0]
    assert stores["none"][1] == stores["cached"][1] > 12
    assert stores["none"][2] == stores["cached"][2]
    assert blobs["none"] == blobs["cached"]  # every channel value, byte for byte
    from kvsaver import delta as D

    assert stores["none"][2]["messages"].count(D.MARK) > 5  # the history as deltas


@pytest.mark.parametrize("bad", [-1, 1.5, "8MiB", True])
def test_cache_bytes_must_be_a_non_negative_int(tmp_path: Any, bad: Any) -> None:
    with pytest.raises(ValueError, match="cache_bytes must be an int"):
        KVSaver(str(tmp_path / "never"), cache_bytes=bad)
    assert not (tmp_path / "never").exists()


def test_cache_bytes_beside_a_serializer_with_its_own_compressor_is_refused(
    tmp_path: Any,
) -> None:
    own = CompressingSerializer(cache_bytes=1 << 20)
    enc = EncryptedSerializer.from_pycryptodome_aes(key=KEY)
    enc.serde = CompressingSerializer(enc.serde)
    for serde in (own, enc):
        with pytest.raises(ValueError, match=r"set it there instead \(CompressingSerializer"):
            KVSaver(str(tmp_path / "never"), serde=serde, cache_bytes=4 << 20)
        assert not (tmp_path / "never").exists()
    with pytest.raises(ValueError, match="cache_bytes"):
        CompressingSerializer(cache_bytes=True)  # type: ignore[arg-type]
    with KVSaver(str(tmp_path / "s"), serde=own) as saver:  # its own budget, x4 in all
        assert _caches(saver) == (1 << 20, 1 << 20, 2 << 20)


def test_saver_compresses_channel_blobs_and_writes_by_default(tmp_path: Any) -> None:
    with KVSaver(str(tmp_path / "s")) as saver:
        # a list: a str this short is kept in the checkpoint record, no blob
        big, small = words(3000), ["hi"]
        cid = put(saver, "t", {"big": big, "small": small})
        saver.put_writes(
            {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": cid}},
            [("big", big), ("small", small)],
            task_id="task",
        )
        blobs = stored_blobs(saver)
        assert blobs["big"][0] == "msgpack.zst"
        assert blobs["small"][0] == "msgpack"
        with saver.store.read() as txn:
            writes = {
                w.channel: w.value
                for _, v in txn.scan(*S.keyspace_range(S.WRITE))
                for w in S.decode_writes(v)
            }
        assert writes["big"][0] == "msgpack.zst" and writes["small"][0] == "msgpack"
        t = saver.get_tuple({"configurable": {"thread_id": "t"}})
        assert t is not None
        assert t.checkpoint["channel_values"] == {"big": big, "small": small}
        assert sorted(w[1:] for w in t.pending_writes or []) == [("big", big), ("small", small)]


def test_incompressible_channel_value_is_stored_raw(tmp_path: Any) -> None:
    with KVSaver(str(tmp_path / "s")) as saver:
        noise = os.urandom(40_000)
        put(saver, "t", {"noise": noise})
        typ, data = stored_blobs(saver)["noise"]
        assert typ == "bytes" and data == noise
        assert latest_values(saver, "t") == {"noise": noise}


def test_compressed_and_encrypted_round_trip(tmp_path: Any) -> None:
    path = str(tmp_path / "s")
    text = words(5000)
    with KVSaver(path, serde=EncryptedSerializer.from_pycryptodome_aes(key=KEY)) as saver:
        put(saver, "t", {"text": text})
        typ, data = stored_blobs(saver)["text"]
        plain_len = len(JsonPlusSerializer().dumps_typed(text)[1])
        # compressed first (so it pays off), then encrypted: the suffix order says so
        assert typ == "msgpack.zst+aes"
        assert len(data) < plain_len // 3
        assert text.encode() not in data
    reopened = KVSaver(path, serde=EncryptedSerializer.from_pycryptodome_aes(key=KEY))
    with reopened:
        assert latest_values(reopened, "t") == {"text": text}


def test_old_uncompressed_values_still_read_after_enabling_compression(tmp_path: Any) -> None:
    path = str(tmp_path / "s")
    old_text, new_text = words(3000, seed=1), words(3000, seed=2)
    with KVSaver(path, compress=False) as saver:  # as a store written before compression
        first = put(saver, "old", {"text": old_text})
        assert stored_blobs(saver)["text"][0] == "msgpack"
    with KVSaver(path) as saver:  # compression on (the default)
        assert latest_values(saver, "old") == {"text": old_text}
        put(saver, "new", {"text": new_text})
        assert latest_values(saver, "new") == {"text": new_text}
        t = saver.get_tuple({"configurable": {"thread_id": "old", "checkpoint_id": first}})
        assert t is not None and t.checkpoint["channel_values"] == {"text": old_text}
    with KVSaver(path, compress=False) as saver:  # and switching it off again reads both
        assert latest_values(saver, "old") == {"text": old_text}
        assert latest_values(saver, "new") == {"text": new_text}


def test_a_thread_deleted_and_written_again_under_the_same_versions_reads_the_new_values(
    tmp_path: Any,
) -> None:
    """Blob keys repeat after delete_thread (versions start again at 1): the
    decompression cache is keyed by content, so it cannot serve the old value."""
    saver = KVSaver(str(tmp_path / "kv"))
    old = {"messages": words(3000, seed=1)}
    put(saver, "t", old)
    assert latest_values(saver, "t") == old
    saver.delete_thread("t")
    new = {"messages": words(3000, seed=2)}
    put(saver, "t", new)
    assert latest_values(saver, "t") == new
    other = KVSaver(str(tmp_path / "kv"))  # a second saver (its own cache) agrees
    assert latest_values(other, "t") == new
    saver.close()
    other.close()


def test_compress_threshold_option(tmp_path: Any) -> None:
    with KVSaver(str(tmp_path / "s"), compress_threshold=100_000) as saver:
        put(saver, "t", {"text": words(3000)})
        assert stored_blobs(saver)["text"][0] == "msgpack"


# -- LangGraph's msgpack allowlist through the wrapper ---------------------------------------


@dataclasses.dataclass
class Custom:
    name: str
    n: int


def _strict() -> JsonPlusSerializer:
    # As with LANGGRAPH_STRICT_MSGPACK=true: only LangGraph's safe types load.
    return JsonPlusSerializer(allowed_msgpack_modules=None)


@pytest.mark.parametrize("encrypted", [False, True])
def test_with_allowlist_reaches_the_serializer_inside(tmp_path: Any, encrypted: bool) -> None:
    inner = _strict()
    serde: Any = (
        EncryptedSerializer(EncryptedSerializer.from_pycryptodome_aes(key=KEY).cipher, inner)
        if encrypted
        else inner
    )
    value = Custom("x" * 5000, 7)  # above the threshold: stored compressed
    with KVSaver(str(tmp_path / "s"), serde=serde) as saver:
        put(saver, "t", {"v": value})
        assert stored_blobs(saver)["v"][0].startswith("msgpack.zst")
        blocked = latest_values(saver, "t")["v"]
        assert not isinstance(blocked, Custom)  # strict: not on the allowlist
        allowed = saver.with_allowlist([(Custom.__module__, Custom.__name__)])
        assert allowed is not saver and allowed.store is saver.store
        assert latest_values(allowed, "t")["v"] == value
        # the clone keeps compression (and encryption) in the same places
        assert C._find(allowed.serde) is not None
        assert isinstance(allowed.serde, EncryptedSerializer) == encrypted
        # nothing new to allow: the same saver back
        assert allowed.with_allowlist([(Custom.__module__, Custom.__name__)]) is allowed


_STRICT_GRAPH = """
import dataclasses
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.graph import END, START, MessagesState, StateGraph
from kvsaver import KVSaver

@dataclasses.dataclass
class Note:
    text: str

class State(MessagesState):
    note: Note

def node(state):
    return {"messages": [AIMessage("hi " * 300)], "note": Note("n" * 1000)}

for serde in (None, EncryptedSerializer.from_pycryptodome_aes(key=b"k" * 16)):
    builder = StateGraph(State)
    builder.add_node("n", node)
    builder.add_edge(START, "n")
    builder.add_edge("n", END)
    graph = builder.compile(checkpointer=KVSaver(":memory:", serde=serde))
    cfg = {"configurable": {"thread_id": "t"}}
    graph.invoke({"messages": [HumanMessage("x" * 2000)]}, cfg)
    values = graph.get_state(cfg).values
    print(type(values["messages"][0]).__name__, type(values["note"]).__name__)
"""


def test_strict_msgpack_graph_allowlist_reaches_compressed_values() -> None:
    """LANGGRAPH_STRICT_MSGPACK=true (read at import, hence a subprocess): the
    graph derives an allowlist from its state schema and hands it to the
    checkpointer; the state's own types must load back as themselves."""
    env = {**os.environ, "LANGGRAPH_STRICT_MSGPACK": "true"}
    out = subprocess.run(
        [sys.executable, "-c", _STRICT_GRAPH], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["HumanMessage Note", "HumanMessage Note"]


# -- loader(): the read path's one-call loads ------------------------------------------


def _values() -> list[Any]:
    from langchain_core.messages import AIMessage, HumanMessage

    return [
        None,
        b"raw bytes",
        bytearray(b"ba"),
        7,
        {"a": [1, 2.5, "x"], 3: "non-str key"},
        words(20),
        words(2000),  # compressed
        [HumanMessage(content=words(50, 1)), AIMessage(content=words(400, 2))],
        {"n": 1, "when": __import__("datetime").datetime(2026, 1, 2, 3, 4, 5)},
        Custom(words(600, 3), 7),
    ]


@pytest.mark.parametrize("fast_paths", [True, False])
@pytest.mark.parametrize("strict", [False, True])
def test_loader_loads_what_loads_typed_loads(strict: bool, fast_paths: bool) -> None:
    serde = CompressingSerializer(_strict() if strict else JsonPlusSerializer())
    fast = C.loader(serde, fast_paths)
    assert fast != serde.loads_typed  # the one-call loader is taken for the default stack
    kinds = set()
    for value in _values():
        typed = serde.dumps_typed(value)
        kinds.add(typed[0])
        assert repr(fast(typed)) == repr(serde.loads_typed(typed)), typed[0]
    assert {"msgpack", "msgpack.zst", "null", "bytes", "bytearray"} <= kinds
    if strict:  # the allowlist still applies: Custom comes back as plain data
        assert not isinstance(fast(serde.dumps_typed(Custom("x", 1))), Custom)
    # a derived allowlist gets its own fast path, with its own ext hook
    allowed = C.with_msgpack_allowlist(serde, [(Custom.__module__, Custom.__name__)])
    assert C.loader(allowed, fast_paths)(allowed.dumps_typed(Custom("x", 1))) == Custom("x", 1)


@pytest.mark.parametrize("strict", [False, True])
def test_values_loaded_inline_are_what_typed_then_loads_give(strict: bool) -> None:
    """A checkpoint's values load in one loop (delta.Codec.values),
    the plain and zstd msgpack records through compression.value_readers'
    parts; every kind of stored record gives what typed() + loads() give,
    and what the same loop without the fast parts gives."""
    from kvsaver import delta as D
    from kvsaver._compat import strict_jsonplus
    from kvsaver.kv import MemoryStore

    # strict_jsonplus: the lowest LangGraph CI installs has no strict mode
    serde = CompressingSerializer(strict_jsonplus() if strict else JsonPlusSerializer())
    fast, loads = C.value_readers(serde, True), C.loader(serde, True)
    codec = D.codec(serde)
    assert fast is not None
    raws = [S.encode_blob(serde.dumps_typed(v)) for v in _values()]
    raws += [S.encode_blob(None), b"empty\x00", None]  # no value (both formats), no record
    assert {raw[: raw.index(b"\x00")] for raw in raws[:-1]} >= {
        b"msgpack",
        b"msgpack.zst",
        b"null",
        b"bytes",
        b"bytearray",
        b"empty",
    }
    channels = [f"c{i}" for i in range(len(raws))]
    keys = [S.blob_key("t", "", ch, "1") for ch in channels]
    with MemoryStore().read() as txn:
        got = codec.values(txn, channels, keys, raws, loads, fast)
        slow = codec.values(txn, channels, keys, raws, loads, None)
        want = {}
        for ch, key, raw in zip(channels, keys, raws):
            if (typed := codec.typed(txn, key, raw)) is not None:
                want[ch] = serde.loads_typed(typed)
    assert list(got) == list(want) == list(slow)
    assert repr(got) == repr(want) == repr(slow)
    enc = C.wrap(EncryptedSerializer.from_pycryptodome_aes(key=KEY))
    assert C.value_readers(enc, True) is None
    assert C.value_readers(JsonPlusSerializer(), True) is None
    assert C.value_readers(serde, False) is None  # the safe path: no fast parts


def test_fast_paths_without_the_private_names_take_the_public_loader(monkeypatch: Any) -> None:
    """``fast_paths=True`` where LangGraph no longer has the private names
    (``_upstream.stock_ext_hook`` finds none): the same one-call loader as
    ``fast_paths=False``, no fast parts, and heads still read."""
    from kvsaver import _upstream as U

    monkeypatch.setattr(U, "stock_ext_hook", lambda serde: None)
    serde = CompressingSerializer()
    loads = C.loader(serde, True)
    assert loads != serde.loads_typed
    for value in _values():
        typed = serde.dumps_typed(value)
        assert repr(loads(typed)) == repr(serde.loads_typed(typed)), typed[0]
    assert C.value_readers(serde, True) is None
    plain = C.msgpack_loader(serde, True)
    assert plain is not None
    assert plain(serde.serde.dumps_typed({"a": [1]})[1]) == {"a": [1]}


@pytest.mark.parametrize("fast_paths", [True, False])
def test_loader_of_other_serializers_is_their_loads_typed(fast_paths: bool) -> None:
    class Sub(JsonPlusSerializer):
        pass

    enc = C.wrap(EncryptedSerializer.from_pycryptodome_aes(key=KEY))
    for serde in (JsonPlusSerializer(), CompressingSerializer(Sub()), enc):
        assert C.loader(serde, fast_paths) == serde.loads_typed


def test_compressors_are_reused_across_short_lived_threads(monkeypatch: Any) -> None:
    # LangGraph writes checkpoints from worker threads that live
    # for one invoke; a zstd context per thread was made anew each invoke.
    made = []
    real = zstandard.ZstdCompressor

    def counting(*args: Any, **kwargs: Any) -> Any:
        made.append(1)
        return real(*args, **kwargs)

    shim = types.SimpleNamespace(
        ZstdCompressor=counting, ZstdDecompressor=zstandard.ZstdDecompressor
    )
    monkeypatch.setattr(C, "zstandard", shim)
    serde = CompressingSerializer(JsonPlusSerializer(), threshold=64)
    value = ["a fairly compressible message " * 8] * 4
    for _ in range(6):
        t = threading.Thread(target=serde.dumps_typed, args=(value,))
        t.start()
        t.join()
    assert len(made) == 1
    small = CompressingSerializer()  # the dictionary's compressor (small values)
    data = _chat_bytes()
    for _ in range(6):
        t = threading.Thread(target=small.compress_small, args=("msgpack", data))
        t.start()
        t.join()
    assert len(made) == 2


def test_concurrent_compressions_each_round_trip() -> None:
    serde = CompressingSerializer(JsonPlusSerializer(), threshold=64)
    values = [[f"thread {i} says " * 40, i] for i in range(16)]
    out: dict[int, Any] = {}

    def work(i: int) -> None:
        for _ in range(50):
            typed = serde.dumps_typed(values[i])
            assert typed[0].endswith(C.SUFFIX)
            out[i] = serde.loads_typed(typed)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == dict(enumerate(values))


# -- small values with the dictionary --------------------------------------------------


def _chat_bytes() -> bytes:
    from langchain_core.messages import AIMessage, HumanMessage

    msgs = [HumanMessage(words(40, seed=1), id="h1"), AIMessage(words(40, seed=2), id="a1")]
    return JsonPlusSerializer().dumps_typed(msgs)[1]


def test_the_dictionary_never_changes() -> None:
    """SMALL_DICT's bytes are part of the stored format: values written with
    it only read with the very same bytes."""
    import hashlib

    assert len(C.SMALL_DICT) == 1398
    assert hashlib.sha256(C.SMALL_DICT).hexdigest() == (
        "1651ce85502f0c631cccf766a6a42c567354562447e7ee08a7a63ac9f3bd1639"
    )


def test_compress_small_marks_and_round_trips() -> None:
    import zstandard

    serde = CompressingSerializer()
    data = _chat_bytes()
    assert C.SMALL_MIN <= len(data) < C.DEFAULT_THRESHOLD
    typ, packed = serde.compress_small("msgpack", data)
    assert typ == "msgpack" + C.DICT_SUFFIX
    # the dictionary is what pays: plain zstd of the same bytes is much larger
    assert len(packed) < 0.8 * len(zstandard.ZstdCompressor(level=1).compress(data))
    fresh = CompressingSerializer()  # no cache: decompresses
    want = JsonPlusSerializer().loads_typed(("msgpack", data))
    assert fresh.loads_typed((typ, packed)) == want
    for fast_paths in (True, False):
        assert C.loader(CompressingSerializer(), fast_paths)((typ, packed)) == want
    assert fresh.decompress_typed(typ, packed) == ("msgpack", data)
    # too small, large enough for the threshold, never compressing, incompressible
    assert serde.compress_small("msgpack", data[:100]) == ("msgpack", data[:100])
    big = JsonPlusSerializer().dumps_typed(words(3000))[1]
    assert serde.compress_small("msgpack", big)[0] == "msgpack.zst"
    off = CompressingSerializer(threshold=None)
    assert off.compress_small("msgpack", data) == ("msgpack", data)
    noise = os.urandom(600)
    assert serde.compress_small("bytes", noise) == ("bytes", noise)


def test_dictionary_frames_are_cached_apart() -> None:
    """The same frame bytes mean other bytes with the dictionary: a ".zst"
    read of a ".zd1" frame must not be served the ".zd1" value."""
    import zstandard

    serde = CompressingSerializer()
    data = _chat_bytes()
    _, packed = serde.compress_small("msgpack", data)
    try:
        _, out = serde.decompress_typed("msgpack.zst", packed)
    except zstandard.ZstdError:
        return
    assert out != data


def test_a_compressing_subclass_with_its_own_dumps_typed_makes_the_values(
    tmp_path: Any,
) -> None:
    """A CompressingSerializer subclass that makes its own choice of what to
    compress is called for each channel value that is not a list, as before
    the delta codec serialized through the layers itself (which it does for
    the stock class); such a stack gets no head record."""

    class NoStrCompression(CompressingSerializer):
        def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
            if isinstance(obj, str):
                return self.serde.dumps_typed(obj)
            return super().dumps_typed(obj)

    text = "compressible text " * 300
    serde = NoStrCompression(JsonPlusSerializer())
    with KVSaver(str(tmp_path / "s"), serde=serde, whole_latest=True) as saver:
        cp = empty_checkpoint()
        cp["channel_values"] = {"text": text, "n": 1}
        cp["channel_versions"] = {"text": "1", "n": "1"}
        conf = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        saver.put(conf, cp, {}, {"text": "1", "n": "1"})
        with saver.store.read() as txn:
            typed = S.decode_blob(txn.get(S.blob_key("t", "", "text", "1")))
            assert not list(txn.scan(*S.heads_range()))
        assert typed is not None and typed[0] == "msgpack"  # its own choice
        got = saver.get_tuple(conf)
        assert got is not None and got.checkpoint["channel_values"] == {"text": text, "n": 1}


def test_a_damaged_frame_reads_as_a_value_error(tmp_path: Any) -> None:
    """A stored zstd frame that does not decompress: a read raised
    zstandard's own ZstdError (not a ValueError, as a damaged msgpack value
    is). It is now ``DamagedValueError``, both."""
    saver = KVSaver(str(tmp_path / "s"))
    cp = empty_checkpoint()
    cp["channel_values"] = {"a": "some text that compresses " * 200}
    cp["channel_versions"] = {"a": "1"}
    conf = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    saver.put(conf, cp, {}, {"a": "1"})
    damage_zstd_blob(saver, S.blob_key("t", "", "a", "1"))
    saver.close()
    with KVSaver(str(tmp_path / "s")) as fresh:  # nothing cached
        with pytest.raises(C.DamagedValueError, match="does not decompress") as caught:
            fresh.get_tuple(conf)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, zstandard.ZstdError)
