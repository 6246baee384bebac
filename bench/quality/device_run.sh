#!/bin/bash
# Issue 39 on the GPU machine (one H200): trains every task of tools/train/tasks.py three ways
# (tools/train/train.py --kind lora, alora, icarus; 300 steps of 32, rank 16) several at once, then
# scores each task's adapters with bench/quality/eval.py against `loom serve --device cuda`.
#
# The third call of the SmolLM2 carry: /tmp/loom/smol_a and /tmp/loom/smol_b are there from the first
# two calls, .carry/smol_c/part travels with this one, .carry/cuda/loom_cuda_pkg.tar.xz holds loom
# (bench/cuda/pack.sh). Carry: .carry/cuda .carry/smol_c. Run from the repository root:
#     bash bench/quality/device_run.sh
#
# Time: the whole run ends within BUDGET seconds (default 540; the call's limit is 600): no training
# starts with less than MIN_TRAIN_LEFT seconds left, each is cut at TRAIN_LIMIT (or at the budget), a
# task's CUDA rows start once its three trainings ended, and everything is packed in the last
# PACK_RESERVE seconds. One failing training does not stop the others (its task is scored without it).
# Resumable: the work lives in /tmp/loom/quality, so while the machine is warm a second call with the
# same command (no carry needed) trains and scores only what is missing and sends what was not sent.
#
# $OUT (at most 8 files): quality_results.<stamp>.tar.xz (logs, every train.json, the CUDA reports
# <task>_cuda.json, status) and the adapters not sent before, as one tar.xz split into 16 MB parts
# adapters.<stamp>.tar.xz.<k>of<n> (at most 7 per call; parts over that wait in /tmp/loom/quality/outbox
# for the next call). Rebuild: cat adapters.<stamp>.tar.xz.*of<n> | tar xJ  (bench/quality/cpu_rows.sh
# does it).
#
# Knobs (environment): PARALLEL (trainings at once, default 8), TASKS, KINDS, BUDGET, TRAIN_LIMIT,
# MIN_TRAIN_LEFT, EVAL_MIN_LEFT, PACK_RESERVE, CUDA_MODEL (hf: the bf16 directory the adapters were
# trained on, default; gguf: the Q4_1 file), STEPS (default 300), HELDOUT (default 200). For a dry run
# off the device: LOOM_ROOT (instead of /tmp/loom), PYTHON, EVAL_DEVICE, TRAIN_ARGS, EVAL_ARGS.
set -uo pipefail
START=$(date +%s)
export START
cd "$(dirname "$0")/../.." || exit 1
export REPO=$PWD
export BUDGET=${BUDGET:-540} PARALLEL=${PARALLEL:-8} TRAIN_LIMIT=${TRAIN_LIMIT:-420}
export MIN_TRAIN_LEFT=${MIN_TRAIN_LEFT:-180} EVAL_MIN_LEFT=${EVAL_MIN_LEFT:-75} PACK_RESERVE=${PACK_RESERVE:-50}
export TASKS=${TASKS:-"arithmetic extraction sorting labelling tool_call"} KINDS=${KINDS:-"alora icarus lora"}
export CUDA_MODEL=${CUDA_MODEL:-hf} STEPS=${STEPS:-300} HELDOUT=${HELDOUT:-200}
export ROOT=${LOOM_ROOT:-/tmp/loom} PY=${PYTHON:-python3} EVAL_DEVICE=${EVAL_DEVICE:-cuda}
export TRAIN_ARGS=${TRAIN_ARGS:-} EVAL_ARGS=${EVAL_ARGS:-}
. bench/cuda/device_env.sh
export OUT W=$ROOT/quality LOOM=$ROOT/bin/loom
mkdir -p "$W/adapters" "$W/logs" "$W/reports" "$W/outbox" "$OUT"
rm -rf "$W/status" && mkdir -p "$W/status"  # this call's outcomes; adapters and reports persist
export LOG=$W/logs/device_run.log
export OMP_NUM_THREADS=2 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1

say() { echo "[$(($(date +%s) - START))s] $*" | tee -a "$LOG"; }
left() { echo $((START + BUDGET - PACK_RESERVE - $(date +%s))); }  # seconds before packing must start
export -f say left

say "device_run: tasks [$TASKS] kinds [$KINDS] parallel $PARALLEL budget ${BUDGET}s"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>&1 | tee -a "$LOG"
"$PY" -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)" 2>&1 | tee -a "$LOG"

