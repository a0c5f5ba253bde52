"""Where the CPU of KVSaver(":memory:")'s put and put_writes goes, against
InMemorySaver (issue #13, the CPU rows): writes bench/results/PROFILE13_CPU.md.

    python bench/profile_cpu13.py [--old DIR] [--out bench/results/PROFILE13_CPU.md]

``--old DIR``: DIR holds a package ``kvsaver_old`` (another checkout's saver/,
with its kv/ as ``kvsaver_old.kv``, imports renamed), profiled beside this
checkout as "before".

* put / put_writes: the calls a real graph made (bench/_workloads' agent loop,
  6 threads, recorded through an InMemorySaver and deep-copied), replayed into
  a fresh saver under cProfile; functions by own time, in µs per call
  (cProfile inflates Python-heavy code: read the shares, not the absolutes),
  beside the unprofiled thread CPU per call of each saver.
* the graph: py-spy (``pip install py-spy``) samples a process running the
  agent loop on KVSaver(":memory:"), only while a thread holds the GIL
  (``--gil``: CPU, not waits); the functions seen inside put and put_writes,
  by own samples. Skipped when py-spy is not installed. Its share of the
  whole run is small (the workload's nodes make text), and the count of
  samples varies with the load of the machine: read the shares.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _workloads import run_loop
from ab_cpu13 import record, replay
from kvsaver import KVSaver
from langgraph.checkpoint.memory import InMemorySaver

HERE = os.path.dirname(os.path.abspath(__file__))


def _short(func: tuple[str, int, str]) -> str:
    path, line, name = func
    if path == "~":
        return name
    parts = path.split(os.sep)
    return f"{name} ({'/'.join(parts[-2:])}:{line})"


def profile_ops(make: Any, calls: list, kind: str, top: int = 18) -> list[str]:
    n = sum(1 for k, _ in calls if k == kind)
    replay(make(), calls, kind)  # warm
    prof = cProfile.Profile()
    for _ in range(3):
        saver = make()
        prof.enable()
        replay(saver, calls, kind)
        prof.disable()
    st = pstats.Stats(prof)
    rows = sorted(
        ((tt, ct, nc, f) for f, (_, nc, tt, ct, _) in st.stats.items()),  # type: ignore[attr-defined]
        reverse=True,
    )
    total = sum(r[0] for r in rows)
    out = [
        f"profiled: {total / (3 * n) * 1e6:,.1f} µs per call",
        "",
        "| own µs/call | share | calls/call | function |",
        "|---:|---:|---:|---|",
    ]
    for tt, _, nc, f in rows[:top]:
        out.append(
            f"| {tt / (3 * n) * 1e6:.1f} | {100 * tt / total:.1f}% | {nc / (3 * n):.1f} "
            f"| `{_short(f)}` |"
        )
    return out


_GRAPH = """
import sys
sys.path.insert(0, {bench!r})
{imp}
from _workloads import build_agent, run_loop
for i in range(8):
    run_loop(build_agent(KVSaver(":memory:")), f"p{{i}}", True, threads=6)
"""


def profile_graph(old: str | None) -> list[str]:
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        return ["(py-spy not installed: skipped)"]
    imp = "from kvsaver import KVSaver"
    if old:
        imp = f"sys.path.insert(0, {old!r})\nfrom kvsaver_old import KVSaver"
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "graph.py")
        with open(script, "w") as f:
            f.write(_GRAPH.format(bench=HERE, imp=imp))
        raw = os.path.join(tmp, "raw.txt")
        cmd = [spy, "record", "--gil", "-r", "500", "-f", "raw", "-o", raw, "--"]
        subprocess.run(
            [*cmd, sys.executable, script],
            check=True,
            capture_output=True,
        )
        own: Counter[str] = Counter()
        inside = total = 0
        with open(raw) as f:
            for line in f:
                stack, _, count = line.rstrip().rpartition(" ")
                n = int(count)
                frames = stack.split(";")
                total += n
                for i, fr in enumerate(frames):
                    if re.match(r"KVSaver\.put(_writes)? ", fr):
                        inside += n
                        leaf = frames[-1] if i + 1 < len(frames) else fr
                        own[re.sub(r" \(.*?([^/]+/[^/]+\.py):\d+\)", r" (\1)", leaf)] += n
                        break
    out = [
        f"{inside:,} of {total:,} GIL-holding samples inside KVSaver.put/put_writes "
        f"({100 * inside / max(total, 1):.1f}%)",
        "",
        "| samples | share of put+put_writes | function (own) |",
        "|---:|---:|---|",
    ]
    for name, n in own.most_common(20):
        out.append(f"| {n} | {100 * n / inside:.1f}% | `{name}` |")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--old", help="directory holding the kvsaver_old package")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "PROFILE13_CPU.md"))
    args = parser.parse_args(argv)
    variants: list[tuple[str, Any, str | None]] = []
    if args.old:
        sys.path.insert(0, args.old)
        from kvsaver_old import KVSaver as OldKVSaver

        variants.append(("before (--old)", lambda: OldKVSaver(":memory:"), args.old))
    variants.append(("after (this checkout)", lambda: KVSaver(":memory:"), None))
    calls = record(run_loop, 6)
    lines = [
        '# Issue #13: CPU of put and put_writes, KVSaver(":memory:") vs InMemorySaver',
        "",
        f"Generated by `python bench/profile_cpu13.py{' --old DIR' if args.old else ''}`"
        " (see its docstring for the method). The graph's calls: "
        f"{sum(1 for k, _ in calls if k == 'put')} puts, "
        f"{sum(1 for k, _ in calls if k == 'put_writes')} put_writes "
        "(agent loop, 6 threads x 30 turns).",
        "",
    ]
    for kind in ("put", "put_writes"):
        makers = {"InMemorySaver": InMemorySaver, **{label: make for label, make, _ in variants}}
        times: dict[str, list[float]] = {label: [] for label in makers}
        for _ in range(9):  # interleaved: the machine's speed drifts
            for label, make in makers.items():
                times[label].append(replay(make(), calls, kind))
        lines += [f"## {kind}", "", "Unprofiled thread CPU per call (median of 9 replays):", ""]
        for label, ts in times.items():
            lines.append(f"- {label}: {sorted(ts)[4] * 1e6:,.1f} µs")
        for label, make, _ in variants:
            lines += ["", f"### {kind}, {label}", "", *profile_ops(make, calls, kind)]
        lines.append("")
    lines += ["## The graph (py-spy --gil, inside KVSaver.put and put_writes)", ""]
    for label, _, old in variants:
        lines += [f"### {label}", "", *profile_graph(old), ""]
    with open(args.out, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
