#!/bin/bash
# On the GPU machine: the cost of structured outputs in serving (issue 16): output tok/s of STREAMS (64)
# concurrent greedy completions on the 8B shape, free against constrained by a regex (masks computed on
# worker threads while the forward runs) and by a JSON schema. Carries .carry/cuda (bench/cuda/pack.sh).
#   bench/cuda/structured_serving.sh      # -> $OUT/structured_serving.jsonl, $OUT/serve_structured.log
set -u
. "$(dirname "$0")/device_env.sh"
/tmp/loom/bin/loom serve --device cuda --model random:llama-8b --port 8125 --gpu-memory-fraction 0.85 \
  > "$OUT/serve_structured.log" 2>&1 &
PID=$!
for i in $(seq 1 240); do curl -sf localhost:8125/health > /dev/null && break; sleep 0.5; done
MODEL=$(curl -s localhost:8125/v1/models | python3 -c "import json,sys; print(json.load(sys.stdin)['data'][0]['id'])")
run() {  # label, extra body
  python3 bench/cuda/lora_serving_bench.py --url http://127.0.0.1:8125 --models "$MODEL" --streams "${STREAMS:-64}" \
    --prompt-tokens 128 --output-tokens "${OUTPUT:-256}" --label "$1" --extra-body "$2" \
    --out "$OUT/structured_serving.jsonl" | cut -c1-400
}
run free '{}'
run regex '{"structured_outputs": {"regex": "[a-z ]*"}}'
run free-again '{}'
run json-schema '{"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}}}, "required": ["items"]}}}}'
curl -s localhost:8125/metrics | grep -E "^loom_decode_batch_size_(sum|count)|^loom_request_success" >> "$OUT/serve_structured.log"
kill $PID; wait $PID
grep -iE "error|warn" "$OUT/serve_structured.log" | head -5
