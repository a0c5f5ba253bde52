"""``CompressingSerializer``: zstd compression of serialized values, per value.

A serde wrapper: ``dumps_typed`` asks the inner serializer for ``(type,
bytes)`` and, when the bytes are at least ``threshold`` long and zstd makes
them at least 1/16 smaller, returns ``(type + ".zst", compressed)``. Anything
else (small values, incompressible ones such as images or ciphertext) is
returned exactly as the inner serializer made it. ``loads_typed`` looks at the
suffix, so one store can hold both kinds: values written before compression
was enabled, or by ``compress=False``, keep reading.

Why the suffix is ``".zst"`` and not ``"+zstd"``: ``EncryptedSerializer``
appends ``"+<cipher>"`` and splits on the *first* ``"+"`` when it loads, so a
``"+"`` of ours inside it would be taken for the cipher name.

With encryption, compression has to happen first (ciphertext does not
compress), so ``wrap`` puts the compressor *inside* an ``EncryptedSerializer``:
``EncryptedSerializer(cipher, CompressingSerializer(inner))``, and the stored
type reads ``"msgpack.zst+aes"``.

LangGraph's msgpack allowlist (``BaseCheckpointSaver.with_allowlist``)
recognizes only ``JsonPlusSerializer`` and ``EncryptedSerializer(cipher,
JsonPlusSerializer)``; ``with_msgpack_allowlist`` below looks through our
wrapper so the allowlist reaches the ``JsonPlusSerializer`` inside it.

Decompressed values are kept in a small cache (``cache_bytes``, 8 MiB by
default), keyed by the compressed bytes themselves, so it can never return
stale data: the same stored bytes always decompress to the same value. Its
use is the read of a thread's latest checkpoint, which every ``invoke`` and
``get_state`` repeats, mostly with the same channel blobs as the last time:
it skips their zstd decompression, which costs a read even for a small
value. ``dumps_typed`` fills it too, so the read that
follows a ``put`` is a hit; a value read, not written, here is kept from
its second read on (a scan of history read once does not flush it).
RocksDB's block cache keeps uncompressed blocks for the same reason. Only
the bytes are cached, never the loaded objects (callers own and may mutate
those).

Why 2 KiB, not less: decompressing a zstd frame has a fixed cost whatever
its size (for a small value, several times what unpacking it costs), and a
checkpoint read loads every channel. A read of a checkpoint whose many small
values and record are compressed spends most of its time in those frames;
a value under 2 KiB saves at most a kilobyte or so when compressed, while
the bytes on disk come from the large values (a growing message list),
which are still compressed.

Small values with a dictionary: a checkpoint record's checkpoint (its
channel versions, ``versions_seen``) and a pending write's value are a few
hundred bytes each, under the 2 KiB threshold, yet they are most of a long
chat's store once message lists are stored as deltas. Alone, zstd has too
little history in a few hundred bytes to find much; with a fixed dictionary
of what such values share (LangGraph's checkpoint keys, zero-padded
versions, LangChain messages' class paths and field names: ``SMALL_DICT``)
it makes checkpoints and messages much smaller than zstd alone does.
``compress_small`` does this for values from ``SMALL_MIN`` bytes up to the
threshold, marked ``".zd1"`` (dictionary 1). The saver uses it for
checkpoints, pending writes, delta pieces and the graph's input, not for
channel values in general (a read loads every channel: see "Why 2 KiB"):
what it costs a read is one frame per checkpoint decoded (a zstd dictionary
trained on generic samples decompresses faster, but stores messages larger;
the raw dictionary is simpler to explain and to keep). The dictionary's
bytes are part of the format: never edit it (a test pins its digest);
another one would be ``".zd2"``.

zstandard, not zlib: on msgpack'd chat messages zstd level 1 compresses
smaller than zlib's fastest level in well under half the time, and zlib's
default level is slower still; zstd also decompresses several times
faster, and its frame records the content size, so decompression allocates
once.
"""

from __future__ import annotations

import base64
import copy
import logging
import threading
from collections.abc import Callable, Collection
from typing import Any, NamedTuple

