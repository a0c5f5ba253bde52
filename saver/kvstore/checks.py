"""What KVStore checks before anything is read or written (namespaces, keys,
values, filters, limits), and the matching of filters and namespace
conditions, with the semantics of LangGraph's InMemoryStore."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import ormsgpack
from langgraph.store.base import InvalidNamespaceError, MatchCondition

__all__ = [
    "OPERATORS",
    "check_filter",
    "check_page",
    "conditions",
    "labels",
    "matches",
    "namespace_matches",
    "pack_value",
    "unmet",
]

OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"})


_CHECKED: set[tuple[str, ...]] = set()  # namespaces found good lately (tuples of str)
_CHECKED_MAX = 16384


def labels(namespace: Any, what: str = "namespace") -> tuple[str, ...]:
    """A namespace as a tuple (a list is taken, as LangGraph's stores take
    it), by the rules of LangGraph's ``_validate_namespace_labels``:
    non-empty strings without "." or NUL ("*" allowed: a wildcard in a
    match path)."""
    # A tuple equal to a good one holds the same strs (a str subclass's
    # equal instance too: same text, same verdict); every read checks one.
    if type(namespace) is tuple and namespace in _CHECKED:
        return namespace
    if isinstance(namespace, (str, bytes)) or not isinstance(namespace, (tuple, list)):
        raise InvalidNamespaceError(
            f"{what} must be a tuple of strings, got {type(namespace).__name__}: {namespace!r}"
        )
    namespace = tuple(namespace)
    for label in namespace:
        if not isinstance(label, str):
            raise InvalidNamespaceError(
                f"Invalid namespace label {label!r} found in {namespace!r}. Namespace labels"
                f" must be strings, but got {type(label).__name__}."
            )
        if "." in label:
            raise InvalidNamespaceError(
                f"Invalid namespace label {label!r} found in {namespace!r}. "
                "Namespace labels cannot contain periods ('.')."
            )
        if "\x00" in label:
            raise InvalidNamespaceError(
                f"Invalid namespace label {label!r} found in {namespace!r}. "
                "Namespace labels cannot contain NUL bytes ('\\x00')."
            )
        if not label:
            raise InvalidNamespaceError(
                f"Namespace labels cannot be empty strings. Got {label!r} in {namespace!r}"
            )
    if len(_CHECKED) >= _CHECKED_MAX:
        _CHECKED.clear()
    _CHECKED.add(namespace)
    return namespace


def check_page(limit: Any, offset: Any, what: str) -> None:
    for name, n in (("limit", limit), ("offset", offset)):
        if type(n) is not int or n < 0:
            raise ValueError(f"{what}: {name} must be an int >= 0, got {n!r}")


def pack_value(value: Any) -> bytes:
    """A put's value as stored: a mapping with str keys of JSON-like values."""
    if not isinstance(value, Mapping):
        raise TypeError(
            f"a store item's value must be a dict (or None to delete), got {type(value).__name__}"
        )
    value = dict(value)
    bad = [key for key in value if not isinstance(key, str)]
    if bad:
        raise TypeError(f"a store item's value must have str keys, got {bad[0]!r}")
    try:
        return ormsgpack.packb(value)
    except (TypeError, ormsgpack.MsgpackEncodeError) as e:
        raise TypeError(f"a store item's value must be JSON-serializable: {e}") from None


def check_filter(filter: Any) -> None:
    """A search filter: a dict of field -> value or {operator: value}; an
    unknown operator is refused here, before the search reads anything."""
    if filter is None:
        return
    if not isinstance(filter, Mapping):
        raise TypeError(f"search filter must be a dict, got {type(filter).__name__}")
    for key, value in filter.items():
        if not isinstance(key, str):
            raise TypeError(f"search filter keys must be str, got {key!r}")
        _check_filter_value(value)


