#!/bin/bash
# On the GPU machine: one `loom serve --device cuda` (MODEL, default random:llama-8b) with an
# isolated, an activated (aLoRA), a base (ICaRus) and a forked (ForkKV) adapter
# answers 20 concurrent OpenAI completions (4 per model, the base model
# included) over one shared prompt; prints each model's answers and the
# server's per-mode prefix hits and decode batch sizes. Carries .carry/cuda.
# Extra `loom serve` arguments in LOOM_SERVE_ARGS (e.g. "--quantization fp8 --kv-cache-dtype fp8", "-tp 4").
set -u
MODEL=${MODEL:-random:llama-8b}
. "$(dirname "$0")/device_env.sh"
LOOM=/tmp/loom/bin/loom
"$LOOM" make-adapters --model "$MODEL" --adapters 3 --rank 16 --out /tmp/loom/modes > /dev/null 2>&1
"$LOOM" make-adapters --model "$MODEL" --adapters 1 --rank 16 --alora-invocation-text " judge:" \
  --out /tmp/loom/alora > /dev/null 2>&1
LOG="$OUT/serve_modes.log"
"$LOOM" serve --device cuda --model "$MODEL" --port 8123 --kv-cache-bytes 8589934592 \
  --lora iso=/tmp/loom/modes/adapter0:isolated --lora icarus=/tmp/loom/modes/adapter1:base \
  --lora fork=/tmp/loom/modes/adapter2:forked --lora judge=/tmp/loom/alora/adapter0:activated ${LOOM_SERVE_ARGS:-} \
  > "$LOG" 2>&1 &
PID=$!
for i in $(seq 1 240); do curl -sf localhost:8123/health > /dev/null && break; sleep 0.5; done
python3 - <<'PY'
import json, threading, urllib.request
base = json.load(urllib.request.urlopen("http://localhost:8123/v1/models"))["data"][0]["id"]
shared = " ".join(f"w{i % 97}" for i in range(600))
results = {}
def call(model, i):
    prompt = shared + f" question {i}:" + (" judge:" if model == "judge" else "")
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 32, "temperature": 0}).encode()
    request = urllib.request.Request("http://localhost:8123/v1/completions", body, {"Content-Type": "application/json"})
    try:
        answer = json.load(urllib.request.urlopen(request, timeout=300))
        results[(model, i)] = (200, answer["usage"]["completion_tokens"], answer["usage"].get("prompt_tokens"))
    except Exception as error:
        results[(model, i)] = ("error", str(error), None)
threads = [threading.Thread(target=call, args=(m, i)) for m in [base, "iso", "judge", "icarus", "fork"] for i in range(4)]
for t in threads: t.start()
for t in threads: t.join()
for key in sorted(results): print(key, results[key])
bad = [k for k, v in results.items() if v[0] != 200 or v[1] != 32]
print("all 20 answered with 32 tokens" if not bad else f"FAILED: {bad}")
PY
curl -s localhost:8123/metrics | grep -E "^loom_(prefix_cache_(hit|queried)_tokens_total|kv_cache_bytes|decode_batch_size_(sum|count))" | head -24
kill $PID; wait $PID; grep -iE "error|warn" "$LOG" | head -5
