// Model weights in the Hugging Face layout, as fp32 host tensors (or, loaded
// with LoadOptions::keep_quantized, 2-D ones in their GGUF block format or
// 16-bit rows: Tensor::quantized, read by the CPU backend and the CUDA upload).
//
// FP8 checkpoints (model/quantization.h, docs/quantization.md): the linear
// weights the config quantizes (q/k/v/o, gate/up/down; never the embedding or
// lm_head) are e4m3 rows viewed in the file mapping (Tensor::is_fp8(),
// whatever LoadOptions says) with their scales attached by
// build_model_weights (Tensor::quantized.fp8, formats/tensor.h):
//   fp8.rows   one fp32 scale per output row, owned by fp8.storage (a
//              per-tensor weight scale repeated over the rows)
//   fp8.input  the static activation scale (ModelConfig::quantization says
//              when there is one), else 0
// so w[r][c] = e4m3(quantized.bytes[r * row_bytes + c]) * fp8.rows[r]. A device
// upload copies bytes and scales as they are; the CPU backend dequantizes them
// to fp32 at load (dequantize_fp8_weights). Invariants after building: every
// scale is finite and > 0, fp8.rows has shape[0] entries, and a weight is FP8
// exactly when the config quantizes its module.
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
  // An FP8 KV cache's scales from the checkpoint (QuantizationScheme::kv_cache_scales;
  // an entry is e4m3(x / scale)); 0 when it gives none (the backend then uses 1.0).
  float k_cache_scale = 0.0f, v_cache_scale = 0.0f;
};

struct ModelWeights {
  Tensor embed_tokens;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  Tensor final_norm;    // [hidden]
  Tensor lm_head;       // [vocab, hidden]; shares storage with embed_tokens when tied
};

// Picks the tensors of `config` out of `tensors`, checking every shape, and
// for an FP8 checkpoint pairs each quantized weight with its weight_scale (and
// input_scale) as above. Throws Error(kNotFound) for a missing tensor (a scale
// included) and Error(kFormat) for a shape mismatch, a scale <= 0 or not
// finite, or a weight stored FP8 where the config says otherwise (and the
// reverse), naming `source` (the file or directory) and the tensor;
// Error(kUnsupported) for an FP8 embedding or lm_head.
ModelWeights build_model_weights(const ModelConfig& config, const TensorMap& tensors,
                                 const std::string& source);

// Whether any tensor is kept in a block format (Tensor::quantized): such weights
// are for the CPU backend only.
bool has_quantized_tensors(const ModelWeights& weights);

// Whether any linear weight is FP8 (an FP8 checkpoint).
bool has_fp8_weights(const ModelWeights& weights);

// `weights` with every FP8 linear weight dequantized to fp32 (to_fp32: e4m3 x
// its row scale); the other tensors shared. The static input scales are
// dropped: the result multiplies unquantized activations (W8A16). Throws
// Error(kFormat) naming the tensor for a NaN byte. The CPU backend's load path.
ModelWeights dequantize_fp8_weights(const ModelWeights& weights);

// The inverse, for writers (`loom convert`, `loom make-model`): HF names -> tensors.
TensorMap model_weights_to_tensor_map(const ModelConfig& config, const ModelWeights& weights);

}  // namespace loom