import ormsgpack
import zstandard
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from . import _upstream as U
from ._lru import SizedLRU, split
from .messages import fast_hook

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_LEVEL",
    "DEFAULT_THRESHOLD",
    "DICT_SUFFIX",
    "SMALL_DICT",
    "SMALL_MIN",
    "SUFFIX",
    "CompressingSerializer",
    "DamagedValueError",
    "EncryptedValueError",
    "Stack",
    "ValueReaders",
    "loader",
    "msgpack_loader",
    "value_readers",
    "with_msgpack_allowlist",
    "wrap",
]

logger = logging.getLogger(__name__)

SUFFIX = ".zst"
DEFAULT_THRESHOLD = 2048  # bytes; see "Why 2 KiB" in the module docstring
# Level 1, not zstd's default 3: on checkpoint data (msgpack of chat messages)
# 3 compresses barely smaller and takes noticeably longer, and every superstep
# compresses the whole of each changed channel again.
DEFAULT_LEVEL = 1
DEFAULT_CACHE_BYTES = 8 << 20
_POOL_MAX = 8  # idle zstd compressors kept per serializer (see CompressingSerializer)
_SEEN_MAX = 4096  # values read once, remembered by hash until read again (see _Inflated)

DICT_SUFFIX = ".zd1"  # zstd with SMALL_DICT (see "Small values" above)
SMALL_MIN = 128  # smaller: a frame's own 10-odd bytes eat what it saves
# Raw-content zstd dictionary 1: JsonPlusSerializer's msgpack of a metadata
# dict, LangChain messages and a checkpoint. Part of the format: never edit.
SMALL_DICT = base64.b64decode(
    "g6Zzb3VyY2WlaW5wdXSkc3RlcP+ncGFyZW50c4CSx4oFlL5sYW5nY2hhaW5fY29yZS5tZXNzYWdlcy5zeXN0ZW2t"
    "U3lzdGVtTWVzc2FnZYanY29udGVudKFzsWFkZGl0aW9uYWxfa3dhcmdzgLFyZXNwb25zZV9tZXRhZGF0YYCkdHlw"
    "ZaZzeXN0ZW2kbmFtZcCiaWShMbNtb2RlbF92YWxpZGF0ZV9qc29ux6wFlLxsYW5nY2hhaW5fY29yZS5tZXNzYWdl"
    "cy50b29sq1Rvb2xNZXNzYWdliadjb250ZW50oXSxYWRkaXRpb25hbF9rd2FyZ3OAsXJlc3BvbnNlX21ldGFkYXRh"
    "gKR0eXBlpHRvb2ykbmFtZcCiaWShMqx0b29sX2NhbGxfaWShY6hhcnRpZmFjdMCmc3RhdHVzp3N1Y2Nlc3OzbW9k"
    "ZWxfdmFsaWRhdGVfanNvbpHHzwWUumxhbmdjaGFpbl9jb3JlLm1lc3NhZ2VzLmFpqUFJTWVzc2FnZYmnY29udGVu"
    "dKCxYWRkaXRpb25hbF9rd2FyZ3OAsXJlc3BvbnNlX21ldGFkYXRhgKR0eXBlomFppG5hbWXAomlkoTGqdG9vbF9j"
    "YWxsc5GEpG5hbWWhZqRhcmdzgKJpZKFjpHR5cGWpdG9vbF9jYWxssmludmFsaWRfdG9vbF9jYWxsc5CudXNhZ2Vf"
    "bWV0YWRhdGHAs21vZGVsX3ZhbGlkYXRlX2pzb26GoXYEonRz2SAyMDI2LTAxLTAxVDAwOjAwOjAwLjAwMDAwMCsw"
    "MDowMKJpZNkkMWYwZTAwMDAtMDAwMC02MDAwLTgwMDAtMDAwMDAwMDAwMDAwsGNoYW5uZWxfdmVyc2lvbnODqV9f"
    "c3RhcnRfX9kzMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDIuMC40OTMwMzgzNDc5MjI3NDI1qG1lc3Nh"
    "Z2Vz2TMwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMi4wLjQ5MzAzODM0NzkyMjc0MjWvYnJhbmNoOnRv"
    "OmFnZW502TMwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMi4wLjQ5MzAzODM0NzkyMjc0MjWtdmVyc2lv"
    "bnNfc2VlboOpX19pbnB1dF9fgKlfX3N0YXJ0X1+BqV9fc3RhcnRfX9kzMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAw"
    "MDAwMDAwMDIuMC40OTMwMzgzNDc5MjI3NDI1pWFnZW50ga9icmFuY2g6dG86YWdlbnTZMzAwMDAwMDAwMDAwMDAw"
    "MDAwMDAwMDAwMDAwMDAwMDAyLjAuNDkzMDM4MzQ3OTIyNzQyNbB1cGRhdGVkX2NoYW5uZWxzkahtZXNzYWdlc4Om"
    "c291cmNlpGxvb3Ckc3RlcAGncGFyZW50c4CSx4cFlL1sYW5nY2hhaW5fY29yZS5tZXNzYWdlcy5odW1hbqxIdW1h"
    "bk1lc3NhZ2WGp2NvbnRlbnShYbFhZGRpdGlvbmFsX2t3YXJnc4CxcmVzcG9uc2VfbWV0YWRhdGGApHR5cGWlaHVt"
    "YW6kbmFtZcCiaWShMbNtb2RlbF92YWxpZGF0ZV9qc29ux64FlLpsYW5nY2hhaW5fY29yZS5tZXNzYWdlcy5haalB"
    "SU1lc3NhZ2WJp2NvbnRlbnShYrFhZGRpdGlvbmFsX2t3YXJnc4CxcmVzcG9uc2VfbWV0YWRhdGGApHR5cGWiYWmk"
    "bmFtZcCiaWShMqp0b29sX2NhbGxzkLJpbnZhbGlkX3Rvb2xfY2FsbHOQrnVzYWdlX21ldGFkYXRhwLNtb2RlbF92"
    "YWxpZGF0ZV9qc29u"
)
_ZDICT = zstandard.ZstdCompressionDict(SMALL_DICT, dict_type=zstandard.DICT_TYPE_RAWCONTENT)


