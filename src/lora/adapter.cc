#include "lora/adapter.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "formats/safetensors.h"
#include "lora/adapter_config.h"
#include "lora/peft_matching.h"
#include "util/error.h"

namespace loom {

namespace {

namespace fs = std::filesystem;

constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kWeightsFile = "adapter_model.safetensors";

// What one tensor name of adapter_model.safetensors refers to.
struct LoraTensorName {
  int layer = 0;
  LoraTarget target = LoraTarget::kQ;
  bool is_b = false;
};

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return parts;
    start = end + 1;
  }
}

bool is_digits(const std::string& text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); });
}

// Parses [base_model.model.]model.layers.N.{self_attn,mlp}.X.lora_{A,B}[.ADAPTER][.weight];
// throws for the tensors of features Loom does not serve and for unknown names.
LoraTensorName parse_tensor_name(const std::string& name, const std::string& path) {
  auto unsupported = [&](const char* what, const char* hint) {
    throw Error(ErrorKind::kUnsupported, fmt::format("{}: tensor {} holds {}, which is not supported", path, name, what),
                hint);
  };
  if (name.find("lora_magnitude_vector") != std::string::npos)
    unsupported("a DoRA magnitude", "use a plain LoRA adapter (use_dora=false)");
  if (name.find("lora_embedding_") != std::string::npos)
    unsupported("an embedding LoRA", "target only the attention and MLP projections");
  if (name.find("modules_to_save") != std::string::npos || name.find("trainable_tokens") != std::string::npos)
    unsupported("fully trained weights (modules_to_save / trainable tokens)", "adapters may only add LoRA weights");

  std::string rest = name;
  const std::string prefix = "base_model.model.";
  if (rest.rfind(prefix, 0) == 0) rest = rest.substr(prefix.size());
  const std::vector<std::string> parts = split(rest, '.');
  // model . layers . N . (self_attn|mlp) . X . lora_A|lora_B [. adapter] [. weight]
  const bool shaped = parts.size() >= 6 && parts.size() <= 8 && parts[0] == "model" && parts[1] == "layers" &&
                      is_digits(parts[2]) && (parts[3] == "self_attn" || parts[3] == "mlp") &&
                      (parts[5] == "lora_A" || parts[5] == "lora_B");
  if (!shaped) {
    if (rest.find(".lora_") != std::string::npos && rest.size() >= 5 && rest.compare(rest.size() - 5, 5, ".bias") == 0)
      unsupported("a LoRA bias", "retrain with lora_bias=false");
    fail(ErrorKind::kFormat,
         "{}: unexpected tensor {} (expected base_model.model.model.layers.N.self_attn|mlp.X_proj.lora_A|lora_B.weight)",
         path, name);
  }
  if (parts.size() >= 7 && parts.back() == "bias") unsupported("a LoRA bias", "retrain with lora_bias=false");
  if (parts.size() == 8 && parts[7] != "weight")
    fail(ErrorKind::kFormat, "{}: unexpected tensor {} (trailing '{}')", path, name, parts[7]);
  LoraTensorName parsed;
  // Digits only (checked above) but maybe more than an int holds: a hostile or
  // corrupt name must give a clean error, not std::stoi's out_of_range.
  if (parts[2].size() > 9)
    fail(ErrorKind::kFormat, "{}: tensor {} names layer {}, which no model has", path, name, parts[2]);
  parsed.layer = std::stoi(parts[2]);
  parsed.is_b = parts[5] == "lora_B";
  for (int t = 0; t < kNumLoraTargets; ++t) {
    const LoraTarget target = static_cast<LoraTarget>(t);
    const bool in_attention = t <= static_cast<int>(LoraTarget::kO);
    if (parts[4] == lora_target_module_name(target) && (parts[3] == "self_attn") == in_attention) {
      parsed.target = target;
      return parsed;
    }
  }
  throw Error(ErrorKind::kUnsupported, fmt::format("{}: tensor {} adapts module '{}.{}'", path, name, parts[3], parts[4]),
              "only q_proj, k_proj, v_proj, o_proj (self_attn) and gate_proj, up_proj, down_proj (mlp) are supported");
}

