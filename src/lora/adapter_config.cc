#include "lora/adapter_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "util/error.h"
#include "util/json_nesting.h"

namespace loom {

namespace {

using Json = nlohmann::ordered_json;

const std::vector<std::string> kAllProjections = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                  "gate_proj", "up_proj", "down_proj"};

bool is_null_or_absent(const Json& json, const char* key) { return !json.contains(key) || json[key].is_null(); }

[[noreturn]] void fail_type(const std::string& path, const char* key, const char* expected, const Json& value) {
  fail(ErrorKind::kFormat, "{}: field '{}' must be {}, got {}", path, key, expected, value.dump());
}

// An int in range: 1e300 or 2^40 must not wrap (or, for doubles, be UB) into a small value.
int get_int(const Json& value, const std::string& path, const char* key) {
  if (value.is_number_unsigned()) {
    if (value.get<uint64_t>() <= static_cast<uint64_t>(INT32_MAX)) return static_cast<int>(value.get<uint64_t>());
  } else if (value.is_number_integer()) {
    const int64_t number = value.get<int64_t>();
    if (number >= INT32_MIN && number <= INT32_MAX) return static_cast<int>(number);
  } else if (value.is_number_float()) {
    const double number = value.get<double>();
    if (std::floor(number) == number && std::fabs(number) <= INT32_MAX) return static_cast<int>(number);
  } else {
    fail_type(path, key, "an integer", value);
  }
  fail(ErrorKind::kFormat, "{}: field '{}' is out of range: {}", path, key, value.dump());
}

float get_number(const Json& value, const std::string& path, const char* key) {
  if (!value.is_number()) fail_type(path, key, "a number", value);
  const double number = value.get<double>();
  if (!(std::fabs(number) <= std::numeric_limits<float>::max()))
    fail(ErrorKind::kFormat, "{}: field '{}' is out of range: {}", path, key, value.dump());
  return static_cast<float>(number);
}

bool get_bool(const Json& json, const char* key, bool fallback, const std::string& path) {
  if (is_null_or_absent(json, key)) return fallback;
  if (!json[key].is_boolean()) fail_type(path, key, "true or false", json[key]);
  return json[key].get<bool>();
}

std::vector<std::string> get_string_list(const Json& value, const std::string& path, const char* key) {
  if (!value.is_array()) fail_type(path, key, "a list of strings", value);
  std::vector<std::string> items;
  for (const Json& item : value) {
    if (!item.is_string()) fail_type(path, key, "a list of strings", value);
    items.push_back(item.get<std::string>());
  }
  return items;
}

std::vector<int> get_int_list(const Json& value, const std::string& path, const char* key) {
  if (value.is_number()) return {get_int(value, path, key)};
  if (!value.is_array()) fail_type(path, key, "an integer or a list of integers", value);
  std::vector<int> items;
  for (const Json& item : value) items.push_back(get_int(item, path, key));
  return items;
}

// A list-or-regex field (target_modules, exclude_modules): a string is a regex.
void get_names_or_regex(const Json& json, const char* key, const std::string& path, std::vector<std::string>& names,
                        std::string& regex) {
  if (is_null_or_absent(json, key)) return;
  if (json[key].is_string()) {
    regex = json[key].get<std::string>();
    return;
  }
  names = get_string_list(json[key], path, key);
}

bool is_set(const Json& json, const char* key) {
  if (is_null_or_absent(json, key)) return false;
  const Json& value = json[key];
  if (value.is_boolean()) return value.get<bool>();
  if (value.is_array() || value.is_object()) return !value.empty();
  return true;
}

void reject_unsupported(const Json& json, const std::string& path) {
  auto unsupported = [&](const std::string& what, const std::string& hint) {
    throw Error(ErrorKind::kUnsupported, fmt::format("{}: {} is not supported", path, what), hint);
  };
  if (json.contains("peft_type") && json["peft_type"].is_string() && json["peft_type"].get<std::string>() != "LORA")
    unsupported(fmt::format("peft_type {}", json["peft_type"].dump()), "only LoRA adapters (peft_type \"LORA\") load");
  if (get_bool(json, "use_dora", false, path))
    unsupported("DoRA (use_dora: true)", "merge the DoRA magnitude into a plain LoRA or retrain with use_dora=false");
  if (!is_null_or_absent(json, "bias") && json["bias"] != "none")
    unsupported(fmt::format("bias {}", json["bias"].dump()), "retrain with bias=\"none\"");
  if (get_bool(json, "lora_bias", false, path)) unsupported("lora_bias: true", "retrain with lora_bias=false");
  if (is_set(json, "modules_to_save"))
    unsupported(fmt::format("modules_to_save {}", json["modules_to_save"].dump()),
                "adapters may only add LoRA weights; fully trained modules (lm_head, embeddings) cannot be swapped "
                "per request");
  if (is_set(json, "target_parameters"))
    unsupported("target_parameters", "target nn.Linear modules through target_modules instead");
  if (is_set(json, "trainable_token_indices"))
    unsupported("trainable_token_indices", "new token embeddings cannot be swapped per request");
  if (is_set(json, "layer_replication")) unsupported("layer_replication", "adapters cannot add layers");
  if (get_bool(json, "use_qalora", false, path)) unsupported("QA-LoRA (use_qalora: true)", "use a plain LoRA");
  for (const char* variant : {"velora_config", "monteclora_config", "arrow_config", "kasa_config", "use_bdlora"})
    if (is_set(json, variant))
      unsupported(fmt::format("the LoRA variant '{}'", variant), "only plain LoRA / rsLoRA / aLoRA adapters load");
}

template <typename Value, typename Read>
void get_pattern(const Json& json, const char* key, const std::string& path, std::map<std::string, Value>& pattern,
                 std::vector<std::string>& order, Read read) {
  if (is_null_or_absent(json, key)) return;
  if (!json[key].is_object()) fail_type(path, key, "an object", json[key]);
  for (const auto& [name, value] : json[key].items()) {
    pattern[name] = read(value, path, key);
    order.push_back(name);
  }
}

Json number_json(float value) {
  if (std::floor(value) == value && std::fabs(value) < 1e9f) return Json(static_cast<int64_t>(value));
  return Json(static_cast<double>(value));
}

}  // namespace