class EncryptedValueError(ValueError):
    """A stored value is encrypted (its type reads ``"<type>+<cipher>"``) and
    the saver's serializer cannot decrypt it: the store was written with an
    ``EncryptedSerializer`` and opened without one."""

    def __init__(self, typ: str) -> None:
        self.type = typ
        cipher = typ.split("+", 1)[1]
        super().__init__(
            f"this value was written with EncryptedSerializer (stored type {typ!r}, "
            f"cipher {cipher!r}) and this saver has no key for it; pass serde=..., e.g. "
            "KVSaver(path, serde=EncryptedSerializer.from_pycryptodome_aes(key=...)) "
            "with the key the store was written with"
        )


class DamagedValueError(ValueError, zstandard.ZstdError):
    """A stored zstd frame does not decompress (the bytes were damaged):
    a ``ValueError``, as a damaged msgpack value is, and still the
    ``zstandard.ZstdError`` that zstandard raised."""


def unzstd(decompressor: zstandard.ZstdDecompressor, frame: bytes) -> bytes:
    """``decompressor.decompress(frame)``; a frame that does not decompress
    raises ``DamagedValueError``: every read of a compressed value, whole or
    a delta's piece, comes here."""
    try:
        return decompressor.decompress(frame)
    except zstandard.ZstdError as e:
        raise DamagedValueError(f"a stored value does not decompress ({e})") from e


