#!/bin/bash
# On the GPU machine: how long `loom` takes to put an 8B bf16 checkpoint
# (`loom make-model --preset 8b`, one 16 GB safetensors file) on the GPU, and the
# host memory it holds while loading and while serving, sampled every 50 ms from
# /proc/PID/status: VmRSS (total), RssAnon (anonymous: what the loader and the
# engine allocate) and RssFile (the file mapping's resident pages).
#   bench/cuda/load_check.sh            -> $OUT/load_check.json, $OUT/load_*.log
# The checkpoint is written first (~1-2 min) and is then in the page cache: the
# figures are warm-cache loads (cold ones read at the disk's speed).
set -u
. "$(dirname "$0")/device_env.sh"
LOOM=/tmp/loom/bin/loom
M=/tmp/loom/m8b
if [ ! -f "$M/model.safetensors" ]; then
  start=$(date +%s.%N)
  "$LOOM" make-model --preset 8b --out "$M" > "$OUT/load_make_model.log" 2>&1 || { tail -5 "$OUT/load_make_model.log"; exit 1; }
  echo "make-model 8b: $(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN{printf "%.2f", e - s}') s, $(du -sh "$M" | cut -f1)"
fi

# sample PID LABEL: peaks of VmRSS / RssAnon / RssFile (KiB) until PID exits or $3 seconds pass.
sample() {
  local pid=$1 label=$2 limit=${3:-600} peak_rss=0 peak_anon=0 peak_file=0 t0
  t0=$(date +%s)
  while kill -0 "$pid" 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do
    read -r rss anon file < <(awk '/^VmRSS/{r=$2} /^RssAnon/{a=$2} /^RssFile/{f=$2} END{print r+0, a+0, f+0}' \
      "/proc/$pid/status" 2>/dev/null || echo "0 0 0")
    [ "${rss:-0}" -gt "$peak_rss" ] && peak_rss=$rss
    [ "${anon:-0}" -gt "$peak_anon" ] && peak_anon=$anon
    [ "${file:-0}" -gt "$peak_file" ] && peak_file=$file
    sleep 0.05
  done
  awk -v l="$label" -v r="$peak_rss" -v a="$peak_anon" -v f="$peak_file" \
    'BEGIN{printf "\"%s\": {\"peak_rss_gib\": %.2f, \"peak_anon_gib\": %.2f, \"peak_file_gib\": %.2f}\n", l, r/1048576, a/1048576, f/1048576}'
}

# 1. loom generate: load, one token, exit; twice (the second is the warm figure reported).
for run in 1 2; do
  start=$(date +%s.%N)
  "$LOOM" generate --model "$M" --device cuda --prompt "hello" --max-tokens 1 --ignore-eos > "$OUT/load_generate_$run.log" 2>&1 &
  pid=$!
  mem=$(sample $pid "generate_$run")
  wait $pid; rc=$?
  wall=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN{printf "%.2f", e - s}')
  upload=$(grep -o 'weights read and uploaded in [0-9.]* s ([0-9.]* GiB/s, [0-9]* streams)' "$OUT/load_generate_$run.log")
  echo "generate run $run: rc $rc, wall $wall s, $upload, $mem"
  echo "{$mem, \"wall_s\": $wall, \"rc\": $rc, \"upload\": \"$upload\"}" > "$OUT/load_generate_$run.json"
done

# 2. loom serve: load, then 16 concurrent requests; memory sampled over both.
"$LOOM" serve --model "$M" --device cuda --port 8391 > "$OUT/load_serve.log" 2>&1 &
pid=$!
sample $pid serve 150 > "$OUT/load_serve_mem.txt" &
sampler=$!
for _ in $(seq 1 240); do curl -s localhost:8391/health > /dev/null && break; sleep 0.5; done
name=$(curl -s localhost:8391/v1/models | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
for i in $(seq 1 16); do
  curl -s localhost:8391/v1/completions -H 'Content-Type: application/json' \
    -d "{\"model\": \"$name\", \"prompt\": \"request $i says\", \"max_tokens\": 64, \"ignore_eos\": true}" > /dev/null &
done
wait $(jobs -p | grep -v "^$pid$" | grep -v "^$sampler$") 2>/dev/null
sleep 1
kill -INT $pid; wait $pid; wait $sampler
echo "serve: $(cat "$OUT/load_serve_mem.txt"), $(grep -o 'weights read and uploaded in [^)]*)' "$OUT/load_serve.log")"
{
  echo "{"
  echo "  \"gpu\": \"$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)\","
  echo "  \"checkpoint\": \"loom make-model --preset 8b (Llama-3-8B shapes, bf16, one safetensors file, $(du -sb "$M" | cut -f1) bytes), warm page cache\","
  echo "  \"generate\": [$(cat "$OUT/load_generate_1.json"), $(cat "$OUT/load_generate_2.json")],"
  echo "  $(cat "$OUT/load_serve_mem.txt")"
  echo "}"
} > "$OUT/load_check.json"
cat "$OUT/load_check.json"
