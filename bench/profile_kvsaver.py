"""Where KVSaver's time goes (issue #6): writes bench/results/PROFILE.md.

    python bench/profile_kvsaver.py [--out bench/results/PROFILE.md]

Profiles KVSaver on LMDB (durability "full"), with the same workloads as the
benchmark suites:

* put (200 calls), get_tuple latest (2,000 calls) and list with a global
  metadata filter (20 calls): cProfile (wall clock, so fsync waits count), one
  thread; the tables list functions by own time, as % of the profiled total,
  and the KVSaver/kv functions by cumulative time.
* the graph loop (20 threads x 30 turns): LangGraph writes checkpoints from
  background threads, so this one is sampled with py-spy (all threads, idle
  included, then samples of threads parked in a wait dropped), when py-spy is
  installed (``pip install py-spy``); otherwise with cProfile on the main
  thread only.

cProfile adds its own overhead per Python call, so Python-heavy code looks
somewhat bigger than it is; read the percentages, not the absolute times.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _workloads import (
    KV_LMDB,
    ThreadGen,
    build_agent,
    build_read_store,
    close_saver,
    make_saver,
    run_loop,
    run_puts,
)

HERE = os.path.dirname(os.path.abspath(__file__))
OURS = (f"{os.sep}kv{os.sep}", f"{os.sep}saver{os.sep}")


def _short(func: tuple[str, int, str]) -> str:
    path, line, name = func
    if path == "~":
        return name  # a builtin, e.g. <method 'commit' of 'lmdb.Transaction' objects>
    parts = path.split(os.sep)
    return f"{name} ({'/'.join(parts[-2:])}:{line})"


def cprofile_table(prof: cProfile.Profile, top: int = 15) -> list[str]:
    st = pstats.Stats(prof, stream=io.StringIO())
    entries = st.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in entries.values()) or 1e-12
    rows = sorted(entries.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    out = [
        f"Profiled total: {total:.3f} s.",
        "",
        "| own time | % | calls | cumulative | function |",
        "|---:|---:|---:|---:|---|",
    ]
    for func, (_cc, nc, tt, ct, _callers) in rows:
        out.append(
            f"| {tt:.3f} s | {100 * tt / total:.1f}% | {nc:,} | {ct:.3f} s | `{_short(func)}` |"
        )
    ours = [(f, v) for f, v in entries.items() if any(o in f[0] for o in OURS)]
    ours.sort(key=lambda kv: kv[1][3], reverse=True)
    out += [
        "",
        "KVSaver / kv functions by cumulative time:",
        "",
        "| cumulative | % | calls | function |",
        "|---:|---:|---:|---|",
    ]
    for func, (_cc, nc, _tt, ct, _callers) in ours[:10]:
        out.append(f"| {ct:.3f} s | {100 * ct / total:.1f}% | {nc:,} | `{_short(func)}` |")
    return out


def profile_call(fn: Any) -> cProfile.Profile:
    prof = cProfile.Profile()
    prof.enable()
    try:
        fn()
    finally:
        prof.disable()
    return prof


def section_put(workdir: str) -> list[str]:
    saver = make_saver(KV_LMDB, os.path.join(workdir, "put"))
    batches = []
    for _ in range(4):
        gen = ThreadGen(saver, f"p-{len(batches)}")
        batches.append([gen.next() for _ in range(50)])
    run_puts(saver, batches[0])  # warm-up
    prof = profile_call(lambda: [run_puts(saver, b) for b in batches[1:]])
    close_saver(saver)
    return ["## put (150 calls, fresh threads, 1-2 changed channels)", "", *cprofile_table(prof)]


def section_reads(workdir: str) -> list[str]:
    rs = build_read_store(KV_LMDB, os.path.join(workdir, "reads"))
    s = rs.saver
    for _ in range(50):
        s.get_tuple(rs.big_latest)
    prof = profile_call(lambda: [s.get_tuple(rs.big_latest) for _ in range(2000)])
    out = [
        "## get_tuple latest (2,000 calls; 1,000-checkpoint thread)",
        "",
        *cprofile_table(prof),
    ]
    flt = {"source": "input", "tag": rs.filter_tag}
    list(s.list(None, filter=flt))
    prof = profile_call(lambda: [list(s.list(None, filter=flt)) for _ in range(20)])
    out += [
        "",
        "## list(None, filter=...) global metadata filter (20 calls, ~4,000 checkpoints)",
        "",
        *cprofile_table(prof),
    ]
    close_saver(s)
    return out


_LINE = re.compile(r":\d+\)$")

# Leaf frames of a thread parked, not working: pool workers waiting for a job,
# the main thread waiting for a future, py-spy's own attach pause.
_PARKED = (
    "wait (threading.py",
    "_wait_for_tstate_lock (threading.py",
    "_worker (concurrent/futures/thread.py",
    "select (selectors.py",
    "section_graph (",
)


def collapse(raw: str, top: int = 20) -> list[str]:
    """py-spy raw (collapsed stacks) -> own and inclusive sample shares."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        # One row per function, not per line (py-spy's frames carry line numbers).
        frames = [_LINE.sub(")", f) for f in stack.split(";")]
        if len(frames) < 2 or any(p in frames[-1] for p in _PARKED):
            continue  # a thread parked in a wait: not work
        n = int(count)
        total += n
        own[frames[-1]] += n
        for f in set(frames[1:]):  # frames[0] is the thread
            incl[f] += n
    out = [
        f"{total:,} samples of working threads.",
        "",
        "| own | function |",
        "|---:|---|",
    ]
    out += [f"| {100 * n / total:.1f}% | `{f}` |" for f, n in own.most_common(top)]
    ours = [(f, n) for f, n in incl.items() if "kv/" in f or "saver/" in f]
    ours.sort(key=lambda fn: fn[1], reverse=True)
    out += ["", "KVSaver / kv functions, inclusive:", "", "| inclusive | function |", "|---:|---|"]
    out += [f"| {100 * n / total:.1f}% | `{f}` |" for f, n in ours[:12]]
    return out


