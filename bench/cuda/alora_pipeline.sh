#!/bin/bash
# On the GPU machine: alora-serving §4.2's base-adapter pipeline on the 8B shape
# (random:llama-8b): the base model reads a fresh prompt x and generates y (256
# tokens), then 5 aLoRA evaluators read x + y + the invocation text and answer
# with 16 tokens each. isolated (per-adapter KV, as vLLM with plain LoRA)
# against activated (the evaluators reuse the base model's KV of x + y).
# Synchronous, as the paper: a closed loop of CONCURRENCY tasks in flight.
#   PROMPTS=8192,32768 TASKS=2 bench/cuda/alora_pipeline.sh [extra loom bench args]
# Env: PROMPTS (x lengths, comma-separated), TASKS (per configuration),
# CONCURRENCY (default 1), GEN (256), EVAL (16), KV_BYTES (default: the
# server's, 0.9 of the GPU), SHARING (isolated,activated), LIMIT (s).
# Off the GPU (a check of the arguments): LOOM=build/loom DEVICE=cpu
# MODEL=random:tiny PROMPTS=256 bench/cuda/alora_pipeline.sh --threads 2
set -u
. "$(dirname "$0")/harness_env.sh"
INVOCATION="Evaluation of the answer above:"
ADAPTER_DIR=${ADAPTER_DIR:-/tmp/loom/alora_adapters}
[ -d "$ADAPTER_DIR/adapter4" ] ||
  "$LOOM" make-adapters --model "$MODEL" --adapters 5 --rank 16 --alora-invocation-text "$INVOCATION" \
    --out "$ADAPTER_DIR" > "$OUT/make_alora_adapters.log" 2>&1 || { cat "$OUT/make_alora_adapters.log"; exit 1; }
LORAS=()
for i in 0 1 2 3 4; do LORAS+=(--lora "evaluator$i=$ADAPTER_DIR/adapter$i"); done
KV=(); [ -n "${KV_BYTES:-}" ] && KV=(--kv-cache-bytes "$KV_BYTES")
timeout "${LIMIT:-560}" "$LOOM" bench pipeline --model "$MODEL" --device "$DEVICE" "${KV[@]}" "${LORAS[@]}" \
  --no-plots --synthetic-outputs --invocation-text "$INVOCATION" --pipeline-adapters 5 \
  --gen-tokens "${GEN:-256}" --eval-tokens "${EVAL:-16}" --final-tokens 0 \
  --num-tasks "${TASKS:-1}" --concurrency "${CONCURRENCY:-1}" \
  --compare sharing="${SHARING:-isolated,activated}" --compare prompt_tokens="${PROMPTS:-8192}" \
  --out "$OUT/pipeline" "$@" > "$OUT/pipeline.log" 2>&1
echo "rc $?"
tail -n 5 "$OUT/pipeline.log"
[ -f "$OUT/pipeline/report.md" ] && grep -E "^\| (config|sharing)" "$OUT/pipeline/report.md"
