#!/bin/bash
# KVFlow in its own setting (issue 42, item 3; "KVFlow: Efficient Prefix
# Caching for Accelerating LLM-Based Multi-Agent Workflows", §5): the
# 10-agent sequential workflow (`loom bench sequential`: each agent its own
# fixed prompt + fresh dynamic tokens, base model, greedy), on the Llama-3.1-8B
# shape (random:llama-8b), after warm-up passes on the same fixed prompts
# (--steady-state), a host tier of HOST (32G) over the H200's PCIe.
#   single      one workflow, fixed/dynamic/output 8192/32/32 (Fig. 5's largest; the 1.83x over
#               HiCache is on the paper's A10G), pool = what an A10G leaves (SGLang's static memory
#               fraction 0.88 assumed): 23028 MiB x 0.88 - 16,060,522,496 B weights - 2 GiB activations
#               = 3,041,009,008 B (~23K tokens: 2.8 of the 10 fixed prompts); 2 warm-up tasks, TASKS_SINGLE
#               (2) measured: end-to-end workflow latency.
#   concurrent  64 concurrent workflows, 1024/32/32 (Fig. 6's largest concurrency; the 2.19x over
#               HiCache), pool = what an H100-80GB leaves: 81559 MiB x 0.88 - weights - 2 GiB =
#               57,050,306,641 B (~435K tokens; the 640 fixed prompts need ~700K with their tails);
#               a closed loop of 64 workflows, warm-up and measurement each a POINT_LIMIT (40 s)
#               window: throughput as agent calls/s (tasks are too long to count inside a window).
# Two warm-up passes per workflow: the server takes an agent's first prompt as its fixed prefix and
# detects the real one from the second (workflow/fixed_prefix_tracker.h), so the measured passes see
# the steady state. (Before the first-prompt rule, one pass left the first measured pass loading every
# prompt on demand: the "prefetch gap", bench/README.md.)
# Configurations (each its own server), in priority order per setting:
#   hicache          lru + host tier, --host-load-policy blocking, no prefetch   (the paper's "SGLang w/ HiCache")
#   kvflow           workflow eviction + prefetch, background loads              (KVFlow)
#   lru-bg           lru + host tier, background loads (Loom's status-aware admission, no workflow policy)
#   kvflow-blocking  workflow eviction + prefetch, blocking loads
#   lru              lru, no host tier                                           (the paper's "SGLang")
#   peer        KVFlow's PEER-style workflow (Fig. 8; `loom bench peer`: plan -> execute -> express -> review,
#               role prompts sharing a preamble, lengths assumed in bench/harness/loombench/shapes.py),
#               WORKFLOWS_PEER (128, assumed: their 512 fixed prompts, ~1.3K tokens each, then exceed the
#               H100 pool's ~435K) concurrent workflows on the H100 pool, PEER_LIMIT (3 x POINT_LIMIT)
#               windows, agent calls/s; lru, hicache, kvflow. --synthetic-outputs: each output re-enters
#               the next prompt as random words of its token count (a random model's text re-tokenizes
#               to ~10x its tokens, which would swamp the fixed prompts).
#   sweep       the concurrent setting at each of WORKFLOWS_SWEEP ("8 16 32", Fig. 6's other concurrencies;
#               64 is `concurrent`): points sweepN-lru, sweepN-hicache, sweepN-kvflow.
#   peersweep   the PEER-style workflow at each of WORKFLOWS_PEER_SWEEP ("32 64": where the next-to-run
#               agents' prompts fit the pool with room to spare): points peerN-hicache, peerN-kvflow.
# One ~8-minute call (BUDGET 470 s) runs, in this order, single/hicache, single/kvflow,
# concurrent/hicache, concurrent/kvflow, single/lru, concurrent/lru, then the ablations as the
# budget allows (skipped.txt lists what it did not reach). PRESET=single or PRESET=concurrent runs
# one setting's five, PRESET=peer the PEER-style three, PRESET=sweep the concurrency sweep; PRESET=baselines the two lru points alone.
#   bench/cuda/kvflow_setting.sh
# Env: PRESET (both | single | concurrent | baselines | peer | sweep | peersweep), WORKFLOWS_PEER (128),
# WORKFLOWS_PEER_SWEEP, WORKFLOWS_SWEEP, HOST (32G; SGLang's HiCache default, a host pool
# twice the device pool, is HOST=114G for the concurrent setting), POINT_LIMIT (40), WORKFLOWS (64),
# TASKS_SINGLE (2), FIXED_SINGLE (8192), FIXED_CONCURRENT (1024), KV_SINGLE / KV_CONCURRENT
# (override the pools), BUDGET, POINTS.
set -u
STUDY=kvflow
. "$(dirname "$0")/setting_common.sh"
PRESET=${PRESET:-both}
HOST=${HOST:-32G}
POINT_LIMIT=${POINT_LIMIT:-40}
WORKFLOWS=${WORKFLOWS:-64}
WORKFLOWS_PEER=${WORKFLOWS_PEER:-128}
# A PEER workflow's four calls take tens of seconds at 128 workflows: its window holds whole passes.
PEER_LIMIT=${PEER_LIMIT:-$(( 3 * POINT_LIMIT ))}
WORKFLOWS_SWEEP=${WORKFLOWS_SWEEP:-8 16 32}
WORKFLOWS_PEER_SWEEP=${WORKFLOWS_PEER_SWEEP:-32 64}
TASKS_SINGLE=${TASKS_SINGLE:-2}
FIXED_SINGLE=${FIXED_SINGLE:-8192}
FIXED_CONCURRENT=${FIXED_CONCURRENT:-1024}
KV_SINGLE=${KV_SINGLE:-$(pool_bytes 23028 88 0 0)}
KV_CONCURRENT=${KV_CONCURRENT:-$(pool_bytes 81559 88 0 0)}

