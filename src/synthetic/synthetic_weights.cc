#include "synthetic/synthetic_weights.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "formats/gguf_dequant.h"
#include "util/error.h"
#include "util/half.h"
#include "util/prng.h"
#include "util/progress.h"

namespace loom {

namespace {

// 1 / sqrt(n): one correctly rounded sqrt and one division, the same everywhere.
float inverse_sqrt(int64_t n) { return 1.0f / std::sqrt(static_cast<float>(n)); }

}  // namespace

int64_t SyntheticTensorSpec::numel() const {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

float synthetic_linear_gain(const ModelConfig& config, LoraTarget target) {
  switch (target) {
    case LoraTarget::kQ:
    case LoraTarget::kK: return config.qk_norm ? 1.0f : kAttentionGain;
    case LoraTarget::kO:
    case LoraTarget::kDown: return kResidualGain;
    default: return 1.0f;
  }
}

std::vector<SyntheticTensorSpec> synthetic_base_tensor_specs(const ModelConfig& config) {
  const int64_t hidden = config.hidden_size;
  const int64_t q_size = config.q_size();
  const int64_t kv_size = config.kv_size();
  const int64_t intermediate = config.intermediate_size;
  std::vector<SyntheticTensorSpec> specs;
  auto linear = [&](const std::string& name, int64_t out, int64_t in, LoraTarget target) {
    specs.push_back({name, {out, in}, false, synthetic_linear_gain(config, target) * inverse_sqrt(in)});
  };
  auto norm = [&](const std::string& name, int64_t size, float gain) { specs.push_back({name, {size}, true, gain}); };
  auto bias = [&](const std::string& name, int64_t size) { specs.push_back({name, {size}, false, 0.125f}); };

  // With tied embeddings the input embedding is lm_head, so the final norm
  // carries the gain that makes logits sharp (a power of two: exact).
  const float embedding_scale = inverse_sqrt(hidden);
  specs.push_back({"model.embed_tokens.weight", {config.vocab_size, hidden}, false, embedding_scale});
  if (!config.tie_word_embeddings)
    specs.push_back({"lm_head.weight", {config.vocab_size, hidden}, false, kLogitGain * embedding_scale});
  norm("model.norm.weight", hidden, config.tie_word_embeddings ? kLogitGain : 1.0f);
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const std::string prefix = fmt::format("model.layers.{}.", layer);
    norm(prefix + "input_layernorm.weight", hidden, 1.0f);
    norm(prefix + "post_attention_layernorm.weight", hidden, 1.0f);
    linear(prefix + "self_attn.q_proj.weight", q_size, hidden, LoraTarget::kQ);
    linear(prefix + "self_attn.k_proj.weight", kv_size, hidden, LoraTarget::kK);
    linear(prefix + "self_attn.v_proj.weight", kv_size, hidden, LoraTarget::kV);
    linear(prefix + "self_attn.o_proj.weight", hidden, q_size, LoraTarget::kO);
    if (config.qkv_bias) {
      bias(prefix + "self_attn.q_proj.bias", q_size);
      bias(prefix + "self_attn.k_proj.bias", kv_size);
      bias(prefix + "self_attn.v_proj.bias", kv_size);
    }
    if (config.o_bias) bias(prefix + "self_attn.o_proj.bias", hidden);
    if (config.qk_norm) {
      norm(prefix + "self_attn.q_norm.weight", config.head_dim, kAttentionGain);
      norm(prefix + "self_attn.k_norm.weight", config.head_dim, kAttentionGain);
    }
    linear(prefix + "mlp.gate_proj.weight", intermediate, hidden, LoraTarget::kGate);
    linear(prefix + "mlp.up_proj.weight", intermediate, hidden, LoraTarget::kUp);
    linear(prefix + "mlp.down_proj.weight", hidden, intermediate, LoraTarget::kDown);
  }
  std::sort(specs.begin(), specs.end(),
            [](const SyntheticTensorSpec& a, const SyntheticTensorSpec& b) { return a.name < b.name; });
  return specs;
}

uint64_t synthetic_tensor_seed(uint64_t seed, const std::string& name) {
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a 64
  for (unsigned char c : name) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash ^ (seed * 0x9e3779b97f4a7c15ull);
}

SyntheticValueStream::SyntheticValueStream(const SyntheticTensorSpec& spec, uint64_t seed)
    : prng_(synthetic_tensor_seed(seed, spec.name)), is_norm_(spec.is_norm), scale_(spec.scale) {}

void SyntheticValueStream::next(float* out, int64_t count) {
  if (is_norm_) {
    // u / 8 is exact, so 1 + u / 8 rounds once with or without FMA; then one multiply.
    for (int64_t i = 0; i < count; ++i) {
      const float near_one = 1.0f + prng_.next_symmetric_float() * 0.125f;
      out[i] = near_one * scale_;
    }
  } else {
    for (int64_t i = 0; i < count; ++i) out[i] = prng_.next_symmetric_float() * scale_;
  }
}

Tensor make_synthetic_tensor(const SyntheticTensorSpec& spec, uint64_t seed) {
  std::vector<float> values(spec.numel());
  SyntheticValueStream(spec, seed).next(values.data(), spec.numel());
  return Tensor::from_vector(spec.shape, std::move(values));
}

void write_synthetic_safetensors(const std::string& path, const std::vector<SyntheticTensorSpec>& specs,
                                 uint64_t seed, StoredDtype dtype) {
  if (dtype == StoredDtype::kF16) fail(ErrorKind::kInvalidArgument, "{}: synthetic weights are F32 or BF16", path);
  const uint64_t element_bytes = dtype == StoredDtype::kF32 ? 4 : 2;
  std::vector<const SyntheticTensorSpec*> sorted;
  for (const SyntheticTensorSpec& spec : specs) sorted.push_back(&spec);
  std::sort(sorted.begin(), sorted.end(),
            [](const SyntheticTensorSpec* a, const SyntheticTensorSpec* b) { return a->name < b->name; });

  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const SyntheticTensorSpec* spec : sorted) {
    const uint64_t num_bytes = static_cast<uint64_t>(spec->numel()) * element_bytes;
    header[spec->name] = {{"dtype", dtype == StoredDtype::kF32 ? "F32" : "BF16"},
                          {"shape", spec->shape},
                          {"data_offsets", {offset, offset + num_bytes}}};
    offset += num_bytes;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // data starts 8-aligned (after the u64 length)

  // Written under a temporary name and renamed: a reader may have the old file mapped.
  const std::string temporary_path = path + ".tmp";
  std::ofstream stream(temporary_path, std::ios::binary | std::ios::trunc);
  if (!stream) fail(ErrorKind::kInvalidArgument, "{}: cannot create file", temporary_path);
  uint8_t length_bytes[8];
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<uint8_t>(static_cast<uint64_t>(header_text.size()) >> (8 * i));
  stream.write(reinterpret_cast<const char*>(length_bytes), 8);
  stream.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));

  constexpr int64_t kChunk = 1 << 20;
  std::vector<float> values(kChunk);
  std::vector<uint16_t> halves(kChunk);
  Progress progress("writing " + path, static_cast<int64_t>(offset));
  for (const SyntheticTensorSpec* spec : sorted) {
    SyntheticValueStream values_stream(*spec, seed);
    for (int64_t start = 0; start < spec->numel(); start += kChunk) {
      const int64_t count = std::min(kChunk, spec->numel() - start);
      values_stream.next(values.data(), count);
      if (dtype == StoredDtype::kF32) {
        stream.write(reinterpret_cast<const char*>(values.data()), count * 4);
      } else {
        for (int64_t i = 0; i < count; ++i) halves[i] = float_to_bf16(values[i]);
        stream.write(reinterpret_cast<const char*>(halves.data()), count * 2);
      }
      progress.advance(count * static_cast<int64_t>(element_bytes));
    }
  }
  stream.close();
  if (!stream) fail(ErrorKind::kInvalidArgument, "{}: write failed (disk full?)", temporary_path);
  if (std::rename(temporary_path.c_str(), path.c_str()) != 0)
    fail(ErrorKind::kInvalidArgument, "{}: cannot rename to {}", temporary_path, path);
}

}  // namespace loom
