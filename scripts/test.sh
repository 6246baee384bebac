#!/usr/bin/env bash
# Runs every CPU test (set-up included). GPU tests carry the label "gpu" and run
# on the device machine only: scripts/test.sh gpu there.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# `scripts/test.sh tsan`: the ThreadSanitizer run of the engine and server tests instead.
if [ "${1:-}" = tsan ]; then exec scripts/tsan.sh "${@:2}"; fi
# Tests run in parallel on few cores: spinning OpenMP threads would starve each other.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
ctest --test-dir "${LOOM_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" -L "${1:-cpu}" "${@:2}"