class _Inflated(SizedLRU[bytes, bytes]):
    """Decompressed bytes by compressed bytes: least recently used first out,
    at most ``max_bytes`` of both together. Values over 1/8 of it are not kept.

    What a write compressed is kept at once (the read that follows a put is
    likely soon); what a read decompressed only the second time it is read
    within the last ``_SEEN_MAX`` misses (``add(..., read=True)``). A stream
    of reads that never come back (a ``list`` of history, another process's
    threads read once) then does not evict what is reused, nor keep every
    value it decompressed alive, which would add an insertion and evictions
    to each of its reads."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes, share=3)
        self.seen: set[int] = set()  # hashes of compressed bytes read once, not kept

    def cost(self, key: bytes, value: bytes) -> int:
        return len(key) + len(value)

    def get(self, packed: bytes) -> bytes | None:
        if type(packed) is not bytes:
            return None  # a bytearray or memoryview: not hashable
        plain = self.items.get(packed)
        if plain is not None:
            try:
                self.items.move_to_end(packed)
            except KeyError:  # evicted by another thread meanwhile
                pass
        return plain

    def add(self, packed: bytes, plain: bytes, read: bool = False) -> None:
        if len(packed) + len(plain) > self.max_bytes >> 3 or type(packed) is not bytes:
            return
        if read:
            h = hash(packed)  # computed by get() already: bytes keep their hash
            if h not in self.seen:
                if len(self.seen) >= _SEEN_MAX:
                    self.seen.clear()
                self.seen.add(h)
                return
            self.seen.discard(h)
        if packed not in self.items:  # the same bytes decompress to the same value
            self.put(packed, plain)


class CompressingSerializer(SerializerProtocol):
    """Compress the inner serializer's bytes with zstd when it pays off.

    Args:
        serde: the inner serializer (default: ``JsonPlusSerializer()``).
        threshold: compress values of at least this many bytes; ``None``
            never compresses (values already compressed still load).
        level: zstd level (1 fast ... 19 small; default 1, see DEFAULT_LEVEL).
        cache_bytes: memory for recently decompressed values (see the module
            docstring), and one eighth more for small ones; 0 turns the cache
            off. The delta layer above it (``saver.delta``) sizes its caches
            from it too: rebuilt lists as much again, a list's elements'
            bytes twice as much (``saver.elements``), so a serializer's
            caches hold about 4x ``cache_bytes`` in all (33 MiB by default),
            and 0 turns all of them off. The split is ``_lru.split``.
    """

    def __init__(
        self,
        serde: SerializerProtocol | None = None,
        *,
        threshold: int | None = DEFAULT_THRESHOLD,
        level: int = DEFAULT_LEVEL,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        if threshold is not None and (not isinstance(threshold, int) or threshold < 0):
            raise ValueError(f"threshold must be a non-negative int or None, got {threshold!r}")
        if not isinstance(level, int) or not 1 <= level <= 22:
            raise ValueError(f"zstd level must be an int from 1 to 22, got {level!r}")
        if type(cache_bytes) is not int or cache_bytes < 0:
            raise ValueError(f"cache_bytes must be a non-negative int, got {cache_bytes!r}")
        self.serde: SerializerProtocol = serde if serde is not None else JsonPlusSerializer()
        self.threshold = threshold
        self.level = level
        self.cache_bytes = cache_bytes
        budget = split(cache_bytes)
        self._inflated = _Inflated(budget.inflated)
        # Apart: the same frame bytes mean other bytes with the dictionary.
        self._inflated_small = _Inflated(budget.inflated_small)
        # zstd contexts must not be shared by concurrent threads (async
        # methods run in worker threads): one pair per thread.
        self._local = threading.local()
        # Compressors are lent from a pool instead: LangGraph writes
        # checkpoints from worker threads that live for one invoke, and a
        # new context costs as much as several compressions.
        self._compressors: list[zstandard.ZstdCompressor] = []
        self._dict_compressors: list[zstandard.ZstdCompressor] = []
        self._loader: tuple[Any, Callable[[tuple[str, bytes]], Any], Any] | None = None  # loader()

    def _compress(self, data: bytes, small: bool = False) -> bytes:
        """zstd of ``data`` (``small``: with ``SMALL_DICT``) with a compressor
        taken from its pool for the call (``list.pop``/``append`` are atomic:
        no two threads get one)."""
        pool = self._dict_compressors if small else self._compressors
        try:
            c = pool.pop()
        except IndexError:
            if small:
                c = zstandard.ZstdCompressor(
                    level=self.level, dict_data=_ZDICT, write_dict_id=False
                )
            else:
                c = zstandard.ZstdCompressor(level=self.level)
        try:
            return c.compress(data)
        finally:
            if len(pool) < _POOL_MAX:
                pool.append(c)

    def _decompressor(self) -> zstandard.ZstdDecompressor:
        d = getattr(self._local, "d", None)
        if d is None:
            d = self._local.d = zstandard.ZstdDecompressor()
        return d

    def _dict_decompressor(self) -> zstandard.ZstdDecompressor:
        d = getattr(self._local, "dd", None)
        if d is None:
            d = self._local.dd = zstandard.ZstdDecompressor(dict_data=_ZDICT)
        return d

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        return self.compress_typed(*self.serde.dumps_typed(obj))

    def compress_small(self, typ: str, data: bytes, *, remember: bool = True) -> tuple[str, bytes]:
        """``compress_typed``, and below the threshold (from ``SMALL_MIN``
        bytes) zstd with ``SMALL_DICT`` when it saves 1/16 (``".zd1"``).
        ``remember=False``: the frame is not put in the cache of decompressed
        values, for bytes no read looks up there soon (a delta piece is read
        through ``delta``'s own cache, a pending write only when its
        checkpoint is resumed), so a put does not pay the cache's lock,
        insertion and evictions for nothing."""
        if self.threshold is None or len(data) >= self.threshold or len(data) < SMALL_MIN:
            return self.compress_typed(typ, data)
        if typ.endswith((SUFFIX, DICT_SUFFIX)):
            return typ, data
        packed = self._compress(data, small=True)
        if len(packed) > len(data) - (len(data) >> 4):
            return typ, data
        if remember:
            self._inflated_small.add(packed, data)
        return typ + DICT_SUFFIX, packed

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        typ, raw = self.decompress_typed(*data)
        try:
            return self.serde.loads_typed((typ, raw))
        except NotImplementedError as e:  # "Unknown serialization type"
            if "+" in typ:  # EncryptedSerializer's "<type>+<cipher>"
                raise EncryptedValueError(typ) from e
            raise

    def compress_typed(
        self, typ: str, data: bytes, threshold: int | None = None
    ) -> tuple[str, bytes]:
        """The step of ``dumps_typed`` after the inner serializer (its one
        home), also for bytes made already (``saver.delta`` serializes a value once, then compresses
        either the whole of it or only its appended part, which may be worth
        compressing below the usual ``threshold``)."""
        if self.threshold is None or typ.endswith(SUFFIX):
            return typ, data
        if len(data) < (self.threshold if threshold is None else threshold):
            return typ, data
        packed = self._compress(data)
        if len(packed) > len(data) - (len(data) >> 4):
            return typ, data  # saves less than 1/16: not worth a decompression
        self._inflated.add(packed, data)  # the next read of this value is likely soon
        return typ + SUFFIX, packed

    def decompress_typed(self, typ: str, raw: bytes) -> tuple[str, bytes]:
        """The step of ``loads_typed`` before the inner serializer."""
        if typ.endswith(SUFFIX):
            return typ[: -len(SUFFIX)], self._inflate(raw)
        if typ.endswith(DICT_SUFFIX):
            return typ[: -len(DICT_SUFFIX)], self._inflate_small(raw)
        return typ, raw

    def _inflate(self, packed: bytes) -> bytes:
        plain = self._inflated.get(packed)
        if plain is None:
            plain = unzstd(self._decompressor(), packed)
            self._inflated.add(packed, plain, read=True)
        return plain

    def _inflate_small(self, packed: bytes) -> bytes:
        plain = self._inflated_small.get(packed)
        if plain is None:
            plain = unzstd(self._dict_decompressor(), packed)
            self._inflated_small.add(packed, plain, read=True)
        return plain

    def with_inner(self, serde: SerializerProtocol) -> CompressingSerializer:
        """The same settings around another inner serializer."""
        return CompressingSerializer(
            serde, threshold=self.threshold, level=self.level, cache_bytes=self.cache_bytes
        )

    def __copy__(self) -> CompressingSerializer:
        return self.with_inner(self.serde)  # fresh thread-local contexts

    def __repr__(self) -> str:
        return (
            f"CompressingSerializer({self.serde!r}, threshold={self.threshold}, "
            f"level={self.level}, cache_bytes={self.cache_bytes})"
        )


def loader(serde: SerializerProtocol, fast_paths: bool) -> Callable[[tuple[str, bytes]], Any]:
    """``serde.loads_typed`` in one call: a checkpoint read loads a dozen
    values, and each would go through this wrapper and
    ``JsonPlusSerializer.loads_typed`` (type checks, a tuple rebuilt) before
    reaching ``ormsgpack.unpackb``. For ``CompressingSerializer(JsonPlusSerializer)``
    exactly (not a subclass, no encryption), this module's own layer is undone
    here (no wrapper call, no suffix parsing) for "msgpack", "msgpack.zst" and
    "msgpack.zd1" values, whose msgpack bytes then load through the inner
    ``JsonPlusSerializer``'s ``loads_typed`` (public calls only), or with
    ``fast_paths`` are unpacked here the way it unpacks them, with that
    serializer's own ext hook (which carries its msgpack allowlist); any
    other type, and any other serializer, goes through ``loads_typed``.
    ``tests/test_compression.py`` checks the two agree. The fast path takes
    private names of LangGraph's (``_upstream``): only with ``fast_paths``."""
    if not isinstance(serde, CompressingSerializer) or type(serde.serde) is not JsonPlusSerializer:
        return serde.loads_typed
    inner = serde.serde
    stock = U.stock_ext_hook(inner) if fast_paths else None
    hook: Any = None  # None: the inner serializer's loads_typed
    if stock is not None:
        fast = serde._loader
        if fast is not None and fast[0] is stock:
            return fast[1]
        # Messages built with less Python, the same objects, unless
        # the hook is the user's own (``__unpack_ext_hook__``): it decides alone.
        hook = stock if U.custom_ext_hook(inner) else fast_hook(stock)
    unpackb, option, inner_loads, inflate, inflate_small, slow = (
        ormsgpack.unpackb,
        ormsgpack.OPT_NON_STR_KEYS,
        inner.loads_typed,
        serde._inflate,
        serde._inflate_small,
        serde.loads_typed,
    )
    packed_type = "msgpack" + SUFFIX
    small_type = "msgpack" + DICT_SUFFIX

    def loads(data: tuple[str, bytes]) -> Any:
        typ, raw = data
        if typ == "msgpack":  # the most common: one test of the path
            if hook is not None:
                return unpackb(raw, ext_hook=hook, option=option)
            return inner_loads(data)
        if typ == packed_type:
            raw = inflate(raw)
        elif typ == small_type:
            raw = inflate_small(raw)
        else:
            return slow(data)
        if hook is not None:
            return unpackb(raw, ext_hook=hook, option=option)
        return inner_loads(("msgpack", raw))

    if hook is not None:
        serde._loader = (stock, loads, ValueReaders(unpackb, hook, option, inflate))
    return loads


