"""kvsaver works with exactly its declared dependencies.

.ci/run installs the wheel alone into a fresh venv (.ci/bare_install.py);
this is the same check inside the test venv, where everything is installed:
a child process hides every distribution that kvsaver's declared
dependencies do not bring (langgraph, psycopg, tqdm, the test tools...),
then imports every module of kvsaver and uses the saver.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from kvsaver import delta

HIDE_UNDECLARED = textwrap.dedent(
    """
    import importlib.abc, importlib.machinery, importlib.metadata, os, re, sys

    def requirements(dist):
        for req in dist.requires or []:
            if "extra ==" not in req:
                yield re.split(r"[\\s\\[<>=!~;(]", req, maxsplit=1)[0]

    def norm(name):
        return re.sub(r"[-_.]+", "-", name).lower()

    dists = {norm(d.metadata["Name"]): d for d in importlib.metadata.distributions()}
    keep, todo = set(), ["kvsaver"]
    while todo:
        name = norm(todo.pop())
        if name in dists and name not in keep:
            keep.add(name)
            todo.extend(requirements(dists[name]))
    hidden = set()
    for name, dist in dists.items():
        if name not in keep:
            for f in dist.files or []:
                hidden.add(os.path.realpath(dist.locate_file(f)))

    class Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None:
                return None
            where = spec.origin or ""
            if spec.submodule_search_locations:
                where = os.path.join(list(spec.submodule_search_locations)[0], "__init__.py")
            if os.path.realpath(where) in hidden:
                raise ModuleNotFoundError(f"{fullname} is not a declared dependency")
            return None

    sys.meta_path.insert(0, Hide())
    """
)

USE = textwrap.dedent(
    """
    import importlib, pkgutil, kvsaver
    for name in ("langgraph.graph", "psycopg", "tqdm", "langgraph.checkpoint.sqlite"):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
        else:
            raise AssertionError(f"{name} is importable: the check hides nothing")
    for m in pkgutil.walk_packages(kvsaver.__path__, "kvsaver."):
        importlib.import_module(m.name)
    from kvsaver import KVSaver
    from langgraph.checkpoint.base import empty_checkpoint
    for where in (":memory:", sys.argv[1]):
        with KVSaver(where) as s:
            cp = empty_checkpoint()
            cp["channel_values"] = {"__start__": {"messages": ["hi"]}, "n": 1}
            cp["channel_versions"] = {"__start__": 1, "n": 1}
            cfg = s.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, cp,
                        {"source": "input", "step": -1}, {"__start__": 1, "n": 1})
            s.put_writes(cfg, [("n", 2)], "task")
            got = s.get_tuple(cfg)
            assert got.checkpoint["channel_values"] == cp["channel_values"], got
            assert got.pending_writes == [("task", "n", 2)], got
    print("ok")
    """
)


def test_runs_with_only_the_declared_dependencies(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", HIDE_UNDECLARED + USE, str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_start_channel_is_langgraphs():
    # delta names the input channel itself, since langgraph is not a dependency
    from langgraph.constants import START

    assert delta.START == START
