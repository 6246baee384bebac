// Model weights in the Hugging Face layout, as fp32 host tensors (or, loaded
// with LoadOptions::keep_quantized, 2-D ones in their GGUF block format:
// Tensor::quantized, read only by the CPU backend).
//
// Ownership: a Tensor views `data`, which stays valid while `storage` lives;
// storage is either a memory-mapped file (f32 safetensors, used in place) or an
// owned buffer (converted f16/bf16, dequantized GGUF). Tensors are immutable
// after loading, so they are shared freely between threads and backends.
//
// Linear weights keep torch's [out_features, in_features] row-major layout;
// Q and K rows use HF's rotate-half RoPE convention (GGUF files store them
// interleaved and the GGUF loader un-permutes them).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "formats/tensor.h"
#include "model/config.h"

namespace loom {

struct LayerWeights {
  Tensor input_norm;           // [hidden]
  Tensor q_proj, k_proj, v_proj, o_proj;  // [q_size, hidden], [kv_size, hidden] x2, [hidden, q_size]
  Tensor q_bias, k_bias, v_bias, o_bias;  // optional (empty when the config has none)
  Tensor q_norm, k_norm;       // [head_dim], Qwen3 only
  Tensor post_attention_norm;  // [hidden]
  Tensor gate_proj, up_proj;   // [intermediate, hidden]
  Tensor down_proj;            // [hidden, intermediate]
};

struct ModelWeights {
  Tensor embed_tokens;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  Tensor final_norm;    // [hidden]
  Tensor lm_head;       // [vocab, hidden]; shares storage with embed_tokens when tied
};

// Picks the tensors of `config` out of `tensors`, checking every shape.
// Throws Error(kNotFound) for a missing tensor and Error(kFormat) for a shape
// mismatch, naming `source` (the file or directory) and the tensor.
ModelWeights build_model_weights(const ModelConfig& config, const TensorMap& tensors,
                                 const std::string& source);

// Whether any tensor is kept in a block format (Tensor::quantized): such weights
// are for the CPU backend only.
bool has_quantized_tensors(const ModelWeights& weights);

// The inverse, for writers (`loom convert`, `loom make-model`): HF names -> tensors.
TensorMap model_weights_to_tensor_map(const ModelConfig& config, const ModelWeights& weights);

}  // namespace loom
