#!/bin/bash
# Issue 39's CPU rows, on this (build) machine, after bench/quality/device_run.sh on the GPU machine:
#     bench/quality/cpu_rows.sh FETCHED_DIR [FETCHED_DIR...]   # import what the device calls sent, then score
#     bench/quality/cpu_rows.sh                                 # score the adapters imported before
#
# Import: every complete adapters.<stamp>.tar.xz.<k>of<n> set is joined and unpacked into
# .models/quality/ (ignored by git), every quality_results.<stamp>.tar.xz into .models/quality/device/;
# the train.json of each adapter is copied to bench/results/quality/train_<task>_<kind>.json and each
# CUDA report to bench/results/quality/<task>_cuda.json (both to commit).
# Score: bench/quality/eval.py on the CPU, every row of every task whose adapters are here (lora:
# isolated, forked, forked-inherits, base; alora: activated, isolated; icarus: base, isolated; the base
# model), under --cpu-precision fp32 and auto, the SmolLM2 Q4_1 GGUF served by `loom serve`, into
# bench/results/quality/<task>_<precision>.json (an existing complete report with the same adapters and
# held-out count is kept).
#
# Time on the 2-core machine: a decode step of 16 sequences takes ~0.2 s in fp32 (tool_call's base-model
# row: 32 items x 48 tokens in 20 s), so a row of N items costs ~N/16 x (answer tokens + 2) x 0.2 s; the
# five tasks' answers are 14, 22, 20, 1 and 23 tokens. All rows of all tasks, fp32 then auto, cost about
# 380 x N/16 + 150 s: ~21 min at HELDOUT=48 (the default here), ~80 min at the device's 200. The first
# N held-out items are the first N of the CUDA reports' 200 (same order), and each row keeps its per-item
# scores, so CPU and CUDA rows compare item by item.
#
# Environment: HELDOUT (48), PRECISIONS ("fp32 auto"), TASKS (all five), MODEL (the GGUF; default the
# one loom downloads to ~/.cache/loom/models), LOOM_BINARY (build/loom), CONCURRENCY (16), STORE_DIR
# (.models/quality), RESULTS_DIR (bench/results/quality), PYTHON.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
HELDOUT=${HELDOUT:-48}
PRECISIONS=${PRECISIONS:-"fp32 auto"}
TASKS=${TASKS:-"arithmetic extraction sorting labelling tool_call"}
MODEL=${MODEL:-$HOME/.cache/loom/models/SmolLM2-135M-Instruct.Q4_1.gguf}
LOOM=${LOOM_BINARY:-build/loom}
CONCURRENCY=${CONCURRENCY:-16}
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
STORE=${STORE_DIR:-.models/quality}
RESULTS=${RESULTS_DIR:-bench/results/quality}
mkdir -p "$STORE/device" "$RESULTS"

for fetched in "$@"; do  # import
  for first in "$fetched"/adapters.*.tar.xz.0of*; do
    [ -e "$first" ] || continue
    base=${first%.0of*}; n=${first##*of}
    have=$(ls "$base".*of"$n" 2>/dev/null | wc -l)
    if [ "$have" -ne "$n" ]; then echo "import: $base has $have of $n parts: fetch the rest (device_run.sh again)"; continue; fi
    for ((k = 0; k < n; k++)); do cat "$base.${k}of$n"; done | tar xJ -C "$STORE" && echo "import: $(basename "$base") ($n parts)"
  done
  for results in "$fetched"/quality_results.*.tar.xz; do
    [ -e "$results" ] || continue
    stamp=$(basename "$results" .tar.xz); mkdir -p "$STORE/device/$stamp"
    tar xJf "$results" -C "$STORE/device/$stamp" && echo "import: $stamp"
    for train in "$STORE/device/$stamp"/adapters/*/*/train.json; do
      [ -e "$train" ] || continue
      kind=$(basename "$(dirname "$train")"); task=$(basename "$(dirname "$(dirname "$train")")")
      cp "$train" "$RESULTS/train_${task}_$kind.json"
    done
    for report in "$STORE/device/$stamp"/reports/*_cuda.json; do
      [ -e "$report" ] && cp "$report" "$RESULTS/"
    done
    [ -f "$STORE/device/$stamp/logs/device_run.log" ] && cp "$STORE/device/$stamp/logs/device_run.log" "$RESULTS/device_run.${stamp#quality_results.}.log"
  done
done

start=$(date +%s)
for precision in $PRECISIONS; do
  for task in $TASKS; do
    flags=(); have=""
    for kind in lora alora icarus; do
      if [ -f "$STORE/adapters/$task/$kind/adapter_config.json" ]; then
        flags+=(--adapter "$kind=$STORE/adapters/$task/$kind"); have="$have $kind"
      fi
    done
    if [ -z "$have" ]; then echo "score $task: no adapters in $STORE/adapters/$task"; continue; fi
    out=$RESULTS/${task}_$precision.json
    if [ -f "$out" ] && "$PY" -c "
import json, sys
r = json.load(open('$out'))
sys.exit(0 if r.get('complete') and r.get('heldout') == $HELDOUT and sorted(r.get('adapters', {})) == sorted('$have'.split()) else 1)"; then
      echo "score $task $precision: $out is complete"; continue
    fi
    echo "[$(($(date +%s) - start))s] score $task $precision: [$have ] x $HELDOUT items"
    "$PY" bench/quality/eval.py --loom "$LOOM" --model "$MODEL" --task "$task" "${flags[@]}" --cpu-precision "$precision" \
      --heldout "$HELDOUT" --concurrency "$CONCURRENCY" --out "$out" || echo "score $task $precision: FAILED"
  done
done
echo "[$(($(date +%s) - start))s] done"
