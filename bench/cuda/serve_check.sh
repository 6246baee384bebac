#!/bin/bash
# On the GPU machine: `loom serve --device cuda` answers the OpenAI API.
#   bench/cuda/serve_check.sh random   # --model random:llama-8b (8B shape, random bf16 built on the GPU)
#   bench/cuda/serve_check.sh smol     # the default SmolLM2 GGUF, reassembled from .carry/smol_{a,b}
# Needs the package of run_device.sh (.carry/cuda) already unpacked in /tmp/loom.
set -u
MODE=${1:-random}
OUT=${OUT:-/tmp/loom-out}
mkdir -p /tmp/loom "$OUT"
if [ -f .carry/cuda/loom_cuda_pkg.tar.xz ]; then tar xJf .carry/cuda/loom_cuda_pkg.tar.xz -C /tmp/loom; fi
[ -f .carry/smol_a/part ] && cp .carry/smol_a/part /tmp/loom/smol_a
CUBLAS=$(ldconfig -p | awk '/libcublas.so.13 /{print $NF; exit}')
[ -z "$CUBLAS" ] && CUBLAS=$(ls /usr/local/cuda/lib64/libcublas.so.13 /usr/local/cuda/targets/x86_64-linux/lib/libcublas.so.13 2>/dev/null | head -1)
[ -z "$CUBLAS" ] && CUBLAS=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib", "libcublas.so.13"))' 2>/dev/null)
export LD_LIBRARY_PATH=/tmp/loom/lib:$(dirname "${CUBLAS:-/usr/local/cuda/lib64/x}")
case "$MODE" in
  random) MODEL=random:llama-8b; PROMPT='"prompt": [1, 2, 3, 4, 5, 6, 7, 8]' ;;
  smol) cat /tmp/loom/smol_a .carry/smol_b/part > /tmp/loom/smol.gguf; MODEL=/tmp/loom/smol.gguf
        PROMPT='"messages": [{"role": "user", "content": "What is the capital of France?"}]' ;;
esac
LOG="$OUT/serve_$MODE.log"
/tmp/loom/bin/loom serve --device cuda --model "$MODEL" --port 8123 --gpu-memory-fraction 0.85 > "$LOG" 2>&1 &
PID=$!
for i in $(seq 1 240); do curl -sf localhost:8123/health > /dev/null && break; sleep 0.5; done
curl -s localhost:8123/v1/models | tee "$OUT/models_$MODE.json"; echo
if [ "$MODE" = smol ]; then URL=localhost:8123/v1/chat/completions; else URL=localhost:8123/v1/completions; fi
for i in 1 2; do
  /usr/bin/time -f "request %e s" curl -s "$URL" -H 'Content-Type: application/json' \
    -d "{\"model\": \"$(python3 -c "import json;print(json.load(open('$OUT/models_$MODE.json'))['data'][0]['id'])")\", $PROMPT, \"max_tokens\": 32, \"temperature\": 0}" \
    | tee -a "$OUT/completion_$MODE.json"; echo
done
curl -s localhost:8123/metrics | grep -E "^loom_(num_requests|kv_cache_bytes|time_to_first_token_seconds_(sum|count))" | head
kill $PID; wait $PID; tail -5 "$LOG"
