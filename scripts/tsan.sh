#!/usr/bin/env bash
# ThreadSanitizer run of the engine and server tests: builds them into
# build-tsan with -fsanitize=thread (no CUDA, no benchmarks) and runs the unit
# tests of the engine, scheduler, KV transfers, workflows, HTTP transport and
# server, then the black-box HTTP tests against a TSan-built `loom serve`.
# Called as `scripts/test.sh tsan`; not part of CI (slow).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${LOOM_TSAN_BUILD_DIR:-build-tsan}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_CUDA=OFF -DLOOM_BUILD_BENCH=OFF \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" >/dev/null
fi
mapfile -t targets < <(ls tests/unit/*_test.cc | xargs -n1 basename | sed 's/\.cc$//' |
                       grep -E '^(engine|scheduler|kv_transfer|workflow|http|server)')
cmake --build "$BUILD_DIR" -j "$(nproc)" --target loom "${targets[@]}"
# libgomp and OpenBLAS are not instrumented: one thread each keeps their
# internals out of the reports (Loom's own threads are what is checked).
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export TSAN_OPTIONS="halt_on_error=1 abort_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
failed=()
for target in "${targets[@]}"; do
  echo "== $target"
  "$BUILD_DIR/$target" --gtest_brief=1 || failed+=("$target")
done
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" -R '^python_test_(openai_api|api_key|workflows)$' "$@" ||
  failed+=(python)
if [ ${#failed[@]} -gt 0 ]; then echo "tsan: FAILED: ${failed[*]}"; exit 1; fi
echo "tsan: every test passed with no report"
