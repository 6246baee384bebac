#!/bin/bash
# On the GPU machine: the CUDA figures of two builds side by side, interleaved, in one run
# (a refactor must not regress them). Carries .carry/compare (bench/cuda/pack_compare.sh).
#   bench/cuda/compare_builds.sh kernels   # loom_cuda_bench (decode vs floor, multi-LoRA, prefill MFU), rounds FIRST_ROUND (1) .. ROUNDS (1)
#   bench/cuda/compare_builds.sh serve     # bench/serve/serve_bench.py: `loom serve --device cuda
#                                          # --model random:llama-8b` of both, 1..128 streams
#   bench/cuda/compare_builds.sh tests     # the after build's cuda_backend_test
set -u
MODE=${1:-kernels}
OUT=${OUT:-/tmp/loom-out}
P=/tmp/loom-compare
mkdir -p "$P" "$OUT"
[ -d "$P/after" ] || tar xJf .carry/compare/pkg.tar.xz -C "$P"
CUBLAS=$(ldconfig -p | awk '/libcublas.so.13 /{print $NF; exit}')
[ -z "$CUBLAS" ] && CUBLAS=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib", "libcublas.so.13"))' 2>/dev/null)
export LD_LIBRARY_PATH=$P/lib:$(dirname "${CUBLAS:-/usr/local/cuda/lib64/x}")
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee -a "$OUT/env.txt"
case "$MODE" in
  kernels)
    for round in $(seq "${FIRST_ROUND:-1}" "${ROUNDS:-1}"); do  # alternate the order: before after, after before, ...
      order="before after"; [ $((round % 2)) = 0 ] && order="after before"
      for build in $order; do
        echo "== round $round: $build"
        timeout ${BENCH_TIMEOUT:-200} "$P/$build/loom_cuda_bench" --what ${WHAT:-decode lora prefill} --out "$OUT/kernels_${build}_$round.json" \
          > "$OUT/kernels_${build}_$round.log" 2>&1
        tail -n 25 "$OUT/kernels_${build}_$round.log"
      done
    done
    ;;
  serve)
    python3 bench/serve/serve_bench.py --out-dir "$OUT" --tag compare --skip-prefix --startup-timeout 300 \
      --concurrency ${CONCURRENCY:-1 16 128} --output-tokens ${OUTPUT_TOKENS:-128} \
      --server "before=$P/before/loom serve --device cuda --model random:llama-8b --port {port} --gpu-memory-fraction 0.8" \
      --server "after=$P/after/loom serve --device cuda --model random:llama-8b --port {port} --gpu-memory-fraction 0.8" \
      2>&1 | tail -n 30
    ;;
  tests)
    timeout 500 "$P/after/cuda_backend_test" 2>&1 | tee "$OUT/cuda_tests.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |tests ran" | head -40
    ;;
esac