def section_graph(workdir: str) -> list[str]:
    saver = make_saver(KV_LMDB, os.path.join(workdir, "graph"))
    graph = build_agent(saver)
    run_loop(graph, "warm", True, threads=2)
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    title = "## graph loop (20 threads x 30 turns, KVSaver LMDB)"
    if os.path.exists(spy):
        raw = os.path.join(workdir, "graph.txt")
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(os.getpid()),
                "--format",
                "raw",
                "--rate",
                "200",
                "--idle",
                "--threads",
                "--output",
                raw,
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(1.0)  # let py-spy attach
        run_loop(graph, "prof", True)
        elapsed = time.perf_counter() - t0
        proc.send_signal(2)  # SIGINT: py-spy writes its output and exits
        _, err = proc.communicate(timeout=60)
        close_saver(saver)
        if os.path.exists(raw):
            with open(raw) as f:
                return [title, "", f"py-spy, {elapsed:.1f} s sampled.", "", *collapse(f.read())]
        note = f"py-spy failed ({err.decode(errors='replace').strip()[:200]}); cProfile instead."
        saver = make_saver(KV_LMDB, os.path.join(workdir, "graph2"))
        graph = build_agent(saver)
    else:
        note = "py-spy is not installed: cProfile of the main thread only (puts run elsewhere)."
    prof = profile_call(lambda: run_loop(graph, "prof", True))
    close_saver(saver)
    return [title, "", note, "", *cprofile_table(prof)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "PROFILE.md"))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        body = [
            "# Profile of KVSaver (LMDB, durability full)",
            "",
            "Generated by `python bench/profile_kvsaver.py`; see its docstring for the method.",
            "",
            *section_put(d),
            "",
            *section_reads(d),
            "",
            *section_graph(d),
            "",
        ]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(body))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
