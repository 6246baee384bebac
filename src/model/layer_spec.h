// The decoder layer, described once for every backend. The architectures Loom
// runs (Llama, Mistral, Qwen2, Qwen3) share one pre-norm block:
//
//   a = rms_norm(x) * input_norm
//   q, k, v = split(a W_qkv^T [+ qkv_bias])           per head: q, k = rms_norm(q, k) * q/k_norm [qk_norm]
//   q, k = rope(q, k, position); the KV cache takes k, v
//   x = x + attention(q, K, V) W_o^T [+ o_bias]
//   b = rms_norm(x) * post_attention_norm
//   x = x + (silu(b W_gate^T) * (b W_up^T)) W_down^T
//
// with each projection's LoRA delta added to its output. An architecture is the
// set of optional parts in brackets; the backends run the block from a
// LayerSpec and never read ModelConfig::arch, so a new part is added here and
// then to each backend's layer (the CPU backend's attention_block / mlp_block,
// the CUDA backend's LayerRunner). A tensor-parallel rank runs the same block
// over its share of the heads and of the intermediate size.
#pragma once

#include <cstdint>

#include "model/config.h"

namespace loom {

struct LayerSpec {
  int32_t hidden_size = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t intermediate_size = 0;
  float rms_norm_eps = 1e-6f;
  bool qkv_bias = false;  // biases on the q/k/v projections (Qwen2; Llama with attention_bias)
  bool o_bias = false;    // a bias on o_proj (Llama with attention_bias)
  bool qk_norm = false;   // RMSNorm over head_dim on q and k before RoPE (Qwen3)

  int32_t q_size() const { return num_heads * head_dim; }
  int32_t kv_size() const { return num_kv_heads * head_dim; }
};

LayerSpec layer_spec(const ModelConfig& config);

}  // namespace loom
