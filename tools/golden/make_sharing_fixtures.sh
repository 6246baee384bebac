#!/usr/bin/env bash
# Regenerates the KV sharing goldens (make_sharing_goldens.py): activated (aLoRA)
# on the llama_alora model and base (ICaRus) on the llama and qwen2 models, the
# same `loom make-model` outputs as make_fixtures.sh.
#
#   LOOM=build/loom PYTHON=/opt/gold/bin/python tools/golden/make_sharing_fixtures.sh [OUT]
#
# OUT defaults to tests/fixtures/golden. MODELS=DIR skips `loom make-model` and
# reads DIR/llama_alora, DIR/llama, DIR/qwen2 instead (e.g. models made on
# another machine; the goldens record their checksums either way). About 30 s
# on one core. tests/unit/sharing_golden_test.cc regenerates these models and
# checks the checksums: change both together.
set -euo pipefail
cd "$(dirname "$0")/../.."
LOOM=${LOOM:-build/loom}
PYTHON=${PYTHON:-python3}
OUT=${1:-tests/fixtures/golden}
if [[ -n "${MODELS:-}" ]]; then
  work=$MODELS
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  "$LOOM" make-model --arch llama --preset tiny --adapters 2 --alora --out "$work/llama_alora"
  for arch in llama qwen2; do
    "$LOOM" make-model --arch "$arch" --preset tiny --adapters 4 --out "$work/$arch"
  done
fi
"$PYTHON" tools/golden/make_sharing_goldens.py --out "$OUT" --activated "$work/llama_alora" \
  --base "$work/llama" --base "$work/qwen2"
