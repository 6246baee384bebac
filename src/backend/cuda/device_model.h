// The model's weights on the GPU: linear weights in bf16 (q/k/v fused into one
// [q_size + 2 kv_size, hidden] matrix, gate/up into one [2 intermediate, hidden]),
// norms and biases in fp32, all in one allocation.
//
// Built either from host ModelWeights in their stored format (fp32, or 16-bit and
// GGUF block rows kept in the file mapping; weight_upload.h streams them and
// converts on the device) or drawn on the device with `loom make-model`'s per-tensor seeds
// (synthetic/synthetic_weights.h), so a 16 GB model never exists on the host.
// Immutable after construction. Thread: the owning backend's thread.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "backend/cuda/device_buffer.h"
#include "model/config.h"
#include "model/tensor_parallel.h"
#include "model/weights.h"

namespace loom::cuda {

// A linear weight in FP8 (--quantization fp8): e4m3 values, row-major like the
// bf16 matrix, row r times scale[r] (fp32, device memory, one per output channel:
// fused q/k/v and gate/up keep each part's scales exactly).
struct Fp8Matrix {
  const uint8_t* data = nullptr;
  const float* scale = nullptr;
  bool per_channel = false;  // false: every scale[r] is equal (one per-tensor scale)
};

// With FP8 weights the four bf16 linear pointers are null and the *_fp8 ones set.
struct DeviceLayer {
  const __nv_bfloat16* qkv_proj = nullptr;      // [q_size + 2 kv_size, hidden]
  const __nv_bfloat16* o_proj = nullptr;        // [hidden, q_size]
  const __nv_bfloat16* gate_up_proj = nullptr;  // [2 intermediate, hidden]: gate rows, then up rows
  const __nv_bfloat16* down_proj = nullptr;     // [hidden, intermediate]
  const float* input_norm = nullptr;            // [hidden]
  const float* post_attention_norm = nullptr;   // [hidden]
  const float* qkv_bias = nullptr;              // [q_size + 2 kv_size] or null
  const float* o_bias = nullptr;                // [hidden] or null
  const float* q_norm = nullptr;                // [head_dim] or null
  const float* k_norm = nullptr;
  Fp8Matrix qkv_fp8, o_fp8, gate_up_fp8, down_fp8;
};

class DeviceModel {
 public:
  // Copies and converts `weights` (validated by the caller against `config`) onto `device`.
  // An FP8 checkpoint (config.quantization) keeps its e4m3 weights and their scales.
  static DeviceModel upload(const ModelConfig& config, const ModelWeights& weights, int device, cudaStream_t stream);
  // Draws the synthetic model of `config` for `seed` on the device. With
  // round_to_bf16, fp32 tensors (norms, biases) are rounded through bf16 as in
  // make-model's bf16 files (the 8b preset); otherwise they are exact fp32 (tiny).
  // With a shard, `config` is the whole model's and the device holds rank_config()'s
  // model: each tensor's slice (tensor_parallel_slice) drawn in place, nothing else.
  static DeviceModel synthetic(const ModelConfig& config, uint64_t seed, bool round_to_bf16, cudaStream_t stream,
                               const TensorParallelShard* shard = nullptr);

  // Replaces the four linear weights of every layer by FP8 copies with
  // per-channel scales (each row's max|w| / 448) or one per matrix (its max|w| /
  // 448, repeated per row), into a new allocation that holds the rest
  // as it was (embeddings and lm_head stay bf16, as vLLM keeps them); the bf16
  // storage is freed. Needs bf16 + fp8 memory while it runs. Synchronous.
  void convert_to_fp8(const ModelConfig& config, cudaStream_t stream, bool per_channel);
  bool fp8() const { return fp8_; }

  const std::vector<DeviceLayer>& layers() const { return layers_; }
  const __nv_bfloat16* embed_tokens() const { return embed_tokens_; }  // [vocab, hidden]
  const __nv_bfloat16* lm_head() const { return lm_head_; }            // [vocab, hidden]; == embed when tied
  const float* final_norm() const { return final_norm_; }
  const float* inverse_frequencies() const { return inverse_frequencies_; }  // [head_dim / 2]
  int64_t weight_bytes() const { return static_cast<int64_t>(storage_.size()); }
  // A checkpoint's FP8 KV cache scales per layer (LayerWeights::k_cache_scale; host
  // values), empty when it gives none: an FP8 cache then uses 1.0.
  const std::vector<float>& k_cache_scales() const { return k_cache_scales_; }
  const std::vector<float>& v_cache_scales() const { return v_cache_scales_; }

 private:
  DeviceModel() = default;
  void lay_out(const ModelConfig& config, bool tied, bool fp8 = false);
  void upload_fp8_scales(const ModelConfig& config, const ModelWeights& weights, cudaStream_t stream);

  DeviceBuffer storage_;
  std::vector<DeviceLayer> layers_;
  const __nv_bfloat16* embed_tokens_ = nullptr;
  const __nv_bfloat16* lm_head_ = nullptr;
  const float* final_norm_ = nullptr;
  const float* inverse_frequencies_ = nullptr;
  bool fp8_ = false;
  std::vector<float> k_cache_scales_, v_cache_scales_;
};

}  // namespace loom::cuda