class ValueReaders(NamedTuple):
    """``loader``'s fast path in parts: msgpack bytes ``raw`` load as
    ``unpackb(raw, ext_hook=ext_hook, option=option)``, exactly as ``loads``
    loads ``("msgpack", raw)``; ``inflate`` turns a ``".zst"`` value's bytes
    into its msgpack bytes. Called inline, not through a wrapper function:
    a call frame per value is a noticeable part of loading a small one."""

    unpackb: Callable[..., Any]
    ext_hook: Callable[..., Any]
    option: int
    inflate: Callable[[bytes], bytes]


def value_readers(serde: SerializerProtocol, fast_paths: bool) -> ValueReaders | None:
    """``loader(serde)``'s fast path in parts (``ValueReaders``), or None
    when it has none (always without ``fast_paths``). For a reader that
    finds the type in its own record (a channel value's,
    ``delta.Codec.values``): it skips the (type, bytes) tuple, a call and
    the type switch per value, a dozen per checkpoint read."""
    if not fast_paths:
        return None
    loads = loader(serde, True)
    fast = serde._loader if isinstance(serde, CompressingSerializer) else None
    if fast is None or fast[1] is not loads:
        return None
    return fast[2]


def msgpack_loader(
    serde: SerializerProtocol, fast_paths: bool
) -> Callable[[bytes | memoryview], Any] | None:
    """msgpack bytes of the inner ``JsonPlusSerializer`` (a head record's
    payload) -> the value, as ``loader(serde, fast_paths)`` loads
    ``("msgpack", raw)``: through ``value_readers`` where it has a fast path,
    else through that serializer's ``loads_typed``; None for a stack that
    ``loader`` leaves to ``loads_typed``."""
    fast = value_readers(serde, fast_paths)
    if fast is not None:
        unpackb, hook, option, _ = fast
        return lambda raw: unpackb(raw, ext_hook=hook, option=option)
    if not isinstance(serde, CompressingSerializer) or type(serde.serde) is not JsonPlusSerializer:
        return None
    loads = serde.serde.loads_typed
    return lambda raw: loads(("msgpack", bytes(raw)))  # its contract: bytes