# cache_flags CONFIG -> CACHE_FLAGS: `loom bench`'s cache presets (configs.py: lru = no host tier; lru+host /
# workflow+prefetch = a host tier of --host-kv-memory, prefetch 0 / 2) and --host-load-policy.
cache_flags() {
  case "$1" in
    hicache) CACHE_FLAGS=(--compare cache=lru+host --compare host_load=blocking) ;;
    kvflow) CACHE_FLAGS=(--compare cache=workflow+prefetch --compare host_load=background) ;;
    lru-bg) CACHE_FLAGS=(--compare cache=lru+host --compare host_load=background) ;;
    kvflow-blocking) CACHE_FLAGS=(--compare cache=workflow+prefetch --compare host_load=blocking) ;;
    lru) CACHE_FLAGS=(--compare cache=lru) ;;
  esac
  CACHE_FLAGS+=(--host-kv-memory "$HOST")  # the harness's: the host tier of the +host presets
}

single() {
  cache_flags "$1"
  point "single-$1" 30 sequential --model "$MODEL" --device "$DEVICE" --kv-cache-bytes "$KV_SINGLE" \
    --fixed-tokens "$FIXED_SINGLE" --dynamic-tokens 32 --output-tokens 32 --workflows 1 --declare-workflows \
    --warmup-tasks 2 --steady-state --num-tasks "$TASKS_SINGLE" --time-limit "$(( POINT_LIMIT * 3 ))" "${CACHE_FLAGS[@]}"
}

concurrent() {  # concurrent CONFIG [WORKFLOWS [NAME]]
  cache_flags "$1"
  local workflows=${2:-$WORKFLOWS}
  point "${3:-concurrent}-$1" 50 sequential --model "$MODEL" --device "$DEVICE" --kv-cache-bytes "$KV_CONCURRENT" \
    --fixed-tokens "$FIXED_CONCURRENT" --dynamic-tokens 32 --output-tokens 32 --workflows "$workflows" \
    --declare-workflows --warmup-tasks "$(( 2 * workflows ))" --steady-state --num-tasks "$(( 4 * workflows ))" \
    --time-limit "$POINT_LIMIT" "${CACHE_FLAGS[@]}"
}

peer() {  # peer CONFIG [WORKFLOWS [NAME]]
  cache_flags "$1"
  local workflows=${2:-$WORKFLOWS_PEER}
  point "${3:-peer}-$1" 50 peer --model "$MODEL" --device "$DEVICE" --kv-cache-bytes "$KV_CONCURRENT" \
    --workflows "$workflows" --declare-workflows --warmup-tasks "$(( 2 * workflows ))" --steady-state \
    --num-tasks "$(( 4 * workflows ))" --time-limit "$PEER_LIMIT" --synthetic-outputs "${CACHE_FLAGS[@]}"
}

# The paper's two baselines first (hicache, lru), then Loom's ablations (lru-bg, kvflow-blocking).
# PRESET=baselines: the points the first H200 run did not reach (the two lru ones) and nothing else.
case "$PRESET" in
  single) for c in hicache kvflow lru lru-bg kvflow-blocking; do single $c; done ;;
  concurrent) for c in hicache kvflow lru lru-bg kvflow-blocking; do concurrent $c; done ;;
  baselines) single lru; concurrent lru ;;
  peer) for c in hicache kvflow lru; do peer $c; done ;;
  sweep) for w in $WORKFLOWS_SWEEP; do for c in hicache kvflow lru; do concurrent $c "$w" "sweep$w"; done; done ;;
  peersweep) for w in $WORKFLOWS_PEER_SWEEP; do for c in hicache kvflow; do peer $c "$w" "peer$w"; done; done ;;
  *)
    single hicache; single kvflow; concurrent hicache; concurrent kvflow
    single lru; concurrent lru
    single lru-bg; single kvflow-blocking; concurrent lru-bg; concurrent kvflow-blocking ;;
esac
summarize
