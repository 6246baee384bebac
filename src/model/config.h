// Model hyper-parameters, built once from config.json or GGUF metadata and
// never changed afterwards. One struct covers the llama family we support.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/quantization.h"

namespace loom {

enum class Architecture { kLlama, kQwen2, kQwen3, kMistral };

// "LlamaForCausalLM" etc. <-> enum. Throws Error(kUnsupported) on an unknown name.
Architecture architecture_from_hf_name(const std::string& name);
const char* architecture_hf_name(Architecture arch);
// "llama", "qwen2", "qwen3", "mistral" (the spelling `loom make-model --arch` takes).
const char* architecture_short_name(Architecture arch);
Architecture architecture_from_short_name(const std::string& name);

struct RopeScaling {
  enum class Type { kNone, kLlama3 };
  Type type = Type::kNone;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
};

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // hidden_size / num_heads unless config.json says otherwise
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2; Llama with attention_bias=true
  bool o_bias = false;    // Llama with attention_bias=true
  bool qk_norm = false;   // Qwen3: RMSNorm over head_dim on q and k before RoPE
  int sliding_window = 0; // Mistral; 0 = full attention (we attend fully and warn if exceeded)
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;
  std::string torch_dtype = "float32";  // as stored on disk, informational
  // config.json's quantization_config: how the checkpoint's linear weights are
  // stored (FP8: their scales are attached to each weight, formats/tensor.h
  // Fp8Scales). Method kNone for 16/32-bit checkpoints and GGUF files.
  QuantizationScheme quantization;

  int q_size() const { return num_heads * head_dim; }
  int kv_size() const { return num_kv_heads * head_dim; }
  // Throws Error(kFormat) naming `source` if the numbers are inconsistent.
  void validate(const std::string& source) const;
};

}  // namespace loom
