#!/bin/bash
# Here (the build machine): packs two builds for bench/cuda/compare_builds.sh on the GPU machine.
#   bench/cuda/pack_compare.sh BEFORE_BUILD_DIR AFTER_BUILD_DIR   -> .carry/compare/pkg.tar.xz
# Each build dir must hold loom and bench/cuda/loom_cuda_bench (the after one also
# tests/cuda/cuda_backend_test); lib/ gets the Debian shared libraries the device image lacks.
set -euo pipefail
cd "$(dirname "$0")/../.."
before=$1 after=$2
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/before" "$stage/after" "$stage/lib" .carry/compare
cp "$before/loom" "$before/bench/cuda/loom_cuda_bench" "$stage/before/"
cp "$after/loom" "$after/bench/cuda/loom_cuda_bench" "$stage/after/"
[ -f "$after/tests/cuda/cuda_backend_test" ] && cp "$after/tests/cuda/cuda_backend_test" "$stage/after/"
for binary in "$stage"/before/* "$stage"/after/*; do
  ldd "$binary" | awk '/=> \//{print $3}' |
    grep -vE 'lib(c|m|dl|rt|pthread|cuda|cudart|cublas|cublasLt|nvidia)[.-]|ld-linux' || true
done | sort -u | xargs -r cp -L -t "$stage/lib"
tar cJf .carry/compare/pkg.tar.xz -C "$stage" before after lib
ls -la .carry/compare/pkg.tar.xz
