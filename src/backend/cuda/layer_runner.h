// Enqueues the model's pass of a CUDA step: embedding, the decoder layers, the
// final norm and the lm_head's logits (into StepBuffers::logits), reading the
// step's uploaded plan. The parts it runs on are the backend's; it owns none.
//
// Thread: the engine thread.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_kv_pools.h"
#include "backend/cuda/device_model.h"
#include "backend/cuda/device_plan.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/l2_prefetcher.h"
#include "backend/cuda/lora_launcher.h"
#include "backend/cuda/step_buffers.h"
#include "model/config.h"
#include "model/layer_spec.h"

namespace loom::cuda {

struct StepParts {
  const ModelConfig& config;
  const LayerSpec& layer;  // the decoder layer every layer runs (model/layer_spec.h)
  const CudaTuning& tuning;
  const DeviceModel& model;
  Gemm& gemm;
  const DeviceKvPools& pools;
  LoraLauncher& lora;
  const DevicePlan& plan;
  StepBuffers& buffers;
  L2Prefetcher& prefetcher;
  const CudaRank& rank;  // a tensor-parallel rank sums its partial products through rank.communicator
};

// What differs between steps beyond the plan.
struct StepLaunch {
  cudaStream_t stream = nullptr;
  bool programmatic = false;           // the step's own kernels launch programmatically
  int32_t residual_rank = 0;           // max k/v rank of the forked sequences' adapters
  bool capture_hidden_states = false;  // Batch::capture_hidden_states
  // Batch::kv_layer_listener (an eager step): told after each layer's K/V writes are
  // enqueued, with layer_events[layer] recorded on `stream` right after them.
  KvLayerListener* kv_listener = nullptr;
  cudaEvent_t* layer_events = nullptr;
};

// Kinds of a step's kernels, as bits (the benchmark's CudaMeasureSwitches::skip_kernels).
enum StepKernelBits : uint32_t {
  kSkipNorms = 1,      // the residual adds + RMS norms
  kSkipQkv = 2,        // q/k/v post-processing (bias, norms, RoPE, KV writes)
  kSkipCombine = 4,    // the split-KV combine
  kSkipSwiglu = 8,     // SwiGLU after a cuBLAS gate/up
  kSkipAttention = 16  // attention and its combine
};

class LayerRunner {
 public:
  explicit LayerRunner(const StepParts& parts) : parts_(parts) {}
  // Everything up to the logits of the plan's logit launch rows.
  void enqueue(const StepLaunch& step);

 private:
  // Enqueues one layer; returns its down_proj LoRA delta (nullptr: none), which
  // the next norm adds with the delta buffer.
  const float* run_layer(int layer, const float* previous_lora_delta);
  void attention(int layer);
  // y = x W^T through the skinny kernels for up to CudaTuning::skinny_max_rows rows, cuBLAS otherwise;
  // over `fp8` instead of w when it has data (FP8 weights: larger steps dequantize it to bf16 first).
  void linear(const __nv_bfloat16* x, int32_t m, int32_t k, const __nv_bfloat16* w, int32_t n, void* y, bool y_is_bf16,
              int32_t y_stride, const Fp8Matrix& fp8 = {});
  void capture_hidden_states(int index, const float* lora_delta);
  // A tensor-parallel rank: folds `lora_delta` (nullable) into the partial product in the delta
  // buffer and sums it over the ranks; returns the LoRA delta left to add (nullptr once folded).
  const float* reduce_delta(const float* lora_delta);
  Launch chain() const { return Launch(step_.stream, step_.programmatic); }
  // The benchmark's build: CudaMeasureSwitches::skip_kernels has `bit` (never in serving's).
  bool skipped(uint32_t bit) const;
  template <typename T>
  T* plan_pointer(size_t section) const {
    return parts_.plan.pointer<T>(section);
  }

  StepParts parts_;
  StepLaunch step_;
};

}  // namespace loom::cuda