# The model: GGUF from its three parts, then the HF bf16 directory train.py loads.
if [ ! -s "$ROOT/smol.gguf" ]; then
  third=.carry/smol_c/part; [ -f "$third" ] || third=$ROOT/smol_c
  if [ -f "$ROOT/smol_a" ] && [ -f "$ROOT/smol_b" ] && [ -f "$third" ]; then
    cat "$ROOT/smol_a" "$ROOT/smol_b" "$third" > "$ROOT/smol.gguf.tmp" && mv "$ROOT/smol.gguf.tmp" "$ROOT/smol.gguf"
  else
    say "FATAL: need $ROOT/smol_a, $ROOT/smol_b and .carry/smol_c/part (or $ROOT/smol_c)"; ls -la "$ROOT" .carry 2>&1 | tee -a "$LOG"
  fi
fi
[ "$(head -c 4 "$ROOT/smol.gguf" 2>/dev/null)" = GGUF ] || say "WARNING: $ROOT/smol.gguf does not start with GGUF"
say "gguf: $(stat -c %s "$ROOT/smol.gguf" 2>/dev/null) bytes, md5 $(md5sum < "$ROOT/smol.gguf" 2>/dev/null | cut -c1-32)"
if [ -s $ROOT/smol.gguf ] && [ ! -f $ROOT/smol-hf/config.json ]; then
  rm -rf $ROOT/smol-hf
  timeout 120 "$LOOM" convert $ROOT/smol.gguf $ROOT/smol-hf >> "$LOG" 2>&1 || say "FATAL: loom convert failed"
fi
ls $ROOT/smol-hf 2>&1 | tr '\n' ' ' | tee -a "$LOG"; echo | tee -a "$LOG"
if [ "$CUDA_MODEL" = gguf ]; then export SERVE_MODEL=$ROOT/smol.gguf; else export SERVE_MODEL=$ROOT/smol-hf; fi

train_one() {  # TASK KIND: one training, cut at its time limit; the adapter appears only when whole
  local task=$1 kind=$2 dir=$W/adapters/$1/$2 status=$W/status/$1_$2 limit rc extra=()
  if [ -f "$dir/train.json" ]; then touch "$status.done"; return 0; fi
  limit=$(left)
  if [ ! -f $ROOT/smol-hf/config.json ] || [ "$limit" -lt "$MIN_TRAIN_LEFT" ]; then
    say "train $task $kind: skipped (${limit}s left)"; touch "$status.skipped"; return 0
  fi
  [ "$limit" -gt "$TRAIN_LIMIT" ] && limit=$TRAIN_LIMIT
  [ "$kind" != lora ] && extra=(--skip-base-score)  # the base model's score is the same for every kind
  say "train $task $kind: start (limit ${limit}s)"
  rm -rf "$dir.tmp"; mkdir -p "$(dirname "$dir")"
  timeout -k 10 "$limit" "$PY" tools/train/train.py --model $ROOT/smol-hf --task "$task" --kind "$kind" \
    --out "$dir.tmp" --steps "$STEPS" --heldout "$HELDOUT" "${extra[@]}" $TRAIN_ARGS > "$W/logs/train_${task}_$kind.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && [ -f "$dir.tmp/train.json" ]; then
    rm -f "$dir.tmp/README.md"; mv "$dir.tmp" "$dir"; touch "$status.done"
    say "train $task $kind: done $("$PY" -c "import json; r = json.load(open('$dir/train.json')); print({k: r.get(k) for k in ['train_seconds', 'score_seconds', 'peft_accuracy', 'peft_isolated_accuracy', 'base_accuracy']})")"
  else
    touch "$status.failed"; say "train $task $kind: FAILED rc=$rc: $(tail -c 300 "$W/logs/train_${task}_$kind.log" | tr '\n' ' ')"
  fi
}

