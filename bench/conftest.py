"""pytest configuration of the benchmark suites (issue #6).

Run them with ``pytest bench/ --benchmark-only`` (or ``python bench/report.py
--run``, which also writes bench/results/). The repository's default ``pytest``
run never collects this directory: pyproject.toml sets ``testpaths = ["tests"]``.

Suites are ``bench/bench_*.py`` (collected by the hook below) or
``bench/test_bench_*.py`` (collected by pytest's default pattern).
"""

from __future__ import annotations

import os
import platform
import sqlite3
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # for `import _workloads`

PACKAGES = [
    "kvsaver",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "langchain-core",
    "lmdb",
    "ormsgpack",
    "pytest-benchmark",
]


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    # A file named on the command line is collected by pytest itself already.
    if (
        file_path.suffix == ".py"
        and file_path.name.startswith("bench_")
        and not parent.session.isinitpath(file_path)
    ):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, object]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    versions["sqlite (library)"] = sqlite3.sqlite_version
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    return {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": versions,
        "loadavg_at_start": [round(x, 2) for x in load],
    }


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    machine_info["kvsaver_bench"] = machine()


_STARTED = time.time()


def _worktree() -> list[str]:
    """Uncommitted changes to the code under test: the numbers belong to them."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--", "kv", "saver"],
            capture_output=True,
            text=True,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return out.stdout.splitlines()


def pytest_benchmark_update_json(
    config: pytest.Config, benchmarks: list, output_json: dict
) -> None:
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = []
    output_json["kvsaver_bench"] = {
        "session_seconds": round(time.time() - _STARTED, 1),
        "loadavg_at_end": load,
        "worktree_changes_kv_saver": _worktree(),
        "argv": sys.argv[1:],
    }
