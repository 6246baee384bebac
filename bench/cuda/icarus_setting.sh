#!/bin/bash
# ICaRus in its own setting (issue 42, item 2; "ICaRus: Identical Cache Reuse for
# Efficient Multi Model Inference", §4.3 Fig. 4/5, appendices A.2, E): ReAct on
# HotPotQA (`loom bench react-hotpotqa`: per-turn lengths drawn from
# bench/harness/loombench/shapes.py, every assumption stated there), 2/4/8 LoRA
# models (rank 128 on q/o/gate/up/down, as ICaRus trains them), every turn
# routed round-robin over the models, Poisson arrivals, the Llama-3.1-8B shape
# (random:llama-8b), the KV pool an A100-80GB leaves (below). Sides:
#   iso-recompute  isolated (per-adapter prefix caching = vLLM multi-LoRA) with recompute preemption
#   iso-swap       the same with --preemption-mode swap and a 4 GiB host tier (appendix E: 4 GB swap space)
#   base           `base` sharing (ICaRus: every adapter reads the base model's KV)
# Metrics per point (report.json): tasks/s (throughput), task p95 latency (the
# paper's P95), TTFT p95, hit rate, preemptions; setting_table.py turns them into
# the max-throughput ratio and the P95 ratio at the baseline's peak, beside the
# paper's 1.4/2.3/3.8x and 3.8/5.1/11.1x.
#
# Points, in priority order (one ~8-minute call runs what BUDGET covers; the rest
# are listed as skipped): 8 models at the saturating rate SAT_RATE (16/s, 96
# tasks: every side's max throughput) for base, iso-recompute, iso-swap; 8 models
# at the paper's top rate 0.8/s (32 tasks) for base and iso-recompute; then 4 and
# 2 models at SAT_RATE (base, iso-recompute). Dropped from the default run (give
# POINTS or RATES to run them in another call): the paper's 0.2/0.4/0.6 QPS, 128
# tasks per point, swap at 2/4 models, 0.8 QPS at 2/4 models.
#   bench/cuda/icarus_setting.sh                         # on the GPU machine, ~8 min
#   RATES="0.2 0.4" AGENT_COUNTS="4" bench/cuda/icarus_setting.sh   # more of the sweep, another call
# Env: AGENT_COUNTS ("8 4 2"), SAT_RATE (16), SAT_TASKS (96), RATES (extra low rates,
# default "0.8"), LOW_TASKS (32), RANK (128), POINT_LIMIT (measured seconds per
# point, 75), KV_BYTES (override the A100 pool), SHAPE (llama-8b | qwen3-14b), BUDGET, POINTS.
# Off the GPU (the plumbing; tests/python/test_setting_scripts.py):
#   LOOM=build/loom DEVICE=cpu MODEL=random:tiny KV_BYTES=4000000 RANK=8 SAT_TASKS=2 LOW_TASKS=2 \
#     LOOM_BENCH_ARGS="--threads 2 --context-tokens 48 ..." bench/cuda/icarus_setting.sh
set -u
STUDY=icarus
# SHAPE: llama-8b (the paper's headline) or qwen3-14b (its Fig. 4 second model: 3.6x / 7.4x): the model, its
# weights in the pool arithmetic and its LoRA slots. Qwen3-14B: 40 layers, hidden 5120, MLP 17408, KV 160 KiB
# per token; A100-80GB pool at 0.9 = 77,309,411,328 - 29,536,614,400 - 2 GiB - N x 901,775,360 (rank 128)
# = 43.8 / 42.0 / 38.4 GB for 2 / 4 / 8 models (267K / 256K / 234K tokens).
SHAPE=${SHAPE:-llama-8b}
case "$SHAPE" in
  llama-8b) LAYERS=32 HIDDEN=4096 MLP=14336 ;;
  qwen3-14b) LAYERS=40 HIDDEN=5120 MLP=17408 MODEL=${MODEL:-random:qwen3-14b} WEIGHT_BYTES=${WEIGHT_BYTES:-29536614400} ;;
  *) echo "SHAPE: llama-8b or qwen3-14b, not $SHAPE" >&2; exit 2 ;;
