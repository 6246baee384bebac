#!/bin/bash
# Runs the CUDA backend's tests or benchmarks on the GPU machine (the `run`
# tool's device), from binaries built here and carried in .carry/cuda:
#   .carry/cuda/loom_cuda_pkg.tar.xz  bin/{cuda_backend_test,cuda_measure_test,loom_cuda_bench,loom} + lib/*.so
#                                      (the Debian shared libraries the device image lacks)
# The SmolLM2 GGUF (98 MB) is over one call's carry limit: .carry/smol_a/part
# (first 50 MB) travels with `tests` and is kept in /tmp/loom, .carry/smol_b/part
# with `smol`, which must follow while the machine is still warm.
#   bench/cuda/run_device.sh tests | all | smol | bench | wide | next | all-after-tests
# all: every GPU test but the SmolLM2 ones in one process (~3 min; CudaAttention.MatchesTorchSdpaToLongContexts
# needs the device's torch and reads bench/cuda/sdpa_check.py from the working directory).
# wide: the wgmma prefill's tests, then its timing against the mma.sync kernel and torch SDPA at 8K and 32K.
# next: programmatic launches at every step size and CudaTuning::pingpong_prefill, tested, then timed against the defaults.
set -u
MODE=${1:-tests}
. "$(dirname "$0")/device_env.sh"
echo "cublas: $CUBLAS" | tee -a "$OUT/env.txt"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv | tee -a "$OUT/env.txt"
T=/tmp/loom/bin/cuda_backend_test

run_suite() {  # one process per suite: a sticky CUDA error stays in its suite
  # The whole output goes to a file first: a pipe cut short (head) must not kill the tests with SIGPIPE.
  local log="$OUT/suite.log"
  timeout "${2:-200}" "$T" --gtest_filter="$1" > "$log" 2>&1
  local rc=$?
  cat "$log" >> "$OUT/tests.log"
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |OK \]|Failure|error|NMSE|smollm2|nmse" "$log" | tail -80
  echo "== $1: exit status $rc"
  rm -f "$log"
  if [ "$rc" -ne 0 ] && grep -q "cuda: .* failed" "$OUT/tests.log"; then
    echo "== $1 hit a CUDA error: rerunning under compute-sanitizer"
    timeout 150 compute-sanitizer --print-limit 5 "$T" --gtest_filter="$1" > "$OUT/sanitizer.log" 2>&1
    grep -E "=========" "$OUT/sanitizer.log" | head -30
  fi
}

sdpa_prefill() {  # torch SDPA on the prefill shapes the bench times, 8K and 32K
  for tokens in 8192 32768; do
    timeout 100 python3 bench/cuda/sdpa_reference.py $tokens > "$OUT/sdpa_$tokens.json" 2>> "$OUT/sdpa.err"
    grep -A3 '"prefill"' "$OUT/sdpa_$tokens.json"
  done
}

case "$MODE" in
  hosttier)
    run_suite 'CudaHostKvTier.*'
    ;;
  tests)
    for suite in 'CudaHostKvTier.*' 'CudaSampling.*' 'CudaKernels.*' 'CudaLora.*' 'CudaAttention.*' 'AllArchs/*' 'CudaBackend.*'; do run_suite "$suite" 300; done
    ;;
  all)
    run_suite '-CudaSmolLM2.*' 500
    # The benchmark's build of the backend: its measurement-only LoRA kernels.
    if [ -x /tmp/loom/bin/cuda_measure_test ]; then
      timeout 120 /tmp/loom/bin/cuda_measure_test 2>&1 | tee -a "$OUT/tests.log" | grep -E "^\[  (FAILED|PASSED) " | head
    fi
    grep -E '"pass"' "$OUT/tests.log" | head -12
    ;;
  smol)
    cat /tmp/loom/smol_a .carry/smol_b/part > /tmp/loom/smol.gguf
    ls -la /tmp/loom/smol.gguf
    LOOM_SMOLLM2_GGUF=/tmp/loom/smol.gguf run_suite 'CudaSmolLM2.*' 300
    ;;
  wide)
    run_suite 'CudaAttention.*' 300
    timeout 200 /tmp/loom/bin/loom_cuda_bench --what attention --out "$OUT/attention_bench.json" 2>&1 | tee "$OUT/attention_bench.log" | tail -4
    sdpa_prefill
    ;;
  next)  # programmatic launches and the ping-pong prefill: their tests, then each timed both ways, and SDPA
    run_suite 'CudaProgrammaticLaunch.*:CudaAttention.Wide*:CudaGraph*' 300
    timeout 360 /tmp/loom/bin/loom_cuda_bench --what decode lora prefill attention --batch-sizes 1 16 64 \
      --out "$OUT/next_bench.json" 2>&1 | tee "$OUT/next_bench.log" | grep -E "batch|prefill|attention|LoRA|lora"
    sdpa_prefill
    ;;
  bench)
    timeout 420 /tmp/loom/bin/loom_cuda_bench --out "$OUT/cuda_bench.json" 2>&1 | tee "$OUT/bench.log"
    timeout 120 python3 bench/cuda/sdpa_reference.py > "$OUT/sdpa.json" 2> "$OUT/sdpa.err"; cat "$OUT/sdpa.json"
    ;;
esac
if [ "$MODE" = profile ]; then  # Nsight Compute on one launch of each hot kernel
  B=/tmp/loom/bin/loom_cuda_bench
  prof() {  # $1 kernel regex, $2.. bench arguments
    local regex=$1; shift
    timeout 150 ncu --kernel-name-base demangled --kernel-name "regex:$regex" --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      "$B" --iterations 3 --out /tmp/loom/prof.json "$@" > "$OUT/ncu_$(echo "$regex" | tr -c 'a-z0-9' '_').txt" 2>&1
    grep -E "attention_kernel|lora_shrink|skinny|Duration|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Stall|Theoretical Occupancy" \
      "$OUT/ncu_$(echo "$regex" | tr -c 'a-z0-9' '_').txt" | head -24
  }
  prof 'attention_kernel<.int.128, .int.4>' --what attention
  prof 'attention_kernel<.int.128, .int.1>' --what attention
  prof 'lora_expand' --what lora
fi
