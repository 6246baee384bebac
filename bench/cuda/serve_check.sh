#!/bin/bash
# On the GPU machine: `loom serve --device cuda` answers the OpenAI API.
#   bench/cuda/serve_check.sh random   # --model random:llama-8b (8B shape, random bf16 built on the GPU)
#   bench/cuda/serve_check.sh smol     # the default SmolLM2 GGUF, reassembled from .carry/smol_{a,b}
# SERVE_EXTRA="--host-kv-memory 4G ..." adds serve flags (e.g. the KV host tier, issue 5).
# Carries .carry/cuda (and .carry/smol_a, then .carry/smol_b for smol), as run_device.sh does.
set -u
MODE=${1:-random}
. "$(dirname "$0")/device_env.sh"
case "$MODE" in
  random) MODEL=random:llama-8b; PROMPT='"prompt": [1, 2, 3, 4, 5, 6, 7, 8]' ;;
  smol) cat /tmp/loom/smol_a .carry/smol_b/part > /tmp/loom/smol.gguf; MODEL=/tmp/loom/smol.gguf
        PROMPT='"messages": [{"role": "user", "content": "What is the capital of France?"}]' ;;
esac
LOG="$OUT/serve_$MODE.log"
/tmp/loom/bin/loom serve --device cuda --model "$MODEL" --port 8123 --gpu-memory-fraction 0.85 ${SERVE_EXTRA:-} > "$LOG" 2>&1 &
PID=$!
for i in $(seq 1 240); do curl -sf localhost:8123/health > /dev/null && break; sleep 0.5; done
curl -s localhost:8123/v1/models | tee "$OUT/models_$MODE.json"; echo
if [ "$MODE" = smol ]; then URL=localhost:8123/v1/chat/completions; else URL=localhost:8123/v1/completions; fi
for i in 1 2; do
  /usr/bin/time -f "request %e s" curl -s "$URL" -H 'Content-Type: application/json' \
    -d "{\"model\": \"$(python3 -c "import json;print(json.load(open('$OUT/models_$MODE.json'))['data'][0]['id'])")\", $PROMPT, \"max_tokens\": 32, \"temperature\": 0}" \
    | tee -a "$OUT/completion_$MODE.json"; echo
done
# Sampled on the device (temperature / top-k / top-p, seeded): the same seed twice gives the same text.
for i in 1 2; do
  curl -s "$URL" -H 'Content-Type: application/json' \
    -d "{\"model\": \"$(python3 -c "import json;print(json.load(open('$OUT/models_$MODE.json'))['data'][0]['id'])")\", $PROMPT, \"max_tokens\": 24, \"temperature\": 0.8, \"top_k\": 40, \"top_p\": 0.9, \"seed\": 7}" \
    | tee -a "$OUT/completion_sampled_$MODE.json"; echo
done
curl -s localhost:8123/metrics | grep -E "^loom_(num_requests|kv_cache_bytes|time_to_first_token_seconds_(sum|count)|offloaded|loaded|kv_transfer)" | head -20
kill $PID; wait $PID; tail -5 "$LOG"
