#!/bin/bash
# On the GPU machine: long prompts through `loom serve --device cuda` on the 8B
# shape (random:llama-8b), up to the model's 131072-token context (issue 14:
# chunked prefill with bounded workspace). Each prompt (random token ids) gets
# 16 greedy tokens; the time, the GPU memory in use, and /health after each.
# The KV pool is the server's default (0.9 of the GPU); SERVE_EXTRA adds flags.
#   bench/cuda/long_context_check.sh [TOKENS...]   (default 32768 65536 131000)
set -u
. "$(dirname "$0")/device_env.sh"
LOG="$OUT/serve_long.log"
/tmp/loom/bin/loom serve --device cuda --model random:llama-8b --port 8124 \
  ${SERVE_EXTRA:-} > "$LOG" 2>&1 &
PID=$!
for i in $(seq 1 240); do curl -sf localhost:8124/health > /dev/null && break; sleep 0.5; done
for tokens in ${@:-32768 65536 131000}; do
  python3 - "$tokens" <<'PY' | tee -a "$OUT/long_context.jsonl"
import http.client, json, random, sys, time
n = int(sys.argv[1])
rng = random.Random(n)
body = {"model": "random:llama-8b", "prompt": [rng.randrange(300, 20000) for _ in range(n)], "max_tokens": 16,
        "ignore_eos": True, "temperature": 0}
connection = http.client.HTTPConnection("127.0.0.1", 8124, timeout=900)
start = time.perf_counter()
connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
response = connection.getresponse()
data = json.loads(response.read())
wall = time.perf_counter() - start
print(json.dumps({"prompt_tokens": n, "status": response.status, "wall_s": round(wall, 3),
                  "prompt_tokens_per_s": round(n / wall, 1), "usage": data.get("usage"),
                  "error": data.get("error")}))
PY
  nvidia-smi --query-gpu=memory.used --format=csv,noheader | sed 's/^/gpu memory used: /'
  curl -sf localhost:8124/health > /dev/null && echo "health ok" || echo "health FAILED"
done
curl -s localhost:8124/metrics | grep -E "^loom_request_prefill_time_seconds_(sum|count)" 
kill $PID; wait $PID; grep -iE "error|warn" "$LOG" | head -5