class Stack:
    """The layers of a serializer stack, ``[EncryptedSerializer](
    [CompressingSerializer](inner))``, and the one home of what puts bytes
    through them outside the serializers' own ``dumps_typed``/``loads_typed``:
    the saver serializes a value once with ``inner`` and compresses and
    encrypts either the whole of it or a part (a delta's piece, a checkpoint
    spliced with its small values) here, and reads them back here."""

    def __init__(self, serde: SerializerProtocol) -> None:
        self.top = serde
        self.enc = serde if isinstance(serde, EncryptedSerializer) else None
        mid = self.enc.serde if self.enc is not None else serde
        self.comp = mid if isinstance(mid, CompressingSerializer) else None
        # A layer of a subclass that makes its own bytes (its own
        # ``dumps_typed``): a channel value that is not a list goes through
        # ``serde.dumps_typed``, and no head is made.
        self.custom = any(
            layer is not None and type(layer).dumps_typed is not cls.dumps_typed
            for layer, cls in ((self.enc, EncryptedSerializer), (self.comp, CompressingSerializer))
        )
        self.inner = self.comp.serde if self.comp is not None else mid

    def wrap(self, typ: str, data: bytes, threshold: int | None = None) -> tuple[str, bytes]:
        if self.comp is not None:
            typ, data = self.comp.compress_typed(typ, data, threshold)
        if self.enc is not None:
            name, data = self.enc.cipher.encrypt(data)
            typ = f"{typ}+{name}"
        return typ, data

    def dumps_small(self, value: Any, *, remember: bool = True) -> tuple[str, bytes]:
        """``serde.dumps_typed`` for a checkpoint, a pending write or the
        graph's input (``__start__``): a value under the compression
        threshold is compressed with zstd's dictionary of checkpoint and
        message bytes when that pays (``compress_small``), inside any
        encryption. ``remember``: see ``compress_small``."""
        if self.comp is None:
            return self.top.dumps_typed(value)
        return self.wrap_small(*self.comp.serde.dumps_typed(value), remember=remember)

    def wrap_small(self, typ: str, data: bytes, *, remember: bool = True) -> tuple[str, bytes]:
        """``wrap`` with ``compress_small`` for the compression."""
        if self.comp is not None:
            typ, data = self.comp.compress_small(typ, data, remember=remember)
        if self.enc is not None:
            name, data = self.enc.cipher.encrypt(data)
            typ = f"{typ}+{name}"
        return typ, data

    def unwrap(self, typ: str, data: bytes) -> tuple[str, bytes]:
        if "+" in typ:
            if self.enc is None:
                raise ValueError(f"a value encrypted with {typ!r}, but no EncryptedSerializer")
            typ, name = typ.split("+", 1)
            data = self.enc.cipher.decrypt(name, data)
        if self.comp is not None:
            typ, data = self.comp.decompress_typed(typ, data)
        return typ, data

    def piece_reader(self) -> Callable[[str, bytes], bytes]:
        """``unwrap(typ, piece)[1]``, with the usual piece types decompressed
        directly: a cold read of a delta chain decompresses up to
        ``MAX_CHAIN - 1`` pieces once, into the value the delta layer caches,
        so the cache of decompressed values and the layers would only cost
        time."""
        comp, unwrap = self.comp, self.unwrap
        if comp is None:
            return lambda typ, piece: unwrap(typ, piece)[1]
        small, zst = comp._dict_decompressor(), comp._decompressor()
        small_type, zst_type = "msgpack" + DICT_SUFFIX, "msgpack" + SUFFIX

        def read(typ: str, piece: bytes) -> bytes:
            if typ == small_type:
                return unzstd(small, piece)
            if typ == zst_type:
                return unzstd(zst, piece)
            return unwrap(typ, piece)[1]

        return read


