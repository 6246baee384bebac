#!/bin/bash
# Issue 39's llama.cpp rows: the same trained LoRA adapters on the same SmolLM2 Q4_1 GGUF, served by
# llama.cpp's llama-server (its own quantized CPU path) beside Loom's CPU rows (bench/quality/cpu_rows.sh):
#     LLAMA_CPP_BIN=<llama.cpp>/build/bin bench/quality/llama_cpp_rows.sh
# For each task whose LoRA adapter is in .models/quality/adapters/<task>/lora: the adapter is written as a
# GGUF LoRA (bench/quality/peft_to_gguf_lora.py; needs `pip install gguf`), one llama-server serves the
# base GGUF with it, and bench/quality/eval.py scores it as an --external row on the first HELDOUT held-out
# items (the same items, token ids and greedy decoding as Loom's rows), beside Loom's base-model row
# (--cpu-precision auto), into bench/results/quality/<task>_llama_cpp.json.
#
# Environment: LLAMA_CPP_BIN (required: the directory with llama-server), HELDOUT (48), TASKS (all five),
# MODEL (the GGUF; default the one loom downloads to ~/.cache/loom/models), LOOM_BINARY (build/loom),
# THREADS (2), CONCURRENCY (16), STORE_DIR (.models/quality), RESULTS_DIR (bench/results/quality), PYTHON.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
: "${LLAMA_CPP_BIN:?set LLAMA_CPP_BIN to the directory holding the llama-server binary of llama.cpp}"
HELDOUT=${HELDOUT:-48}
TASKS=${TASKS:-"arithmetic extraction sorting labelling tool_call"}
MODEL=${MODEL:-$HOME/.cache/loom/models/SmolLM2-135M-Instruct.Q4_1.gguf}
LOOM=${LOOM_BINARY:-build/loom}
THREADS=${THREADS:-2}
CONCURRENCY=${CONCURRENCY:-16}
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
STORE=${STORE_DIR:-.models/quality}
RESULTS=${RESULTS_DIR:-bench/results/quality}
mkdir -p "$STORE/gguf" "$RESULTS"
"$LLAMA_CPP_BIN/llama-server" --version 2>&1 | grep -E "^(version|built)" > "$RESULTS/llama_cpp_version.txt"

server=
trap '[ -n "$server" ] && kill "$server" 2>/dev/null' EXIT
for task in $TASKS; do
  adapter=$STORE/adapters/$task/lora
  [ -f "$adapter/adapter_model.safetensors" ] || { echo "$task: no LoRA adapter in $adapter, skipped"; continue; }
  lora=$STORE/gguf/${task}_lora.gguf
  "$PY" bench/quality/peft_to_gguf_lora.py --base "$MODEL" --adapter "$adapter" --out "$lora" || exit 1
  port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  # One slot per concurrent request, 1K tokens each (prompt + answer fit in a few hundred).
  "$LLAMA_CPP_BIN/llama-server" -m "$MODEL" --lora "$lora" --port "$port" -t "$THREADS" -tb "$THREADS" \
      -np "$CONCURRENCY" -c $((CONCURRENCY * 1024)) --no-webui > "$STORE/gguf/${task}_llama_cpp.server.log" 2>&1 &
  server=$!
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
    kill -0 "$server" 2>/dev/null || { echo "$task: llama-server exited"; tail -5 "$STORE/gguf/${task}_llama_cpp.server.log"; exit 1; }
    sleep 0.2
  done
  "$PY" bench/quality/eval.py --loom "$LOOM" --model "$MODEL" --task "$task" --cpu-precision auto \
      --heldout "$HELDOUT" --concurrency "$CONCURRENCY" \
      --external "llama.cpp, LoRA=http://127.0.0.1:$port" --out "$RESULTS/${task}_llama_cpp.json"
  kill "$server"; wait "$server" 2>/dev/null; server=
done
