#!/usr/bin/env bash
# Set up a virtualenv and run the main job: a LangGraph chat whose state
# survives a process restart, with its history and a fork, stored by KVSaver.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${KVSAVER_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e ".[demo]"
"$VENV/bin/python" examples/chat_demo.py "${1:-./demo-state}"
