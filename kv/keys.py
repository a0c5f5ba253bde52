"""Order-preserving encoding of key tuples (FoundationDB tuple-layer style).

Pure functions, no I/O. ``pack`` turns a tuple into bytes whose byte order is
the tuple order; ``unpack`` reverses it; ``prefix_range`` gives the byte range
holding exactly the strict extensions of a tuple.

Every element is a type code followed by its bytes, and every element is
self-delimiting, so ``("a",) < ("a", "b") < ("ab",)`` holds in byte order and
two distinct tuples never pack alike (a thread id of ``"a\\x00b"`` cannot
collide with the pair ``("a", "b")``).

Type codes (the system of record; tests pin the vectors below):

======  ==========================================================
code    element
======  ==========================================================
0x00    None
0x01    bytes: raw bytes, ``\\x00`` escaped as ``\\x00\\xff``, then ``\\x00``
0x02    str: UTF-8 (lone surrogates passed through), escaped as bytes
0x0b    int < -(2**64 - 1): ``0x0b``, ``len ^ 0xff``, one's complement bytes
0x0c-13 int, negative, 8..1 bytes: ``0x14 - n`` + one's complement
0x14    int 0
0x15-1c int, positive, 1..8 bytes: ``0x14 + n`` + big-endian magnitude
0x1d    int > 2**64 - 1: ``0x1d``, ``len``, big-endian magnitude
0x21    float: IEEE-754 double, big-endian; negative: all bits
        flipped, else the sign bit flipped (total order:
        -nan < -inf < -1.0 < -0.0 < 0.0 < 1.0 < inf < nan)
0x26    False
0x27    True
======  ==========================================================

Integers are limited to 255 magnitude bytes (|n| < 2**2040); nested tuples
and any other type raise ``ValueError``. ``bool`` is its own type, never
confused with 0 or 1.

Byte-exact vectors::

    pack(())                 == b""
    pack((None,))            == b"\\x00"
    pack((b"a\\x00b",))        == b"\\x01a\\x00\\xffb\\x00"
    pack(("",))              == b"\\x02\\x00"
    pack(("a\\x00b",))         == b"\\x02a\\x00\\xffb\\x00"
    pack(("\\u00e9",))         == b"\\x02\\xc3\\xa9\\x00"
    pack((0,))               == b"\\x14"
    pack((1,))               == b"\\x15\\x01"
    pack((-1,))              == b"\\x13\\xfe"
    pack((256,))             == b"\\x16\\x01\\x00"
    pack((2**64,))           == b"\\x1d\\x09\\x01" + b"\\x00" * 8
    pack((-(2**64),))        == b"\\x0b\\xf6\\xfe" + b"\\xff" * 8
    pack((1.0,))             == b"\\x21\\xbf\\xf0" + b"\\x00" * 6
    pack((-1.0,))            == b"\\x21\\x40\\x0f" + b"\\xff" * 6
    pack((False, True))      == b"\\x26\\x27"
    pack(("c", "t", 7))      == b"\\x02c\\x00\\x02t\\x00\\x15\\x07"
    prefix_range(("a",))     == (b"\\x02a\\x00\\x00", b"\\x02a\\x00\\xff")
"""

from __future__ import annotations

import struct
from typing import Any

from .store import CorruptStoreError

__all__ = [
    "Element",
    "MalformedKeyError",
    "extensions",
    "pack",
    "prefix_range",
    "split",
    "unpack",
]

Element = Any  # None | bytes | str | int | float | bool

NONE = 0x00
BYTES = 0x01
STR = 0x02
NEG_BIG = 0x0B
INT_ZERO = 0x14
POS_BIG = 0x1D
FLOAT = 0x21
FALSE = 0x26
TRUE = 0x27

_MAX_INT_BYTES = 255
_SIZE_LIMITS = tuple((1 << (8 * i)) - 1 for i in range(9))
_DOUBLE = struct.Struct(">d")
_U64 = struct.Struct(">Q")