esac
. "$(dirname "$0")/setting_common.sh"
AGENT_COUNTS=${AGENT_COUNTS:-8 4 2}
SAT_RATE=${SAT_RATE:-16}
SAT_TASKS=${SAT_TASKS:-96}
RATES=${RATES-0.8}
LOW_TASKS=${LOW_TASKS:-32}
RANK=${RANK:-128}
POINT_LIMIT=${POINT_LIMIT:-75}
TARGETS=q_proj,o_proj,gate_proj,up_proj,down_proj
ADAPTER_DIR=${ADAPTER_DIR:-/tmp/loom/icarus_adapters_${SHAPE}_r$RANK}
MAX_AGENTS=$(echo $AGENT_COUNTS | tr ' ' '\n' | sort -n | tail -1)
make_adapters "$ADAPTER_DIR" "$MAX_AGENTS" "$RANK" "$TARGETS"

# The pool an A100-80GB leaves Llama-3.1-8B with N rank-RANK adapters (vLLM, gpu_memory_utilization 0.9):
#   81920 MiB x 0.9 = 77,309,411,328 B - weights 16,060,522,496 B - activations 2 GiB
#   - N LoRA slots of 32 layers x (q 2x4096xR + o 2x4096xR + gate/up/down 3x(4096+14336)xR) x 2 B
#     (R = 128: 587,202,560 B per slot) = 57.9 GB (2 models), 56.8 GB (4), 54.4 GB (8) = 442K / 433K / 415K tokens
#   of the 8B shape's 128 KiB per token.
SLOT=$(( LAYERS * (4 * HIDDEN + 3 * (HIDDEN + MLP)) * RANK * 2 ))

run_side() {  # run_side NAME AGENTS RATE TASKS SIDE
  local name=$1 agents=$2 rate=$3 tasks=$4 side=$5
  local kv=${KV_BYTES:-$(pool_bytes 81920 90 "$SLOT" "$agents")}
  lora_flags "$ADAPTER_DIR" "$agents"
  local sharing=isolated extra=()
  case "$side" in
    base) sharing=base ;;
    # (--host-kv-memory alone would be the harness's own flag: serve gets it through --compare serve.*)
    iso-swap) extra=(--preemption-mode swap --compare "serve.host-kv-memory=${SWAP_SPACE:-4G}") ;;
  esac
  point "$name" 40 react-hotpotqa --model "$MODEL" --device "$DEVICE" --kv-cache-bytes "$kv" --synthetic-outputs \
    --no-workflow-hints --agents "$agents" --rate "$rate" --num-tasks "$tasks" --concurrency 1 \
    --time-limit "$POINT_LIMIT" --compare "sharing=$sharing" "${extra[@]}" "${LORA_FLAGS[@]}"
}

for agents in $AGENT_COUNTS; do
  for side in base iso-recompute $([ "$agents" = "$MAX_AGENTS" ] && echo iso-swap); do
    run_side "n${agents}-${side}-r${SAT_RATE}" "$agents" "$SAT_RATE" "$SAT_TASKS" "$side"
  done
  if [ "$agents" = "$MAX_AGENTS" ]; then
    for rate in $RATES; do
      for side in base iso-recompute; do run_side "n${agents}-${side}-r${rate}" "$agents" "$rate" "$LOW_TASKS" "$side"; done
    done
  fi
done
# What the budget left: the low rates at the other model counts, then swap there.
for agents in $AGENT_COUNTS; do
  [ "$agents" = "$MAX_AGENTS" ] && continue
  for rate in $RATES; do
    for side in base iso-recompute; do run_side "n${agents}-${side}-r${rate}" "$agents" "$rate" "$LOW_TASKS" "$side"; done
  done
done
summarize
