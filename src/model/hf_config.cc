#include "model/hf_config.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "util/error.h"
#include "util/json_nesting.h"

namespace loom {

namespace {

using nlohmann::json;

// Typed access to config.json fields with errors that name the file and key.
class ConfigReader {
 public:
  ConfigReader(const json& root, const std::string& path) : root_(root), path_(path) {}

  const std::string& path() const { return path_; }

  bool has(const std::string& key) const { return has_in(root_, key); }
  static bool has_in(const json& object, const std::string& key) {
    auto found = object.find(key);
    return found != object.end() && !found->is_null();
  }

  int require_int(const std::string& key) const { return int_in(root_, key, key); }
  int get_int(const std::string& key, int fallback) const {
    return has(key) ? require_int(key) : fallback;
  }
  int int_in(const json& object, const std::string& key, const std::string& label) const {
    auto found = object.find(key);
    if (found == object.end() || found->is_null())
      fail(ErrorKind::kFormat, "{}: missing required field \"{}\"", path_, label);
    return to_int(*found, label);
  }
  int to_int(const json& value, const std::string& label) const {
    if (value.is_number_integer()) {
      int64_t number = value.get<int64_t>();
      if (number >= INT32_MIN && number <= INT32_MAX) return static_cast<int>(number);
    } else if (value.is_number_float()) {
      double number = value.get<double>();
      if (std::floor(number) == number && std::abs(number) < 2147483647.0) return static_cast<int>(number);
    }
    fail(ErrorKind::kFormat, "{}: field \"{}\" must be an integer, got {}", path_, label, value.dump());
  }

  float float_in(const json& object, const std::string& key, const std::string& label,
                 float fallback) const {
    auto found = object.find(key);
    if (found == object.end() || found->is_null()) return fallback;
    if (!found->is_number())
      fail(ErrorKind::kFormat, "{}: field \"{}\" must be a number, got {}", path_, label, found->dump());
    const double number = found->get<double>();
    if (!(std::abs(number) <= std::numeric_limits<float>::max()))
      fail(ErrorKind::kFormat, "{}: field \"{}\" is out of range, got {}", path_, label, found->dump());
    return static_cast<float>(number);
  }
  float get_float(const std::string& key, float fallback) const {
    return float_in(root_, key, key, fallback);
  }

  bool get_bool(const std::string& key, bool fallback) const {
    auto found = root_.find(key);
    if (found == root_.end() || found->is_null()) return fallback;
    if (!found->is_boolean())
      fail(ErrorKind::kFormat, "{}: field \"{}\" must be true or false, got {}", path_, key, found->dump());
    return found->get<bool>();
  }

  std::string get_string(const std::string& key, const std::string& fallback) const {
    auto found = root_.find(key);
    if (found == root_.end() || found->is_null()) return fallback;
    if (!found->is_string())
      fail(ErrorKind::kFormat, "{}: field \"{}\" must be a string, got {}", path_, key, found->dump());
    return found->get<std::string>();
  }

  const json* object(const std::string& key) const {
    auto found = root_.find(key);
    if (found == root_.end() || found->is_null()) return nullptr;
    if (!found->is_object())
      fail(ErrorKind::kFormat, "{}: field \"{}\" must be an object, got {}", path_, key, found->dump());
    return &*found;
  }

