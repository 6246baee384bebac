#!/bin/bash
# One decode step kernel by kernel against the bandwidth floor (issue 43, item 4): for each batch size
# in BATCHES, Nsight Compute collects each launch's time and DRAM bytes over the start of
# `loom_cuda_bench --what decode` (8B shape, 2K context), and ncu_decode_breakdown.py takes the first
# whole step and ranks its kernels by their time over what their bytes take at the measured copy
# bandwidth (the bench prints it into the same log). Carry .carry/cuda (pack.sh with loom_cuda_bench).
# Writes into $OUT: ncu_bN.csv.xz, breakdown_bN.json / .txt.
#   BATCHES="1 16 64" bash bench/cuda/decode_kernels.sh
set -u
. "$(dirname "$0")/device_env.sh"
B=/tmp/loom/bin/loom_cuda_bench
for batch in ${BATCHES:-1 16 64}; do
  # The weights' synthetic init launches come first; LAUNCHES covers them, a whole step and the next one's start.
  timeout "${NCU_SECONDS:-150}" ncu --cache-control none --clock-control none \
    --metrics gpu__time_duration.sum,dram__bytes.sum --launch-count "${LAUNCHES:-1500}" --csv --page raw \
    "$B" --what decode --batch-sizes "$batch" --iterations 1 > "$OUT/ncu_b$batch.csv" 2> "$OUT/ncu_b$batch.err"
  python3 "$(dirname "$0")/ncu_decode_breakdown.py" "$OUT/ncu_b$batch.csv" --json "$OUT/breakdown_b$batch.json" \
    | tee "$OUT/breakdown_b$batch.txt"
  xz -f "$OUT/ncu_b$batch.csv"
done
