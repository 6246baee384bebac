// CudaTuning::l2_prefetch: in captured steps of few rows, weights the next
// kernels read are pulled into L2 on a side stream while latency-bound kernels
// (attention, norms) run. Owns the side stream and its events; a step that
// forked must join (end_step) before it ends, so that a capture is closed.
//
// Thread: the engine thread.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_model.h"
#include "model/config.h"

namespace loom::cuda {

class L2Prefetcher {
 public:
  // `sizes`: the backend's tuning, which outlives the prefetcher (read at each step).
  L2Prefetcher(const ModelConfig& config, const CudaTuning::L2Prefetch& sizes);
  ~L2Prefetcher();
  L2Prefetcher(const L2Prefetcher&) = delete;
  L2Prefetcher& operator=(const L2Prefetcher&) = delete;

  // Decides whether this step prefetches: it is being captured on `main` and has at most max_rows rows.
  void begin_step(cudaStream_t main, int32_t rows);
  // After layer's q/k/v GEMM: o_proj's weight and the first gate/up bytes.
  void after_qkv(const DeviceLayer& layer, cudaStream_t main);
  // After layer's down GEMM: the next q/k/v weight's first bytes (the lm_head's after the last layer).
  void after_down(const DeviceModel& model, int layer, cudaStream_t main);
  // Makes `main` wait for what this step forked.
  void end_step(cudaStream_t main);

 private:
  void fork(const void* const (&begins)[3], const int64_t (&bytes)[3], cudaStream_t main);

  const ModelConfig config_;
  const CudaTuning::L2Prefetch& sizes_;
  bool active_ = false;  // this step prefetches
  bool forked_ = false;  // this step launched a prefetch
  cudaStream_t stream_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
};

}  // namespace loom::cuda
