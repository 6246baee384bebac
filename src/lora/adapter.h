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

#include "formats/safetensors.h"
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
  // PEFT tries pattern keys in the order of adapter_config.json and takes the
  // first that matches; these keep that order (keys of the maps above). When
  // empty, the maps' order is used.
  std::vector<std::string> rank_pattern_order;
  std::vector<std::string> alpha_pattern_order;
  // exclude_modules: names (a module is excluded when its path is one or ends
  // with ".name") or one regex matched against the full path.
  std::vector<std::string> exclude_modules;
  std::string exclude_modules_regex;
  // layers_to_transform restricts list-style target_modules to these layer
  // indices (empty: all layers); layers_pattern names the ModuleList ("layers").
  std::vector<int> layers_to_transform;
  std::vector<std::string> layers_pattern;
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
  // The largest rank of its k_proj / v_proj LoRA (0 when it has none): what
  // its rCache entries need in forked sharing.
  int max_kv_rank() const;
};

// Loads and validates an adapter against `base`: every targeted module's A/B
// must exist with shapes matching the base model's dimensions. Throws
// Error(kNotFound) / Error(kFormat) naming the file and tensor, e.g. for an
// adapter made for another base model (shape mismatch) or a missing tensor.
// Error(kUnsupported), with a hint, for what Loom does not serve: DoRA
// (use_dora), LoRA biases (bias != "none", lora_bias), modules_to_save,
// embedding / lm_head / norm targets, target_parameters, trainable tokens,
// layer replication and the LoRA variants (VeLoRA, MonteCLoRA, Arrow, ...).
// Module matching, rank_pattern / alpha_pattern and rsLoRA scaling follow PEFT
// 0.21 exactly (see lora/peft_matching.h). Accepted tensor names:
// [base_model.model.]model.layers.N.{self_attn,mlp}.X_proj.lora_{A,B}[.ADAPTER][.weight].
std::shared_ptr<const LoraAdapter> load_lora_adapter(const std::string& name, const std::string& directory,
                                                     const ModelConfig& base);

// Writes adapter_config.json + adapter_model.safetensors that PEFT 0.21 loads.
// Creates `directory` if needed. Throws Error(kInvalidArgument) when the
// adapter's modules disagree with its config (a module targeted without
// weights, weights for a module not targeted, a rank other than the config's).
// `dtype` is how the tensors are stored (PEFT saves in the model's dtype).
void write_lora_adapter(const std::string& directory, const LoraAdapter& adapter, const ModelConfig& base,
                        StoredDtype dtype = StoredDtype::kF32);

}  // namespace loom
