#include "formats/gguf_names.h"

#include <cstring>
#include <vector>

#include "util/error.h"

namespace loom {

namespace {

struct NamePair {
  const char* gguf;
  const char* hf;
};

constexpr NamePair kGlobalNames[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

// Suffixes after "blk.N."; the HF name is "model.layers.N." + hf.
constexpr NamePair kLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.bias", "self_attn.o_proj.bias"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};

}  // namespace

std::optional<std::string> gguf_to_hf_tensor_name(const std::string& gguf_name) {
  for (const auto& pair : kGlobalNames)
    if (gguf_name == pair.gguf) return std::string(pair.hf);
  constexpr const char* kPrefix = "blk.";
  if (gguf_name.rfind(kPrefix, 0) != 0) return std::nullopt;
  size_t digits_end = std::strlen(kPrefix);
  while (digits_end < gguf_name.size() && gguf_name[digits_end] >= '0' && gguf_name[digits_end] <= '9')
    ++digits_end;
  if (digits_end == std::strlen(kPrefix) || digits_end >= gguf_name.size() || gguf_name[digits_end] != '.')
    return std::nullopt;
  const std::string layer = gguf_name.substr(std::strlen(kPrefix), digits_end - std::strlen(kPrefix));
  const std::string suffix = gguf_name.substr(digits_end + 1);
  for (const auto& pair : kLayerNames)
    if (suffix == pair.gguf) return "model.layers." + layer + "." + pair.hf;
  return std::nullopt;
}

void unpermute_rope_row_bytes(uint8_t* data, int64_t num_heads, int64_t head_dim, int64_t row_bytes) {
  LOOM_CHECK(head_dim % 2 == 0);
  const int64_t half = head_dim / 2;
  std::vector<uint8_t> head(static_cast<size_t>(head_dim * row_bytes));
  for (int64_t h = 0; h < num_heads; ++h) {
    uint8_t* rows = data + h * head_dim * row_bytes;
    std::memcpy(head.data(), rows, head.size());
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j)
        std::memcpy(rows + (j * half + i) * row_bytes, head.data() + (2 * i + j) * row_bytes,
                    static_cast<size_t>(row_bytes));
  }
}

void unpermute_rope_rows(float* data, int64_t num_heads, int64_t head_dim, int64_t row_length) {
  unpermute_rope_row_bytes(reinterpret_cast<uint8_t*>(data), num_heads, head_dim,
                           row_length * static_cast<int64_t>(sizeof(float)));
}

}  // namespace loom
