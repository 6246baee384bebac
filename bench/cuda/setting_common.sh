# Sourced by the issue-42 study scripts (icarus_setting.sh, forkkv_setting.sh,
# kvflow_setting.sh): one device-time budget for the whole script, points run
# in priority order, each its own `loom bench` (and so its own report.json
# under $OUT/$STUDY/NAME), a point the budget no longer covers skipped and
# listed in $OUT/$STUDY/skipped.txt, the last points' windows (--time-limit) shrunk to what is
# left so their reports are still written; pool sizes of the papers' GPUs.
# Env: BUDGET (s of the whole script, default 470: one ~8-minute device call),
# POINTS (space-separated names: run only these), LOOM_BENCH_ARGS (appended to
# every point: e.g. --threads 2 on the CPU).
. "$(dirname "${BASH_SOURCE[0]}")/harness_env.sh"
BUDGET=${BUDGET:-470}
SCRIPT_START=$(date +%s)
mkdir -p "$OUT/$STUDY"
: > "$OUT/$STUDY/skipped.txt"
: > "$OUT/$STUDY/points.txt"

seconds_left() { echo $(( BUDGET - ($(date +%s) - SCRIPT_START) )); }

# wanted NAME: whether POINTS (if set) names it.
wanted() { [ -z "${POINTS:-}" ] || [[ " $POINTS " == *" $1 "* ]]; }

# point NAME MIN_SECONDS WORKLOAD [loom bench args]: runs `loom bench WORKLOAD`
# into $OUT/$STUDY/NAME when POINTS allows it and at least MIN_SECONDS of the
# budget are left; the run is cut at what is left (timeout) so the script ends
# within BUDGET. Records "NAME rc seconds" in points.txt.
point() {
  local name=$1 min=$2 workload=$3
  shift 3
  wanted "$name" || return 0
  local left
  left=$(seconds_left)
  if [ "$left" -lt "$min" ]; then
    echo "$name: skipped ($left s of the budget left, needs ~$min)" | tee -a "$OUT/$STUDY/skipped.txt"
    return 0
  fi
  local began=$(date +%s)
  # Near the end of the budget the point's windows shrink to fit (the harness ends them and still writes its
  # report; the timeout below is the backstop): what is left minus ~30 s of start-up, over its phases.
  # A --warmup-time-limit W keeps its warm-up window: the measured one gets what is left after it.
  local limit="" phases=1 previous="" arg warm_limit=""
  for arg in "$@"; do
    [ "$previous" = --time-limit ] && limit=${arg%.*}
    [ "$previous" = --warmup-tasks ] && phases=2
    [ "$previous" = --warmup-time-limit ] && warm_limit=${arg%.*}
    previous=$arg
  done
  local fit=$(( (left - ${POINT_OVERHEAD:-30}) / phases )) extra=()
  [ -n "$warm_limit" ] && fit=$(( left - ${POINT_OVERHEAD:-30} - warm_limit ))
  [ "$fit" -lt 5 ] && fit=5
  if [ -z "$limit" ] || [ "$limit" -gt "$fit" ]; then extra=(--time-limit "$fit"); fi
  # shellcheck disable=SC2086
  timeout "$left" "$LOOM" bench "$workload" --no-plots --out "$OUT/$STUDY/$name" "$@" "${extra[@]}" \
    ${LOOM_BENCH_ARGS:-} > "$OUT/$STUDY/$name.log" 2>&1
  local rc=$?
  echo "$name $rc $(( $(date +%s) - began ))" | tee -a "$OUT/$STUDY/points.txt"
  [ "$rc" -eq 0 ] || tail -n 5 "$OUT/$STUDY/$name.log"
}

# make_adapters DIR N RANK TARGETS: random PEFT adapters for $MODEL (once per machine).
make_adapters() {
  local dir=$1 count=$2 rank=$3 targets=$4
  [ -f "$dir/adapter$((count - 1))/adapter_config.json" ] && return 0
  local began=$(date +%s)
  "$LOOM" make-adapters --model "$MODEL" --adapters "$count" --rank "$rank" --targets "$targets" --out "$dir" \
    > "$OUT/$STUDY/make_adapters.log" 2>&1 || { cat "$OUT/$STUDY/make_adapters.log"; exit 1; }
  echo "made $count rank-$rank adapters in $(( $(date +%s) - began )) s"
}

# lora_flags DIR N: --lora agentI=DIR/adapterI for I < N, and --max-loras-per-batch.
lora_flags() {
  local dir=$1 count=$2 i
  LORA_FLAGS=(--max-loras-per-batch "$count")
  for ((i = 0; i < count; i++)); do LORA_FLAGS+=(--lora "agent$i=$dir/adapter$i"); done
}

# KV pool a paper's GPU leaves a Llama-3-8B-shaped model (bytes), vLLM's way:
# gpu_memory_utilization x memory - weights - LoRA slots - activations.
#   pool_bytes GPU_MIB UTILIZATION_PERCENT LORA_SLOT_BYTES NUM_SLOTS
# GPU memory as nvidia-smi reports it: A100-SXM4-80GB 81920 MiB, H100 80GB HBM3
# 81559 MiB, L40 46068 MiB, A10G 23028 MiB.
# Llama-3.1-8B: 8,030,261,248 parameters x 2 bytes (bf16) = 16,060,522,496 bytes.
# Activations: 2 GiB assumed (vLLM's profile run at max_num_batched_tokens 8192 plus
# CUDA graphs on an 8B model; the real figure depends on the version).
# WEIGHT_BYTES: the served model's bf16 weights (default Llama-3.1-8B's; icarus_setting.sh SHAPE=qwen3-14b sets
# Qwen3-14B's 14,768,307,200 x 2).
LLAMA8B_WEIGHT_BYTES=16060522496
WEIGHT_BYTES=${WEIGHT_BYTES:-$LLAMA8B_WEIGHT_BYTES}
ACTIVATION_BYTES=$(( 2 * 1024 * 1024 * 1024 ))
pool_bytes() {
  local mib=$1 percent=$2 slot=$3 slots=$4
  echo $(( mib * 1024 * 1024 * percent / 100 - WEIGHT_BYTES - slot * slots - ACTIVATION_BYTES ))
}

# The summary beside the reports: markdown rows with the paper's figures (setting_table.py).
summarize() {
  python3 "$(dirname "${BASH_SOURCE[0]}")/setting_table.py" "$STUDY" "$OUT/$STUDY" > "$OUT/$STUDY/table.md" 2>&1
  cat "$OUT/$STUDY/table.md"
  echo "script: $(( $(date +%s) - SCRIPT_START )) s of a $BUDGET s budget"
  [ -s "$OUT/$STUDY/skipped.txt" ] && { echo "skipped:"; cat "$OUT/$STUDY/skipped.txt"; }
  return 0
}