 private:
  const json& root_;
  const std::string& path_;
};

Architecture read_architecture(const ConfigReader& reader, const json& root) {
  auto architectures = root.find("architectures");
  if (architectures != root.end() && !architectures->is_null()) {
    if (!architectures->is_array() || architectures->empty() || !(*architectures)[0].is_string())
      fail(ErrorKind::kFormat, "{}: \"architectures\" must be a non-empty list of strings", reader.path());
    const std::string name = (*architectures)[0].get<std::string>();
    try {
      return architecture_from_hf_name(name);
    } catch (const Error& error) {
      throw Error(error.kind(), fmt::format("{}: {}", reader.path(), error.message()), error.hint());
    }
  }
  const std::string model_type = reader.get_string("model_type", "");
  if (model_type.empty())
    fail(ErrorKind::kFormat, "{}: neither \"architectures\" nor \"model_type\" is set", reader.path());
  try {
    return architecture_from_short_name(model_type);
  } catch (const Error& error) {
    throw Error(error.kind(), fmt::format("{}: model_type: {}", reader.path(), error.message()),
                error.hint());
  }
}

// transformers 4 spells RoPE as rope_theta + rope_scaling; transformers 5 as
// rope_parameters {rope_type, rope_theta, ...}. Like transformers 5, a non-null
// rope_scaling wins over rope_parameters, and a theta inside the dict wins over
// the top-level one.
void read_rope(const ConfigReader& reader, ModelConfig& config) {
  const json* parameters = reader.object("rope_scaling");
  std::string label = "rope_scaling";
  if (parameters == nullptr) {
    parameters = reader.object("rope_parameters");
    label = "rope_parameters";
  }
  config.rope_theta = reader.get_float("rope_theta", 10000.0f);
  if (parameters == nullptr) return;
  config.rope_theta = reader.float_in(*parameters, "rope_theta", label + ".rope_theta", config.rope_theta);

  std::string rope_type = "default";
  for (const char* key : {"rope_type", "type"}) {
    auto found = parameters->find(key);
    if (found != parameters->end() && !found->is_null()) {
      if (!found->is_string())
        fail(ErrorKind::kFormat, "{}: {}.{} must be a string", reader.path(), label, key);
      rope_type = found->get<std::string>();
      break;
    }
  }
  if (rope_type == "default") return;
  if (rope_type != "llama3")
    throw Error(ErrorKind::kUnsupported,
                fmt::format("{}: {} type \"{}\" is not supported", reader.path(), label, rope_type),
                "supported rope types: default, llama3");
  RopeScaling& scaling = config.rope_scaling;
  scaling.type = RopeScaling::Type::kLlama3;
  scaling.factor = reader.float_in(*parameters, "factor", label + ".factor", NAN);
  scaling.low_freq_factor = reader.float_in(*parameters, "low_freq_factor", label + ".low_freq_factor", NAN);
  scaling.high_freq_factor =
      reader.float_in(*parameters, "high_freq_factor", label + ".high_freq_factor", NAN);
  scaling.original_max_position_embeddings = reader.int_in(
      *parameters, "original_max_position_embeddings", label + ".original_max_position_embeddings");
  for (auto [value, name] : {std::pair{scaling.factor, "factor"},
                             std::pair{scaling.low_freq_factor, "low_freq_factor"},
                             std::pair{scaling.high_freq_factor, "high_freq_factor"}})
    if (std::isnan(value))
      fail(ErrorKind::kFormat, "{}: llama3 {} needs \"{}\"", reader.path(), label, name);
}

void read_special_tokens(const ConfigReader& reader, const json& root, ModelConfig& config) {
  config.bos_token_id = reader.get_int("bos_token_id", -1);
  auto eos = root.find("eos_token_id");
  if (eos == root.end() || eos->is_null()) return;
  if (eos->is_array()) {
    for (const auto& id : *eos) config.eos_token_ids.push_back(reader.to_int(id, "eos_token_id"));
  } else {
    config.eos_token_ids.push_back(reader.to_int(*eos, "eos_token_id"));
  }
}

// The shortest decimal that reads back as the same float ("1e-05", not
// 9.999999747378752e-06), so written configs look like the ones HF publishes.
json float_json(float value) { return json(std::stod(fmt::format("{}", value))); }

// Each architecture fixes which optional parts exist; a config that asks for
// another combination cannot be written as that architecture.
void check_expressible(const ModelConfig& config) {
  const char* name = architecture_hf_name(config.arch);
  bool expressible = true;
  switch (config.arch) {
    case Architecture::kLlama:
      expressible = config.qkv_bias == config.o_bias && !config.qk_norm;
      break;
    case Architecture::kQwen2:
      expressible = config.qkv_bias && !config.o_bias && !config.qk_norm;
      break;
    case Architecture::kQwen3:
      expressible = config.qkv_bias == config.o_bias && config.qk_norm;
      break;
    case Architecture::kMistral:
      expressible = !config.qkv_bias && !config.o_bias && !config.qk_norm;
      break;
  }
  if (!expressible)
    fail(ErrorKind::kUnsupported, "{} cannot express qkv_bias={} o_bias={} qk_norm={}", name,
         config.qkv_bias, config.o_bias, config.qk_norm);
}

}  // namespace

ModelConfig parse_hf_config(const nlohmann::json& root, const std::string& path) {
  if (!root.is_object()) fail(ErrorKind::kFormat, "{}: config is not a JSON object", path);
  ConfigReader reader(root, path);
  ModelConfig config;
  config.arch = read_architecture(reader, root);

  const std::string hidden_act = reader.get_string("hidden_act", "silu");
  if (hidden_act != "silu")
    fail(ErrorKind::kUnsupported, "{}: hidden_act \"{}\" is not supported (only silu)", path, hidden_act);
  if (reader.get_bool("mlp_bias", false))
    fail(ErrorKind::kUnsupported, "{}: mlp_bias=true is not supported", path);

  config.vocab_size = reader.require_int("vocab_size");
  config.hidden_size = reader.require_int("hidden_size");
  config.intermediate_size = reader.require_int("intermediate_size");
  config.num_layers = reader.require_int("num_hidden_layers");
  config.num_heads = reader.require_int("num_attention_heads");
  config.num_kv_heads = reader.get_int("num_key_value_heads", config.num_heads);
  if (config.num_heads <= 0)
    fail(ErrorKind::kFormat, "{}: num_attention_heads must be positive, got {}", path, config.num_heads);
  // Qwen3Config defaults head_dim to 128; the others derive it.
  const int derived_head_dim = config.arch == Architecture::kQwen3 ? 128 : config.hidden_size / config.num_heads;
  config.head_dim = reader.get_int("head_dim", derived_head_dim);
  config.rms_norm_eps = reader.get_float("rms_norm_eps", 1e-6f);
  config.tie_word_embeddings = reader.get_bool("tie_word_embeddings", false);
  read_rope(reader, config);

  switch (config.arch) {
    case Architecture::kLlama: {
      config.max_position_embeddings = reader.get_int("max_position_embeddings", 2048);
      const bool attention_bias = reader.get_bool("attention_bias", false);
      config.qkv_bias = config.o_bias = attention_bias;
      break;
    }
    case Architecture::kQwen2:
      config.max_position_embeddings = reader.get_int("max_position_embeddings", 32768);
      config.qkv_bias = true;
      if (reader.get_bool("use_sliding_window", false)) config.sliding_window = reader.get_int("sliding_window", 4096);
      break;
    case Architecture::kQwen3: {
      config.max_position_embeddings = reader.get_int("max_position_embeddings", 32768);
      const bool attention_bias = reader.get_bool("attention_bias", false);
      config.qkv_bias = config.o_bias = attention_bias;
      config.qk_norm = true;
      if (reader.get_bool("use_sliding_window", false)) config.sliding_window = reader.get_int("sliding_window", 4096);
      break;
    }
    case Architecture::kMistral:
      config.max_position_embeddings = reader.get_int("max_position_embeddings", 4096 * 32);
      config.sliding_window = reader.get_int("sliding_window", 0);
      break;
  }
  read_special_tokens(reader, root, config);
  config.torch_dtype = reader.get_string("dtype", reader.get_string("torch_dtype", "float32"));
  if (const json* quantization = reader.object("quantization_config"))
    config.quantization = parse_quantization_config(*quantization, path);
  config.validate(path);
  return config;
}

ModelConfig read_hf_config(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) fail(ErrorKind::kNotFound, "cannot open {}", path);
  std::stringstream text;
  text << stream.rdbuf();
  const std::string bytes = text.str();
  check_json_nesting(bytes, path, ErrorKind::kFormat);
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(bytes);
  } catch (const nlohmann::json::exception& error) {
    fail(ErrorKind::kFormat, "{}: not valid JSON: {}", path, error.what());
  }
  return parse_hf_config(root, path);
}

