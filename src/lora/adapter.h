// PEFT LoRA adapters (adapter_config.json + adapter_model.safetensors).
//
// An adapter adds s * (x A^T) B^T to the output of each module it targets, with
// A: [r, in], B: [out, r] (PEFT's lora_A.weight / lora_B.weight) and
// s = alpha / r, or alpha / sqrt(r) with use_rslora. rank_pattern / alpha_pattern
// override r and alpha per module (keys are regexes matched against the module
// path's end, as PEFT does). Adapters are immutable once loaded.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace loom {

enum class LoraTarget : int { kQ = 0, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kNumLoraTargets = 7;
// "q_proj", "k_proj", ..., "down_proj".
const char* lora_target_module_name(LoraTarget target);

struct LoraConfig {
  int rank = 8;
  float alpha = 8.0f;
  bool use_rslora = false;
  // Either a list of module names ("q_proj", ...) or one regex matched against
  // the full module path ("model.layers.0.self_attn.q_proj"), as PEFT allows.
  std::vector<std::string> target_modules;
  std::string target_modules_regex;
  std::map<std::string, int> rank_pattern;
  std::map<std::string, float> alpha_pattern;
  std::vector<int> alora_invocation_tokens;  // empty: not an aLoRA adapter
  std::string base_model_name_or_path;
  std::string loom_kv_sharing;               // "", "isolated", "activated", "base", "forked"
};

struct LoraModuleWeights {
  Tensor a;      // [rank, in_features]
  Tensor b;      // [out_features, rank]
  int rank = 0;
  float scale = 0.0f;  // alpha / rank (or alpha / sqrt(rank) with rsLoRA), pattern overrides applied
};

struct LoraAdapter {
  std::string name;
  std::string path;
  LoraConfig config;
  // layers[l][target] is set when the adapter targets that module in layer l.
  std::vector<std::array<std::optional<LoraModuleWeights>, kNumLoraTargets>> layers;

  int max_rank() const;
};

// Loads and validates an adapter against `base`: every targeted module's A/B
// must exist with shapes matching the base model's dimensions. Throws
// Error(kNotFound) / Error(kFormat) naming the file and tensor, e.g. for an
// adapter made for another base model (shape mismatch) or a missing tensor.
std::shared_ptr<const LoraAdapter> load_lora_adapter(const std::string& name, const std::string& directory,
                                                     const ModelConfig& base);

// Writes adapter_config.json + adapter_model.safetensors that PEFT 0.21 loads.
void write_lora_adapter(const std::string& directory, const LoraAdapter& adapter, const ModelConfig& base);

}  // namespace loom
