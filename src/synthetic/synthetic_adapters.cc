// Synthetic PEFT adapters: the recipe per adapter index and their weights.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lora/peft_matching.h"
#include "synthetic/synthetic_model.h"
#include "synthetic/synthetic_weights.h"
#include "util/error.h"

namespace loom {

namespace {

const std::vector<std::string> kAllProjections = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                  "gate_proj", "up_proj", "down_proj"};

LoraConfig recipe_config(int index, const SyntheticModelOptions& options) {
  const int rank = options.rank;
  const float alpha = options.alpha;
  LoraConfig config;
  config.rank = rank;
  config.alpha = alpha;
  config.use_rslora = options.use_rslora;
  switch (index % 4) {
    case 0:
      config.target_modules = kAllProjections;
      break;
    case 1:
      config.target_modules = {"q_proj", "v_proj"};
      config.rank = rank >= 2 ? rank / 2 : 2;
      break;
    case 2:
      config.use_rslora = true;
      config.target_modules = {"q_proj", "k_proj", "o_proj", "up_proj", "down_proj"};
      config.rank_pattern = {{"o_proj", 2 * rank}, {"layers.0.mlp.down_proj", std::max(1, rank / 2)}};
      config.rank_pattern_order = {"o_proj", "layers.0.mlp.down_proj"};
      config.alpha_pattern = {{"k_proj", 2.0f * alpha}, {"up_proj", 0.5f * alpha}};
      config.alpha_pattern_order = {"k_proj", "up_proj"};
      break;
    default:
      config.target_modules_regex = R"(model\.layers\.\d*[02468]\.(self_attn\.(k|o)_proj|mlp\.(gate|up)_proj))";
      break;
  }
  return config;
}

}  // namespace

std::vector<int> synthetic_alora_invocation_tokens(const ModelConfig& config) {
  const int middle = config.vocab_size / 2;
  return {middle + 3, middle + 7};
}

std::vector<SyntheticAdapterSpec> synthetic_adapter_specs(const SyntheticModelOptions& options,
                                                          const ModelConfig& config) {
  if (options.num_adapters < 0)
    fail(ErrorKind::kInvalidArgument, "--adapters must not be negative, got {}", options.num_adapters);
  if (options.num_adapters > 0 && options.rank < 1)
    fail(ErrorKind::kInvalidArgument, "--rank must be at least 1, got {}", options.rank);
  if (!(options.alpha > 0.0f)) fail(ErrorKind::kInvalidArgument, "--alpha must be positive, got {}", options.alpha);
  for (const std::string& target : options.targets)
    if (std::find(kAllProjections.begin(), kAllProjections.end(), target) == kAllProjections.end())
      fail(ErrorKind::kInvalidArgument, "--targets: unknown module '{}' (expected some of {})", target,
           fmt::join(kAllProjections, ","));

  std::vector<SyntheticAdapterSpec> specs;
  for (int index = 0; index < options.num_adapters; ++index) {
    SyntheticAdapterSpec spec;
    spec.name = fmt::format("adapter{}", index);
    if (options.targets.empty()) {
      spec.config = recipe_config(index, options);
    } else {
      spec.config.rank = options.rank;
      spec.config.alpha = options.alpha;
      spec.config.use_rslora = options.use_rslora;
      spec.config.target_modules = options.targets;
    }
    if (options.alora_invocation) spec.config.alora_invocation_tokens = synthetic_alora_invocation_tokens(config);
    spec.config.base_model_name_or_path =
        fmt::format("loom-synthetic/{}-{}", architecture_short_name(config.arch), synthetic_preset_name(options.preset));
    specs.push_back(std::move(spec));
  }
  return specs;
}

LoraAdapter make_synthetic_adapter(const SyntheticAdapterSpec& spec, const ModelConfig& config, uint64_t seed) {
  const LoraAdapterPlan plan = plan_lora_modules(spec.config, config, "synthetic adapter " + spec.name);
  LoraAdapter adapter;
  adapter.name = spec.name;
  adapter.config = spec.config;
  adapter.layers.resize(config.num_layers);
  for (int layer = 0; layer < config.num_layers; ++layer) {
    for (int t = 0; t < kNumLoraTargets; ++t) {
      const auto& module_plan = plan[layer][t];
      if (!module_plan) continue;
      const LoraTarget target = static_cast<LoraTarget>(t);
      const int64_t in = lora_in_features(config, target);
      const int64_t out = lora_out_features(config, target);
      const int64_t rank = module_plan->rank;
      const std::string prefix = fmt::format("adapters/{}/{}", spec.name, lora_module_path(layer, target));
      const float b_scale =
          synthetic_linear_gain(config, target) / (module_plan->scale * std::sqrt(static_cast<float>(rank)));
      LoraModuleWeights weights;
      weights.a = make_synthetic_tensor({prefix + ".lora_A.weight", {rank, in}, false,
                                         1.0f / std::sqrt(static_cast<float>(in))},
                                        seed);
      weights.b = make_synthetic_tensor({prefix + ".lora_B.weight", {out, rank}, false, b_scale}, seed);
      weights.rank = module_plan->rank;
      weights.scale = module_plan->scale;
      adapter.layers[layer][t] = std::move(weights);
    }
  }
  return adapter;
}

}  // namespace loom
