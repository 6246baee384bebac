#!/bin/bash
# ForkKV in its own setting (issue 42, item 4; "ForkKV", §7.1-7.2, Fig. 11-13):
# react and mapreduce over one shared static context of 32K or 64K tokens,
# 8 agents per workflow, each agent its own rank-16 LoRA (all seven projections),
# 1/4/8 concurrent workflows (every agent of every workflow a distinct adapter:
# 8 x workflows adapters), Poisson arrivals at 2 tasks/s, 0.1 s tool latency,
# 100-token observations, 256 output tokens, the Llama-3-8B shape
# (random:llama-8b); forked (ForkKV: shared bCache + per-adapter rCache)
# against isolated (per-adapter prefix caching = vLLM / SGLang with LoRA).
# With the paper's warm-up ("warm": the measured phase follows a warm-up phase
# of the same workload on the same contexts, --steady-state, as the paper's
# steady-state figures) or without ("cold").
#
# Pool: the paper serves Llama3-8B on one L40 (§7.1), so by default the pool is
# what an L40 leaves (vLLM, gpu_memory_utilization 0.9): 46068 MiB x 0.9 =
# 43,475,219,251 B - weights 16,060,522,496 B - activations 2 GiB - 8 LoRA slots
# (vLLM max_loras 8; rank 16 on all seven projections: 32 x 1,310,720 x 2 B =
# 83,886,080 B each) = 24,596,124,467 B (22.9 GiB: ~5 isolated copies of a 32K
# context at 128 KiB per token, ~2.7 at 64K). POOL_GPU=h100 sizes it to an
# H100-80GB instead (81559 MiB: 58,089,634,201 B, 54.1 GiB). Forked takes its rCache pool out of
# the same bytes: 2 KiB per token per agent at rank 16, sized for every agent's
# rCache of the context plus 15%.
#
# A react task at 32K runs minutes (8 sequential 256-token calls over a 32K+
# context), so a point is a time window (WARMUP_LIMIT seconds of warm-up, POINT_LIMIT
# by default, then POINT_LIMIT measured; tasks keep arriving at 2/s throughout): throughput is output
# tokens/s and calls/s over the window (tasks/s too, but few tasks finish in a
# window), which in steady state are proportional to tasks/s.
#
# PRESET picks the points of one ~8-minute call (BUDGET 470 s):
#   core (default)  react 32K 8 workflows warm; mapreduce 32K 8 workflows cold
#   workflows       react 32K 1 and 4 workflows, warm
#   cold            react 32K 8 workflows cold; react 32K 1 workflow cold
#   64k             react 64K 8 workflows warm
#   mapreduce       mapreduce 32K 8 workflows warm; mapreduce 64K 8 workflows cold
#   mapreducewarm   mapreduce 32K 8 workflows warm with a warm-up long enough for every agent's rCache
#                   (64 x 32K of adapter prefill, ~170 s on the H200): WARMUP_LIMIT 180, POINT_LIMIT 60;
#                   one side per call (POINTS=mapreduce-32k-w8-warm-forked, then -isolated)
#   mapreduce64warm the same at 64K: 64 x 64K of adapter prefill, ~330 s, so WARMUP_LIMIT 340 and
#                   POINT_LIMIT 60; one side per call (POINTS=mapreduce-64k-w8-warm-forked, BUDGET 540)
# The whole study is the five calls; each point is forked then isolated.
#   PRESET=core bench/cuda/forkkv_setting.sh
# Env: PRESET, POOL_GPU (l40 | h100), POINT_LIMIT (s per phase, 70), WARMUP_LIMIT, RATE (2),
# OUTPUT (256), LOOPS (react loops over the 8 agents, 1), KV_BYTES (override),
# BUDGET, POINTS.
# Off the GPU: LOOM=build/loom DEVICE=cpu MODEL=random:tiny KV_BYTES=... CONTEXT_32K=64 ...
set -u
STUDY=forkkv
. "$(dirname "$0")/setting_common.sh"
PRESET=${PRESET:-core}
[ "$PRESET" = mapreducewarm ] && : "${WARMUP_LIMIT:=180}" "${POINT_LIMIT:=60}"
[ "$PRESET" = mapreduce64warm ] && : "${WARMUP_LIMIT:=340}" "${POINT_LIMIT:=60}"
POINT_LIMIT=${POINT_LIMIT:-70}
WARMUP_LIMIT=${WARMUP_LIMIT:-$POINT_LIMIT}  # the warm-up's window, when shorter than the measured one
RATE=${RATE:-2}
OUTPUT=${OUTPUT:-256}
LOOPS=${LOOPS:-1}
RANK=${RANK:-16}
CONTEXT_32K=${CONTEXT_32K:-32768}
CONTEXT_64K=${CONTEXT_64K:-65536}
RESIDUAL_BYTES_PER_TOKEN=${RESIDUAL_BYTES_PER_TOKEN:-2048}  # rank 16, 8B shape: 2 x 32 layers x 16 x 2 B
ADAPTER_DIR=${ADAPTER_DIR:-/tmp/loom/forkkv_adapters_r$RANK}
SLOT=$(( 32 * 1310720 * 2 ))
case "${POOL_GPU:-l40}" in
  l40) POOL=$(pool_bytes 46068 90 "$SLOT" 8) ;;
  h100) POOL=$(pool_bytes 81559 90 "$SLOT" 8) ;;
  *) echo "POOL_GPU: l40 or h100"; exit 2 ;;