def _escape(raw: bytes) -> bytes:
    return raw.replace(b"\x00", b"\x00\xff")


def _pack_int(value: int, out: list[bytes]) -> None:
    if value == 0:
        out.append(b"\x14")
        return
    if value > 0:
        if value <= _SIZE_LIMITS[8]:
            n = (value.bit_length() + 7) // 8
            out.append(bytes((INT_ZERO + n,)) + value.to_bytes(n, "big"))
            return
        n = (value.bit_length() + 7) // 8
        if n > _MAX_INT_BYTES:
            raise ValueError(f"int too large to pack ({n} bytes; the limit is 255)")
        out.append(bytes((POS_BIG, n)) + value.to_bytes(n, "big"))
        return
    magnitude = -value
    if magnitude <= _SIZE_LIMITS[8]:
        n = (magnitude.bit_length() + 7) // 8
        out.append(bytes((INT_ZERO - n,)) + (_SIZE_LIMITS[n] + value).to_bytes(n, "big"))
        return
    n = (magnitude.bit_length() + 7) // 8
    if n > _MAX_INT_BYTES:
        raise ValueError(f"int too large to pack ({n} bytes; the limit is 255)")
    out.append(bytes((NEG_BIG, n ^ 0xFF)) + (((1 << (8 * n)) - 1) + value).to_bytes(n, "big"))


def _pack_float(value: float) -> bytes:
    raw = _DOUBLE.pack(value)
    if raw[0] & 0x80:
        flipped = _U64.unpack(raw)[0] ^ 0xFFFFFFFFFFFFFFFF
    else:
        flipped = _U64.unpack(raw)[0] ^ 0x8000000000000000
    return b"\x21" + _U64.pack(flipped)


# Encoded str elements, memoized: key building repeats the same few strings
# (keyspace names, thread ids, namespaces, channel names) all the time, and a
# dict hit is several times cheaper than encode + escape + concatenate.
_STR_CACHE: dict[str, bytes] = {}
_STR_CACHE_MAX = 16384


def _str_element(s: str) -> bytes:
    enc = _STR_CACHE.get(s)
    if enc is None:
        enc = b"\x02" + _escape(s.encode("utf-8", "surrogatepass")) + b"\x00"
        if len(s) <= 256:
            if len(_STR_CACHE) >= _STR_CACHE_MAX:
                _STR_CACHE.clear()
            _STR_CACHE[s] = enc
    return enc


def pack(t: tuple) -> bytes:
    """Encode a tuple of None/bytes/str/int/float/bool as order-preserving bytes.

    Raises ``ValueError`` for any other element type (nested tuples included)
    and for ints of more than 255 bytes.
    """
    if not isinstance(t, tuple):
        raise ValueError(f"pack() takes a tuple, not {type(t).__name__}")
    out: list[bytes] = []
    for el in t:
        # bool before int: bool is a subclass of int.
        if type(el) is str:
            out.append(_str_element(el))
        elif el is None:
            out.append(b"\x00")
        elif isinstance(el, str):
            out.append(b"\x02" + _escape(el.encode("utf-8", "surrogatepass")) + b"\x00")
        elif isinstance(el, bool):
            out.append(b"\x27" if el else b"\x26")
        elif isinstance(el, int):
            _pack_int(el, out)
        elif isinstance(el, (bytes, bytearray, memoryview)):
            out.append(b"\x01" + _escape(bytes(el)) + b"\x00")
        elif isinstance(el, float):
            out.append(_pack_float(el))
        else:
            raise ValueError(f"cannot pack element of type {type(el).__name__}: {el!r}")
    return b"".join(out)


class MalformedKeyError(CorruptStoreError, ValueError):
    """``unpack`` met bytes that ``pack`` never makes: read from a store, a
    damaged store, hence a CorruptStoreError; a ValueError as for any bad
    input."""


