#!/usr/bin/env bash
# Install everything (scripts/setup.sh) and run the whole test suite: contract, unit, integration
# (real gRPC over loopback, real ZMQ, real model), and the conformance self-test against the
# reference server and its mutants.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
