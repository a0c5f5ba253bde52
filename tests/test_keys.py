"""kv.keys: the order-preserving tuple encoding.

Properties (hypothesis, >= 1000 examples each) over hostile tuples: byte order
is tuple order, round trip, prefix-range containment, injectivity. Plus the
byte-exact vectors of the module docstring (the system of record for the
on-disk key format) and the error cases.

Equality is type-aware throughout (``ident``): ``True`` is not ``1``, ``1.0``
is not ``1``, ``-0.0`` is not ``0.0``, and floats compare by their IEEE bits
(so NaNs compare equal to themselves, payload and sign included).
"""

from __future__ import annotations

import math
import re
import struct
from decimal import Decimal
from enum import Enum
from typing import Any

import kvsaver.kv.keys as kv_keys
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvsaver.kv.keys import pack, prefix_range, split, unpack

PROPERTY = settings(max_examples=1000, deadline=None)

# -- type-aware identity and the reference order --------------------------------


def ident(x: Any) -> tuple[str, Any]:
    """What makes two elements "the same": type, and value (floats: bits)."""
    if isinstance(x, float):
        return ("float", struct.pack(">d", x))
    return (type(x).__name__, x)


def tident(t: tuple) -> tuple:
    return tuple(ident(x) for x in t)


def float_total_key(x: float) -> int:
    """IEEE-754 total order (the FDB order: -nan < -inf < ... < -0.0 < 0.0 <
    ... < inf < nan) by the classic bit trick, independent of kv.keys: read the
    double as a signed int64; for negatives, flip the 63 magnitude bits."""
    (i,) = struct.unpack(">q", struct.pack(">d", x))
    return i if i >= 0 else i ^ 0x7FFF_FFFF_FFFF_FFFF


def order_key(t: tuple) -> tuple:
    """Reference tuple order for same-typed tuples: Python's own order, except
    floats (total order), and None (all equal)."""
    out: list[Any] = []
    for x in t:
        if x is None:
            out.append(0)
        elif isinstance(x, float):
            out.append(float_total_key(x))
        else:
            out.append(x)  # str: code point order; bytes, int, bool: Python's order
    return tuple(out)


def bits_to_float(bits: int) -> float:
    return struct.unpack(">d", bits.to_bytes(8, "big"))[0]


NEG_NAN = math.copysign(math.nan, -1.0)
assert math.copysign(1.0, NEG_NAN) < 0

# -- hostile elements -------------------------------------------------------------

HOSTILE_CHARS = [
    "\x00",
    "\x01",
    "\x7f",
    "\xff",
    "\u00e9",
    "\ufffe",
    "\uffff",
    "\ud800",
    "\udbff",
    "\udc00",
    "\udfff",  # lone surrogates
    "\U0001f600",
    "\u200d",
    "\U0010ffff",  # emoji, zero-width joiner, last code point
]
HOSTILE_STRINGS = [*HOSTILE_CHARS, "\U0001f469\u200d\U0001f4bb", "\ud83d\ude00", "\x00\xff"]
HOSTILE_BYTES = [0x00, 0x01, 0x02, 0x7F, 0xFE, 0xFF]

INT_EDGES = sorted(
    {0, 2**2000, 2**2040 - 1}
    | {s * v for s in (1, -1) for k in range(1, 10) for v in (2 ** (8 * k) - 1, 2 ** (8 * k))}
    | {s * v for s in (1, -1) for v in (1, 2, 127, 128, 2**64 + 1, 2**2000, 2**2040 - 1)}
)
FLOAT_EDGES = [
    math.nan,
    NEG_NAN,
    math.inf,
    -math.inf,
    0.0,
    -0.0,
    1.0,
    -1.0,
    5e-324,
    -5e-324,
    2.2250738585072014e-308,
    1.7976931348623157e308,
    -1.7976931348623157e308,
    bits_to_float(0x7FF0_0000_0000_0001),  # a signalling NaN
    bits_to_float(0xFFFF_FFFF_FFFF_FFFF),  # the "largest" negative NaN
]

