"""What ``KVSaver(path, backend=..., **options)`` opens: the backend a path
names (``":memory:"``, a PostgreSQL URL, ``backend=`` else LMDB), each
backend's store options checked before anything is opened, and the store.
A new backend is one entry of ``BACKENDS`` (and its constructor's options).
And what ``KVSaver.from_conn_string`` and ``setup`` return (``Opening``,
``Done``).
"""

from __future__ import annotations

import asyncio
import difflib
import inspect
import os
from collections.abc import Callable, Collection, Generator, Mapping
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Generic, Protocol, TypeVar

from kvsaver.kv import FileStore, LMDBStore, MemoryStore, PostgresStore, Store
from kvsaver.kv.postgres import is_postgres_url

__all__ = ["BACKENDS", "DONE", "Done", "Opening", "OptionError", "choose", "open_store"]


class OptionError(TypeError):
    """A keyword option KVSaver does not take, or not for this backend (a
    misspelling, ``durability=`` with a PostgreSQL URL): raised before
    anything is opened, so a caller such as the migration tool can report it
    as the refusal it is without mistaking any other TypeError for one."""


# -- PostgreSQL: KVSaver("postgresql://...", **options) -------------------------
# The keyword options a PostgreSQL URL accepts, and the kv.PostgresStore
# argument each becomes (pool_*: the psycopg_pool.ConnectionPool's; LMDB's
# max_size, a byte cap, means nothing there).
_POSTGRES_OPTIONS = {
    "table": "table",
    "pool_min_size": "min_size",
    "pool_max_size": "max_size",
    "pool_timeout": "pool_timeout",
    "pool_options": "pool_options",
    "connect_timeout": "connect_timeout",
    "statement_timeout": "statement_timeout",
    "retries": "retries",
}


def _open_postgres(url: str, *, readonly: bool = False, **options: Any) -> Store:
    # Options were checked against _POSTGRES_OPTIONS by choose.
    return PostgresStore(
        url, readonly=readonly, **{_POSTGRES_OPTIONS[k]: v for k, v in options.items()}
    )


# -- backends and their options -------------------------------------------------


class _Backend:
    """A store KVSaver can open: its options are its constructor's keyword
    parameters (besides ``readonly``), so a backend declares them by taking
    them, and KVSaver refuses any other before opening anything."""

    def __init__(
        self,
        factory: Callable[..., Store],
        options: Collection[str] | None = None,
        *,
        takes_path: bool = True,
    ) -> None:
        self.factory = factory
        self.takes_path = takes_path
        if options is None:
            params = inspect.signature(factory).parameters.values()
            options = [p.name for p in params if p.kind is p.KEYWORD_ONLY]
        self.options = frozenset(options) - {"readonly"}

    def open(
        self, path: str | os.PathLike[str], readonly: bool, options: Mapping[str, Any]
    ) -> Store:
        if self.takes_path:
            return self.factory(path, readonly=readonly, **options)
        return self.factory(readonly=readonly, **options)


# What KVSaver(path) opens: ":memory:" -> "memory", else ``backend=`` (default
# "lmdb"). A new backend is one entry here (and its constructor's options).
BACKENDS: dict[str, _Backend] = {
    "lmdb": _Backend(LMDBStore),
    "file": _Backend(FileStore),
    "memory": _Backend(MemoryStore, takes_path=False),
    "postgres": _Backend(lambda url, **kw: _open_postgres(str(url), **kw), _POSTGRES_OPTIONS),
}


def _saver_options(chosen: str, saver_init: Callable[..., Any]) -> list[str]:
    """KVSaver's own keyword options (read from the signature of
    ``saver_init``, its ``__init__``, so a new one is never missing from the
    "did you mean" of a misspelled one), without those it passes to a store
    (``BACKENDS``: durability, max_size) and, for ':memory:' and a URL,
    without ``backend``, which they do not take."""
    params = inspect.signature(saver_init).parameters.values()
    skip = {*_all_store_options(), *(["backend"] if chosen in ("memory", "postgres") else [])}
    return [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.name not in skip]


