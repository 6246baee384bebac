#!/usr/bin/env bash
# Runs `loom divergence` on the default model (SmolLM2-135M) with 4 random
# rank-16 adapters and writes bench/divergence/results/NAME.{txt,json}.
# Usage: [RELATIVE_NORM=0.1] bench/divergence/run.sh [LOOM_BINARY [NAME [more loom divergence flags...]]]
#   NAME defaults to "divergence"; e.g. RELATIVE_NORM=0.05 run.sh build/loom rel0.05
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
loom="${1:-$here/../../build/loom}"
name="${2:-divergence}"
shift $(( $# < 2 ? $# : 2 ))
mkdir -p "$here/results"
# Passive OpenMP waiting: on a shared (oversubscribed) CPU, spinning threads
# make every parallel region wait for a descheduled peer (2x slower here).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"
set -x
time "$loom" divergence --adapters 4 --rank 16 --alpha 32 --relative-norm "${RELATIVE_NORM:-0.1}" --seed 0 \
  --context-tokens 256 --suffix-tokens 32 --generate 32 --prompts-per-adapter 1 \
  --out "$here/results/$name.json" "$@" | tee "$here/results/$name.txt"
