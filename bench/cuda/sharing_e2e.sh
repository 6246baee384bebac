#!/bin/bash
# On the GPU machine: `loom bench` workloads of the KV sharing modes on the 8B
# shape (random:llama-8b, 8 random rank-16 adapters on all seven projections),
# isolated (per-adapter prefix caching, as vLLM/SGLang) against forked / base.
# Carries .carry/cuda (bench/cuda/pack.sh) and .carry/py (the harness's httpx
# and its dependencies, from the .venv here: the device has no network).
#   bench/cuda/sharing_e2e.sh react|mapreduce|reflexion|reflexion-skewed [extra loom bench args]
# Sizes come from the environment (defaults: a scaled-down ForkKV / ICaRus shape
# that fits one 10-minute call): CONTEXT, OUTPUT, TASKS, KV_BYTES, LIMIT (seconds),
# ADAPTERS (random rank-16 adapters served, default 8; workflow copies wrap around them);
# react/mapreduce: RATE (tasks/s; empty: closed loop), WORKFLOWS; reflexion: AGENTS, RATES.
set -u
WORKLOAD=${1:-react}
shift
. "$(dirname "$0")/harness_env.sh"
ADAPTERS=${ADAPTERS:-8}
[ -d "/tmp/loom/adapters/adapter$((ADAPTERS - 1))" ] ||
  "$LOOM" make-adapters --model random:llama-8b --adapters "$ADAPTERS" --rank 16 --out /tmp/loom/adapters \
    > "$OUT/make_adapters.log" 2>&1
LORAS=(--max-loras-per-batch "$(( ADAPTERS > 8 ? ADAPTERS : 8 ))")
for ((i = 0; i < ADAPTERS; i++)); do LORAS+=(--lora "agent$i=/tmp/loom/adapters/adapter$i"); done
COMMON=(--model random:llama-8b --device cuda --kv-cache-bytes "${KV_BYTES:-4294967296}" --no-plots --synthetic-outputs
        --context-tokens "${CONTEXT:-8192}" --output-tokens "${OUTPUT:-128}" --num-tasks "${TASKS:-8}")
case "$WORKLOAD" in
  react|mapreduce)
    RATE_ARGS=(); [ -n "${RATE-2}" ] && RATE_ARGS=(--rate "${RATE-2}")
    timeout "${LIMIT:-540}" "$LOOM" bench "$WORKLOAD" "${COMMON[@]}" "${LORAS[@]}" --agents 8 "${RATE_ARGS[@]}" \
      --compare sharing=${SHARING:-isolated,forked} --compare workflows=${WORKFLOWS:-1,4} --out "$OUT/$WORKLOAD" "$@" > "$OUT/$WORKLOAD.log" 2>&1
    ;;
  reflexion|reflexion-skewed)
    timeout "${LIMIT:-540}" "$LOOM" bench "$WORKLOAD" "${COMMON[@]}" "${LORAS[@]}" --agents "${AGENTS:-4}" \
      --compare sharing=${SHARING:-isolated,base} --compare rate=${RATES:-2,8} --out "$OUT/$WORKLOAD" "$@" > "$OUT/$WORKLOAD.log" 2>&1
    ;;
esac
echo "rc $?"
tail -n 30 "$OUT/$WORKLOAD.log"
[ -f "$OUT/$WORKLOAD/report.md" ] && cat "$OUT/$WORKLOAD/report.md"