def _find(serde: SerializerProtocol) -> CompressingSerializer | None:
    """The stack's ``CompressingSerializer``, if it has one."""
    return Stack(serde).comp


def wrap(
    serde: SerializerProtocol,
    threshold: int | None = DEFAULT_THRESHOLD,
    cache_bytes: int | None = None,
) -> SerializerProtocol:
    """``serde`` with a ``CompressingSerializer`` in the right place.

    Already compressing (either form): returned as it is (``cache_bytes``
    given too: ``ValueError``, the serializer has its own). An
    ``EncryptedSerializer``: a copy whose inner serializer is wrapped, so
    values are compressed before they are encrypted. Anything else: wrapped.
    ``threshold=None`` wraps too (nothing new is compressed, but values
    written compressed earlier still load). ``cache_bytes``: the new
    wrapper's (default ``DEFAULT_CACHE_BYTES``).
    """
    if _find(serde) is not None:
        if cache_bytes is not None:
            raise ValueError(
                "cache_bytes= with a serializer that has its own CompressingSerializer: "
                "set it there instead (CompressingSerializer(cache_bytes=N // 4) "
                "for a saver's caches of about N bytes in all)"
            )
        return serde
    cache = DEFAULT_CACHE_BYTES if cache_bytes is None else cache_bytes
    if isinstance(serde, EncryptedSerializer):
        clone = copy.copy(serde)
        clone.serde = CompressingSerializer(serde.serde, threshold=threshold, cache_bytes=cache)
        return clone
    return CompressingSerializer(serde, threshold=threshold, cache_bytes=cache)