std::string shape_string(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

std::string tensor_name(int layer, LoraTarget target, bool is_b) {
  return fmt::format("base_model.model.{}.lora_{}.weight", lora_module_path(layer, target), is_b ? "B" : "A");
}

}  // namespace

int LoraAdapter::max_rank() const {
  int rank = 0;
  for (const auto& layer : layers)
    for (const auto& module : layer)
      if (module) rank = std::max(rank, module->rank);
  return rank;
}

int LoraAdapter::max_kv_rank() const {
  int rank = 0;
  for (const auto& layer : layers)
    for (LoraTarget target : {LoraTarget::kK, LoraTarget::kV})
      if (const auto& module = layer[static_cast<size_t>(target)]) rank = std::max(rank, module->rank);
  return rank;
}

std::shared_ptr<const LoraAdapter> load_lora_adapter(const std::string& name, const std::string& directory,
                                                     const ModelConfig& base) {
  const std::string config_path = (fs::path(directory) / kConfigFile).string();
  const std::string weights_path = (fs::path(directory) / kWeightsFile).string();
  if (!fs::is_directory(directory))
    fail(ErrorKind::kNotFound, "{}: adapter directory does not exist", directory);
  if (!fs::exists(config_path)) fail(ErrorKind::kNotFound, "{}: missing (not a PEFT adapter directory?)", config_path);

  auto adapter = std::make_shared<LoraAdapter>();
  adapter->name = name;
  adapter->path = directory;
  adapter->config = read_lora_config(config_path);
  const LoraAdapterPlan plan = plan_lora_modules(adapter->config, base, config_path);
  for (int token : adapter->config.alora_invocation_tokens)
    if (token < 0 || token >= base.vocab_size)
      fail(ErrorKind::kFormat, "{}: alora_invocation_tokens has id {} outside the base vocabulary (size {})",
           config_path, token, base.vocab_size);

  if (!fs::exists(weights_path)) {
    if (fs::exists(fs::path(directory) / "adapter_model.bin"))
      throw Error(ErrorKind::kUnsupported, fmt::format("{}: only adapter_model.bin (pickle) found", directory),
                  "save the adapter with safe_serialization=True (adapter_model.safetensors)");
    fail(ErrorKind::kNotFound, "{}: missing", weights_path);
  }
  const TensorMap tensors = read_safetensors(weights_path);

  std::vector<std::array<std::array<const Tensor*, 2>, kNumLoraTargets>> found(base.num_layers);
  std::vector<std::array<std::array<std::string, 2>, kNumLoraTargets>> found_names(base.num_layers);
  for (const auto& [tensor_key, tensor] : tensors) {
    const LoraTensorName parsed = parse_tensor_name(tensor_key, weights_path);
    if (parsed.layer >= base.num_layers)
      throw Error(ErrorKind::kFormat,
                  fmt::format("{}: tensor {} is for layer {}, but the base model has {} layers", weights_path,
                              tensor_key, parsed.layer, base.num_layers),
                  "the adapter was made for another base model");
    const int target = static_cast<int>(parsed.target);
    if (!plan[parsed.layer][target])
      fail(ErrorKind::kFormat, "{}: tensor {} is for module {}, which {} does not target", weights_path, tensor_key,
           lora_module_path(parsed.layer, parsed.target), config_path);
    const Tensor*& slot = found[parsed.layer][target][parsed.is_b];
    if (slot != nullptr)
      fail(ErrorKind::kFormat, "{}: tensors {} and {} are the same weight", weights_path,
           found_names[parsed.layer][target][parsed.is_b], tensor_key);
    slot = &tensor;
    found_names[parsed.layer][target][parsed.is_b] = tensor_key;
  }

  adapter->layers.resize(base.num_layers);
  for (int layer = 0; layer < base.num_layers; ++layer) {
    for (int t = 0; t < kNumLoraTargets; ++t) {
      const std::optional<LoraModulePlan>& module_plan = plan[layer][t];
      if (!module_plan) continue;
      const LoraTarget target = static_cast<LoraTarget>(t);
      const int rank = module_plan->rank;
      const std::vector<int64_t> expected_a = {rank, lora_in_features(base, target)};
      const std::vector<int64_t> expected_b = {lora_out_features(base, target), rank};
      for (int is_b = 0; is_b < 2; ++is_b) {
        const Tensor* tensor = found[layer][t][is_b];
        if (tensor == nullptr)
          fail(ErrorKind::kNotFound, "{}: missing tensor {} ({} targets {})", weights_path,
               tensor_name(layer, target, is_b), config_path, lora_module_path(layer, target));
        const std::vector<int64_t>& expected = is_b ? expected_b : expected_a;
        if (tensor->shape != expected)
          throw Error(ErrorKind::kFormat,
                      fmt::format("{}: tensor {} has shape {}, expected {} (rank {} from {})", weights_path,
                                  found_names[layer][t][is_b], shape_string(tensor->shape), shape_string(expected),
                                  rank, config_path),
                      "the adapter was made for another base model, or r / rank_pattern disagree with the weights");
      }
      LoraModuleWeights weights;
      weights.a = *found[layer][t][0];
      weights.b = *found[layer][t][1];
      weights.rank = rank;
      weights.scale = module_plan->scale;
      adapter->layers[layer][t] = std::move(weights);
    }
  }
  return adapter;
}

