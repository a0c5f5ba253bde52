"""Every private name of LangGraph and pydantic that the saver's fast paths
use, in one place. None of them is a documented API, so a release may rename
or change any of them; each fast path then switches itself off (the values
stay correct, only slower), which ``tests/test_upstream.py`` turns into a
failing test, so an upgrade that does it is noticed. The fast paths are
opt-in (``KVSaver(fast_paths=True)``): by default a saver takes none of
these names and reads and writes through ``dumps_typed``/``loads_typed``.

========================================  ===================================
name                                      used by
========================================  ===================================
``jsonplus._msgpack_enc``                 ``elements``: a list's elements
                                          serialized one by one
``jsonplus._option``                      ``elements``: the same options
``_msgpack.SAFE_MSGPACK_TYPES``           ``messages``: the classes built
                                          without the stock hook; and with
``_msgpack.SAFE_MSGPACK_METHODS``         it ``tools/sources.py``: what the
                                          commands show as not allowed
``JsonPlusSerializer._unpack_ext_hook``   ``compression.loader``: the stock
                                          ext hook, with its allowlist
``._custom_unpack_ext_hook``              ``compression.loader``: a user's
                                          hook decides alone
``__pydantic_decorators__``,              ``elements._plain_model``: a model
``__pydantic_computed_fields__``,         that pydantic alone serializes
``__pydantic_core_schema__``
``__pydantic_extra__``                    ``elements``: the fingerprint of a
                                          message's state
``__pydantic_validator__``                ``messages``: a message validated
``.validate_python(self_instance=)``      in place, as ``BaseModel.__init__``
========================================  ===================================

Two are read inline where a call per value would cost the hot path, and
are named here only: ``__pydantic_extra__`` in ``elements._fingerprints``
and the validator's ``validate_python`` in ``messages.fast_hook`` (per
message decoded). Outside the fast paths, the migration's strict reads
(``migrate.common``) use ``custom_ext_hook`` and ``msgpack_policy``
(``_allowed_msgpack_modules``), whatever ``fast_paths`` says (no public API
tells a serializer's msgpack policy; a test fails if they go), and
``tools/sources.py`` imports ``_msgpack``'s safe lists (it fails loudly if
they go).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langgraph.checkpoint.serde import jsonplus as _jsonplus

__all__ = [
    "SAFE_MSGPACK_METHODS",
    "SAFE_MSGPACK_TYPES",
    "computed_fields",
    "core_schema",
    "custom_ext_hook",
    "decorators",
    "msgpack_enc",
    "msgpack_option",
    "msgpack_policy",
    "stock_ext_hook",
    "validator",
]

# JsonPlusSerializer's own msgpack encoder and its ormsgpack options
msgpack_enc: Any = getattr(_jsonplus, "_msgpack_enc", None)
msgpack_option: int | None = getattr(_jsonplus, "_option", None)

try:  # langgraph-checkpoint 4.0.1+ (4.0.0 has no allowlist: no loader uses this there)
    from langgraph.checkpoint.serde._msgpack import SAFE_MSGPACK_METHODS, SAFE_MSGPACK_TYPES
except ImportError:  # pragma: no cover - depends on the installed release
    SAFE_MSGPACK_TYPES = SAFE_MSGPACK_METHODS = frozenset()


def stock_ext_hook(serde: Any) -> Callable[[int, bytes], Any] | None:
    """A ``JsonPlusSerializer``'s ext hook (its msgpack allowlist in it)."""
    return getattr(serde, "_unpack_ext_hook", None)


def custom_ext_hook(serde: Any) -> bool:
    """Whether the hook is the user's own (``__unpack_ext_hook__``); True
    when the serializer does not say."""
    return bool(getattr(serde, "_custom_unpack_ext_hook", True))


def msgpack_policy(serde: Any) -> Any:
    """A ``JsonPlusSerializer``'s msgpack policy: True permissive (the default
    unless LANGGRAPH_STRICT_MSGPACK is set), None strict, a set an allowlist;
    False when the serializer does not say."""
    return getattr(serde, "_allowed_msgpack_modules", False)


def decorators(cls: type) -> Any:
    """A pydantic model class's validators and serializers, None if not known."""
    return getattr(cls, "__pydantic_decorators__", None)


def computed_fields(cls: type) -> Any:
    return getattr(cls, "__pydantic_computed_fields__", None)


def core_schema(cls: type) -> Any:
    return getattr(cls, "__pydantic_core_schema__", None)


def validator(cls: type) -> Any:
    """A pydantic model class's validator, None if it has none."""
    return getattr(cls, "__pydantic_validator__", None)
