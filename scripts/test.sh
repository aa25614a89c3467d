#!/usr/bin/env bash
# Install everything (scripts/setup.sh) and run the whole test suite: contract, unit, integration
# (real gRPC over loopback, real ZMQ, real model), the conformance self-test against the reference
# server and its mutants, and what users install: the sdist and the wheel, built here and installed
# into clean environments as the README says (tests/install/dist.py); every harness run of the
# tests uses that wheel's `conformance`. A caller that set LMRPC_DIST reuses what it built.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -z "${LMRPC_DIST:-}" ]; then
  .venv/bin/python -m tests.install.dist --out .dist
  export LMRPC_DIST="$PWD/.dist"
fi
exec .venv/bin/python -m pytest "$@"