LoraConfig parse_lora_config(const nlohmann::ordered_json& json, const std::string& path) {
  if (!json.is_object()) fail(ErrorKind::kFormat, "{}: expected a JSON object", path);
  reject_unsupported(json, path);
  LoraConfig config;
  if (!is_null_or_absent(json, "r")) config.rank = get_int(json["r"], path, "r");
  if (config.rank <= 0) fail(ErrorKind::kFormat, "{}: r must be positive, got {}", path, config.rank);
  if (!is_null_or_absent(json, "lora_alpha")) config.alpha = get_number(json["lora_alpha"], path, "lora_alpha");
  config.use_rslora = get_bool(json, "use_rslora", false, path);

  get_names_or_regex(json, "target_modules", path, config.target_modules, config.target_modules_regex);
  if (is_null_or_absent(json, "target_modules")) {
    config.target_modules = {"q_proj", "v_proj"};  // PEFT's default for llama / mistral / qwen2 / qwen3
  } else if ([&] {
               std::string lower = config.target_modules_regex;
               std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
               return lower == "all-linear";
             }()) {
    config.target_modules_regex.clear();
    config.target_modules = kAllProjections;  // every Linear but the output layer
  }
  get_names_or_regex(json, "exclude_modules", path, config.exclude_modules, config.exclude_modules_regex);

  if (!is_null_or_absent(json, "layers_to_transform"))
    config.layers_to_transform = get_int_list(json["layers_to_transform"], path, "layers_to_transform");
  if (!is_null_or_absent(json, "layers_pattern")) {
    if (json["layers_pattern"].is_string())
      config.layers_pattern = {json["layers_pattern"].get<std::string>()};
    else
      config.layers_pattern = get_string_list(json["layers_pattern"], path, "layers_pattern");
  }
  if (!config.target_modules_regex.empty() &&
      (!is_null_or_absent(json, "layers_to_transform") || !is_null_or_absent(json, "layers_pattern")))
    fail(ErrorKind::kFormat, "{}: layers_to_transform / layers_pattern cannot be used when target_modules is a regex",
         path);
  if (!config.layers_pattern.empty() && is_null_or_absent(json, "layers_to_transform"))
    fail(ErrorKind::kFormat, "{}: layers_pattern needs layers_to_transform", path);

  get_pattern(json, "rank_pattern", path, config.rank_pattern, config.rank_pattern_order, get_int);
  get_pattern(json, "alpha_pattern", path, config.alpha_pattern, config.alpha_pattern_order, get_number);

  if (!is_null_or_absent(json, "alora_invocation_tokens")) {
    config.alora_invocation_tokens = get_int_list(json["alora_invocation_tokens"], path, "alora_invocation_tokens");
    if (config.alora_invocation_tokens.empty())
      fail(ErrorKind::kFormat, "{}: alora_invocation_tokens is an empty list", path);
  }
  if (!is_null_or_absent(json, "base_model_name_or_path")) {
    if (!json["base_model_name_or_path"].is_string())
      fail_type(path, "base_model_name_or_path", "a string", json["base_model_name_or_path"]);
    config.base_model_name_or_path = json["base_model_name_or_path"].get<std::string>();
  }
  if (!is_null_or_absent(json, "loom_kv_sharing")) {
    const Json& value = json["loom_kv_sharing"];
    const std::vector<std::string> modes = {"isolated", "activated", "base", "forked"};
    if (!value.is_string() || std::find(modes.begin(), modes.end(), value.get<std::string>()) == modes.end())
      fail_type(path, "loom_kv_sharing", "one of \"isolated\", \"activated\", \"base\", \"forked\"", value);
    config.loom_kv_sharing = value.get<std::string>();
  }
  return config;
}