chars = st.one_of(st.characters(exclude_categories=()), st.sampled_from(HOSTILE_CHARS))
texts = st.one_of(
    st.text(chars, max_size=10),
    st.lists(st.sampled_from(HOSTILE_STRINGS), max_size=4).map("".join),
)
byte_strings = st.one_of(
    st.binary(max_size=10),
    st.lists(st.sampled_from(HOSTILE_BYTES), max_size=6).map(bytes),
)
ints = st.one_of(
    st.integers(),
    st.integers(-(2**70), 2**70),
    st.integers(-(2**2000), 2**2000),
    st.sampled_from(INT_EDGES),
)
floats = st.one_of(
    st.floats(),  # includes nan, +-inf, +-0.0, subnormals
    st.integers(0, 2**64 - 1).map(bits_to_float),  # every bit pattern, all NaN payloads
    st.sampled_from(FLOAT_EDGES),
)
BY_TYPE = {
    "none": st.none(),
    "bool": st.booleans(),
    "int": ints,
    "float": floats,
    "str": texts,
    "bytes": byte_strings,
}
elements = st.one_of(*BY_TYPE.values())
tuples = st.lists(elements, max_size=5).map(tuple)
nonempty_tuples = st.lists(elements, min_size=1, max_size=4).map(tuple)

# A small pool of near-colliding atoms: drawing tuples from it makes equal and
# almost-equal tuples frequent, which random elements alone almost never are.
POOL = [
    None,
    False,
    True,
    0,
    1,
    -1,
    255,
    256,
    2**64,
    -(2**64),
    2**64 - 1,
    0.0,
    -0.0,
    1.0,
    math.nan,
    NEG_NAN,
    math.inf,
    "",
    "\x00",
    "\x00\xff",
    "\xff",
    "a",
    "a\x00",
    "\x00b",
    "a\x00b",
    "b",
    "ab",
    "\ud800",
    "\U0001f600",
    b"",
    b"\x00",
    b"\x00\xff",
    b"\xff",
    b"a",
    b"a\x00",
    b"a\x00b",
    b"b",
]
pool_tuples = st.lists(st.one_of(st.sampled_from(POOL), elements), max_size=5).map(tuple)


# -- (a) byte order equals tuple order --------------------------------------------


@st.composite
def same_typed_tuples(draw: st.DrawFn) -> list[tuple]:
    """Tuples that all follow one type signature (prefixes of it allowed), and
    share random-length prefixes of one base tuple, so that comparisons are
    decided at every depth, by every type."""
    sig = draw(st.lists(st.sampled_from(sorted(BY_TYPE)), max_size=4))
    base = [draw(BY_TYPE[t]) for t in sig]
    out = []
    for _ in range(draw(st.integers(2, 8))):
        length = draw(st.integers(0, len(sig)))
        keep = draw(st.integers(0, length))
        out.append(tuple(base[:keep]) + tuple(draw(BY_TYPE[t]) for t in sig[keep:length]))
    return out


@PROPERTY
@given(same_typed_tuples())
def test_byte_order_is_tuple_order(ts: list[tuple]) -> None:
    for a in ts:
        for b in ts:
            pa, pb = pack(a), pack(b)
            ka, kb = order_key(a), order_key(b)
            assert (pa < pb) == (ka < kb), (a, b)
            assert (pa == pb) == (ka == kb), (a, b)


@PROPERTY
@given(st.lists(floats, min_size=2, max_size=8))
def test_float_byte_order_is_ieee_total_order(xs: list[float]) -> None:
    by_bytes = sorted(xs, key=lambda x: pack((x,)))
    by_total = sorted(xs, key=float_total_key)
    assert [ident(x) for x in by_bytes] == [ident(x) for x in by_total]


