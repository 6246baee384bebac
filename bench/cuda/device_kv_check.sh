#!/bin/bash
# On the GPU machine (device tool; carry .carry/cuda from bench/cuda/pack.sh and .carry/wheels, the
# openai client's wheels for the device's Python): the cuda-ipc device KV plane (issue 41).
#   1. loom_ipc_plane_bench: 1 GiB of KV blocks (8B shape) from a PE process's pools into a DE
#      process's, on one GPU, and GPU 0 -> GPU 1 when there are two; every byte checked;
#   2. with two GPUs: NCCL's send/recv peak in the same run (bench/nccl_peak.py);
#   3. tests/python/test_device_kv.py's device-path tests with GPU engines (PE on cuda:0, DE on
#      cuda:$DE_GPU): greedy outputs equal one engine, the device path counted, nothing staged.
# Env: DE_GPU (default 1 with two GPUs, else 0), TESTS (unittest -k filter, default the two device-path tests).
. bench/cuda/device_env.sh
nvidia-smi -L | tee $OUT/gpu.txt; nvidia-smi topo -m 2>&1 | head -6 > $OUT/topo.txt
B=/tmp/loom/bin
GPUS=$(nvidia-smi -L | wc -l)
DE_GPU=${DE_GPU:-$([ "$GPUS" -ge 2 ] && echo 1 || echo 0)}
timeout 120 $B/loom_ipc_plane_bench --pe-device 0 --de-device 0 --out $OUT/ipc_plane_same_gpu.json > $OUT/ipc_same.log 2>&1
echo "same GPU rc=$?"; grep -E '"gb_per_s"|"pe_gb_per_s"|"wrong_blocks"|"ok"' $OUT/ipc_plane_same_gpu.json
if [ "$GPUS" -ge 2 ]; then
  timeout 120 $B/loom_ipc_plane_bench --pe-device 0 --de-device 1 --out $OUT/ipc_plane_2gpu.json > $OUT/ipc_2gpu.log 2>&1
  echo "GPU0->GPU1 rc=$?"; grep -E '"gb_per_s"|"pe_gb_per_s"|"wrong_blocks"|"ok"' $OUT/ipc_plane_2gpu.json
  timeout 120 python3 bench/nccl_peak.py --bytes 1073741824 --out $OUT/nccl_peak.json 2>&1 | tail -4
fi
mkdir -p /tmp/pyx && python3 -m pip install --quiet --no-index --no-deps --target /tmp/pyx .carry/wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/pyx LOOM_BINARY=$B/loom LOOM_TEST_DEVICE=cuda:0 LOOM_TEST_DECODE_DEVICE=cuda:$DE_GPU
export LOOM_TEST_DEVICE_PLANE=cuda-ipc
K=${TESTS:-"test_outputs_equal_one_engine test_with_the_plane_off"}
KARGS=(); for k in $K; do KARGS+=(-k "$k"); done
(cd tests/python && timeout 400 python3 -m unittest -v "${KARGS[@]}" test_device_kv) > $OUT/device_kv_test.log 2>&1
echo "device_kv tests rc=$?"; grep -E "^(test_|Ran|OK|FAILED)|Error|assert" $OUT/device_kv_test.log | head -30
tar cJf $OUT/logs.tar.xz -C $OUT ipc_same.log $(ls $OUT | grep -E '^ipc_2gpu.log$') device_kv_test.log 2>/dev/null