void write_lora_adapter(const std::string& directory, const LoraAdapter& adapter, const ModelConfig& base,
                        StoredDtype dtype) {
  const std::string config_path = (fs::path(directory) / kConfigFile).string();
  const LoraAdapterPlan plan = plan_lora_modules(adapter.config, base, config_path);
  if (static_cast<int>(adapter.layers.size()) != base.num_layers)
    fail(ErrorKind::kInvalidArgument, "{}: adapter has {} layers, base model {}", directory, adapter.layers.size(),
         base.num_layers);
  TensorMap tensors;
  for (int layer = 0; layer < base.num_layers; ++layer) {
    for (int t = 0; t < kNumLoraTargets; ++t) {
      const LoraTarget target = static_cast<LoraTarget>(t);
      const auto& module = adapter.layers[layer][t];
      const auto& module_plan = plan[layer][t];
      if (module.has_value() != module_plan.has_value())
        fail(ErrorKind::kInvalidArgument, "{}: module {} {} but the config {}", directory,
             lora_module_path(layer, target), module ? "has weights" : "has no weights",
             module_plan ? "targets it" : "does not target it");
      if (!module) continue;
      const std::vector<int64_t> expected_a = {module_plan->rank, lora_in_features(base, target)};
      const std::vector<int64_t> expected_b = {lora_out_features(base, target), module_plan->rank};
      if (module->a.shape != expected_a || module->b.shape != expected_b)
        fail(ErrorKind::kInvalidArgument, "{}: module {} has A {} and B {}, the config implies {} and {}", directory,
             lora_module_path(layer, target), shape_string(module->a.shape), shape_string(module->b.shape),
             shape_string(expected_a), shape_string(expected_b));
      tensors[tensor_name(layer, target, false)] = module->a;
      tensors[tensor_name(layer, target, true)] = module->b;
    }
  }
  std::error_code error;
  fs::create_directories(directory, error);
  if (error) fail(ErrorKind::kInvalidArgument, "{}: cannot create directory: {}", directory, error.message());
  // Through a temporary file: a server may have the old weights mapped.
  const fs::path weights_path = fs::path(directory) / kWeightsFile;
  const fs::path temporary_path = fs::path(directory) / (std::string(kWeightsFile) + ".tmp");
  write_safetensors(temporary_path.string(), tensors, dtype, {{"format", "pt"}});
  fs::rename(temporary_path, weights_path, error);
  if (error) fail(ErrorKind::kInvalidArgument, "{}: cannot write: {}", weights_path.string(), error.message());
  std::ofstream stream(config_path, std::ios::trunc);
  stream << lora_config_to_json(adapter.config).dump(2) << "\n";
  stream.flush();
  if (!stream) fail(ErrorKind::kInvalidArgument, "{}: cannot write", config_path);
}

}  // namespace loom
