"""The PostgreSQL backend (kv/postgres/) uses psycopg's documented API only:
no private module (``psycopg._*``), none of its internals (the generators
under its cursors, ``Connection.wait``, its waiting functions,
``Transformer``, ``error_from_result``, the connection's lock), and of its
libpq wrapper (``Connection.pgconn``, ``psycopg.pq.PGconn``) only methods of
the interface every implementation shares (``psycopg.pq.abc.PGconn``). A
source check: a new import or call of an internal fails here, loudly, with
the file and line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BACKEND = Path(__file__).resolve().parent.parent / "kv" / "postgres"

# Modules with a page in psycopg's API reference (and the pool's).
DOCUMENTED_MODULES = {
    "psycopg",
    "psycopg.adapt",
    "psycopg.errors",
    "psycopg.pq",
    "psycopg.rows",
    "psycopg.sql",
    "psycopg_pool",
}
INTERNAL_NAMES = {"generators", "waiting", "Transformer", "error_from_result", "wait_c"}


def _sources() -> list[tuple[Path, ast.AST]]:
    files = sorted(BACKEND.glob("*.py"))
    assert files, BACKEND
    return [(f, ast.parse(f.read_text(), str(f))) for f in files]


def _where(f: Path, node: ast.AST) -> str:
    return f"{f.name}:{getattr(node, 'lineno', '?')}"


def test_the_backend_imports_only_documented_psycopg_modules() -> None:
    bad = []
    for f, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]  # the names it imports: below
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in ("psycopg", "psycopg_pool"):
                    continue
                private = any(p.startswith("_") for p in name.split("."))
                if name not in DOCUMENTED_MODULES or private:
                    bad.append(f"{_where(f, node)} imports {name}")
            if isinstance(node, ast.ImportFrom):
                for a in node.names:
                    if a.name in INTERNAL_NAMES or a.name.startswith("_"):
                        bad.append(f"{_where(f, node)} imports {a.name} from {node.module}")
    assert not bad, "undocumented psycopg API in kv/postgres:\n" + "\n".join(bad)


def test_the_backend_uses_no_psycopg_internals() -> None:
    bad = []
    for f, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                owner = node.value.id if isinstance(node.value, ast.Name) else ""
                if node.attr in INTERNAL_NAMES:
                    bad.append(f"{_where(f, node)} uses .{node.attr}")
                elif "conn" in owner.lower() and node.attr in ("wait", "lock"):
                    bad.append(f"{_where(f, node)} uses {owner}.{node.attr}")
                elif owner in ("psycopg", "errors", "pq", "sql") and node.attr.startswith("_"):
                    bad.append(f"{_where(f, node)} uses {owner}.{node.attr}")
            elif isinstance(node, ast.Constant) and node.value in INTERNAL_NAMES:
                bad.append(f"{_where(f, node)} names {node.value!r}")  # getattr(..., "...")
    assert not bad, "psycopg internals in kv/postgres:\n" + "\n".join(bad)


def test_the_backend_calls_only_the_shared_libpq_interface() -> None:
    """Every attribute read of a ``pgconn`` is one of ``psycopg.pq.abc.PGconn``
    (the protocol the python, c and binary implementations of psycopg.pq
    share), and public."""
    abc = pytest.importorskip("psycopg.pq.abc")
    used: dict[str, str] = {}
    for f, tree in _sources():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "pgconn") or (
                isinstance(owner, ast.Attribute) and owner.attr == "pgconn"
            ):
                used.setdefault(node.attr, _where(f, node))
    assert "send_query_prepared" in used  # the check sees the driver's calls
    bad = [
        f"{where} uses pgconn.{name}"
        for name, where in sorted(used.items())
        if name.startswith("_") or not hasattr(abc.PGconn, name)
    ]
    assert not bad, "not psycopg.pq's shared interface:\n" + "\n".join(bad)


def test_the_driver_s_libpq_constants_are_psycopg_s() -> None:
    """The driver compares libpq's statuses as plain ints (an enum's
    comparison costs more at every result): they are the documented enums'."""
    pq = pytest.importorskip("psycopg.pq")
    from kvsaver.kv.postgres import driver

    assert driver._COMMAND_OK == pq.ExecStatus.COMMAND_OK
    assert driver._TUPLES_OK == pq.ExecStatus.TUPLES_OK
    assert driver._FATAL_ERROR == pq.ExecStatus.FATAL_ERROR
    assert driver._PIPELINE_SYNC == pq.ExecStatus.PIPELINE_SYNC
    assert driver._BAD == pq.ConnStatus.BAD
    assert driver._IDLE == pq.TransactionStatus.IDLE
    assert driver._SQLSTATE == pq.DiagnosticField.SQLSTATE
