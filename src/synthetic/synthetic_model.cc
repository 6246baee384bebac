#include "synthetic/synthetic_model.h"

#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "model/hf_config.h"
#include "synthetic/synthetic_tokenizer.h"
#include "synthetic/synthetic_weights.h"
#include "util/error.h"

namespace loom {

namespace {

namespace fs = std::filesystem;

ModelConfig tiny_config(Architecture arch) {
  ModelConfig config;
  config.arch = arch;
  config.vocab_size = 512;
  config.hidden_size = 64;
  config.intermediate_size = 128;
  config.num_layers = 2;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = 16;
  config.max_position_embeddings = 4096;
  config.torch_dtype = "float32";
  switch (arch) {
    case Architecture::kLlama:
      config.rms_norm_eps = 1e-5f;
      config.rope_theta = 500000.0f;
      // A short original context puts the head_dim 16 frequencies in all three
      // llama3 bands (kept, smoothed, divided by the factor).
      config.rope_scaling = {RopeScaling::Type::kLlama3, 8.0f, 1.0f, 4.0f, 1024};
      config.tie_word_embeddings = true;
      break;
    case Architecture::kQwen2:
      config.hidden_size = 96;
      config.intermediate_size = 192;
      config.num_layers = 3;
      config.num_heads = 6;
      config.num_kv_heads = 2;
      config.rope_theta = 1000000.0f;
      config.qkv_bias = true;
      break;
    case Architecture::kQwen3:
      config.head_dim = 32;  // explicit, not hidden / heads
      config.rope_theta = 1000000.0f;
      config.qk_norm = true;
      config.tie_word_embeddings = true;
      break;
    case Architecture::kMistral:
      config.intermediate_size = 160;
      config.num_kv_heads = 1;
      config.rms_norm_eps = 1e-5f;
      config.rope_theta = 1000000.0f;
      break;
  }
  return config;
}

// Llama-3-8B (3.1 rope scaling); other archs keep the dimensions.
ModelConfig llama3_8b_config(Architecture arch) {
  ModelConfig config;
  config.arch = arch;
  config.vocab_size = 128256;
  config.hidden_size = 4096;
  config.intermediate_size = 14336;
  config.num_layers = 32;
  config.num_heads = 32;
  config.num_kv_heads = 8;
  config.head_dim = 128;
  config.max_position_embeddings = 131072;
  config.rms_norm_eps = 1e-5f;
  config.rope_theta = 500000.0f;
  config.rope_scaling = {RopeScaling::Type::kLlama3, 8.0f, 1.0f, 4.0f, 8192};
  config.torch_dtype = "bfloat16";
  if (arch == Architecture::kQwen2) config.qkv_bias = true;
  if (arch == Architecture::kQwen3) config.qk_norm = true;
  return config;
}

// Llama-3-70B (3.1 rope scaling): the 8B's attention and vocabulary, wider and deeper.
ModelConfig llama3_70b_config(Architecture arch) {
  ModelConfig config = llama3_8b_config(arch);
  config.hidden_size = 8192;
  config.intermediate_size = 28672;
  config.num_layers = 80;
  config.num_heads = 64;
  return config;
}

// Qwen3-14B (qk-norm, no rope scaling, 40 heads over 8 kv heads); other archs keep the dimensions.
ModelConfig qwen3_14b_config(Architecture arch) {
  ModelConfig config = llama3_8b_config(arch);
  config.vocab_size = 151936;
  config.hidden_size = 5120;
  config.intermediate_size = 17408;
  config.num_layers = 40;
  config.num_heads = 40;
  config.max_position_embeddings = 40960;
  config.rms_norm_eps = 1e-6f;
  config.rope_theta = 1000000.0f;
  config.rope_scaling = {};
  return config;
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream stream(path, std::ios::binary | std::ios::trunc);
  stream << text;
  stream.flush();
  if (!stream) fail(ErrorKind::kInvalidArgument, "{}: cannot write", path.string());
}

// The synthetic tokenizer of the arch's family: llama3 for llama, qwen2 for
// qwen2/qwen3, smollm (GPT-2 regex, single digits) for mistral.
SyntheticTokenizer synthetic_tokenizer_for(const ModelConfig& config) {
  PreTokenizerFamily family = PreTokenizerFamily::kSmolLM;
  if (config.arch == Architecture::kLlama) family = PreTokenizerFamily::kLlama3;
  if (config.arch == Architecture::kQwen2 || config.arch == Architecture::kQwen3) family = PreTokenizerFamily::kQwen2;
  return make_synthetic_tokenizer(config.vocab_size, family);
}

}  // namespace

SyntheticPreset synthetic_preset_from_name(const std::string& name) {
  if (name == "tiny") return SyntheticPreset::kTiny;
  if (name == "8b") return SyntheticPreset::k8b;
  if (name == "70b") return SyntheticPreset::k70b;
  if (name == "14b") return SyntheticPreset::k14b;
  fail(ErrorKind::kInvalidArgument, "--preset: unknown preset '{}' (expected tiny, 8b, 14b or 70b)", name);
}

const char* synthetic_preset_name(SyntheticPreset preset) {
  switch (preset) {
    case SyntheticPreset::kTiny: return "tiny";
    case SyntheticPreset::k8b: return "8b";
    case SyntheticPreset::k70b: return "70b";
    case SyntheticPreset::k14b: return "14b";
  }
  return "?";
}

ModelConfig synthetic_model_config(Architecture arch, SyntheticPreset preset) {
  ModelConfig config;
  switch (preset) {
    case SyntheticPreset::kTiny: config = tiny_config(arch); break;
    case SyntheticPreset::k8b: config = llama3_8b_config(arch); break;
    case SyntheticPreset::k14b: config = qwen3_14b_config(arch); break;
    case SyntheticPreset::k70b: config = llama3_70b_config(arch); break;
  }
  const SyntheticTokenizer tokenizer = synthetic_tokenizer_for(config);
  config.bos_token_id = tokenizer.bos_token_id;
  config.eos_token_ids = tokenizer.eos_token_ids;
  config.validate(fmt::format("synthetic {} {}", architecture_short_name(arch), synthetic_preset_name(preset)));
  return config;
}

void write_synthetic_checkpoint(const std::string& directory, const ModelConfig& config, uint64_t seed,
                                StoredDtype dtype) {
  std::error_code error;
  fs::create_directories(directory, error);
  if (error) fail(ErrorKind::kInvalidArgument, "{}: cannot create directory: {}", directory, error.message());
  write_text(fs::path(directory) / "config.json", hf_config_to_json(config).dump(2) + "\n");
  write_synthetic_safetensors((fs::path(directory) / "model.safetensors").string(), synthetic_base_tensor_specs(config),
                              seed, dtype);
}

void write_synthetic_model(const std::string& directory, const SyntheticModelOptions& options) {
  const ModelConfig config = synthetic_model_config(options.arch, options.preset);
  // Validate before writing anything.
  const std::vector<SyntheticAdapterSpec> adapter_specs = synthetic_adapter_specs(options, config);
  const StoredDtype dtype = options.preset == SyntheticPreset::kTiny ? StoredDtype::kF32 : StoredDtype::kBF16;
  write_synthetic_checkpoint(directory, config, options.seed, dtype);
  const SyntheticTokenizer tokenizer = synthetic_tokenizer_for(config);
  write_text(fs::path(directory) / "tokenizer.json", tokenizer.tokenizer_json);
  write_text(fs::path(directory) / "tokenizer_config.json", tokenizer.tokenizer_config_json);
  for (const SyntheticAdapterSpec& spec : adapter_specs) {
    const LoraAdapter adapter = make_synthetic_adapter(spec, config, options.seed);
    write_lora_adapter((fs::path(directory) / "adapters" / spec.name).string(), adapter, config, dtype);
  }
}

}  // namespace loom
