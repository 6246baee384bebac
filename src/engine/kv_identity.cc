#include "engine/kv_identity.h"

#include <algorithm>
#include <cstddef>
#include <vector>

#include <fmt/format.h>

namespace loom {

namespace {

constexpr int64_t kSampleFloats = 16384;  // 64 KiB

// Adds a tensor's name, shape and sampled data to `parts`.
void add_tensor(std::vector<KvBlockHash>& parts, const std::string& name, const Tensor& tensor) {
  std::string head = name;
  for (int64_t dim : tensor.shape) head += fmt::format(",{}", dim);
  parts.push_back(hash_string(head));
  if (tensor.empty()) return;
  if (tensor.is_quantized()) {  // the file's bytes: another fingerprint than the fp32 model's, as its KV differs
    const int64_t num_bytes = tensor.quantized.row_bytes * tensor.shape[0];
    parts.push_back(hash_string(fmt::format("quantized type {}", tensor.quantized.ggml_type)));
    for (const int64_t start : {int64_t{0}, std::max<int64_t>(0, num_bytes / 2 - kSampleFloats * 2),
                                std::max<int64_t>(0, num_bytes - kSampleFloats * 4)}) {
      const int64_t length = std::min(kSampleFloats * 4, num_bytes - start);
      parts.push_back(hash_bytes(std::as_bytes(std::span<const uint8_t>(tensor.quantized.bytes + start,
                                                                        static_cast<size_t>(length)))));
    }
    const Fp8Scales& fp8 = tensor.quantized.fp8;
    if (tensor.is_fp8() && fp8.rows != nullptr) {  // every row scale (one float a row) and the input scale
      parts.push_back(hash_bytes(std::as_bytes(std::span<const float>(fp8.rows, static_cast<size_t>(tensor.shape[0])))));
      parts.push_back(hash_string(fmt::format("input_scale={}", fp8.input)));
    }
    return;
  }
  const int64_t count = tensor.numel();
  for (const int64_t start : {int64_t{0}, std::max<int64_t>(0, count / 2 - kSampleFloats / 2),
                              std::max<int64_t>(0, count - kSampleFloats)}) {
    const int64_t length = std::min(kSampleFloats, count - start);
    parts.push_back(hash_bytes(std::as_bytes(std::span<const float>(tensor.data + start, static_cast<size_t>(length)))));
  }
}

KvBlockHash combine_all(const std::vector<KvBlockHash>& parts) {
  KvBlockHash hash;
  for (const KvBlockHash& part : parts) hash = hash_combine(hash, part);
  return hash;
}

}  // namespace

KvBlockHash model_fingerprint(const ModelConfig& config, const ModelWeights& weights) {
  std::vector<KvBlockHash> parts;
  parts.push_back(hash_string(fmt::format(
      "arch={} vocab={} hidden={} inter={} layers={} heads={} kv_heads={} head_dim={} eps={} theta={} rope={}/{}/{}/{}/{} "
      "tie={} qkv_bias={} o_bias={} qk_norm={}",
      static_cast<int>(config.arch), config.vocab_size, config.hidden_size, config.intermediate_size, config.num_layers,
      config.num_heads, config.num_kv_heads, config.head_dim, config.rms_norm_eps, config.rope_theta,
      static_cast<int>(config.rope_scaling.type), config.rope_scaling.factor, config.rope_scaling.low_freq_factor,
      config.rope_scaling.high_freq_factor, config.rope_scaling.original_max_position_embeddings,
      config.tie_word_embeddings, config.qkv_bias, config.o_bias, config.qk_norm)));
  add_tensor(parts, "embed", weights.embed_tokens);
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    const LayerWeights& layer = weights.layers[l];
    const std::pair<const char*, const Tensor*> tensors[] = {
        {"in_norm", &layer.input_norm}, {"q", &layer.q_proj},       {"k", &layer.k_proj},
        {"v", &layer.v_proj},           {"o", &layer.o_proj},       {"qb", &layer.q_bias},
        {"kb", &layer.k_bias},          {"vb", &layer.v_bias},      {"ob", &layer.o_bias},
        {"qn", &layer.q_norm},          {"kn", &layer.k_norm},      {"post_norm", &layer.post_attention_norm},
        {"gate", &layer.gate_proj},     {"up", &layer.up_proj},     {"down", &layer.down_proj}};
    for (const auto& [name, tensor] : tensors) add_tensor(parts, fmt::format("{}.{}", l, name), *tensor);
    if (layer.k_cache_scale > 0.0f || layer.v_cache_scale > 0.0f)  // only where given: other names unchanged
      parts.push_back(hash_string(fmt::format("{}.kv_cache_scales={},{}", l, layer.k_cache_scale, layer.v_cache_scale)));
  }
  add_tensor(parts, "final_norm", weights.final_norm);
  add_tensor(parts, "lm_head", weights.lm_head);
  return combine_all(parts);
}

KvBlockHash model_fingerprint(const LoadedModel& model) {
  if (model.weights) return model_fingerprint(model.config, *model.weights);
  return hash_combine(model_fingerprint(model.config, ModelWeights{}), hash_string("path=" + model.path));
}

KvBlockHash engine_model_identity(const LoadedModel& model, bool fp8_weights) {
  const KvBlockHash fingerprint = model_fingerprint(model);
  return fp8_weights ? hash_combine(fingerprint, hash_string("weights quantized at load: fp8_e4m3")) : fingerprint;
}

KvBlockHash adapter_fingerprint(const LoraAdapter& adapter) {
  std::vector<KvBlockHash> parts;
  for (size_t l = 0; l < adapter.layers.size(); ++l)
    for (size_t target = 0; target < adapter.layers[l].size(); ++target) {
      const std::optional<LoraModuleWeights>& module = adapter.layers[l][target];
      if (!module) continue;
      parts.push_back(hash_string(fmt::format("{}.{} rank={} scale={}", l, target, module->rank, module->scale)));
      add_tensor(parts, "a", module->a);
      add_tensor(parts, "b", module->b);
    }
  return combine_all(parts);
}

std::string kv_cache_layout_spelling(const KvCacheLayoutSpec& layout) {
  std::string text = fmt::format("block_size={} bytes_per_block={}", layout.block_size, layout.bytes_per_block);
  if (layout.tensor_parallel_size > 1) text += fmt::format(" tensor_parallel={}", layout.tensor_parallel_size);
  if (layout.dtype != KvCacheDtype::kAuto) text += fmt::format(" kv_dtype={}", kv_cache_dtype_name(layout.dtype));
  return text;
}

KvBlockHash kv_cache_salt(const KvBlockHash& model, const std::string& layout, const std::string& member) {
  return hash_combine(model, hash_string(layout + "|" + member));
}

}  // namespace loom