def choose(
    path_or_store: Any,
    backend: str | None,
    options: Mapping[str, Any],
    saver_init: Callable[..., Any],
    owner: str = "KVSaver",
) -> str | None:
    """The backend KVSaver(path_or_store, ...) opens (None: a Store given),
    after checking every store option against it (``saver_init``: KVSaver's
    ``__init__``, whose options a misspelling is compared with too).
    ``owner``: the class the errors name (KVStore checks its options here)."""
    if isinstance(path_or_store, Store):
        if backend is not None or options:
            given = ", ".join(sorted({*options, *(["backend"] if backend else [])}))
            raise OptionError(
                f"{owner}(store): {given} apply only when {owner} opens the store itself; "
                "pass them to the store's constructor instead"
            )
        return None
    if is_postgres_url(path_or_store):
        if backend is not None:
            raise ValueError("a PostgreSQL URL is the postgres backend; pass no backend=")
        chosen = "postgres"
    elif path_or_store == ":memory:":
        if backend not in (None, "memory"):
            raise ValueError(f"':memory:' is the in-memory store; backend={backend!r} needs a path")
        chosen = "memory"
    else:
        chosen = "lmdb" if backend is None else backend
        if chosen not in BACKENDS or chosen in ("memory", "postgres"):
            raise ValueError(
                f"unknown backend {backend!r}; choose 'lmdb' or 'file' "
                "(':memory:' as the path is the in-memory store)"
            )
    valid = BACKENDS[chosen].options
    for name in options:
        if name in valid:
            continue
        owners = sorted(b for b, spec in BACKENDS.items() if name in spec.options)
        where = {"memory": "':memory:'", "postgres": "a PostgreSQL URL"}.get(
            chosen, f"backend={chosen!r}"
        )
        if owners:
            theirs = (
                f"its store options are {', '.join(sorted(valid))}"
                if valid
                else "it takes no store options"
            )
            raise OptionError(
                f"{owner} option {name!r} applies only to the {' and '.join(owners)} "
                f"backend, not to {where}: {theirs}"
            )
        known = sorted({*_saver_options(chosen, saver_init), *valid})
        close = difflib.get_close_matches(name, [*known, *_all_store_options()], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "."
        raise OptionError(
            f"{owner} got an unexpected keyword argument {name!r}{hint} "
            f"Valid options for {where}: {', '.join(known)}"
        )
    return chosen


def _all_store_options() -> list[str]:
    return sorted({name for spec in BACKENDS.values() for name in spec.options})


def open_store(
    chosen: str, path: str | os.PathLike[str], readonly: bool, options: Mapping[str, Any]
) -> Store:
    """The store of backend ``chosen`` (``choose``'s) at ``path``."""
    return BACKENDS[chosen].open(path, readonly, options)


class Done:
    """What ``setup()`` returns: nothing to wait for, but awaitable."""

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield


DONE = Done()


class _Closing(Protocol):
    def close(self) -> None: ...


_Saver = TypeVar("_Saver", bound=_Closing)


class Opening(AbstractContextManager, AbstractAsyncContextManager, Generic[_Saver]):
    """What ``KVSaver.from_conn_string`` returns: a saver opened on entering a
    ``with`` or ``async with`` block and closed on leaving it."""

    def __init__(self, open_saver: Callable[[], _Saver]) -> None:
        self._open = open_saver
        self._saver: _Saver | None = None

    def __enter__(self) -> _Saver:
        self._saver = self._open()
        return self._saver

    def __exit__(self, *exc: object) -> None:
        if self._saver is not None:
            self._saver.close()
            self._saver = None

    async def __aenter__(self) -> _Saver:
        self._saver = await asyncio.to_thread(self._open)
        return self._saver

    async def __aexit__(self, *exc: object) -> None:
        if self._saver is not None:
            saver, self._saver = self._saver, None
            await asyncio.to_thread(saver.close)
