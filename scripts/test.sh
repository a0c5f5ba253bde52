#!/usr/bin/env bash
# Set up a virtualenv with the test extra, lint (ruff check and format) and
# type-check, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${KVSAVER_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e ".[test]"
"$VENV/bin/python" -m ruff check kv saver tools tests bench .ci
"$VENV/bin/python" -m ruff format --check kv saver tools tests bench .ci

# mypy on the installed names (kvsaver = saver/, kvsaver.kv = kv/, kvsaver.tools
# = tools/), laid out as links in a temporary directory: mypy cannot map a
# directory to another package name. lmdb is read as untyped (a stub of Any):
# 1.x ships no types, and 2.x+ stubs type every key and value as
# bytes | memoryview (for buffers=True, which LMDBStore never uses).
TREE="$(mktemp -d)"
trap 'rm -rf "$TREE"' EXIT
mkdir "$TREE/kvsaver" "$TREE/stubs"
ln -s "$PWD"/saver/* "$TREE/kvsaver/"
ln -s "$PWD/kv" "$TREE/kvsaver/kv"
ln -s "$PWD/tools" "$TREE/kvsaver/tools"
printf 'from typing import Any\n\ndef __getattr__(name: str) -> Any: ...\n' > "$TREE/stubs/lmdb.pyi"
PY="$(cd "$VENV/bin" && pwd)/python"
# mypy runs beside pytest; its output comes after the tests', and either
# failing fails the script.
MYPY_LOG="$TREE/mypy.log"
(cd "$TREE" && MYPYPATH="$TREE/stubs" "$PY" -m mypy \
    --config-file "$OLDPWD/pyproject.toml" --cache-dir "$OLDPWD/.mypy_cache" -p kvsaver) \
    > "$MYPY_LOG" 2>&1 &
MYPY_PID=$!

PYTEST_RC=0
if [ "$#" -gt 0 ]; then
    "$VENV/bin/python" -m pytest -q "$@" || PYTEST_RC=$?
else
    # The whole suite as three pytest runs side by side: the files that run
    # other processes (kill -9, crash, several processes on one store, the
    # PostgreSQL server's) in the background, LangGraph's SQLite TTL and
    # AsyncPostgresStore suites (tests/upstream_suites.py; mostly waiting for
    # TTLs to pass) in the background as well, and the rest here, the busy
    # two keeping about one of two cores busy each; the background runs'
    # output follows. Each has its own temporary directories (and PostgreSQL
    # clusters: the system's, and pgserver's with pgvector where a test needs it).
    PROCS=(tests/test_crash.py tests/test_saver_differential.py
        tests/test_lmdb_reliability.py tests/test_lmdb_processes.py
        tests/test_postgres.py tests/test_processes.py tests/test_saver_restart.py
        tests/test_kvstore.py tests/test_kvstore_differential.py tests/test_kvstore_graph.py
        tests/test_kvstore_processes.py tests/test_kvstore_upstream.py
        tests/test_kvstore_upstream_sqlite.py tests/test_kvstore_upstream_sqlite_async.py
        tests/test_kvstore_vectors.py tests/test_kvstore_pgvector.py)
    WAITS=(tests/test_kvstore_upstream_ttl.py tests/test_kvstore_upstream_postgres_async.py)
    REST=()
    for f in tests/test_*.py; do
        case " ${PROCS[*]} ${WAITS[*]} " in *" $f "*) ;; *) REST+=("$f") ;; esac
    done
    PROCS_LOG="$TREE/procs.log"
    WAITS_LOG="$TREE/waits.log"
    "$VENV/bin/python" -m pytest -q "${PROCS[@]}" > "$PROCS_LOG" 2>&1 &
    PROCS_PID=$!
    "$VENV/bin/python" -m pytest -q "${WAITS[@]}" > "$WAITS_LOG" 2>&1 &
    WAITS_PID=$!
    "$VENV/bin/python" -m pytest -q "${REST[@]}" || PYTEST_RC=$?
    for run in PROCS WAITS; do
        pid="${run}_PID" log="${run}_LOG" files="${run}[*]"
        RC=0
        wait "${!pid}" || RC=$?
        echo "== ${!files}"
        cat "${!log}"
        if [ "$RC" -ne 0 ]; then
            echo "pytest of ${!files} failed (exit $RC)"
            PYTEST_RC=$RC
        fi
    done
fi
MYPY_RC=0
wait "$MYPY_PID" || MYPY_RC=$?
cat "$MYPY_LOG"
if [ "$MYPY_RC" -ne 0 ]; then
    echo "mypy failed (exit $MYPY_RC)"
    exit 1
fi
exit "$PYTEST_RC"
