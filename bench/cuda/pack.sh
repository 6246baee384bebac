#!/bin/bash
# Here (the build machine): packs one build for run_device.sh / serve_check.sh on the GPU machine.
#   bench/cuda/pack.sh [BUILD_DIR]   -> .carry/cuda/loom_cuda_pkg.tar.xz
# PACK_EXTRAS (optional) names the extras to take instead of all of them, to fit a carry beside another
# (e.g. PACK_EXTRAS="cuda_backend_test loom_fp8_drift").
# bin/ gets loom and, where built, loom_cuda_bench, loom_gemm_algos_bench, loom_ipc_plane_bench, loom_kv_link_bench, loom_tp_bench, loom_fp8_drift, cuda_backend_test and cuda_measure_test; lib/ the Debian shared
# libraries the device image lacks. With a .venv here (scripts/setup.sh), also
# .carry/py/pylibs.tar.xz: the `loom bench` harness's httpx and its
# dependencies, which the device image lacks (sharing_e2e.sh unpacks it).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" .carry/cuda
# loom is needed; the others travel when built (cmake --build build --target loom alone is enough for a soak).
cp "$build/loom" "$stage/bin/"
for extra in bench/cuda/loom_cuda_bench bench/cuda/loom_gemm_algos_bench bench/cuda/loom_ipc_plane_bench bench/cuda/loom_kv_link_bench bench/cuda/loom_tp_bench bench/cuda/loom_fp8_drift tests/cuda/cuda_backend_test tests/cuda/cuda_measure_test; do
  if [ -n "${PACK_EXTRAS:-}" ] && [[ " $PACK_EXTRAS " != *" $(basename "$extra") "* ]]; then continue; fi
  if [ -f "$build/$extra" ]; then cp "$build/$extra" "$stage/bin/"; else echo "pack: no $build/$extra (not built): left out"; fi
done
for binary in "$stage"/bin/*; do
  ldd "$binary" | awk '/=> \//{print $3}' |
    grep -vE 'lib(c|m|dl|rt|pthread|cuda|cudart|cublas|cublasLt|nvidia)[.-]|ld-linux' || true
done | sort -u | xargs -r cp -L -t "$stage/lib"
tar cJf .carry/cuda/loom_cuda_pkg.tar.xz -C "$stage" bin lib
ls -la .carry/cuda/loom_cuda_pkg.tar.xz
site_packages=$(ls -d .venv/lib/python3*/site-packages 2>/dev/null | head -1 || true)
if [ -n "$site_packages" ] && [ -d "$site_packages/httpx" ]; then
  mkdir -p .carry/py
  tar cJf .carry/py/pylibs.tar.xz -C "$site_packages" httpx httpcore h11 anyio sniffio certifi idna typing_extensions.py
  ls -la .carry/py/pylibs.tar.xz
fi
