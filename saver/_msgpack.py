"""msgpack read and written at the byte level, where a decode would cost
more than it tells: the array header a delta joins its pieces under
(``delta``), the module and class name a pydantic record starts with
(``messages``)."""

from __future__ import annotations

__all__ = ["header", "make_header", "str_at"]


def header(data: bytes) -> tuple[int, int] | None:
    """(element count, header length) of a msgpack array, else None."""
    if not data:
        return None
    b = data[0]
    if 0x90 <= b <= 0x9F:
        return b & 0x0F, 1
    if b == 0xDC and len(data) >= 3:
        return int.from_bytes(data[1:3], "big"), 3
    if b == 0xDD and len(data) >= 5:
        return int.from_bytes(data[1:5], "big"), 5
    return None


def make_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


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
