#!/bin/bash
# On a machine of two or more GPUs (nvidia-h200-x2 / -x4): tensor parallelism over NCCL.
#   1. the multi-GPU tests (CudaNcclTensorParallel: TP=2 (and 4) logits against the unsharded model, every
#      architecture and sharing mode mixed; CudaNcclGroup: abort ends a rank waiting for its peer; the NCCL KV link);
#   2. `loom serve --device cuda -tp N --model random:llama-8b` with an adapter in every sharing mode
#      (serve_modes_check.sh: 20 concurrent completions, the base model included);
#   3. loom_tp_bench: the decode step at TP=1 and TP=N against the per-GPU floor, and the all-reduces' share
#      (peer-access kernel against NCCL alone), then TP=N again with every sum on NCCL (--peer-all-reduce-bytes 0);
#   4. bench/serve/serve_bench.py of -tp N against -tp 1 (output tok/s at CONCURRENCY streams), while time is left;
#   5. (BIG=1) the 70B shape at -tp N: loom_tp_bench (decode steps against the floor, LoRA, 8K prefill MFU),
#      every sharing mode in one server (issue 37's "done when" at N = 4), then serve_bench at 1/16/64/128
#      streams in bf16 and with FP8 weights + FP8 KV (issue 40).
# Carries .carry/cuda (bench/cuda/pack.sh). TP (default 2), BUDGET seconds for the whole (default 560).
# Every result file ends in $OUT/tp_results.tgz (the device tool returns 8 files a call).
set -u
TP=${TP:-2}
BUDGET=${BUDGET:-560}
START=$(date +%s)
left() { echo $((START + BUDGET - $(date +%s))); }
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/tp_env.txt"
nvidia-smi topo -m >> "$OUT/tp_env.txt" 2>&1
T=/tmp/loom/bin/cuda_backend_test
timeout 220 "$T" --gtest_filter='CudaPeerAllReduce*:CudaNccl*:CudaKvNcclLink*:CudaTensorParallel*:AllArchs/CudaNcclTensorParallel*:AllArchs/CudaTensorParallel*' \
  > "$OUT/tp_tests.log" 2>&1
echo "== tests: exit status $?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |OK \]|Failure" "$OUT/tp_tests.log" | tail -30
LOOM_SERVE_ARGS="-tp $TP" timeout $(( $(left) < 230 ? $(left) : 230 )) bash "$(dirname "$0")/serve_modes_check.sh" > "$OUT/tp_modes.log" 2>&1
echo "== serve -tp $TP, every mode: exit status $?"
grep -E "all 20|FAILED|decode_batch|error" "$OUT/tp_modes.log" | head
[ -f "$OUT/serve_modes.log" ] && mv "$OUT/serve_modes.log" "$OUT/tp_serve_modes.log"
if [ "$(left)" -gt 150 ] && [ -x /tmp/loom/bin/loom_tp_bench ]; then
  timeout $(( $(left) - 120 )) /tmp/loom/bin/loom_tp_bench --sizes 1 "$TP" --batch-sizes 1 16 64 --iterations 10 \
    --what decode lora --out "$OUT/tp_bench.json" 2>&1 | grep -E "TP=|GPUs|wrote|loom_tp_bench"
  timeout 90 /tmp/loom/bin/loom_tp_bench --sizes "$TP" --batch-sizes 1 16 64 --iterations 10 --what decode \
    --peer-all-reduce-bytes 0 --out "$OUT/tp_bench_nccl.json" 2>&1 | grep -E "TP=|wrote"
fi
if [ "$(left)" -gt 150 ]; then
  L=/tmp/loom/bin/loom
  timeout $(( $(left) - 10 )) python3 bench/serve/serve_bench.py --out-dir "$OUT" --tag tp$TP --skip-prefix --startup-timeout 200 \
    --concurrency ${CONCURRENCY:-1 64} --output-tokens 128 \
    --server "tp$TP=$L serve --device cuda --model random:llama-8b --port {port} -tp $TP --gpu-memory-fraction 0.8" \
    --server "tp1=$L serve --device cuda --model random:llama-8b --port {port} --gpu-memory-fraction 0.8" 2>&1 | tail -12
fi
if [ -n "${BIG:-}" ] && [ "$(left)" -gt 150 ]; then
  timeout 120 /tmp/loom/bin/loom_tp_bench --preset 70b --sizes "$TP" --batch-sizes 1 64 --iterations 10 \
    --out "$OUT/tp_bench_70b.json" 2>&1 | grep -E "TP=|GPUs|wrote|loom_tp_bench"
fi
if [ -n "${BIG:-}" ] && [ "$(left)" -gt 120 ]; then
  MODEL=random:llama-70b LOOM_SERVE_ARGS="-tp $TP" timeout $(( $(left) < 200 ? $(left) : 200 )) \
    bash "$(dirname "$0")/serve_modes_check.sh" > "$OUT/tp_modes_70b.log" 2>&1
  echo "== serve 70B -tp $TP, every mode: exit status $?"
  grep -E "all 20|FAILED" "$OUT/tp_modes_70b.log" | head -3
  [ -f "$OUT/serve_modes.log" ] && mv "$OUT/serve_modes.log" "$OUT/tp_serve_modes_70b.log"
  for variant in bf16 fp8; do
    [ "$(left)" -gt 100 ] || break
    extra=""; [ "$variant" = fp8 ] && extra="--quantization fp8 --kv-cache-dtype fp8"
    timeout $(( $(left) - 10 )) python3 bench/serve/serve_bench.py --out-dir "$OUT" --tag "tp$TP-70b-$variant" --skip-prefix \
      --startup-timeout 150 --concurrency 1 16 64 128 --output-tokens 128 \
      --server "tp$TP-70b-$variant=/tmp/loom/bin/loom serve --device cuda --model random:llama-70b --port {port} -tp $TP $extra --gpu-memory-fraction 0.92" \
      2>&1 | tail -8
  done
fi
echo "== done in $(( $(date +%s) - START )) s"
# The device tool returns at most 8 files a call: everything but the caller's own log goes back as one archive.
(cd "$OUT" && find . -maxdepth 1 -type f ! -name 'tp_check*.log' ! -name tp_results.tgz -printf '%P\n' |
  tar czf tp_results.tgz --remove-files -T -) && echo "== results in $OUT/tp_results.tgz"
