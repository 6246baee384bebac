#!/bin/bash
set -u
. bench/cuda/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt
timeout 200 /tmp/loom/bin/cuda_backend_test --gtest_filter='CudaResidualAttention.*:CudaSharing*:CudaGraph.*:CudaFp8Kv.*:CudaEngineCapabilities*:CudaForked*' > $OUT/gtest.log 2>&1
echo "gtest rc $?"; grep -E "^\[  (PASSED|FAILED) |FAILED|residual attention \]" $OUT/gtest.log | head -40
mkdir -p $OUT/prof
OUT=$OUT/prof KERNELS="residual=attention_kernel<.int.128, .int.1, .int.16, .bool.0>" bash bench/cuda/residual_profile.sh
OUT=$OUT PRESET="react:32:1:warm" POINTS="react-32k-w1-warm-forked" BUDGET=200 bash bench/cuda/forkkv_setting.sh > $OUT/forkkv.log 2>&1
tail -5 $OUT/forkkv.log
cd $OUT && tar cJf /tmp/all.tar.xz . ; find . -mindepth 1 -delete; mv /tmp/all.tar.xz .
