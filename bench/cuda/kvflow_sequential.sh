#!/bin/bash
# On the GPU machine: KVFlow's sequential workflow (kvflow §5) on the 8B shape
# (random:llama-8b): 10 agents one after the other, each on its own fixed prompt
# plus fresh dynamic tokens, the device KV pool too small for the fixed
# prompts, a host tier over PCIe. LRU without the host tier, LRU + host (SGLang
# HiCache's behaviour: reactive loads) and workflow-aware eviction + prefetch,
# side by side, after warm passes on the same fixed prompts (--steady-state).
#   FIXED=8192 WORKFLOWS=1 bench/cuda/kvflow_sequential.sh     # one workflow, KVFlow Fig. 5
#   FIXED=1024 WORKFLOWS=8 bench/cuda/kvflow_sequential.sh     # concurrent workflows, Fig. 6
# Env: FIXED, DYNAMIC (32), OUTPUT (32), WORKFLOWS, TASKS (measured, default = WORKFLOWS),
# WARMUP (warm-up tasks, default 2 x WORKFLOWS), KV_BYTES (device pool; default a third of
# the fixed prompts' KV), HOST (host tier, 32G), CACHES, LIMIT (s).
# Off the GPU (a check of the arguments): LOOM=build/loom DEVICE=cpu MODEL=random:tiny
# FIXED=256 KV_BYTES=2000000 bench/cuda/kvflow_sequential.sh --threads 2
set -u
. "$(dirname "$0")/harness_env.sh"
FIXED=${FIXED:-1024}
WORKFLOWS=${WORKFLOWS:-8}
# 8B shape: 128 KiB of KV per token (32 layers x 8 kv heads x 128 x 2 x bf16).
KV_BYTES=${KV_BYTES:-$(( FIXED * 10 * WORKFLOWS * 131072 / 3 ))}
timeout "${LIMIT:-560}" "$LOOM" bench sequential --model "$MODEL" --device "$DEVICE" --no-plots \
  --compare cache="${CACHES:-lru,lru+host,workflow+prefetch}" --workflows "$WORKFLOWS" \
  --warmup-tasks "${WARMUP:-$(( 2 * WORKFLOWS ))}" --steady-state --num-tasks "${TASKS:-$WORKFLOWS}" \
  --fixed-tokens "$FIXED" --dynamic-tokens "${DYNAMIC:-32}" --output-tokens "${OUTPUT:-32}" \
  --declare-workflows --host-kv-memory "${HOST:-32G}" --kv-cache-bytes "$KV_BYTES" \
  --out "$OUT/sequential" "$@" > "$OUT/sequential.log" 2>&1
echo "rc $?"
tail -n 5 "$OUT/sequential.log"
[ -f "$OUT/sequential/report.md" ] && grep -E "^\| (config|cache)" "$OUT/sequential/report.md"
