#include "backend/cuda/l2_prefetcher.h"

#include <algorithm>

#include <cuda_bf16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace loom::cuda {

L2Prefetcher::L2Prefetcher(const ModelConfig& config, const CudaTuning::L2Prefetch& sizes)
    : config_(config), sizes_(sizes) {
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
}

L2Prefetcher::~L2Prefetcher() {
  cudaEventDestroy(fork_);
  cudaEventDestroy(join_);
  cudaStreamDestroy(stream_);
}

void L2Prefetcher::begin_step(cudaStream_t main, int32_t rows) {
  // Eager steps leave it out: two more API calls a layer cost more host time than the overlap saves.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  LOOM_CUDA_CHECK(cudaStreamIsCapturing(main, &capture));
  active_ = capture != cudaStreamCaptureStatusNone && rows <= sizes_.max_rows &&
            (sizes_.o_proj > 0 || sizes_.gate_up > 0 || sizes_.qkv > 0);
}

void L2Prefetcher::fork(const void* const (&begins)[3], const int64_t (&bytes)[3], cudaStream_t main) {
  L2PrefetchRanges ranges;
  for (int i = 0; i < 3; ++i) ranges.range[i] = {begins[i], bytes[i]};
  LOOM_CUDA_CHECK(cudaEventRecord(fork_, main));
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream_, fork_, 0));
  launch_prefetch_l2(ranges, stream_);
  forked_ = true;
}

// FP8 weights (DeviceModel::fp8) are read at one byte a value, bf16 at two.
void L2Prefetcher::after_qkv(const DeviceLayer& layer, cudaStream_t main) {
  if (!active_) return;
  const bool fp8 = layer.o_fp8.data != nullptr;
  const int64_t element = fp8 ? 1 : static_cast<int64_t>(sizeof(__nv_bfloat16));
  const auto* o = fp8 ? layer.o_fp8.data : reinterpret_cast<const uint8_t*>(layer.o_proj);
  const auto* gate_up = fp8 ? layer.gate_up_fp8.data : reinterpret_cast<const uint8_t*>(layer.gate_up_proj);
  const int64_t hidden = config_.hidden_size, intermediate = config_.intermediate_size;
  const int64_t half = sizes_.gate_up / 2;
  const int64_t gate_bytes = intermediate * hidden * element;
  fork({o, gate_up, gate_up + gate_bytes},
       {std::min<int64_t>(sizes_.o_proj, hidden * config_.q_size() * element), std::min(half, gate_bytes),
        std::min(half, gate_bytes)},
       main);
}

void L2Prefetcher::after_down(const DeviceModel& model, int layer, cudaStream_t main) {
  if (!active_ || sizes_.qkv <= 0) return;
  const bool last = layer + 1 == config_.num_layers;
  const bool fp8 = !last && model.fp8();
  const void* next = last ? static_cast<const void*>(model.lm_head())
                          : fp8 ? static_cast<const void*>(model.layers()[layer + 1].qkv_fp8.data)
                                : static_cast<const void*>(model.layers()[layer + 1].qkv_proj);
  const int64_t rows = last ? config_.vocab_size : config_.q_size() + 2 * config_.kv_size();
  const int64_t element = fp8 ? 1 : static_cast<int64_t>(sizeof(__nv_bfloat16));
  fork({next, nullptr, nullptr}, {std::min<int64_t>(sizes_.qkv, rows * config_.hidden_size * element), 0, 0}, main);
}

void L2Prefetcher::end_step(cudaStream_t main) {
  if (!forked_) return;
  LOOM_CUDA_CHECK(cudaEventRecord(join_, stream_));
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(main, join_, 0));
  forked_ = false;
}

}  // namespace loom::cuda
