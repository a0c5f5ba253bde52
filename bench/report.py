"""Tables of the benchmark results: every bench/results/<area>.json.

    python bench/report.py                      # print them (markdown)
    python bench/report.py -o /tmp/results.md   # and write them to a file
    python bench/report.py --results DIR        # the results of another run
    python bench/report.py --against OLD_DIR    # A/B: each figure beside OLD_DIR's

Each area file holds groups (one workload each): what it measures, a table
(row -> metric -> value), scalar info and targets (a value, a goal, at most or
at least). This prints, per area, the machine and the code measured, then per
group its table, its info and its targets, each met or not met. What the
figures mean is in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
AREAS = [
    "ops",
    "graph",
    "reads",
    "concurrency",
    "async",
    "storage",
    "long_chat",
    "postgres",
    "store",
]
ROW_ORDER = [
    "kvsaver-lmdb",
    "kvsaver-lmdb-whole",
    "kvsaver-lmdb-blobs",
    "kvsaver-memory",
    "kv",
    "kv cold",
    "kvsaver-full",
    "kvsaver-meta",
    "kvsaver-none",
    "KVSaver",
    "sqlite",
    "async-sqlite",
    "inmemory",
    "PostgresSaver",
    "KVStore",
    "KVStore-memory",
    "KVStore-postgres",
    "SqliteStore",
    "InMemoryStore",
    "PostgresStore",
    "none",
    "no checkpointer",
]


def load(results: str) -> list[dict[str, Any]]:
    """The area files of ``results``, known areas first; unreadable files skipped."""
    try:
        names = [f for f in os.listdir(results) if f.endswith(".json")]
    except OSError:
        return []
    docs = []
    for name in names:
        try:
            with open(os.path.join(results, name)) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("groups"), dict):
            doc.setdefault("area", name[: -len(".json")])
            docs.append(doc)
    rank = {a: i for i, a in enumerate(AREAS)}
    return sorted(docs, key=lambda d: (rank.get(d["area"], len(AREAS)), d["area"]))


def ordered(names: list[str]) -> list[str]:
    """Known rows in ROW_ORDER first, the others as the suite wrote them."""
    rank = {n: i for i, n in enumerate(ROW_ORDER)}
    return sorted(names, key=lambda n: rank.get(n, len(ROW_ORDER)))


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v != 0 and abs(v) < 10:
            return f"{v:.3g}"
        return f"{v:,.1f}"
    if isinstance(v, list):
        return ", ".join(fmt(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k} {fmt(x)}" for k, x in v.items())
    return str(v)


def table(header: list[str], rows: list[list[str]], right: int | None = None) -> list[str]:
    """A markdown table; columns from the second up to ``right`` right-aligned."""
    n = len(header) if right is None else right
    align = ["---" if i == 0 or i >= n else "---:" for i in range(len(header))]
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def status(t: dict[str, Any]) -> str:
    value, goal = t.get("value"), t["goal"]
    if value is None:
        return "not measured"
    ok = value <= goal if t.get("at_most", True) else value >= goal
    return "met" if ok else "**not met**"


def targets_table(targets: list[dict[str, Any]]) -> list[str]:
    rows = [
        [
            t["target"],
            "-" if t.get("value") is None else f"{t['value']:.3g}x",
            ("<= " if t.get("at_most", True) else ">= ") + f"{t['goal']}x",
            status(t),
        ]
        for t in targets
    ]
    return table(["target", "measured", "goal", "status"], rows, right=3)


def cell(new: Any, old: Any = None, against: bool = False) -> str:
    if not against:
        return fmt(new)
    if isinstance(new, (int, float)) and isinstance(old, (int, float)) and old:
        return f"{fmt(new)} ({fmt(old)}, {new / old:.2f}x)"
    return f"{fmt(new)} ({fmt(old)})"


def group_lines(name: str, g: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    rows = g.get("rows") or {}
    old_rows = (old or {}).get("rows") or {}
    metrics: list[str] = []
    for r in rows.values():
        metrics += [m for m in r if m not in metrics]
    out = ["", f"### {name}", ""]
    if g.get("what"):
        out += [str(g["what"]), ""]
    if rows:
        body = [
            [
                row,
                *(
                    cell(rows[row].get(m), old_rows.get(row, {}).get(m), against=old is not None)
                    for m in metrics
                ),
            ]
            for row in ordered(list(rows))
        ]
        out += table(["row", *metrics], body)
    info = g.get("info") or {}
    if info:
        out += ["", "; ".join(f"{k}: {fmt(v)}" for k, v in info.items())]
    if g.get("targets"):
        out += ["", *targets_table(g["targets"])]
    return out


def area_lines(doc: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    m = doc.get("machine") or {}
    code = doc.get("code") or {}
    out = ["", f"## {doc['area']}", ""]
    if doc.get("smoke"):
        out += ["**Smoke run (fewer rounds, smaller stores): not results.**", ""]
    out.append(
        f"Started {doc.get('started', '?')}; code {code.get('commit', '?')[:10]}"
        + (" with uncommitted changes" if code.get("changes_kv_saver") else "")
        + f"; {m.get('cpu_model', '?')}, {m.get('cores', '?')} cores, python {m.get('python', '?')}"
        + f"; load {fmt(m.get('loadavg'))} at start, {fmt(doc.get('loadavg_at_end'))} at end."
    )
    if old is not None:
        oc = (old.get("code") or {}).get("commit", "?")[:10]
        out += ["", f"Each figure: this run (the run of {oc}, this / that)."]
    old_groups = (old or {}).get("groups") or {}
    for name, g in doc["groups"].items():
        out += group_lines(name, g, old_groups.get(name, {}) if old is not None else None)
    return out


def render(results: str = RESULTS, against: str | None = None) -> str:
    docs = load(results)
    olds = {d["area"]: d for d in load(against)} if against else {}
    out = ["# Benchmark results", "", f"From {results}."]
    if not docs:
        out += ["", "No results: run `pytest bench --benchmark-only -s` first."]
    for doc in docs:
        out += area_lines(doc, olds.get(doc["area"], {}) if against else None)
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--results", default=RESULTS, help="directory of <area>.json files")
    ap.add_argument("--against", default=None, help="another run's directory, for an A/B")
    ap.add_argument("-o", "--output", default=None, help="also write the tables here")
    args = ap.parse_args(argv)
    text = render(args.results, args.against)
    sys.stdout.write(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
