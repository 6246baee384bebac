#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time from a COPY of its committed
# seed corpus (new inputs never land in the repository). Exits non-zero on any
# crash, leak, sanitizer report, uncaught exception, timeout or memory blow-up;
# the input that did it is kept in ARTIFACT_DIR and printed as hex.
#
# Usage: run_fuzzer.sh FUZZER_BINARY SEED_CORPUS_DIR ARTIFACT_DIR [extra libFuzzer flags]
# Env:   LOOM_FUZZ_SECONDS (default 30), LOOM_FUZZ_RSS_MB (default 2048).
set -euo pipefail
binary=$(readlink -f "$1") seeds=$(readlink -f "$2") artifacts=$(readlink -m "$3")
shift 3
seconds=${LOOM_FUZZ_SECONDS:-30}
rss_mb=${LOOM_FUZZ_RSS_MB:-2048}

if [ ! -x "$binary" ]; then
  echo "run_fuzzer: $binary is missing: scripts/setup.sh builds the fuzz targets into build-fuzz (needs clang)" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$artifacts"
mkdir -p "$work/corpus" "$artifacts"
if [ -d "$seeds" ]; then cp -R "$seeds"/. "$work/corpus/"; fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# tests/fuzz/<target>.dict (tools/make_fuzz_corpus.py) lists the format's keywords.
dictionary="$(dirname "$(dirname "$seeds")")/$(basename "$seeds").dict"
dict_flag=()
if [ -f "$dictionary" ]; then dict_flag=(-dict="$dictionary"); fi
status=0
(cd "$work" && "$binary" -max_total_time="$seconds" -rss_limit_mb="$rss_mb" -malloc_limit_mb="$rss_mb" \
  -timeout=20 -print_final_stats=1 -artifact_prefix="$artifacts/" "${dict_flag[@]}" "$@" "$work/corpus") || status=$?
if [ "$status" != 0 ]; then
  echo "run_fuzzer: $(basename "$binary") failed (exit $status); reproducer(s) in $artifacts:" >&2
  for file in "$artifacts"/*; do
    [ -f "$file" ] || continue
    echo "--- $file ($(stat -c %s "$file") bytes, first 512 as hex):" >&2
    head -c 512 "$file" | od -An -tx1 >&2
  done
fi
exit "$status"
