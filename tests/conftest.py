"""Shared pytest configuration. Generic only: layer-specific fixtures live in
their own test modules (or below, in their own section)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from kvsaver import KVSaver
from saver_helpers import BACKENDS, open_kv

# -- hypothesis ---------------------------------------------------------------
# "ci" is the default everywhere (CI included): at least 1000 examples per
# property, no per-example deadline (a 2**2000 int or a slow CI box must not
# turn into a flaky DeadlineExceeded). A failure prints its falsifying example
# and a @reproduce_failure blob; the local example database (.hypothesis/,
# git-ignored) replays it first on the next run.
# HYPOTHESIS_PROFILE=<name> selects another registered profile.
settings.register_profile(
    "ci",
    max_examples=1000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# -- temporary directories on tmpfs -------------------------------------------
# Almost every test opens an LMDB store at full durability, so the suite's time
# was dominated by fsync on the runner's disk (a device flush each, longer under
# load), not by what is tested. Stores made by tests (tmp_path and tempfile,
# in this process and in the subprocesses it starts) live on /dev/shm when it
# is there: fsync is then free, and nothing else changes. Crash tests kill
# processes, which tmpfs does not make easier (the page cache survives a
# SIGKILL on any filesystem); power loss is not simulated anywhere.
# Benchmarks (bench/) run on the real disk. KVSAVER_TEST_TMPDIR overrides.
def _fast_tmpdir() -> str | None:
    base = os.environ.get("KVSAVER_TEST_TMPDIR")
    if base is None and os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        base = "/dev/shm"
    if base is None:
        return None
    import tempfile

    path = tempfile.mkdtemp(prefix="kvsaver-tests-", dir=base)
    # Like /tmp: tests that run a tool as another user (PostgreSQL refuses
    # root) must be able to reach their own directories below this one.
    os.chmod(path, 0o1777)
    os.environ["TMPDIR"] = path
    tempfile.tempdir = path
    return path


_TMP = _fast_tmpdir()


def pytest_sessionfinish(session, exitstatus):
    from pg_helpers import stop_shared_server

    stop_shared_server()
    if _TMP is not None:
        import shutil

        shutil.rmtree(_TMP, ignore_errors=True)


# -- KVSaver on each backend ----------------------------------------------------
# The saver test modules share it; test_saver_errors.py overrides it with a
# seeded one.


@pytest.fixture(params=BACKENDS)
def kv(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KVSaver]:
    saver = open_kv(request.param, tmp_path)
    yield saver
    saver.close()


# -- one throwaway PostgreSQL server for the session ------------------------------
# Started on first use by any test that needs a server (the store suite, the
# saver suites, the export to PostgresSaver, the fault tests, the benchmark);
# skipped with the reason where PostgreSQL's binaries are not installed.


@pytest.fixture(scope="session")
def pg_server() -> Any:
    from pg_helpers import shared_server

    return shared_server()


@pytest.fixture(scope="session")
def postgres_url(pg_server: Any) -> str:
    return str(pg_server.url)


# A second one, PostgreSQL with pgvector (the pgserver wheel's binaries), for
# KVStore's search on pgvector; a test needing it fails where it cannot start.
@pytest.fixture(scope="session")
def pgvector_url() -> str:
    from pg_helpers import shared_pgvector_server

    return str(shared_pgvector_server().url)


# -- cases a module deselects ---------------------------------------------------------
# A test module may define ``deselected(item) -> reason | None``
# (tests/upstream_suites.py: LangGraph's suites' cases that name their backend).


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    kept, dropped = [], []
    for item in items:
        why = getattr(getattr(item, "module", None), "deselected", None)
        (dropped if why is not None and why(item) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
