"""pytest configuration of the benchmark suite.

Run it with ``pytest bench --benchmark-only -s`` (one area:
``pytest bench/test_postgres.py --benchmark-only -s``); each area writes
bench/results/<area>.json, and ``python bench/report.py`` prints the tables.
``--quick`` (or ``KVSAVER_BENCH_QUICK=1``) is the smoke mode: fewer rounds,
smaller stores. The repository's default ``pytest`` run never collects this
directory: pyproject.toml sets ``testpaths = ["tests"]``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # for `import _workloads`
# for `import pg_helpers` (the tests' throwaway PostgreSQL server)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick",
        action="store_true",
        help="kvsaver bench smoke mode: fewer rounds, smaller stores (KVSAVER_BENCH_QUICK=1)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # Before the suites are imported: their module-level sizes read it.
    if config.getoption("--quick", default=False):
        os.environ["KVSAVER_BENCH_QUICK"] = "1"


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    from _workloads import machine

    machine_info["kvsaver_bench"] = machine()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # An area may run for minutes (the storage area's 200 turns): the tests'
    # timeout would cut it short, raising inside whatever call it lands in.
    for item in items:
        item.add_marker(pytest.mark.timeout(1800))


def _server(env: str, pgvector: bool) -> Iterator[str | None]:
    """The URL in ``env``, else a throwaway server with its default
    durability (the system's PostgreSQL, or the pgserver wheel's with
    pgvector), stopped after; None where its binaries are not installed."""
    url = os.environ.get(env)
    if url:
        yield url
        return
    from pg_helpers import PgServer, Unavailable, pgserver_bindir

    try:
        server = PgServer(pgserver_bindir() if pgvector else None)
    except Unavailable:
        yield None
        return
    try:
        server.start(durable=True)
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str | None]:
    """A throwaway PostgreSQL server, or KVSAVER_BENCH_PG_URL's."""
    yield from _server("KVSAVER_BENCH_PG_URL", pgvector=False)


@pytest.fixture(scope="module")
def pgvector_url() -> Iterator[str | None]:
    """A second throwaway server, with pgvector (the pgserver wheel's
    PostgreSQL, in the test extra), or KVSAVER_BENCH_PGVECTOR_URL's."""
    yield from _server("KVSAVER_BENCH_PGVECTOR_URL", pgvector=True)
