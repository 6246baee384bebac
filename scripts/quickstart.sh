#!/usr/bin/env bash
# Quick start: install what `loom` needs, fetch the built-in default model, build only the `loom` binary (the
# CUDA backend too on a machine with an NVIDIA GPU), then answer a chat prompt with that model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh loom
exec "${LOOM_BUILD_DIR:-build}/loom" generate --prompt "${1:-What are the three primary colors? Answer in one sentence.}" --max-tokens 64