def _check_filter_value(value: Any) -> None:
    if isinstance(value, Mapping):
        if any(isinstance(k, str) and k.startswith("$") for k in value):
            for op, operand in value.items():
                if op not in OPERATORS:
                    raise ValueError(
                        f"unknown filter operator {op!r}; use one of {', '.join(sorted(OPERATORS))}"
                    )
                if op in ("$gt", "$gte", "$lt", "$lte"):
                    _number(operand, op)
            return
        for v in value.values():
            _check_filter_value(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _check_filter_value(v)


def _number(x: Any, op: str) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        raise ValueError(f"filter operator {op} needs a number, got {x!r}") from None


def matches(value: Mapping[str, Any], filter: Mapping[str, Any] | None) -> bool:
    """Whether an item's value passes a filter, as InMemoryStore decides
    (``_compare_values``), except that a range operator on a field that is
    not a number is no match instead of an error."""
    if not filter:
        return True
    return all(_compare(value.get(key), fv) for key, fv in filter.items())


def _compare(item_value: Any, filter_value: Any) -> bool:
    if isinstance(filter_value, dict):
        if any(k.startswith("$") for k in filter_value):
            return all(_apply(item_value, op, v) for op, v in filter_value.items())
        if not isinstance(item_value, dict):
            return False
        return all(_compare(item_value.get(k), v) for k, v in filter_value.items())
    if isinstance(filter_value, (list, tuple)):
        return (
            isinstance(item_value, (list, tuple))
            and len(item_value) == len(filter_value)
            and all(_compare(iv, fv) for iv, fv in zip(item_value, filter_value, strict=False))
        )
    return bool(item_value == filter_value)


def _apply(value: Any, op: str, operand: Any) -> bool:
    if op == "$eq":
        return bool(value == operand)
    if op == "$ne":
        return bool(value != operand)
    try:
        x, y = float(value), float(operand)
    except (TypeError, ValueError):
        return False
    if math.isnan(x) or math.isnan(y):
        return False
    if op == "$gt":
        return x > y
    if op == "$gte":
        return x >= y
    if op == "$lt":
        return x < y
    return x <= y  # $lte (operators are checked before a search runs)


def conditions(given: Any) -> tuple[MatchCondition, ...]:
    """list_namespaces' match conditions, checked, their paths as tuples
    (a str path is one label)."""
    out = []
    for c in given or ():
        if not isinstance(c, tuple) or len(c) != 2:
            raise TypeError(
                f"list_namespaces: a match condition must be a MatchCondition, got {c!r}"
            )
        match_type, path = c
        if match_type not in ("prefix", "suffix"):
            raise ValueError(
                f"list_namespaces: match_type must be 'prefix' or 'suffix', got {match_type!r}"
            )
        if isinstance(path, str):
            # One label, as LangGraph's PostgresStore suite writes a suffix
            # ("public"); LangGraph's stores take a str as a path of its
            # characters, which no namespace of real labels matches.
            path = (path,)
        out.append(MatchCondition(match_type, labels(path, "a match condition's path")))
    return tuple(out)


def namespace_matches(conditions: Sequence[MatchCondition] | None, ns: tuple[str, ...]) -> bool:
    """InMemoryStore's ``_does_match`` of every condition ("*" any label)."""
    for match_type, path in conditions or ():
        if len(ns) < len(path):
            return False
        pairs = zip(ns, path) if match_type == "prefix" else zip(reversed(ns), reversed(path))
        if any(p != "*" and n != p for n, p in pairs):
            return False
    return True


def literal_prefix(conditions: Sequence[MatchCondition] | None) -> tuple[str, ...]:
    """The labels every namespace the conditions match starts with (the
    prefix conditions' labels up to their first wildcard), to scan only them."""
    best: tuple[str, ...] = ()
    for match_type, path in conditions or ():
        if match_type != "prefix":
            continue
        lit: list[str] = []
        for label in path:
            if label == "*":
                break
            lit.append(label)
        if len(lit) > len(best):
            best = tuple(lit)
    return best


def unmet(
    conditions: Sequence[MatchCondition] | None, prefix: tuple[str, ...]
) -> list[MatchCondition]:
    """The conditions a namespace under ``prefix`` may still fail: all but
    the prefix conditions without a wildcard that ``prefix`` starts with."""
    return [
        c
        for c in conditions or ()
        if not (c.match_type == "prefix" and "*" not in c.path and prefix[: len(c.path)] == c.path)
    ]
