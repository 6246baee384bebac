#!/usr/bin/env bash
# Quick start: set everything up, then answer a chat prompt with the built-in default model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec "${LOOM_BUILD_DIR:-build}/loom" generate --prompt "${1:-What are the three primary colors? Answer in one sentence.}" --max-tokens 64