eval_task() {  # TASK: its CUDA rows once its trainings ended, with the adapters that exist
  local task=$1 report=$W/reports/$1_cuda.json kind ended limit flags=() have=""
  while :; do
    ended=0
    for kind in $KINDS; do
      ls "$W/status/${task}_$kind".* > /dev/null 2>&1 && ended=$((ended + 1))
    done
    [ "$ended" -eq "$(echo $KINDS | wc -w)" ] && break
    [ "$(left)" -lt "$EVAL_MIN_LEFT" ] && { say "eval $task: no time left (trainings still running)"; return 0; }
    sleep 3
  done
  for kind in lora alora icarus; do
    if [ -f "$W/adapters/$task/$kind/train.json" ]; then flags+=(--adapter "$kind=$W/adapters/$task/$kind"); have="$have $kind"; fi
  done
  if ls "$W/status/${task}_"*.skipped > /dev/null 2>&1; then
    say "eval $task: a training was skipped for time; scored by the next call"; return 0
  fi
  if [ -f "$report" ] && "$PY" -c "
import json, sys
r = json.load(open('$report'))
sys.exit(0 if r.get('complete') and sorted(r.get('adapters', {})) == sorted('$have'.split()) else 1)"; then
    say "eval $task: report complete already"; return 0
  fi
  limit=$(left)
  if [ "$limit" -lt "$EVAL_MIN_LEFT" ]; then say "eval $task: skipped (${limit}s left)"; return 0; fi
  say "eval $task: start with [$have ] on $SERVE_MODEL (limit ${limit}s)"
  timeout -k 20 "$limit" "$PY" bench/quality/eval.py --loom "$LOOM" --model "$SERVE_MODEL" --task "$task" \
    "${flags[@]}" --device "$EVAL_DEVICE" --heldout "$HELDOUT" --concurrency 64 --out "$report" $EVAL_ARGS > "$W/logs/eval_$task.log" 2>&1
  say "eval $task: rc=$? $(grep -c accuracy "$W/logs/eval_$task.log") rows: $(grep -o "^[a-z:. -]* {'accuracy': [0-9.]*" "$W/logs/eval_$task.log" | sed "s/{'accuracy'://" | tr '\n' ';')"
}
export -f train_one eval_task

# Trainings, PARALLEL at once, task by task (a task's rows start as soon as its three adapters are in).
jobs_list=$(for task in $TASKS; do for kind in $KINDS; do echo "$task $kind"; done; done)
echo "$jobs_list" | xargs -P "$PARALLEL" -L 1 bash -c 'train_one "$0" "$1"' &
pool=$!
waiters=()
for task in $TASKS; do eval_task "$task" & waiters+=($!); done
wait "$pool"
say "trainings ended"
for pid in "${waiters[@]}"; do wait "$pid"; done
say "evals ended; packing"
nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>&1 | tee -a "$LOG"

# Pack: adapters not sent yet -> parts in the outbox; up to 7 parts and the results go to $OUT.
stamp=$(date +%s)
fresh=()
for dir in "$W"/adapters/*/*; do
  [ -f "$dir/train.json" ] && [ ! -f "$dir/.sent" ] && fresh+=("${dir#$W/}")
done
if [ ${#fresh[@]} -gt 0 ]; then
  tar -C "$W" -cf - "${fresh[@]}" | xz -T0 -6 > "$W/adapters.$stamp.tar.xz"
  size=$(stat -c %s "$W/adapters.$stamp.tar.xz")
  parts=$(( (size + 15999999) / 16000000 ))
  split -b 16000000 -d -a 1 "$W/adapters.$stamp.tar.xz" "$W/outbox/adapters.$stamp.tar.xz."
  for part in "$W/outbox/adapters.$stamp.tar.xz."[0-9]; do mv "$part" "${part}of$parts"; done
  rm -f "$W/adapters.$stamp.tar.xz"
  for dir in "${fresh[@]}"; do touch "$W/$dir/.sent"; done
  say "adapters packed: ${#fresh[@]} (${fresh[*]}), $size bytes in $parts parts"
fi
sent=0
for part in $(ls "$W/outbox" 2>/dev/null | sort); do
  [ $sent -ge 7 ] && break
  mv "$W/outbox/$part" "$OUT/" && sent=$((sent + 1))
done
say "sent $sent adapter parts; left in $W/outbox for the next call: $(ls "$W/outbox" | wc -l)"
ls "$W/status" | tr '\n' ' ' | tee -a "$LOG"; echo
tar -C "$W" -cJf "$OUT/quality_results.$stamp.tar.xz" logs reports status \
  $(cd "$W" && ls adapters/*/*/train.json 2>/dev/null)
ls -la "$OUT" | tee -a "$LOG"
say "device_run: end"