def test_float_total_order_landmarks() -> None:
    order = [NEG_NAN, -math.inf, -1.0, -5e-324, -0.0, 0.0, 5e-324, 1.0, math.inf, math.nan]
    packed = [pack((x,)) for x in order]
    assert packed == sorted(packed)
    assert len(set(packed)) == len(packed)


def test_cross_type_order_follows_type_codes() -> None:
    # None < bytes < str < int < float < False < True (the codes in the table).
    order = [
        None,
        b"",
        b"\xff",
        "",
        "\U0010ffff",
        -(2**2000),
        -1,
        0,
        1,
        2**2000,
        NEG_NAN,
        0.0,
        math.nan,
        False,
        True,
    ]
    packed = [pack((x,)) for x in order]
    assert packed == sorted(packed)
    assert len(set(packed)) == len(packed)


def test_documented_self_delimiting_order() -> None:
    assert pack(("a",)) < pack(("a", "b")) < pack(("ab",))
    assert pack((-4,)) < pack((-1,)) < pack((0,)) < pack((2,)) < pack((10,))
    # decimal text would sort write 10 before write 2; ints do not
    assert pack(("w", 2)) < pack(("w", 10))


# -- (b) round trip ----------------------------------------------------------------


@PROPERTY
@given(tuples, st.integers(0, 6))
def test_round_trip(t: tuple, cut: int) -> None:
    packed = pack(t)
    back = unpack(packed)
    assert type(back) is tuple
    assert tident(back) == tident(t)  # types preserved (bool vs int), floats bitwise
    assert pack(back) == packed
    # Every element is self-delimiting: keys compose by plain concatenation.
    assert pack(t[:cut]) + pack(t[cut:]) == packed


@PROPERTY
@given(tuples, st.integers(0, 6))
def test_split_gives_each_elements_packed_bytes(t: tuple, cut: int) -> None:
    packed = pack(t)
    assert split(packed) == [pack((e,)) for e in t]
    start = len(pack(t[:cut]))
    assert split(packed, start) == [pack((e,)) for e in t[cut:]]


# -- (c) prefix ranges ---------------------------------------------------------------


def in_range(key: bytes, rng: tuple[bytes, bytes]) -> bool:
    return rng[0] <= key < rng[1]


def is_strict_extension(q: tuple, p: tuple) -> bool:
    return len(q) > len(p) and tident(q[: len(p)]) == tident(p)


def _grow(x: Any, extra: Any) -> Any:
    """An element of the same type that is "longer" or "next to" x."""
    if isinstance(x, str):
        return x + (extra if isinstance(extra, str) and extra else "\x00")
    if isinstance(x, bytes):
        return x + (extra if isinstance(extra, bytes) and extra else b"\x00")
    if isinstance(x, bool) or x is None:
        return extra
    if isinstance(x, int):  # the next int, unless x is the largest that packs (255 bytes)
        return x + 1 if (x + 1).bit_length() <= 8 * 255 else x - 1
    return math.nextafter(x, math.inf) if not math.isnan(x) else -x


@st.composite
def prefix_and_candidate(draw: st.DrawFn) -> tuple[tuple, tuple, tuple]:
    p = draw(pool_tuples)
    ext = draw(nonempty_tuples)
    kind = draw(
        st.sampled_from(["any", "strict_prefix", "self", "diverge", "grown_last", "extension"])
    )
    if kind == "any":
        q = draw(pool_tuples)
    elif kind == "strict_prefix":
        q = p[: draw(st.integers(0, max(0, len(p) - 1)))]
    elif kind == "self":
        q = tuple(p)
    elif kind == "diverge":  # a common prefix, then anything (possibly equal)
        q = p[: draw(st.integers(0, len(p)))] + draw(pool_tuples)
    elif kind == "grown_last" and p:  # ("ab",) vs prefix ("a",)
        q = (*p[:-1], _grow(p[-1], draw(elements)), *draw(pool_tuples))
    else:
        q = p + draw(st.lists(elements, min_size=1, max_size=3).map(tuple))
    return p, ext, q


