"""LangGraph's own store suites run against KVStore: the test files of the
sdists of the installed langgraph-checkpoint, -sqlite and -postgres (PyPI),
loaded as they are; only the names that pick their backend are replaced
(``_patch``), and the cases that name their backend are deselected
(``LEFT_OUT``, each with its reason). Every case runs on each of KVStore's
backends (the ``kvstore_backend`` fixture): the backend the suite asks for,
whatever it names (SqliteStore's ":memory:" or file, PostgresStore's
database), is the case's.

pip downloads each sdist once into ``$KVSAVER_TEST_CACHE`` (default
``$XDG_CACHE_HOME/kvsaver-tests``, else ``~/.cache/kvsaver-tests``), of
which only the test files are kept. A failed download fails the module
(``test_the_suite_is_downloaded``); it is never a skip.

A test module exposes a suite with ``globals().update(expose(DIST, NAME))``.
"""

from __future__ import annotations

import fcntl
import fnmatch
import importlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import types
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from _pytest.fixtures import getfixturemarker
from kvsaver import KVStore
from kvstore_helpers import STORE_BACKENDS, backend_place

CACHE = Path(
    os.environ.get("KVSAVER_TEST_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvsaver-tests"
)

# The files each suite needs from its sdist's tests/ (what its modules import).
FILES = {
    "langgraph-checkpoint": ["embed_test_utils.py", "test_store.py"],
    "langgraph-checkpoint-sqlite": ["test_store.py", "test_async_store.py", "test_ttl.py"],
    "langgraph-checkpoint-postgres": [
        "conftest.py",
        "embed_test_utils.py",
        "test_store.py",
        "test_async_store.py",
    ],
}

_COSINE_ONLY = (
    "a distance_type other than cosine: KVStore scores by cosine similarity and refuses "
    "another with ValueError (saver/kvstore/vectors.py); pgvector's operators"
)
_HALFVEC = (
    "pgvector's halfvec column: KVStore keeps one kind of vector (float32); "
    "the case runs as 'vector'"
)
_SQLITE_FILE = (
    "SQLite's file connection (beside ':memory:'): the case runs on each of KVStore's "
    "backends instead"
)
_POSTGRES_SQL = "SQL against PostgresStore's table (store._cursor())"
_SYNC_ON_LOOP = (
    "AsyncSqliteStore/AsyncPostgresStore refuse sync calls on their event loop's thread "
    "(their sync methods run on that loop); KVStore's sync methods run in the caller's thread"
)

# (suite, case glob, parameters it has (name -> value, or a test on the
# value), why the case names its backend). A case matching none runs.
LEFT_OUT: list[tuple[str, str, dict[str, Any], str]] = [
    ("sqlite/test_store", "*", {"store": "file"}, _SQLITE_FILE),
    ("sqlite/test_store", "*", {"conn_type": "file"}, _SQLITE_FILE),
    ("sqlite/test_store", "test_nonnull_migrations", {}, "SqliteStore's SQL migrations"),
    (
        "sqlite/test_store",
        "test_vector_store_initialization",
        {},
        "reads SqliteStore's vector table from sqlite_master (store.conn)",
    ),
    (
        "sqlite/test_store",
        "test_sql_injection_vulnerability",
        {},
        "expects SqliteStore's refusal of filter keys that are not SQL-safe; KVStore "
        "builds no SQL, such a key is a field name (test_kvstore.py: "
        "test_a_filter_key_is_only_a_field_name)",
    ),
    (
        "sqlite/test_store",
        "test_escape_glob_literal",
        {},
        "SqliteStore's GLOB escaping (no store)",
    ),
    (
        "sqlite/test_store",
        "test_namespace_match_pattern",
        {},
        "SqliteStore's namespace GLOB pattern (no store)",
    ),
    (
        "sqlite/test_store",
        "test_list_namespaces_prefix_uses_indexable_condition",
        {},
        "the SQL that BaseSqliteStore builds (no store)",
    ),
    (
        "sqlite/test_store",
        "test_filter_keys_with_hyphens_and_digits",
        {},
        "a dotted filter key as a nested path is SqliteStore's (json_extract's '$.a.b'); "
        "InMemoryStore and PostgresStore, and KVStore with them (docs/store.md), compare "
        "a filter key with one top-level field",
    ),
    ("sqlite/test_async_store", "*", {"store": "file"}, _SQLITE_FILE),
    ("sqlite/test_async_store", "*", {"conn_string": "file"}, _SQLITE_FILE),
    ("sqlite/test_async_store", "test_no_running_loop", {}, _SYNC_ON_LOOP),
    ("postgres/test_store", "*", {"vector_store": lambda p: p[1] != "cosine"}, _COSINE_ONLY),
    # (halfvec, cosine, no TTL) runs: the suite's one vector store without a TTL
    ("postgres/test_store", "*", {"vector_store": lambda p: p[0] == "halfvec" and p[2]}, _HALFVEC),
    ("postgres/test_store", "*", {"distance_type": lambda d: d != "cosine"}, _COSINE_ONLY),
    ("postgres/test_store", "*", {"vector_type": "halfvec"}, _HALFVEC),
    ("postgres/test_store", "test_nonnull_migrations", {}, "PostgresStore's SQL migrations"),
    ("postgres/test_store", "test_omit_expired_*", {}, _POSTGRES_SQL),
    (
        "postgres/test_store",
        "test_escape_like_literal",
        {},
        "PostgresStore's LIKE escaping (no store)",
    ),
    (
        "postgres/test_store",
        "test_namespace_match_pattern",
        {},
        "PostgresStore's namespace LIKE pattern (no store)",
    ),
    ("postgres/test_async_store", "*", {"vector_store": lambda p: p[1] != "cosine"}, _COSINE_ONLY),
    ("postgres/test_async_store", "*", {"vector_store": lambda p: p[0] == "halfvec"}, _HALFVEC),
    ("postgres/test_async_store", "*", {"distance_type": lambda d: d != "cosine"}, _COSINE_ONLY),
    ("postgres/test_async_store", "*", {"vector_type": "halfvec"}, _HALFVEC),
    ("postgres/test_async_store", "test_omit_expired_*", {}, _POSTGRES_SQL),
    ("postgres/test_async_store", "test_no_running_loop", {}, _SYNC_ON_LOOP),
    (
        "postgres/test_async_store",
        "test_abatch_uses_single_pool_checkout",
        {},
        "counts checkouts of AsyncPostgresStore's connection pool (_ainternal)",
    ),
]


# -- the sdists ------------------------------------------------------------------


def tests_dir(dist: str) -> Path:
    """The installed version's sdist's tests/ (only ``FILES[dist]``),
    downloaded and extracted once."""
    version = importlib.metadata.version(dist)
    target = CACHE / f"{dist}-{version}" / "tests"
    if all((target / f).is_file() for f in FILES[dist]):
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two pytest runs side by side download once
        if all((target / f).is_file() for f in FILES[dist]):
            return target
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
            cmd += ["--no-binary", ":all:", "-d", tmp, f"{dist}=={version}"]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            sdists = list(Path(tmp).glob("*.tar.gz"))
            if done.returncode != 0 or len(sdists) != 1:
                raise RuntimeError(
                    f"pip could not download the sdist of {dist}=={version}:\n"
                    f"{' '.join(cmd)}\n{done.stdout}{done.stderr}"
                )
            staged = Path(tmp) / "tests"
            staged.mkdir()
            with tarfile.open(sdists[0]) as tar:
                for name in FILES[dist]:
                    member = next(  # <top>/tests/<name>
                        m for m in tar.getmembers() if m.name.split("/")[1:] == ["tests", name]
                    )
                    data = tar.extractfile(member)
                    assert data is not None, member.name
                    (staged / name).write_bytes(data.read())
            (staged / "__init__.py").touch()
            shutil.rmtree(target, ignore_errors=True)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged, target)
    return target


