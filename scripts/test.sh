#!/usr/bin/env bash
# Set up a virtualenv with the test extra and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${KVSAVER_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e ".[test]"
"$VENV/bin/python" -m ruff check kv saver tools tests bench
"$VENV/bin/python" -m pytest -q "$@"
