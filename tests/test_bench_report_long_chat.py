"""bench/report.py on the long-chat results: each target met / not met, the
figures of each row shown, an A/B against another run's file."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

_PATH = Path(__file__).resolve().parent.parent / "bench" / "report.py"
_SPEC = importlib.util.spec_from_file_location("kvsaver_bench_report", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
report = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(report)


def _group(what: str, kv: float, warm: float, cold: float, goal: float) -> dict[str, Any]:
    """A long_chat group as test_long_chat.py records it."""
    rows = {
        "sqlite": {"disk_bytes": 1000, "x_sqlite_bytes": 1.0, "get_tuple_ms": 10.0},
        "kv": {"disk_bytes": int(kv * 1000), "x_sqlite_bytes": kv, "get_tuple_ms": 10 * warm},
        "kv cold": {"get_tuple_ms": 10 * cold},
    }
    for n, x in (("sqlite", 1.0), ("kv", warm), ("kv cold", cold)):
        rows[n]["x_sqlite_get_tuple"] = x
    return {
        "what": f"a long chat, {what}",
        "rows": rows,
        "info": {"threads": int(what.split()[0]), "rounds": 15},
        "targets": [
            {"target": f"bytes on disk vs SqliteSaver, {what}", "value": kv, "goal": goal},
            {"target": f"get_tuple latest, warm, {what}", "value": warm, "goal": 0.8},
            {"target": f"get_tuple latest, cold, {what}", "value": cold, "goal": 0.8},
        ],
    }


def _write(d: Path, groups: dict[str, Any], commit: str = "abc") -> None:
    d.mkdir(exist_ok=True)
    doc = {"area": "long_chat", "smoke": False, "code": {"commit": commit}, "groups": groups}
    (d / "long_chat.json").write_text(json.dumps(doc))


def _statuses(text: str) -> dict[str, str]:
    """target -> status, from every targets table."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[3] in ("met", "**not met**", "not measured"):
            out[cells[0]] = cells[3]
    return out


def _row(text: str, group: str, row: str) -> list[str]:
    """The cells of ``row`` in ``group``'s table."""
    section = text.split(f"### {group}\n", 1)[1].split("### ", 1)[0]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == row:
            return cells[1:]
    raise AssertionError(f"no row {row!r} in {group}")


def test_each_target_met_or_not(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "long_chat:3x120": _group("3 x 120 turns", 0.049, 0.7, 0.9, 0.05),
            "long_chat:1x500": _group("1 x 500 turns", 0.031, 1.0, 1.0, 0.03),
        },
    )
    text = report.render(str(tmp_path))
    assert "## long_chat" in text
    assert _statuses(text) == {
        "bytes on disk vs SqliteSaver, 3 x 120 turns": "met",
        "get_tuple latest, warm, 3 x 120 turns": "met",
        "get_tuple latest, cold, 3 x 120 turns": "**not met**",
        "bytes on disk vs SqliteSaver, 1 x 500 turns": "**not met**",
        "get_tuple latest, warm, 1 x 500 turns": "**not met**",
        "get_tuple latest, cold, 1 x 500 turns": "**not met**",
    }
    # columns: disk_bytes, x_sqlite_bytes, get_tuple_ms, x_sqlite_get_tuple
    assert _row(text, "long_chat:3x120", "kv") == ["49", "0.049", "7", "0.7"]
    assert _row(text, "long_chat:3x120", "kv cold") == ["-", "-", "9", "0.9"]
    assert "Smoke run" not in text


def test_at_least_goals_and_missing_values() -> None:
    lines = report.targets_table(
        [
            {"target": "reads/s", "value": 2.0, "goal": 2.5, "at_most": False},
            {"target": "ops/s", "value": 3.5, "goal": 3.0, "at_most": False},
            {"target": "bytes", "value": None, "goal": 0.3},
            {"target": "at most, at the goal", "value": 0.8, "goal": 0.8},
            {"target": "at least, at the goal", "value": 1.5, "goal": 1.5, "at_most": False},
        ]
    )
    assert _statuses("\n".join(lines)) == {
        "reads/s": "**not met**",
        "ops/s": "met",
        "bytes": "not measured",
        "at most, at the goal": "met",
        "at least, at the goal": "met",
    }


def test_against_another_run(tmp_path: Path) -> None:
    _write(tmp_path / "new", {"long_chat:3x120": _group("3 x 120 turns", 0.04, 0.6, 0.7, 0.05)})
    _write(
        tmp_path / "old",
        {"long_chat:3x120": _group("3 x 120 turns", 0.08, 0.6, 0.7, 0.05)},
        commit="0123456789abcdef",
    )
    text = report.render(str(tmp_path / "new"), str(tmp_path / "old"))
    assert "the run of 0123456789" in text
    assert _row(text, "long_chat:3x120", "kv")[1] == "0.04 (0.08, 0.50x)"


def test_no_results(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "other.json").write_text(json.dumps({"benchmarks": []}))
    assert "No results" in report.render(str(tmp_path))
    assert "No results" in report.render(str(tmp_path / "absent"))