_LOADED: dict[str, dict[str, types.ModuleType]] = {}


def load(dist: str) -> dict[str, types.ModuleType]:
    """The suite's modules by name. They import each other as ``tests.*``
    (their repository's test package), which resolves to the sdist's tests/
    while they load; pytest rewrites their asserts as it does ours."""
    if dist not in _LOADED:
        root = tests_dir(dist)
        ours = {n: m for n, m in sys.modules.items() if n == "tests" or n.startswith("tests.")}
        for n in ours:
            del sys.modules[n]
        try:
            importlib.invalidate_caches()
            package = types.ModuleType("tests")
            package.__path__ = [str(root)]
            sys.modules["tests"] = package
            modules = {}
            for f in FILES[dist]:
                name = f.removesuffix(".py")
                modules[name] = importlib.import_module(f"tests.{name}")
        finally:
            for n in [n for n in sys.modules if n == "tests" or n.startswith("tests.")]:
                del sys.modules[n]
            sys.modules.update(ours)
        _patch(dist, modules)
        _LOADED[dist] = modules
    return _LOADED[dist]


# -- the test's backend ------------------------------------------------------------


class _Backend:
    name: str | None = None
    places: ExitStack | None = None


_BACKEND = _Backend()


def _backend_fixture(backends: list[str]) -> Any:
    @pytest.fixture(params=backends, autouse=True)
    def kvstore_backend(request: pytest.FixtureRequest) -> Iterator[str]:
        """The backend of every store the case opens; they close with the case."""
        if request.param == "postgres":
            request.getfixturevalue("pg_server")
        if request.param == "pgvector":
            request.getfixturevalue("pgvector_url")
        with ExitStack() as places:
            _BACKEND.name, _BACKEND.places = request.param, places
            try:
                yield request.param
            finally:
                _BACKEND.name = _BACKEND.places = None

    return kvstore_backend


