#!/usr/bin/env bash
# Regenerates the golden fixtures: random tiny models from `loom make-model`,
# then transformers + PEFT outputs for them (make_goldens.py).
#
#   LOOM=build/loom PYTHON=/opt/gold/bin/python tools/golden/make_fixtures.sh [OUT]
#
# OUT defaults to tests/fixtures/golden. PYTHON needs torch, transformers >= 5,
# peft >= 0.21 (CPU is enough: about a minute per model on 2 cores). The model
# list here is what tests/unit/synthetic_model_test.cc regenerates and checks
# against the recorded checksums: change both together.
set -euo pipefail
cd "$(dirname "$0")/../.."
LOOM=${LOOM:-build/loom}
PYTHON=${PYTHON:-python3}
OUT=${1:-tests/fixtures/golden}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for arch in llama qwen2 qwen3 mistral; do
  "$LOOM" make-model --arch "$arch" --preset tiny --adapters 4 --out "$work/$arch"
done
"$LOOM" make-model --arch llama --preset tiny --adapters 2 --alora --out "$work/llama_alora"
"$PYTHON" tools/golden/make_goldens.py --out "$OUT" "$work"/llama "$work"/qwen2 "$work"/qwen3 "$work"/mistral \
  "$work"/llama_alora