def with_msgpack_allowlist(
    serde: SerializerProtocol, extra_allowlist: Collection[tuple[str, ...]]
) -> SerializerProtocol:
    """LangGraph's msgpack allowlist applied through our wrapper: returns
    ``serde`` itself when nothing changes, else a new serializer of the same
    shape whose ``JsonPlusSerializer`` carries the extended allowlist."""
    if not hasattr(JsonPlusSerializer, "with_msgpack_allowlist"):
        return serde  # langgraph-checkpoint 4.0.0: no msgpack allowlist to extend
    comp = _find(serde)
    inner = comp.serde if comp is not None else serde
    if isinstance(inner, JsonPlusSerializer):
        updated: SerializerProtocol = inner.with_msgpack_allowlist(extra_allowlist)
    elif isinstance(inner, EncryptedSerializer) and isinstance(inner.serde, JsonPlusSerializer):
        new = inner.serde.with_msgpack_allowlist(extra_allowlist)
        updated = inner
        if new is not inner.serde:
            updated = copy.copy(inner)
            updated.serde = new
    else:
        logger.warning(
            "Serializer %s does not support msgpack allowlist. "
            "Strict msgpack deserialization will not be enforced.",
            type(inner).__name__,
        )
        return serde
    if updated is inner:
        return serde
    if comp is None:
        return updated
    new_comp = comp.with_inner(updated)
    if comp is serde:
        return new_comp
    assert isinstance(serde, EncryptedSerializer)
    clone = copy.copy(serde)
    clone.serde = new_comp
    return clone