@PROPERTY
@given(prefix_and_candidate())
def test_prefix_range_holds_exactly_the_strict_extensions(
    case: tuple[tuple, tuple, tuple],
) -> None:
    p, ext, q = case
    rng = prefix_range(p)
    assert in_range(pack(p + ext), rng)  # every extension is in
    assert not in_range(pack(p), rng)  # the prefix itself is not
    assert in_range(pack(q), rng) == is_strict_extension(q, p), (p, q)  # nothing else is


def test_prefix_range_of_empty_tuple_holds_every_nonempty_key() -> None:
    lo, hi = prefix_range(())
    assert (lo, hi) == (b"\x00", b"\xff")
    assert not in_range(pack(()), (lo, hi))
    for x in POOL:
        assert in_range(pack((x,)), (lo, hi))


# -- (d) injectivity --------------------------------------------------------------


def _split_str(t: tuple, i: int, cut: int) -> tuple:
    """("a\\x00b",) -> ("a\\x00", "b"): the thread-id collision shape."""
    x = t[i]
    return (*t[:i], x[:cut], x[cut:], *t[i + 1 :])


@st.composite
def tuple_pairs(draw: st.DrawFn) -> tuple[tuple, tuple]:
    a = draw(pool_tuples)
    kind = draw(st.sampled_from(["independent", "replace", "split", "join", "trim", "same"]))
    strs = [i for i, x in enumerate(a) if isinstance(x, (str, bytes))]
    if kind == "independent":
        b = draw(pool_tuples)
    elif kind == "replace" and a:
        i = draw(st.integers(0, len(a) - 1))
        b = (*a[:i], draw(st.one_of(st.sampled_from(POOL), elements)), *a[i + 1 :])
    elif kind == "split" and strs:
        i = draw(st.sampled_from(strs))
        b = _split_str(a, i, draw(st.integers(0, len(a[i]))))
    elif kind == "join" and len(a) >= 2:
        i = draw(st.integers(0, len(a) - 2))
        x, y = a[i], a[i + 1]
        glue = draw(st.sampled_from(["", "\x00", "\x00\xff"]))
        if isinstance(x, str) and isinstance(y, str):
            b = (*a[:i], x + glue + y, *a[i + 2 :])
        elif isinstance(x, bytes) and isinstance(y, bytes):
            b = (*a[:i], x + glue.encode("latin-1") + y, *a[i + 2 :])
        else:
            b = a[:i] + a[i + 1 :]
    elif kind == "trim" and a:
        b = a[:-1]
    else:
        b = tuple(a)
    return a, b


@PROPERTY
@given(tuple_pairs())
def test_distinct_tuples_never_pack_alike(ab: tuple[tuple, tuple]) -> None:
    a, b = ab
    assert (pack(a) == pack(b)) == (tident(a) == tident(b)), (a, b)


def test_thread_id_collisions() -> None:
    candidates = [
        ("a\x00b",),
        ("a", "b"),
        ("a\x00", "b"),
        ("a", "\x00b"),
        ("a\x00b", ""),
        ("a\x00\xffb",),
        ("a\xff", "b"),
        ("", "a", "b"),
        ("a", "", "b"),
        ("a", "b", ""),
        (b"a\x00b",),
        (b"a", b"b"),
        ("",),
        ("", ""),
        (),
        ("\U0001f600",),
        ("\ud83d\ude00",),
    ]
    packed = [pack(t) for t in candidates]
    assert len(set(packed)) == len(candidates)
    for t, k in zip(candidates, packed):
        assert tident(unpack(k)) == tident(t)
    # A thread's keyspace holds none of the others'.
    thread = prefix_range(("c", "a"))
    assert in_range(pack(("c", "a", "ns", 1)), thread)
    for other in [("c", "a\x00b"), ("c", "a\x00", "b"), ("c", "ab"), ("c", "a\xff"), ("c",)]:
        assert not in_range(pack(other), thread)
        assert not in_range(pack((*other, "ns", 1)), thread)


