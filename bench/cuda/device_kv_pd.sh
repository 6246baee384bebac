#!/bin/bash
# On nvidia-h200-x2 (carry .carry/cuda from bench/cuda/pack.sh): bench/device_kv_pd.py on the 8B shape,
# PE and the one-engine baseline on cuda:0, the decode engines on cuda:1: TTFT of a PROMPT-token prompt
# (default 32768) through the cuda-ipc device path, the staged path and one engine; then the PE killed
# mid-transfer. Results and logs land in $OUT.
. bench/cuda/device_env.sh
python3 bench/device_kv_pd.py --loom /tmp/loom/bin/loom --model random:llama-8b --pe-device cuda:0 --de-device cuda:1 \
  --prompt-tokens ${PROMPT:-32768} --repeat ${REPEAT:-3} --kill --workdir /tmp/pdw --out $OUT/device_kv_pd.json 2>&1 | tail -20
for f in /tmp/pdw/*.log; do echo "== $f"; grep -iE "error|warn|device KV" $f | grep -v "GET /metrics" | head -6; done
tar cJf $OUT/pd_logs.tar.xz -C /tmp/pdw $(cd /tmp/pdw && ls *.log) 2>/dev/null