LoraConfig read_lora_config(const std::string& path) {
  std::ifstream stream(path);
  if (!stream) fail(ErrorKind::kNotFound, "{}: cannot open adapter config", path);
  std::stringstream text;
  text << stream.rdbuf();
  const std::string bytes = text.str();
  check_json_nesting(bytes, path, ErrorKind::kFormat);
  Json json;
  try {
    json = Json::parse(bytes);
  } catch (const nlohmann::json::exception& error) {
    fail(ErrorKind::kFormat, "{}: malformed JSON: {}", path, error.what());
  }
  return parse_lora_config(json, path);
}

nlohmann::ordered_json lora_config_to_json(const LoraConfig& config) {
  auto pattern_json = [](const auto& pattern, const std::vector<std::string>& order) {
    Json object = Json::object();
    for (const std::string& key : order)
      if (pattern.count(key)) object[key] = number_json(static_cast<float>(pattern.at(key)));
    for (const auto& [key, value] : pattern)
      if (!object.contains(key)) object[key] = number_json(static_cast<float>(value));
    return object;
  };
  auto names_or_regex = [](const std::vector<std::string>& names, const std::string& regex) -> Json {
    if (!regex.empty()) return regex;
    if (names.empty()) return nullptr;
    std::vector<std::string> sorted = names;
    std::sort(sorted.begin(), sorted.end());
    return sorted;
  };
  // Keys in the (alphabetical) order PEFT 0.21's save_pretrained writes them.
  Json json = Json::object();
  json["alora_invocation_tokens"] =
      config.alora_invocation_tokens.empty() ? Json(nullptr) : Json(config.alora_invocation_tokens);
  json["alpha_pattern"] = pattern_json(config.alpha_pattern, config.alpha_pattern_order);
  json["arrow_config"] = nullptr;
  json["auto_mapping"] = nullptr;
  json["base_model_name_or_path"] =
      config.base_model_name_or_path.empty() ? Json(nullptr) : Json(config.base_model_name_or_path);
  json["bias"] = "none";
  json["corda_config"] = nullptr;
  json["ensure_weight_tying"] = false;
  json["eva_config"] = nullptr;
  json["exclude_modules"] = names_or_regex(config.exclude_modules, config.exclude_modules_regex);
  json["fan_in_fan_out"] = false;
  json["inference_mode"] = true;
  json["init_lora_weights"] = true;
  json["kasa_config"] = nullptr;
  json["layer_replication"] = nullptr;
  json["layers_pattern"] = config.layers_pattern.empty() ? Json(nullptr) : Json(config.layers_pattern);
  json["layers_to_transform"] =
      config.layers_to_transform.empty() ? Json(nullptr) : Json(config.layers_to_transform);
  json["loftq_config"] = Json::object();
  if (!config.loom_kv_sharing.empty()) json["loom_kv_sharing"] = config.loom_kv_sharing;
  json["lora_alpha"] = number_json(config.alpha);
  json["lora_bias"] = false;
  json["lora_dropout"] = 0.0;
  json["lora_ga_config"] = nullptr;
  json["megatron_config"] = nullptr;
  json["megatron_core"] = "megatron.core";
  json["modules_to_save"] = nullptr;
  json["monteclora_config"] = nullptr;
  json["peft_type"] = "LORA";
  json["peft_version"] = "0.21.0";
  json["qalora_group_size"] = 16;
  json["r"] = config.rank;
  json["rank_pattern"] = pattern_json(config.rank_pattern, config.rank_pattern_order);
  json["revision"] = nullptr;
  json["target_modules"] = names_or_regex(config.target_modules, config.target_modules_regex);
  json["target_parameters"] = nullptr;
  json["task_type"] = "CAUSAL_LM";
  json["trainable_token_indices"] = nullptr;
  json["use_bdlora"] = nullptr;
  json["use_dora"] = false;
  json["use_qalora"] = false;
  json["use_rslora"] = config.use_rslora;
  json["velora_config"] = nullptr;
  return json;
}

}  // namespace loom
