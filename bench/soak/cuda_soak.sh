#!/bin/bash
# On the GPU machine (the `run` tool), from the package bench/cuda/pack.sh carried in .carry/cuda:
#   bench/soak/cuda_soak.sh LABEL SECONDS WARMUP [soak.py options] [-- extra loom serve flags]
# One soak (bench/soak/soak.py) of `loom serve --device cuda` on the tiny Llama with four adapters, one per
# sharing mode (activated, base, forked, isolated), 64 clients, the small pools of issue 35's soak (a 6 MB
# device KV pool and a 16 MB host tier, so eviction and the host tier stay busy). Writes
# $OUT/soak_LABEL.json and $OUT/soak_LABEL.log; exits with the soak's status.
set -u
LABEL=$1 SECONDS_=$2 WARMUP=$3
shift 3
soak_args=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do soak_args+=("$1"); shift; done
[ $# -gt 0 ] && shift
. "$(dirname "$0")/../cuda/device_env.sh"
L=/tmp/loom/bin/loom
M=/tmp/loom/soak-model
[ -d "$M" ] || "$L" make-model --arch llama --preset tiny --adapters 4 --alora --out "$M" > /dev/null
PYTHONUNBUFFERED=1 python3 "$(dirname "$0")/soak.py" --loom "$L" --model "$M" --device cuda --clients 64 \
  --seconds "$SECONDS_" --warmup "$WARMUP" --sample-every 5 --out "$OUT/soak_$LABEL.json" "${soak_args[@]}" -- \
  --kv-cache-bytes 6000000 --host-kv-memory 16000000 --max-lora-rank 16 "$@" > "$OUT/soak_$LABEL.log" 2>&1
status=$?
grep -v "^soak: t=" "$OUT/soak_$LABEL.log" | sed "s/^/[$LABEL] /" | tail -5
exit $status
