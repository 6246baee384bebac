#!/bin/bash
# On the GPU machine: `loom serve` against llama.cpp's llama-server (CUDA) on the same F16 GGUF of the
# 8B shape (issue 43): batch-1 decode, cold 8K TTFT, output tok/s at 1/16/64 streams, peak host RSS.
# llama.cpp is a peer for measuring only: build it yourself (CUDA) from the llama-cpp-python sdist's
# vendored llama.cpp and pass its binaries; this script builds nothing of it.
#   LLAMA_CPP_BIN=<llama.cpp build>/bin GGUF_PY=<llama.cpp>/gguf-py bash bench/cuda/vs_llama_cpp.sh
# Carries .carry/cuda (bench/cuda/pack.sh). Writes $OUT/serve_bench-vs_llama_cpp.{json,md},
# $OUT/llama_bench.txt, $OUT/loom_decode.json. GGUF (/tmp/m8b.gguf): written once from
# `loom make-model --preset 8b` by bench/serve/hf_to_gguf.py. CONCURRENCY ("1 16 64"), PROMPT (8192),
# OUTPUT (128), SERVERS ("loom llama-server") from the environment.
set -u
. "$(dirname "$0")/device_env.sh"
: "${LLAMA_CPP_BIN:?set LLAMA_CPP_BIN to llama.cpp's bin/ folder}" "${GGUF_PY:?set GGUF_PY to llama.cpp's gguf-py}"
LOOM=${LOOM:-/tmp/loom/bin/loom}
GGUF=${GGUF:-/tmp/m8b.gguf}
if [ ! -s "$GGUF" ]; then
  [ -f /tmp/m8b/config.json ] || "$LOOM" make-model --arch llama --preset 8b --out /tmp/m8b > "$OUT/make_model.log" 2>&1
  PYTHONPATH="$GGUF_PY" python3 bench/serve/hf_to_gguf.py /tmp/m8b "$GGUF.part" && mv "$GGUF.part" "$GGUF" || exit 1
  rm -rf /tmp/m8b
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/env.txt"

# Kernel-level batch-1 figures of each: llama-bench (prefill 8K, decode 128 after it) and Loom's decode step.
timeout 240 "$LLAMA_CPP_BIN/llama-bench" -m "$GGUF" -ngl 99 -fa 1 -p "${PROMPT:-8192}" -n 128 -r 3 \
  > "$OUT/llama_bench.txt" 2>&1; cat "$OUT/llama_bench.txt" | grep -E "^\|"
[ -x /tmp/loom/bin/loom_cuda_bench ] && timeout 200 /tmp/loom/bin/loom_cuda_bench --what decode --out "$OUT/loom_decode.json" \
  > "$OUT/loom_decode.log" 2>&1 && grep -E "batch +1 " "$OUT/loom_decode.log" | head -3

SERVERS_ARGS=()
for server in ${SERVERS:-loom llama-server}; do
  case "$server" in
    loom) SERVERS_ARGS+=(--server "loom=$LOOM serve --device cuda --model $GGUF --port {port} --gpu-memory-fraction 0.8") ;;
    # 64 slots over one unified KV of 64K tokens (each slot may take an 8K prompt), flash attention, all layers on the GPU.
    llama-server) SERVERS_ARGS+=(--server "llama-server=$LLAMA_CPP_BIN/llama-server -m $GGUF --port {port} -ngl 99 -fa on -np 64 -kvu -c 65536 --no-webui") ;;
  esac
done
python3 bench/serve/serve_bench.py --out-dir "$OUT" --tag vs_llama_cpp --startup-timeout 400 \
  --prompt-tokens "${PROMPT:-8192}" --prefix-reps 3 --concurrency ${CONCURRENCY:-1 16 64} \
  --output-tokens "${OUTPUT:-128}" "${SERVERS_ARGS[@]}" 2>&1 | tail -n 40
