#!/bin/bash
# On the 2-GPU machine (device tool, kind nvidia-h200-x2, carry .carry after bench/cuda/pack.sh): the NCCL
# plane's tests, the KV link bench, NCCL's peak, then the DualPath replay
# with PE on cuda:0 and DE on cuda:1 (issue 20). Env: SKIP_CHECKS, CHECKS_ONLY, DP_AGENTS, DP_TURNS,
# DP_CONTEXT, DP_GEN, DP_BW, DP_EXTRA, DP_POLICIES, DP_TIMEOUT. Results and logs land in $OUT.
. bench/cuda/device_env.sh
export NCCL_NVLS_ENABLE=0
nvidia-smi -L | tee $OUT/gpu.txt; nvidia-smi topo -m 2>&1 | head -6 | tee $OUT/topo.txt
echo "LOOM_NCCL_LIBRARY=$LOOM_NCCL_LIBRARY"
B=/tmp/loom/bin
if [ -z "${SKIP_CHECKS:-}" ]; then
NCCL_DEBUG=INFO timeout 120 $B/cuda_backend_test --gtest_filter='CudaKvNccl*' > $OUT/nccl_test.log 2>&1; echo "test rc=$?"
grep -E "^\[ +(OK|FAILED|SKIPPED) |PASSED|via |NCCL version" $OUT/nccl_test.log | head -12
timeout 120 $B/loom_kv_link_bench --planes tcp,nccl --blocks 512 --repeat 5 --out $OUT/kv_link.json 2>&1 | grep -v "^\[20" | tail -4
timeout 120 python3 bench/nccl_peak.py --bytes 1073741824 --out $OUT/nccl_peak.json 2>&1 | tail -8
fi
[ -n "${CHECKS_ONLY:-}" ] && exit 0
time $B/loom make-model --arch llama --preset 8b --out /tmp/m8b > $OUT/make.log 2>&1
ARGS="--kv-cache-bytes 4G --host-kv-memory 6G ${DP_EXTRA:-}"
timeout ${DP_TIMEOUT:-470} python3 bench/dualpath_replay.py --loom $B/loom --model /tmp/m8b --pe-device cuda:0 --de-device cuda:1 \
  --engine-args "$ARGS" --role-args "--kv-transfer-backend nccl" --read-bandwidth ${DP_BW:-1G} --kv-buffer-bytes 8G --disk-kv-bytes 40G \
  --agents ${DP_AGENTS:-32} --turns ${DP_TURNS:-3} --context ${DP_CONTEXT:-4096} --append 64 --gen ${DP_GEN:-16} --vocab 30000 \
  --policies ${DP_POLICIES:-prefill,dual,both} --workdir /tmp/dpw --out $OUT/dualpath_2gpu.json > $OUT/dp.log 2>&1
echo "replay rc=$?"
python3 - <<'PY'
import json, os
try:
    r = json.load(open(os.environ["OUT"] + "/dualpath_2gpu.json"))
    for run in r["runs"]:
        print(run["policy"], "req/s %.3f" % run["requests_per_second"], "ttft p50/p95 %.3f/%.3f" % (run["ttft_p50"], run["ttft_p95"]),
              "tpot p50 %.4f" % run["tpot_p50"], "hit %.2f" % run["engine_hit_rate"], "paths", run["paths"],
              "pe->de GB %.2f de->pe GB %.2f chan GB %.2f link s %.1f" % (run["pe_to_de_bytes"] / 1e9, run["de_to_pe_bytes"] / 1e9, run["channel_bytes"] / 1e9, run["link_seconds"]))
except Exception as e:
    print("no report:", e)
PY
tail -5 $OUT/dp.log
for f in /tmp/dpw/*.log; do echo "== $f"; grep -iE "error|warn|NCCL" $f | grep -v "GET /metrics" | head -4; done
tar cJf $OUT/replay_logs.tar.xz -C /tmp/dpw $(cd /tmp/dpw && ls *.log) 2>/dev/null  # one file: few come back
free -g | head -2
