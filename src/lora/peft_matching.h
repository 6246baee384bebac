// Which modules of a base model a LoRA config targets, and with which rank
// and alpha: PEFT 0.21's rules, reproduced exactly.
//
//   module path  "model.layers.3.self_attn.q_proj", as torch's named_modules()
//                lists them for LlamaForCausalLM / Qwen2 / Qwen3 / Mistral.
//   targets      list: the path equals a name or ends with ".name"
//                (check_target_module_exists); layers_to_transform then keeps
//                only the listed layer indices.
//                string: re.fullmatch(regex, path).
//   excluded     exclude_modules (same rules) wins over targets.
//   rank/alpha   get_pattern_key: the first key K of rank_pattern (alpha_pattern),
//                in file order, with re.match(r"(.*\.)?(K)$", path); else r (lora_alpha).
//   scale        alpha / r, or alpha / sqrt(r) with use_rslora.
//
// Regexes are Python `re` syntax run through PCRE2 (identical for the
// patterns adapters use: classes, groups, alternation, (?P<name>...)).
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "lora/adapter.h"
#include "model/config.h"

namespace loom {

// "model.layers.3.self_attn.q_proj" / "model.layers.3.mlp.down_proj".
std::string lora_module_path(int layer, LoraTarget target);

// Every module path named_modules() yields for `base` except the root "",
// in torch's order: "model", "model.embed_tokens", "model.layers",
// "model.layers.0", "model.layers.0.self_attn", ..., "model.norm",
// "model.rotary_emb", "lm_head".
std::vector<std::string> peft_module_paths(const ModelConfig& base);

// in_features / out_features of a target's base Linear (A is [r, in], B is [out, r]).
int lora_in_features(const ModelConfig& base, LoraTarget target);
int lora_out_features(const ModelConfig& base, LoraTarget target);

// PEFT's scaling: alpha / rank, or alpha / sqrt(rank) with rsLoRA.
float lora_scale(float alpha, int rank, bool use_rslora);

struct LoraModulePlan {
  int rank = 0;
  float alpha = 0.0f;
  float scale = 0.0f;
};

// plan[layer][target] is set when the config targets that module.
using LoraAdapterPlan = std::vector<std::array<std::optional<LoraModulePlan>, kNumLoraTargets>>;

// Compiles a config's regexes once; then answers per module path.
// Not thread-safe (PCRE2 match data is reused); cheap to build.
class PeftModuleMatcher {
 public:
  // Throws Error(kFormat) naming `source` (the adapter_config.json) and the
  // pattern for a regex PCRE2 cannot compile.
  PeftModuleMatcher(const LoraConfig& config, std::string source);
  ~PeftModuleMatcher();
  PeftModuleMatcher(const PeftModuleMatcher&) = delete;
  PeftModuleMatcher& operator=(const PeftModuleMatcher&) = delete;

  // check_target_module_exists: targeted and not excluded.
  bool targets(const std::string& module_path) const;
  // rank_pattern / alpha_pattern lookups, falling back to r / lora_alpha.
  int rank_for(const std::string& module_path) const;
  float alpha_for(const std::string& module_path) const;

 private:
  struct Impl;
  Impl* impl_;
};

// Resolves every module of `base` against `config`, as PEFT's inject_adapter
// does. Throws Error(kUnsupported) with a hint when a non-projection module
// matches (embed_tokens, lm_head, a norm, a whole layer), Error(kFormat) when
// nothing matches or a rank is not positive, naming `source`.
LoraAdapterPlan plan_lora_modules(const LoraConfig& config, const ModelConfig& base, const std::string& source);

}  // namespace loom
