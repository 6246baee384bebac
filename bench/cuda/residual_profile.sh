#!/bin/bash
# ResidualAttention decode on the H200 (issue 43, item 3): the sharing figures of
# loom_cuda_bench (decode 64 x 2K, forked vs paged; decode-64 steps), then Nsight
# Compute's sections for the two decode kernels (KERNELS; per-instruction stalls in ncu_sass_NAME.csv,
# summed by opcode and stall reason by ncu_sass_summary.py): speed of light, occupancy, warp states,
# scheduler and pipes, so the gap is placed (memory, issue, latency). Carry
# .carry/cuda (bench/cuda/pack.sh with loom_cuda_bench). Writes into $OUT.
set -u
. "$(dirname "$0")/device_env.sh"
B=/tmp/loom/bin/loom_cuda_bench
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv > "$OUT/env.txt"
timeout "${BENCH_SECONDS:-150}" "$B" --what sharing --iterations 20 --out "$OUT/sharing.json" > "$OUT/sharing.log" 2>&1
grep -E "sharing|decode-64" "$OUT/sharing.log"
[ "${PROFILE:-1}" = 1 ] || exit 0
# KERNELS: NAME=REGEX pairs separated by ';' (the regexes hold spaces and commas): paged decode
# (attention_kernel<128, 1, 0>) and ResidualAttention's (<128, 1, 16>).
KERNELS=${KERNELS:-"paged=attention_kernel<.int.128, .int.1, .int.0, .bool.0>;residual=attention_kernel<.int.128, .int.1, .int.16, .bool.0>"}
IFS=';' read -r -a specs <<< "$KERNELS"
for spec in "${specs[@]}"; do
  name=${spec%%=*}
  regex=${spec#*=}
  timeout "${NCU_SECONDS:-120}" ncu --clock-control none --kernel-name-base demangled \
    -k "regex:$regex" --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section InstructionStats --section SourceCounters -o "$OUT/decode_$name" \
    "$B" --what sharing --iterations 1 > "$OUT/ncu_$name.log" 2>&1
  ncu --import "$OUT/decode_$name.ncu-rep" --page details > "$OUT/ncu_details_$name.txt" 2>&1
  echo "== $name"
  grep -E "Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Warp Cycles Per Issued|Block Limit (Reg|Shared)|Grid Size" \
    "$OUT/ncu_details_$name.txt" | head -20
  ncu --import "$OUT/decode_$name.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_sass_$name.csv" 2>&1
  python3 "$(dirname "$0")/ncu_sass_summary.py" "$OUT/ncu_sass_$name.csv" --json "$OUT/sass_$name.json" | head -16
done
