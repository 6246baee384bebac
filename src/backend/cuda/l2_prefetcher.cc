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

void L2Prefetcher::after_qkv(const DeviceLayer& layer, cudaStream_t main) {
  if (!active_) return;
  using bf16 = __nv_bfloat16;
  const int64_t hidden = config_.hidden_size, intermediate = config_.intermediate_size;
  const int64_t half = sizes_.gate_up / 2;
  const int64_t gate_bytes = intermediate * hidden * static_cast<int64_t>(sizeof(bf16));
  fork({layer.o_proj, layer.gate_up_proj, layer.gate_up_proj + intermediate * hidden},
       {std::min<int64_t>(sizes_.o_proj, hidden * config_.q_size() * static_cast<int64_t>(sizeof(bf16))),
        std::min(half, gate_bytes), std::min(half, gate_bytes)},
       main);
}

void L2Prefetcher::after_down(const DeviceModel& model, int layer, cudaStream_t main) {
  if (!active_ || sizes_.qkv <= 0) return;
  const bool last = layer + 1 == config_.num_layers;
  const void* next = last ? model.lm_head() : model.layers()[layer + 1].qkv_proj;
  const int64_t rows = last ? config_.vocab_size : config_.q_size() + 2 * config_.kv_size();
  fork({next, nullptr, nullptr},
       {std::min<int64_t>(sizes_.qkv, rows * config_.hidden_size * static_cast<int64_t>(sizeof(__nv_bfloat16))), 0, 0},
       main);
}

void L2Prefetcher::end_step(cudaStream_t main) {
  if (!forked_) return;
  LOOM_CUDA_CHECK(cudaEventRecord(join_, stream_));
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(main, join_, 0));
  forked_ = false;
}

}  // namespace loom::cuda
