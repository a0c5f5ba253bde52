"""LangGraph's public checkpointer conformance suite, run in pytest.

``langgraph.checkpoint.conformance`` detects which capabilities a saver
implements (by which async methods it overrides) and runs one spec suite per
capability. KVSaver must implement all eight and pass every one of them on
each backend.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from kvsaver import KVSaver
from kvsaver.kv import PostgresStore
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import (
    ALL_CAPABILITIES,
    BASE_CAPABILITIES,
    EXTENDED_CAPABILITIES,
    Capability,
)
from langgraph.checkpoint.conformance.report import CapabilityReport
from langgraph.checkpoint.memory import InMemorySaver
from pg_helpers import shared_pool, unique_table

ALL = sorted(c.value for c in Capability)


def _failures(report: CapabilityReport) -> str:
    lines = []
    for name, result in sorted(report.results.items()):
        lines.append(
            f"{name}: detected={result.detected} passed={result.passed} "
            f"ok={result.tests_passed} failed={result.tests_failed} "
            f"skipped={result.tests_skipped}"
        )
        lines.extend(f"    {failure}" for failure in result.failures)
    return "\n".join(lines)


def _factory(
    backend: str, tmp_path: Path, fast_paths: bool = False
) -> Callable[[], AsyncIterator[KVSaver]]:
    counter = iter(range(1_000_000))

    async def make() -> AsyncIterator[KVSaver]:
        # A fresh store per capability suite, as the runner expects.
        n = next(counter)
        if backend == "memory":
            saver = KVSaver(":memory:", fast_paths=fast_paths)
        elif backend == "lmdb":
            saver = KVSaver(tmp_path / f"lmdb-{n}", fast_paths=fast_paths)
        elif backend == "postgres":
            saver = KVSaver(PostgresStore(shared_pool(), table=unique_table("conf")))
        else:
            saver = KVSaver(tmp_path / f"store-{n}.kvs", backend="file")
        try:
            yield saver
        finally:
            saver.close()

    return make


@pytest.mark.parametrize(
    ("backend", "fast_paths"),
    [
        ("lmdb", False),
        ("memory", False),
        ("file", False),
        ("postgres", False),
        ("lmdb", True),
        ("memory", True),
    ],
)
async def test_full_conformance(backend: str, fast_paths: bool, tmp_path: Path) -> None:
    registered = checkpointer_test(name=f"KVSaver[{backend}]")(
        _factory(backend, tmp_path, fast_paths)
    )
    report = await validate(registered)
    detail = _failures(report)
    assert sorted(report.results) == ALL, detail
    for cap in ALL_CAPABILITIES:
        result = report.results[cap.value]
        assert result.detected, f"{cap.value} not detected\n{detail}"
        assert result.passed is True, f"{cap.value} failed\n{detail}"
        assert result.tests_failed == 0, detail
        assert result.failures == [], detail
        assert result.tests_passed > 0, f"{cap.value} ran no test\n{detail}"
    assert report.conformance_level() == "FULL", detail


async def test_only_selected_capabilities_run(tmp_path: Path) -> None:
    """The ``capabilities=`` filter of validate: the rest report as not run."""
    registered = checkpointer_test(name="KVSaver[memory, subset]")(_factory("memory", tmp_path))
    report = await validate(registered, capabilities={"put", "prune"})
    detail = _failures(report)
    assert report.results["put"].passed is True, detail
    assert report.results["prune"].passed is True, detail
    assert report.results["list"].detected is False, detail


async def test_inmemorysaver_lacks_the_extended_capabilities() -> None:
    """A fact check of the reference: InMemorySaver implements only the base
    five, so passing the extended three is something KVSaver adds."""

    async def make() -> AsyncIterator[InMemorySaver]:
        yield InMemorySaver()

    report = await validate(checkpointer_test(name="InMemorySaver")(make))
    detail = _failures(report)
    for cap in EXTENDED_CAPABILITIES:
        assert report.results[cap.value].detected is False, detail
        assert report.results[cap.value].passed is None, detail
    for cap in BASE_CAPABILITIES:
        assert report.results[cap.value].detected is True, detail
        assert report.results[cap.value].passed is True, detail
    assert report.conformance_level() == "FULL"  # "full" over what it detects


class _ForgetfulSaver(KVSaver):
    """A deliberately broken KVSaver: put_writes stores nothing."""

    def put_writes(self, *args: object, **kwargs: object) -> None:
        return None


async def test_the_suite_catches_a_broken_saver() -> None:
    """The harness above can fail: a saver that drops pending writes is
    reported as failing put_writes, with the failing tests named."""

    async def make() -> AsyncIterator[KVSaver]:
        saver = _ForgetfulSaver(":memory:")
        yield saver
        saver.close()

    report = await validate(checkpointer_test(name="broken")(make), capabilities={"put_writes"})
    result = report.results["put_writes"]
    assert result.detected is True
    assert result.passed is False
    assert result.tests_failed > 0
    assert result.failures and "put_writes" in _failures(report)