class OnBackend(KVStore):
    """A KVStore on the case's backend, where the suite opened its own store
    (``InMemoryStore(...)``): the place is ours, the options the suite's."""

    def __init__(self, **options: Any) -> None:
        places = _BACKEND.places
        assert places is not None and _BACKEND.name is not None, "outside a case"
        super().__init__(places.enter_context(backend_place(_BACKEND.name)), **options)
        places.callback(self.close)  # before its place goes (last in, first out)


def _sqlite_options(options: dict[str, Any]) -> dict[str, Any]:
    """SqliteStore's configs in KVStore's terms: SqliteIndexConfig names
    IndexConfig's ``fields`` ``text_fields``, and SqliteStore refreshes TTLs
    on read only where its TTLConfig says ``refresh_on_read: True`` (its
    default is False, TTLConfig's documented one and KVStore's True)."""
    index, ttl = options.get("index"), options.get("ttl")
    if index is not None and "text_fields" in index:
        options = {**options, "index": {**index, "fields": index["text_fields"]}}
    if ttl is not None:
        options = {**options, "ttl": {"refresh_on_read": False, **ttl}}
    return options


class SqliteOnBackend(OnBackend):
    """``SqliteStore``: ``from_conn_string`` opens a KVStore on the case's
    backend (the connection string is SQLite's place)."""

    @classmethod
    @contextmanager
    def from_conn_string(cls, conn_string: str, **options: Any) -> Iterator[KVStore]:
        with cls(**_sqlite_options(options)) as store:
            yield store


class AsyncOnBackend(OnBackend):
    """KVStore as the async stores' code calls it: their setup, sweep_ttl and
    stop_ttl_sweeper are coroutines (start_ttl_sweeper's future is awaitable)."""

    async def setup(self) -> None:  # type: ignore[override]
        await super().setup()

    async def sweep_ttl(self) -> int:  # type: ignore[override]
        return await self.asweep_ttl()

    async def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:  # type: ignore[override]
        return super().stop_ttl_sweeper(timeout)


class AsyncSqliteOnBackend(AsyncOnBackend):
    """``AsyncSqliteStore``: ``from_conn_string`` as SqliteOnBackend's."""

    @classmethod
    @asynccontextmanager
    async def from_conn_string(cls, conn_string: str, **options: Any) -> AsyncIterator[KVStore]:
        async with cls(**_sqlite_options(options)) as store:
            yield store


# -- PostgresStore's fixtures --------------------------------------------------------
# PostgresStore's suites open each store in a database of their own, in three
# connection modes (the ``store`` fixture's params), run its SQL migrations
# (rewritten) and drop its migrations table between two setups
# (``_create_vector_store``): all of it PostgresStore's. These open a KVStore
# on the case's backend with the same TTL and index configs instead.


def _postgres_ttl(module: types.ModuleType) -> dict[str, Any]:
    minutes = module.TTL_MINUTES
    return {"default_ttl": minutes, "refresh_on_read": True, "sweep_interval_minutes": minutes / 2}


def _postgres_index(
    vector_type: str, distance_type: str, embed: Any, text_fields: list[str] | None
) -> dict[str, Any]:
    return {
        "dims": embed.dims,
        "embed": embed,
        "ann_index_config": {"vector_type": vector_type},
        "distance_type": distance_type,
        "fields": text_fields,
    }


