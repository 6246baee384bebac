#!/bin/bash
# On the GPU machine: the KV host tier (issue 5) with --device cuda. The 8B
# shape (random bf16 weights) gets a device KV pool of ~7K tokens and an 8 GB
# host tier; prompts A, B, C of 3000 tokens push A's blocks to the host, then A
# again must load them back (loaded tokens > 0, cached prompt tokens > 0) and
# give the same greedy tokens as the first time.
# Carries .carry/cuda, as run_device.sh does.
set -u
. "$(dirname "$0")/device_env.sh"
LOG="$OUT/serve_host_tier.log"
/tmp/loom/bin/loom serve --device cuda --model random:llama-8b --port 8124 --kv-cache-bytes 1000000000 \
  --host-kv-memory 8G > "$LOG" 2>&1 &
PID=$!
for i in $(seq 1 240); do curl -sf localhost:8124/health > /dev/null && break; sleep 0.5; done
python3 - <<'EOF' | tee "$OUT/host_tier_check.txt"
import json, time, urllib.request
def post(prompt):
    body = json.dumps({"model": "random:llama-8b", "prompt": prompt, "max_tokens": 16, "temperature": 0}).encode()
    request = urllib.request.Request("http://localhost:8124/v1/completions", body, {"Content-Type": "application/json"})
    start = time.time()
    answer = json.load(urllib.request.urlopen(request, timeout=120))
    usage = answer.get("usage", {})
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return answer["choices"][0]["text"], cached, time.time() - start
def metric(name):
    text = urllib.request.urlopen("http://localhost:8124/metrics").read().decode()
    return [line for line in text.splitlines() if line.startswith(name)]
prompts = {k: [(seed * 7919 + i * 104729) % 120000 + 100 for i in range(3000)] for k, seed in (("A", 1), ("B", 2), ("C", 3))}
first, cached, seconds = post(prompts["A"]); print("A", cached, f"{seconds:.3f}s")
for k in ("B", "C"):
    _, cached, seconds = post(prompts[k]); print(k, cached, f"{seconds:.3f}s")
time.sleep(0.5)
again, cached, seconds = post(prompts["A"]); print("A again", cached, f"{seconds:.3f}s")
print("same greedy tokens:", first == again)
for name in ("loom_offloaded_tokens_total", "loom_loaded_tokens_total", "loom_evicted_tokens_total",
             "loom_kv_transfer_failures_total", "loom_prefix_cache_hit_tokens_total ", "loom_kv_cache_bytes{tier=\"host\"", "loom_kv_load_wait_seconds_sum"):
    print("\n".join(metric(name)))
EOF
kill $PID; wait $PID; tail -3 "$LOG"