# -- byte-exact vectors -----------------------------------------------------------

_VECTOR_LINE = re.compile(r"^\s+((?:pack|prefix_range)\(.*\))\s+==\s+(.+?)\s*$")


def docstring_vectors() -> list[tuple[str, str]]:
    doc = kv_keys.__doc__ or ""
    block = doc.split("Byte-exact vectors::", 1)[1]
    return [m.groups() for line in block.splitlines() if (m := _VECTOR_LINE.match(line))]


def test_docstring_vectors_hold() -> None:
    vectors = docstring_vectors()
    assert len(vectors) >= 17  # the parser must find them all, not silently none
    namespace = {"__builtins__": {}, "pack": pack, "prefix_range": prefix_range}
    for lhs, rhs in vectors:
        assert eval(lhs, namespace) == eval(rhs, namespace), lhs
        if lhs.startswith("pack("):
            t = eval(lhs[len("pack(") : -1], namespace)
            assert tident(unpack(eval(rhs, namespace))) == tident(t), lhs


# The same vectors, copied: the on-disk key format must not change, even if the
# code and its docstring were edited together.
PINNED = [
    ((), b""),
    ((None,), b"\x00"),
    ((b"a\x00b",), b"\x01a\x00\xffb\x00"),
    (("",), b"\x02\x00"),
    (("a\x00b",), b"\x02a\x00\xffb\x00"),
    (("\u00e9",), b"\x02\xc3\xa9\x00"),
    ((0,), b"\x14"),
    ((1,), b"\x15\x01"),
    ((-1,), b"\x13\xfe"),
    ((256,), b"\x16\x01\x00"),
    ((2**64,), b"\x1d\x09\x01" + b"\x00" * 8),
    ((-(2**64),), b"\x0b\xf6\xfe" + b"\xff" * 8),
    ((1.0,), b"\x21\xbf\xf0" + b"\x00" * 6),
    ((-1.0,), b"\x21\x40\x0f" + b"\xff" * 6),
    ((False, True), b"\x26\x27"),
    (("c", "t", 7), b"\x02c\x00\x02t\x00\x15\x07"),
    # not in the docstring, pinned too
    ((2**64 - 1,), b"\x1c" + b"\xff" * 8),
    ((-(2**64 - 1),), b"\x0c" + b"\x00" * 8),
    ((0.0,), b"\x21\x80" + b"\x00" * 7),
    ((-0.0,), b"\x21\x7f" + b"\xff" * 7),
    (("\U0001f600",), b"\x02\xf0\x9f\x98\x80\x00"),
    (("\ud800",), b"\x02\xed\xa0\x80\x00"),
]


@pytest.mark.parametrize(("t", "expected"), PINNED, ids=[repr(t) for t, _ in PINNED])
def test_pinned_vectors(t: tuple, expected: bytes) -> None:
    assert pack(t) == expected
    assert tident(unpack(expected)) == tident(t)


def test_pinned_prefix_range() -> None:
    assert prefix_range(("a",)) == (b"\x02a\x00\x00", b"\x02a\x00\xff")


def test_bytes_like_pack_as_bytes() -> None:
    assert pack((bytearray(b"a\x00"),)) == pack((memoryview(b"a\x00"),)) == pack((b"a\x00",))


class _Name(str):
    pass


class _Kind(str, Enum):
    CHECKPOINT = "c"


def test_str_subclasses_pack_as_plain_str() -> None:
    for s in ["", "c", "a\x00b", "\x00\xff", "\ud800", "\U0001f600"]:
        assert pack((_Name(s), 1)) == pack((s, 1))
    assert pack((_Kind.CHECKPOINT, "t")) == pack(("c", "t"))
    back = unpack(pack((_Name("x"), _Kind.CHECKPOINT)))
    assert back == ("x", "c") and [type(x) for x in back] == [str, str]


