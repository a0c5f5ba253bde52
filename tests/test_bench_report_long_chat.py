"""bench/report.py's issue #15 section: each long-chat target met / not met."""

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


def _mark(kv: float, warm: float, cold: float, cpu: float | None) -> dict[str, Any]:
    mark: dict[str, Any] = {
        "disk_bytes": {"sqlite": 1000, "kv": int(kv * 1000)},
        "bytes_per_turn": {"sqlite": 10, "kv": 1},
        "bytes_ratio_vs_sqlite": {"kv": kv},
        "get_tuple_latest": {
            "median_ms": {"sqlite": 10.0, "kv": 10 * warm, "kv cold": 10 * cold},
            "ratio_vs_sqlite": {"sqlite": 1.0, "kv": warm, "kv cold": cold},
        },
    }
    if cpu is not None:
        mark["put_cpu_kv_over_kv_whole_median"] = cpu
    return mark


def _rows(lines: list[str]) -> dict[str, str]:
    """target -> status of the section's first table."""
    out = {}
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 5 and cells[3] in ("met", "**not met**", "not measured"):
            out[cells[0]] = cells[3]
    return out


def test_suite_run_and_result_files(tmp_path: Path) -> None:
    suite = {
        "benchmarks": [
            {
                "group": "long_chat:storage",
                "name": "test_long_chat_storage",
                "fullname": "bench/bench_long_chat.py::test_long_chat_storage",
                "stats": {"median": 0.0},
                "extra_info": {"threads": 3, "turns": 120, "K": 64, **_mark(0.049, 0.7, 0.9, 1.2)},
            }
        ]
    }
    long500 = {"threads": 1, "turns": 500, "K": 64, "marks": {"500": _mark(0.031, 1, 1, None)}}
    (tmp_path / "long_chat_500.json").write_text(json.dumps(long500))
    (tmp_path / "long_chat.json").write_text(json.dumps({"threads": 3, "turns": 120}))
    lines = report.long_chat_section(report.by_group(suite), str(tmp_path))
    assert "## Issue #15 targets" in lines[1]
    rows = _rows(lines)
    assert rows == {
        "bytes on disk vs SqliteSaver, 3 x 120 turns": "met",
        "get_tuple latest, warm, 3 x 120 turns": "met",
        "get_tuple latest, cold (fresh serializer), 3 x 120 turns": "**not met**",
        "put CPU, deltas on / every version whole (kv-whole), 3 x 120 turns": "**not met**",
        "bytes on disk vs SqliteSaver, 1 x 500 turns": "**not met**",
        "get_tuple latest, warm, 1 x 500 turns": "**not met**",
        "get_tuple latest, cold (fresh serializer), 1 x 500 turns": "**not met**",
    }


def test_process_cpu_ratios_are_shown_beside_the_wall_time_ones(tmp_path: Path) -> None:
    mark = _mark(0.04, 0.7, 0.75, 0.9)
    mark["get_tuple_latest"]["cpu_ratio_vs_sqlite"] = {"sqlite": 1.0, "kv": 0.52, "kv cold": 0.66}
    chat = {"threads": 3, "turns": 120, "K": 64, "marks": {"120": mark}}
    (tmp_path / "long_chat.json").write_text(json.dumps(chat))
    text = "\n".join(report.long_chat_section({}, str(tmp_path)))
    assert "7.00 vs 10.00 ms; process CPU 0.52x" in text
    assert "7.50 vs 10.00 ms; process CPU 0.66x" in text


def test_without_a_suite_run_the_files_are_read(tmp_path: Path) -> None:
    chat = {"threads": 3, "turns": 120, "K": 64, "marks": {"120": _mark(0.06, 0.9, 1.1, 0.9)}}
    (tmp_path / "long_chat.json").write_text(json.dumps(chat))
    (tmp_path / "long_chat_k.json").write_text(json.dumps({"sweep_k": {}}))
    rows = _rows(report.long_chat_section({}, str(tmp_path)))
    assert rows["bytes on disk vs SqliteSaver, 3 x 120 turns"] == "**not met**"
    assert rows["put CPU, deltas on / every version whole (kv-whole), 3 x 120 turns"] == "met"
    (tmp_path / "empty").mkdir()
    assert report.long_chat_section({}, str(tmp_path / "empty")) == []
    assert report.long_chat_section({}, str(tmp_path / "absent")) == []