def _patch_postgres_sync(module: types.ModuleType) -> None:
    @pytest.fixture
    def store(kvstore_backend: str) -> Iterator[KVStore]:
        with OnBackend(ttl=_postgres_ttl(module)) as store:  # type: ignore[arg-type]
            store.setup()
            store.start_ttl_sweeper()
            yield store
            store.stop_ttl_sweeper()

    @contextmanager
    def _create_vector_store(
        vector_type: str,
        distance_type: str,
        fake_embeddings: Any,
        text_fields: list[str] | None = None,
        enable_ttl: bool = True,
    ) -> Iterator[KVStore]:
        index = _postgres_index(vector_type, distance_type, fake_embeddings, text_fields)
        ttl = {"default_ttl": 2, "refresh_on_read": True} if enable_ttl else None
        with OnBackend(index=index, ttl=ttl) as store:  # type: ignore[arg-type]
            store.setup()
            store.setup()
            yield store

    module.store = store
    module._create_vector_store = _create_vector_store
    module.PostgresStore = OnBackend


def _patch_postgres_async(module: types.ModuleType) -> None:
    @pytest.fixture
    async def store(kvstore_backend: str) -> AsyncIterator[KVStore]:
        async with AsyncOnBackend(ttl=_postgres_ttl(module)) as store:  # type: ignore[arg-type]
            await store.setup()
            await store.start_ttl_sweeper()
            yield store
            await store.stop_ttl_sweeper()

    @asynccontextmanager
    async def _create_vector_store(
        vector_type: str,
        distance_type: str,
        fake_embeddings: Any,
        text_fields: list[str] | None = None,
    ) -> AsyncIterator[KVStore]:
        index = _postgres_index(vector_type, distance_type, fake_embeddings, text_fields)
        async with AsyncOnBackend(index=index) as store:  # type: ignore[arg-type]
            await store.setup()
            yield store

    module.store = store
    module._create_vector_store = _create_vector_store
    module.AsyncPostgresStore = AsyncOnBackend


def _patch(dist: str, modules: dict[str, types.ModuleType]) -> None:
    """Replace the names that pick the suite's backend."""
    if dist == "langgraph-checkpoint":
        modules["test_store"].InMemoryStore = OnBackend
    elif dist == "langgraph-checkpoint-sqlite":
        for m in modules.values():
            if hasattr(m, "SqliteStore"):
                m.SqliteStore = SqliteOnBackend
            if hasattr(m, "AsyncSqliteStore"):
                m.AsyncSqliteStore = AsyncSqliteOnBackend
    else:
        _patch_postgres_sync(modules["test_store"])
        _patch_postgres_async(modules["test_async_store"])


# -- exposing a suite to pytest --------------------------------------------------------


def _short(dist: str) -> str:
    return dist.removeprefix("langgraph-checkpoint").strip("-") or "checkpoint"


def _matches(params: dict[str, Any], when: dict[str, Any]) -> bool:
    for name, wanted in when.items():
        if name not in params:
            return False
        value = params[name]
        if not (wanted(value) if callable(wanted) else value == wanted):
            return False
    return True


def left_out(suite: str, case: str, params: dict[str, Any]) -> str | None:
    """Why the suite's case (``Class::name`` or ``name``) is deselected, or None."""
    for s, glob, when, why in LEFT_OUT:
        if s == suite and fnmatch.fnmatchcase(case, glob) and _matches(params, when):
            return why
    return None


def expose(
    dist: str, name: str, conftest: tuple[str, ...] = (), backends: list[str] = STORE_BACKENDS
) -> dict[str, Any]:
    """What a test module of ours takes into its globals: the suite's test
    functions and classes, its fixtures and those named in ``conftest``
    from its conftest.py, ``kvstore_backend`` (each case on each of
    ``backends``), and ``deselected`` (which tests/conftest.py asks). Where
    the download fails, one failing test."""
    suite = f"{_short(dist)}/{name}"
    try:
        modules = load(dist)
    except Exception as e:
        error = e

        def test_the_suite_is_downloaded() -> None:
            raise error

        return {"test_the_suite_is_downloaded": test_the_suite_is_downloaded}
    out: dict[str, Any] = {attr: getattr(modules["conftest"], attr) for attr in conftest}
    for attr, obj in vars(modules[name]).items():
        if getfixturemarker(obj) is not None:
            out[attr] = obj
    for attr, obj in vars(modules[name]).items():
        if (attr.startswith("test_") and callable(obj)) or (
            attr.startswith("Test") and isinstance(obj, type)
        ):
            out[attr] = obj
    out["kvstore_backend"] = _backend_fixture(backends)

    def deselected(item: pytest.Item) -> str | None:
        case = item.nodeid.split("::", 1)[1].split("[", 1)[0]
        params = getattr(getattr(item, "callspec", None), "params", {})
        return left_out(suite, case, params)

    out["deselected"] = deselected
    return out