def _find_terminator(key: bytes, pos: int) -> int:
    """Index of the unescaped 0x00 ending the byte string that starts at pos."""
    while True:
        end = key.find(b"\x00", pos)
        if end < 0:
            raise MalformedKeyError("malformed key: unterminated byte string")
        if end + 1 < len(key) and key[end + 1] == 0xFF:
            pos = end + 2
            continue
        return end


def unpack(key: bytes) -> tuple:
    """Decode bytes made by ``pack``; raises ``ValueError`` on malformed input."""
    key = bytes(key)
    out: list[Any] = []
    pos = 0
    n = len(key)
    while pos < n:
        code = key[pos]
        pos += 1
        if code == NONE:
            out.append(None)
        elif code == BYTES or code == STR:
            end = _find_terminator(key, pos)
            raw = key[pos:end].replace(b"\x00\xff", b"\x00")
            if code == BYTES:
                out.append(raw)
            else:
                try:
                    out.append(raw.decode("utf-8", "surrogatepass"))
                except UnicodeDecodeError:
                    raise MalformedKeyError("malformed key: a string that is not UTF-8") from None
            pos = end + 1
        elif NEG_BIG < code < POS_BIG:
            size = code - INT_ZERO
            if size >= 0:
                body = key[pos : pos + size]
                if len(body) != size:
                    raise MalformedKeyError("malformed key: truncated int")
                out.append(int.from_bytes(body, "big"))
            else:
                size = -size
                body = key[pos : pos + size]
                if len(body) != size:
                    raise MalformedKeyError("malformed key: truncated int")
                out.append(int.from_bytes(body, "big") - _SIZE_LIMITS[size])
            pos += size
        elif code == POS_BIG or code == NEG_BIG:
            if pos >= n:
                raise MalformedKeyError("malformed key: truncated int")
            size = key[pos] if code == POS_BIG else key[pos] ^ 0xFF
            pos += 1
            body = key[pos : pos + size]
            if len(body) != size:
                raise MalformedKeyError("malformed key: truncated int")
            value = int.from_bytes(body, "big")
            out.append(value if code == POS_BIG else value - ((1 << (8 * size)) - 1))
            pos += size
        elif code == FLOAT:
            body = key[pos : pos + 8]
            if len(body) != 8:
                raise MalformedKeyError("malformed key: truncated float")
            bits = _U64.unpack(body)[0]
            if bits & 0x8000000000000000:
                bits ^= 0x8000000000000000
            else:
                bits ^= 0xFFFFFFFFFFFFFFFF
            out.append(_DOUBLE.unpack(_U64.pack(bits))[0])
            pos += 8
        elif code == FALSE:
            out.append(False)
        elif code == TRUE:
            out.append(True)
        else:
            raise MalformedKeyError(f"malformed key: unknown type code 0x{code:02x} at {pos - 1}")
    return tuple(out)


def split(key: bytes, start: int = 0) -> list[bytes]:
    """The packed bytes of each element of ``key[start:]``, undecoded:
    ``split(pack(t)) == [pack((e,)) for e in t]``. Reordering elements of one
    key into another (an index entry -> the record it points at) is then
    concatenation, with no decode and re-encode of each string."""
    out: list[bytes] = []
    pos, n = start, len(key)
    while pos < n:
        code = key[pos]
        if code != STR and code != BYTES:  # rare in our keys: through unpack
            return out + [pack((e,)) for e in unpack(key[pos:])]
        end = _find_terminator(key, pos + 1) + 1
        out.append(key[pos:end])
        pos = end
    return out


def prefix_range(t: tuple) -> tuple[bytes, bytes]:
    """``(start, stop)``: start inclusive, stop exclusive, covering exactly the
    keys of tuples that strictly extend ``t`` (not ``t`` itself).

    Every element starts with a type code below 0xff, so appending ``\\x00``
    and ``\\xff`` to the packed prefix brackets all extensions.
    """
    return extensions(pack(t))


def extensions(p: bytes) -> tuple[bytes, bytes]:
    """``prefix_range`` of an already packed prefix ``p``."""
    return p + b"\x00", p + b"\xff"