nlohmann::json hf_config_to_json(const ModelConfig& config) {
  check_expressible(config);
  json out;
  out["architectures"] = {architecture_hf_name(config.arch)};
  out["model_type"] = architecture_short_name(config.arch);
  out["vocab_size"] = config.vocab_size;
  out["hidden_size"] = config.hidden_size;
  out["intermediate_size"] = config.intermediate_size;
  out["num_hidden_layers"] = config.num_layers;
  out["num_attention_heads"] = config.num_heads;
  out["num_key_value_heads"] = config.num_kv_heads;
  out["head_dim"] = config.head_dim;
  out["max_position_embeddings"] = config.max_position_embeddings;
  out["rms_norm_eps"] = float_json(config.rms_norm_eps);
  out["hidden_act"] = "silu";
  out["tie_word_embeddings"] = config.tie_word_embeddings;
  out["dtype"] = config.torch_dtype;
  out["use_cache"] = true;

  // transformers 5 reads rope_parameters; rope_theta and (for llama3) rope_scaling
  // keep transformers 4 working, and transformers 5 resolves them to the same values.
  json rope = {{"rope_type", "default"}, {"rope_theta", float_json(config.rope_theta)}};
  out["rope_theta"] = float_json(config.rope_theta);
  if (config.rope_scaling.type == RopeScaling::Type::kLlama3) {
    json scaling = {{"rope_type", "llama3"},
                    {"factor", float_json(config.rope_scaling.factor)},
                    {"low_freq_factor", float_json(config.rope_scaling.low_freq_factor)},
                    {"high_freq_factor", float_json(config.rope_scaling.high_freq_factor)},
                    {"original_max_position_embeddings", config.rope_scaling.original_max_position_embeddings}};
    out["rope_scaling"] = scaling;
    rope.update(scaling);
  }
  out["rope_parameters"] = rope;

  if (config.arch == Architecture::kLlama || config.arch == Architecture::kQwen3)
    out["attention_bias"] = config.qkv_bias;
  if (config.arch == Architecture::kLlama) out["mlp_bias"] = false;
  if (config.arch == Architecture::kQwen2 || config.arch == Architecture::kQwen3) {
    out["use_sliding_window"] = config.sliding_window > 0;
    out["sliding_window"] = config.sliding_window > 0 ? json(config.sliding_window) : json(nullptr);
    out["max_window_layers"] = 0;
  } else if (config.arch == Architecture::kMistral) {
    out["sliding_window"] = config.sliding_window > 0 ? json(config.sliding_window) : json(nullptr);
  }
  out["bos_token_id"] = config.bos_token_id >= 0 ? json(config.bos_token_id) : json(nullptr);
  if (config.eos_token_ids.empty())
    out["eos_token_id"] = nullptr;
  else if (config.eos_token_ids.size() == 1)
    out["eos_token_id"] = config.eos_token_ids[0];
  else
    out["eos_token_id"] = config.eos_token_ids;
  return out;
}

}  // namespace loom
