#include "model/config.h"

#include "util/error.h"

namespace loom {

namespace {

struct ArchitectureNames {
  Architecture arch;
  const char* hf_name;
  const char* short_name;
};

constexpr ArchitectureNames kArchitectureNames[] = {
    {Architecture::kLlama, "LlamaForCausalLM", "llama"},
    {Architecture::kQwen2, "Qwen2ForCausalLM", "qwen2"},
    {Architecture::kQwen3, "Qwen3ForCausalLM", "qwen3"},
    {Architecture::kMistral, "MistralForCausalLM", "mistral"},
};

const ArchitectureNames& names_of(Architecture arch) {
  for (const auto& names : kArchitectureNames)
    if (names.arch == arch) return names;
  fail(ErrorKind::kInternal, "unknown Architecture value {}", static_cast<int>(arch));
}

}  // namespace

Architecture architecture_from_hf_name(const std::string& name) {
  for (const auto& names : kArchitectureNames)
    if (name == names.hf_name) return names.arch;
  throw Error(ErrorKind::kUnsupported, fmt::format("unsupported architecture \"{}\"", name),
              "supported: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM");
}

const char* architecture_hf_name(Architecture arch) { return names_of(arch).hf_name; }

const char* architecture_short_name(Architecture arch) { return names_of(arch).short_name; }

Architecture architecture_from_short_name(const std::string& name) {
  for (const auto& names : kArchitectureNames)
    if (name == names.short_name) return names.arch;
  throw Error(ErrorKind::kUnsupported, fmt::format("unsupported architecture \"{}\"", name),
              "supported: llama, qwen2, qwen3, mistral");
}

void ModelConfig::validate(const std::string& source) const {
  auto require_positive = [&](int value, const char* field) {
    if (value <= 0) fail(ErrorKind::kFormat, "{}: {} must be positive, got {}", source, field, value);
  };
  require_positive(vocab_size, "vocab_size");
  require_positive(hidden_size, "hidden_size");
  require_positive(intermediate_size, "intermediate_size");
  require_positive(num_layers, "num_hidden_layers");
  require_positive(num_heads, "num_attention_heads");
  require_positive(num_kv_heads, "num_key_value_heads");
  require_positive(head_dim, "head_dim");
  require_positive(max_position_embeddings, "max_position_embeddings");
  // Products the model code forms in int (q_size, kv_size, hidden x intermediate rows).
  if (static_cast<int64_t>(num_heads) * head_dim > INT32_MAX)
    fail(ErrorKind::kFormat, "{}: num_attention_heads x head_dim ({} x {}) is implausibly large", source,
         num_heads, head_dim);
  if (num_heads % num_kv_heads != 0)
    fail(ErrorKind::kFormat, "{}: num_attention_heads ({}) is not a multiple of num_key_value_heads ({})",
         source, num_heads, num_kv_heads);
  if (head_dim % 2 != 0)
    fail(ErrorKind::kFormat, "{}: head_dim ({}) must be even for RoPE", source, head_dim);
  if (!(rms_norm_eps > 0.0f))
    fail(ErrorKind::kFormat, "{}: rms_norm_eps must be positive, got {}", source, rms_norm_eps);
  if (!(rope_theta > 0.0f))
    fail(ErrorKind::kFormat, "{}: rope_theta must be positive, got {}", source, rope_theta);
  if (sliding_window < 0)
    fail(ErrorKind::kFormat, "{}: sliding_window must be >= 0, got {}", source, sliding_window);
  if (rope_scaling.type == RopeScaling::Type::kLlama3) {
    if (!(rope_scaling.factor > 0.0f) || !(rope_scaling.low_freq_factor > 0.0f) ||
        !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor) ||
        rope_scaling.original_max_position_embeddings <= 0)
      fail(ErrorKind::kFormat,
           "{}: invalid llama3 rope_scaling (factor {}, low_freq_factor {}, high_freq_factor {}, "
           "original_max_position_embeddings {})",
           source, rope_scaling.factor, rope_scaling.low_freq_factor, rope_scaling.high_freq_factor,
           rope_scaling.original_max_position_embeddings);
  }
  if (bos_token_id >= vocab_size)
    fail(ErrorKind::kFormat, "{}: bos_token_id {} is outside the vocabulary ({})", source, bos_token_id,
         vocab_size);
  for (int eos : eos_token_ids)
    if (eos < 0 || eos >= vocab_size)
      fail(ErrorKind::kFormat, "{}: eos_token_id {} is outside the vocabulary ({})", source, eos,
           vocab_size);
}

}  // namespace loom
