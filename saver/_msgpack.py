"""msgpack read and written at the byte level, where a decode would cost
more than it tells: the array header a delta joins its pieces under
(``delta``), the map headers a head record is spliced under (``heads``), the
module and class name a pydantic record starts with (``messages``)."""

from __future__ import annotations

__all__ = ["header", "make_header", "make_map_header", "map_header", "str_at"]


def header(data: bytes) -> tuple[int, int] | None:
    """(element count, header length) of a msgpack array, else None."""
    return _sized(data, 0x90, 0xDC)


def map_header(data: bytes) -> tuple[int, int] | None:
    """(entry count, header length) of a msgpack map, else None."""
    return _sized(data, 0x80, 0xDE)


def make_header(n: int) -> bytes:
    """A msgpack array header for ``n`` elements."""
    return _make(n, 0x90, 0xDC)


def make_map_header(n: int) -> bytes:
    """A msgpack map header for ``n`` entries."""
    return _make(n, 0x80, 0xDE)


def _sized(data: bytes, fix: int, c16: int) -> tuple[int, int] | None:
    # fix: the 4-bit form's code (count in its low nibble); c16, c16 + 1: the
    # 16- and 32-bit forms' codes (arrays 0x90/0xDC/0xDD, maps 0x80/0xDE/0xDF)
    if not data:
        return None
    b = data[0]
    if fix <= b <= fix + 0x0F:
        return b & 0x0F, 1
    if b == c16 and len(data) >= 3:
        return int.from_bytes(data[1:3], "big"), 3
    if b == c16 + 1 and len(data) >= 5:
        return int.from_bytes(data[1:5], "big"), 5
    return None


def _make(n: int, fix: int, c16: int) -> bytes:
    if n < 16:
        return bytes((fix | n,))
    if n < 1 << 16:
        return bytes((c16,)) + n.to_bytes(2, "big")
    return bytes((c16 + 1,)) + n.to_bytes(4, "big")


def str_at(data: bytes, i: int) -> tuple[str, int]:
    """The msgpack string at ``data[i]`` and the offset after it (ValueError
    when it is not a string)."""
    b = data[i]
    if 0xA0 <= b <= 0xBF:
        n, i = b & 0x1F, i + 1
    elif b == 0xD9:
        n, i = data[i + 1], i + 2
    elif b == 0xDA:
        n, i = int.from_bytes(data[i + 1 : i + 3], "big"), i + 3
    else:
        raise ValueError("not a short msgpack string")
    if i + n > len(data):
        raise ValueError("a truncated msgpack string")
    return data[i : i + n].decode("utf-8"), i + n
