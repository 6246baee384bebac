#!/bin/bash
# Here (the build machine): packs one build for run_device.sh / serve_check.sh on the GPU machine.
#   bench/cuda/pack.sh [BUILD_DIR]   -> .carry/cuda/loom_cuda_pkg.tar.xz
# bin/ gets loom, loom_cuda_bench and cuda_backend_test; lib/ the Debian shared
# libraries the device image lacks.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" .carry/cuda
cp "$build/loom" "$build/bench/cuda/loom_cuda_bench" "$build/tests/cuda/cuda_backend_test" "$stage/bin/"
for binary in "$stage"/bin/*; do
  ldd "$binary" | awk '/=> \//{print $3}' |
    grep -vE 'lib(c|m|dl|rt|pthread|cuda|cudart|cublas|cublasLt|nvidia)[.-]|ld-linux' || true
done | sort -u | xargs -r cp -L -t "$stage/lib"
tar cJf .carry/cuda/loom_cuda_pkg.tar.xz -C "$stage" bin lib
ls -la .carry/cuda/loom_cuda_pkg.tar.xz