@PROPERTY
@given(st.lists(texts, min_size=1, max_size=3))
def test_repeated_strings_pack_the_same(strings: list[str]) -> None:
    # pack memoizes encoded strings: a second packing must agree with the first,
    # and with the str-subclass path, which bypasses the memo.
    t = tuple(strings)
    first = pack(t)
    assert pack(t) == first
    assert pack(tuple(_Name(x) for x in strings)) == first
    assert tident(unpack(first)) == tident(t)


# -- bool is not int ----------------------------------------------------------------


def test_bool_never_packs_as_int() -> None:
    assert pack((True,)) != pack((1,))
    assert pack((False,)) != pack((0,))
    assert pack((1.0,)) != pack((1,)) and pack((0.0,)) != pack((0,))
    assert pack(("t", True, 0)) != pack(("t", 1, 0))
    assert unpack(pack((True, 1, False, 0))) == (True, 1, False, 0)
    assert [type(x) for x in unpack(pack((True, 1, False, 0)))] == [bool, int, bool, int]


# -- errors -----------------------------------------------------------------------


class _Thing:
    pass


@pytest.mark.parametrize(
    "bad",
    [
        (("a",),),
        ((),),
        ([1],),
        ({"a": 1},),
        ({1},),
        (_Thing(),),
        (object(),),
        (1j,),
        (Decimal(1),),
        ("ok", ("nested",)),
    ],
    ids=lambda bad: type(bad[-1]).__name__,
)
def test_unknown_element_types_raise_value_error(bad: tuple) -> None:
    with pytest.raises(ValueError, match="cannot pack"):
        pack(bad)


@pytest.mark.parametrize("not_a_tuple", [["a"], "a", b"a", 1, None, {"a": 1}], ids=repr)
def test_pack_requires_a_tuple(not_a_tuple: Any) -> None:
    with pytest.raises(ValueError, match="tuple"):
        pack(not_a_tuple)


@pytest.mark.parametrize("n", [2**2040, -(2**2040), 2**4000, -(2**4000)], ids=str)
def test_int_beyond_255_bytes_raises(n: int) -> None:
    with pytest.raises(ValueError, match="255"):
        pack((n,))


@pytest.mark.parametrize("n", [2**2040 - 1, -(2**2040 - 1)], ids=str)
def test_int_of_exactly_255_bytes_packs(n: int) -> None:
    assert unpack(pack((n,))) == (n,)


MALFORMED = [
    b"\x01",  # bytes, no terminator
    b"\x02abc",  # str, no terminator
    b"\x02a\x00\xff",  # str ending inside an escape
    b"\x02\xff\x00",  # not UTF-8
    b"\x02\xc3\x00",  # truncated UTF-8 sequence
    b"\x15",  # 1-byte int, no body
    b"\x1c\x01\x02",  # 8-byte int, 2 bytes of body
    b"\x13",  # negative 1-byte int, no body
    b"\x0c\x00",  # negative 8-byte int, truncated
    b"\x1d",  # big int, no length
    b"\x1d\x09\x01",  # big int, short body
    b"\x0b",  # big negative, no length
    b"\x0b\xf6\x00",  # big negative, short body
    b"\x21",  # float, no body
    b"\x21\x00\x00\x00",  # float, short body
    b"\x03",  # unknown codes
    b"\x0a",
    b"\x1e",
    b"\x20",
    b"\x28",
    b"\xff",
    b"\x14\x05",  # a valid element, then an unknown code
]


@pytest.mark.parametrize("key", MALFORMED, ids=repr)
def test_malformed_keys_raise_value_error(key: bytes) -> None:
    with pytest.raises(ValueError):
        unpack(key)


@PROPERTY
@given(st.one_of(st.binary(max_size=24), tuples.map(pack).map(lambda k: k[:-1])))
def test_unpack_of_arbitrary_bytes_is_a_tuple_or_value_error(key: bytes) -> None:
    try:
        t = unpack(key)
    except ValueError:
        return
    # Whatever unpack accepts is a packable tuple of supported types.
    assert tident(unpack(pack(t))) == tident(t)
