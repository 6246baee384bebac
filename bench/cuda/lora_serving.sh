#!/bin/bash
# On the GPU machine: multi-LoRA decode through the HTTP API (issue 14), the
# 8B shape (random:llama-8b) with 8 random rank-16 adapters on all seven
# projections: output tok/s at STREAMS concurrent completions, the base model
# only against the 8 adapters round-robin, with CUDA graphs (default) and
# with --enforce-eager. Carries .carry/cuda (bench/cuda/pack.sh).
#   bench/cuda/lora_serving.sh            # -> $OUT/lora_serving.jsonl, $OUT/serve_*.log
# STREAMS (64), PROMPT (128), OUTPUT (256), MODES ("graphs eager"), LOOM (another build) from the environment.
set -u
. "$(dirname "$0")/device_env.sh"
LOOM=${LOOM:-/tmp/loom/bin/loom}
[ -d /tmp/loom/adapters/adapter7 ] ||
  "$LOOM" make-adapters --model random:llama-8b --adapters 8 --rank 16 --out /tmp/loom/adapters > "$OUT/make_adapters.log" 2>&1
LORAS=()
for i in 0 1 2 3 4 5 6 7; do LORAS+=(--lora "agent$i=/tmp/loom/adapters/adapter$i"); done
for graphs in ${MODES:-graphs eager}; do
  EXTRA=(); [ "$graphs" = eager ] && EXTRA=(--enforce-eager)
  "$LOOM" serve --device cuda --model random:llama-8b --port 8123 --gpu-memory-fraction 0.85 "${LORAS[@]}" \
    "${EXTRA[@]}" > "$OUT/serve_$graphs.log" 2>&1 &
  PID=$!
  for i in $(seq 1 240); do curl -sf localhost:8123/health > /dev/null && break; sleep 0.5; done
  BASE=$(curl -s localhost:8123/v1/models | python3 -c "import json,sys; print([m['id'] for m in json.load(sys.stdin)['data'] if not m.get('parent')][0])")
  for models in "$BASE" agent0,agent1,agent2,agent3,agent4,agent5,agent6,agent7; do
    label="$graphs $( [ "$models" = "$BASE" ] && echo base || echo lora8)"
    python3 bench/cuda/lora_serving_bench.py --url http://127.0.0.1:8123 --models "$models" \
      --streams "${STREAMS:-64}" --prompt-tokens "${PROMPT:-128}" --output-tokens "${OUTPUT:-256}" \
      --label "$label" --out "$OUT/lora_serving.jsonl" | cut -c1-300
  done
  curl -s localhost:8123/metrics | grep -E "^loom_decode_batch_size_(sum|count)" >> "$OUT/serve_$graphs.log"
  kill $PID; wait $PID
done
python3 - "$OUT/lora_serving.jsonl" <<'PY'
import json, sys
rows = {r["label"]: r["tokens_per_s_best"] for r in map(json.loads, open(sys.argv[1]))}
for mode in ("graphs", "eager"):
    if f"{mode} base" in rows and f"{mode} lora8" in rows:
        print(f"{mode}: base {rows[f'{mode} base']:.0f} tok/s, 8 adapters {rows[f'{mode} lora8']:.0f} tok/s, "
              f"ratio {rows[f'{mode} lora8'] / rows[f'{mode} base']:.3f}")
if "graphs lora8" in rows and "eager lora8" in rows:
    print(f"graphs / eager, 8 adapters: {rows['graphs lora8'] / rows['eager lora8']:.3f}")
PY