esac
POOL=${KV_BYTES:-$POOL}

case "$PRESET" in
  core) SPECS="react:32:8:warm mapreduce:32:8:cold" ;;
  workflows) SPECS="react:32:1:warm react:32:4:warm" ;;
  cold) SPECS="react:32:8:cold react:32:1:cold" ;;
  64k) SPECS="react:64:8:warm" ;;
  mapreduce) SPECS="mapreduce:32:8:warm mapreduce:64:8:cold" ;;
  mapreducewarm) SPECS="mapreduce:32:8:warm" ;;
  mapreduce64warm) SPECS="mapreduce:64:8:warm" ;;
  *) SPECS=$PRESET ;;  # e.g. "react:32:4:cold"
esac
MAX_WORKFLOWS=1
for spec in $SPECS; do
  IFS=: read -r _ _ w _ <<< "$spec"
  [ "$w" -gt "$MAX_WORKFLOWS" ] && MAX_WORKFLOWS=$w
done
# enough tasks to keep arriving through a window (the window, not the count, ends a phase)
LONGEST=$(( POINT_LIMIT > WARMUP_LIMIT ? POINT_LIMIT : WARMUP_LIMIT ))
TASKS=$(awk -v r="$RATE" -v l="$LONGEST" 'BEGIN { print int(r * l * 1.5) + 8 }')
make_adapters "$ADAPTER_DIR" $(( 8 * MAX_WORKFLOWS )) "$RANK" q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj

for spec in $SPECS; do
  IFS=: read -r workload k workflows warm <<< "$spec"
  context=$CONTEXT_32K; [ "$k" = 64 ] && context=$CONTEXT_64K
  adapters=$(( 8 * workflows ))
  lora_flags "$ADAPTER_DIR" "$adapters"
  # every agent's rCache of the context (and of its share of the history) plus 15%
  residual=$(( adapters * (context + 8 * (OUTPUT + 100)) * RESIDUAL_BYTES_PER_TOKEN * 115 / 100 ))
  warm_args=()
  [ "$warm" = warm ] && warm_args=(--warmup-tasks "$TASKS" --steady-state --warmup-time-limit "$WARMUP_LIMIT")
  for side in forked isolated; do
    side_args=()
    [ "$side" = forked ] && side_args=(--residual-kv-cache-memory "$residual")
    point "$workload-${k}k-w$workflows-$warm-$side" 60 "$workload" --model "$MODEL" --device "$DEVICE" \
      --kv-cache-bytes "$POOL" --synthetic-outputs --no-workflow-hints --agents 8 --loops "$LOOPS" \
      --context-tokens "$context" --output-tokens "$OUTPUT" --observation-tokens 100 --tool-latency 0.1 \
      --rate "$RATE" --workflows "$workflows" --num-tasks "$TASKS" --time-limit "$POINT_LIMIT" \
      --compare "sharing=$side" "${warm_args[@]}" "${side_args[@]}" "${LORA_FLAGS[@]}"
  done
done
summarize
