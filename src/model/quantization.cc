#include "model/quantization.h"

#include <nlohmann/json.hpp>

#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tokenizer/regex.h"
#include "util/error.h"

namespace loom {

namespace {

using nlohmann::json;

constexpr const char* kSupportedHint =
    "Loom loads FP8 checkpoints written by llm-compressor (quant_method compressed-tensors, format "
    "float-quantized, 8-bit float weights per tensor or per channel) or transformers' fbgemm_fp8, besides "
    "bf16/fp16/fp32 safetensors and GGUF files; `--quantization fp8` (cuda) quantizes a 16-bit checkpoint at load";

constexpr const char* kRegexPrefix = "re:";

// Typed access to the quantization_config object, naming the file and key in errors.
class Reader {
 public:
  explicit Reader(const std::string& path) : path_(path) {}

  [[noreturn]] void unsupported(const std::string& message) const {
    throw Error(ErrorKind::kUnsupported, fmt::format("{}: quantization_config: {}", path_, message), kSupportedHint);
  }
  [[noreturn]] void malformed(const std::string& message) const {
    fail(ErrorKind::kFormat, "{}: quantization_config: {}", path_, message);
  }

  // nullptr when absent or null.
  static const json* find(const json& object, const std::string& key) {
    auto found = object.find(key);
    return found == object.end() || found->is_null() ? nullptr : &*found;
  }
  const json& require(const json& object, const std::string& key, const std::string& label) const {
    const json* value = find(object, key);
    if (value == nullptr) malformed(fmt::format("missing \"{}\"", label));
    return *value;
  }
  std::string string(const json& object, const std::string& key, const std::string& label) const {
    const json& value = require(object, key, label);
    if (!value.is_string()) malformed(fmt::format("\"{}\" must be a string, got {}", label, value.dump()));
    return value.get<std::string>();
  }
  bool boolean(const json& object, const std::string& key, const std::string& label, bool fallback) const {
    const json* value = find(object, key);
    if (value == nullptr) return fallback;
    if (!value->is_boolean()) malformed(fmt::format("\"{}\" must be true or false, got {}", label, value->dump()));
    return value->get<bool>();
  }
  const json& object(const json& parent, const std::string& key, const std::string& label) const {
    const json& value = require(parent, key, label);
    if (!value.is_object()) malformed(fmt::format("\"{}\" must be an object, got {}", label, value.dump()));
    return value;
  }
  std::vector<std::string> strings(const json& object, const std::string& key, const std::string& label) const {
    std::vector<std::string> values;
    const json* value = find(object, key);
    if (value == nullptr) return values;
    if (!value->is_array()) malformed(fmt::format("\"{}\" must be a list of strings, got {}", label, value->dump()));
    for (const json& item : *value) {
      if (!item.is_string()) malformed(fmt::format("\"{}\" must be a list of strings, got {}", label, value->dump()));
      values.push_back(item.get<std::string>());
    }
    return values;
  }

 private:
  const std::string& path_;
};

// One group's arguments ("weights" or "input_activations"): 8-bit float, the
// strategy returned; num_bits, type and the group/block fields checked.
std::string read_float8_args(const Reader& reader, const json& args, const std::string& label) {
  if (!args.is_object()) reader.malformed(fmt::format("\"{}\" must be an object, got {}", label, args.dump()));
  const json& bits = reader.require(args, "num_bits", label + ".num_bits");
  if (!bits.is_number_integer())
    reader.malformed(fmt::format("\"{}.num_bits\" must be an integer, got {}", label, bits.dump()));
  const std::string type = Reader::find(args, "type") ? reader.string(args, "type", label + ".type") : "int";
  if (type != "float")
    reader.unsupported(fmt::format("{}.type \"{}\" is not supported: Loom runs 8-bit float (FP8 e4m3) only", label,
                                   type));
  if (bits.get<int64_t>() != 8)
    reader.unsupported(fmt::format("{}.num_bits {} is not supported: Loom runs 8-bit float (FP8 e4m3) only", label,
                                   bits.dump()));
  const std::string strategy = reader.string(args, "strategy", label + ".strategy");
  for (const char* key : {"group_size", "block_structure"})
    if (const json* value = Reader::find(args, key))
      reader.unsupported(fmt::format("{}.{} {} is not supported: FP8 scales per tensor, channel or token only",
                                     label, key, value->dump()));
  return strategy;
}

QuantizationScheme group_scheme(const Reader& reader, const json& group, const std::string& label) {
  if (!group.is_object()) reader.malformed(fmt::format("\"{}\" must be an object, got {}", label, group.dump()));
  const std::vector<std::string> targets = reader.strings(group, "targets", label + ".targets");
  if (targets != std::vector<std::string>{"Linear"})
    reader.unsupported(fmt::format("{}.targets [{}] is not supported: Loom applies one scheme to every Linear layer "
                                   "(targets [\"Linear\"], exceptions in \"ignore\")",
                                   label, fmt::join(targets, ", ")));
  if (const json* output = Reader::find(group, "output_activations"))
    reader.unsupported(fmt::format("{}.output_activations {} is not supported", label, output->dump()));

  QuantizationScheme scheme;
  scheme.method = QuantizationMethod::kCompressedTensors;
  const json* weights = Reader::find(group, "weights");
  if (weights == nullptr) reader.unsupported(fmt::format("{}.weights is missing: Loom needs FP8 weights", label));
  const std::string weight_label = label + ".weights";
  const std::string weight_strategy = read_float8_args(reader, *weights, weight_label);
  if (weight_strategy == "tensor")
    scheme.weight_strategy = Fp8WeightStrategy::kTensor;
  else if (weight_strategy == "channel")
    scheme.weight_strategy = Fp8WeightStrategy::kChannel;
  else
    reader.unsupported(fmt::format("{}.strategy \"{}\" is not supported: FP8 weights per tensor or per channel only",
                                   weight_label, weight_strategy));
  if (!reader.boolean(*weights, "symmetric", weight_label + ".symmetric", true))
    reader.unsupported(fmt::format("{}.symmetric false is not supported: FP8 weights are symmetric", weight_label));
  if (reader.boolean(*weights, "dynamic", weight_label + ".dynamic", false))
    reader.unsupported(fmt::format("{}.dynamic true is not supported: weights carry their scales", weight_label));

  const json* inputs = Reader::find(group, "input_activations");
  if (inputs == nullptr) return scheme;  // weight-only FP8
  const std::string input_label = label + ".input_activations";
  const std::string input_strategy = read_float8_args(reader, *inputs, input_label);
  const bool dynamic = reader.boolean(*inputs, "dynamic", input_label + ".dynamic", false);
  if (input_strategy != "tensor" && input_strategy != "token")
    reader.unsupported(fmt::format("{}.strategy \"{}\" is not supported: FP8 activations per tensor or per token only",
                                   input_label, input_strategy));
  if (dynamic) {
    scheme.activations =
        input_strategy == "token" ? Fp8Activations::kDynamicPerToken : Fp8Activations::kDynamicPerTensor;
    return scheme;
  }
  if (input_strategy == "token")
    reader.unsupported(fmt::format("{}: static per-token activation scales are not supported (a token's scale is "
                                   "only known at run time: give dynamic true)",
                                   input_label));
  if (!reader.boolean(*inputs, "symmetric", input_label + ".symmetric", true))
    reader.unsupported(fmt::format("{}.symmetric false is not supported: static FP8 activations are symmetric",
                                   input_label));
  scheme.activations = Fp8Activations::kStaticPerTensor;
  return scheme;
}

bool same_scheme(const QuantizationScheme& a, const QuantizationScheme& b) {
  return a.method == b.method && a.weight_strategy == b.weight_strategy && a.activations == b.activations;
}

// An ignore entry "re:REGEX" as a pattern anchored at the name's start (Python's re.match; PCRE2, whose
// syntax is Python's for what these lists use).
Regex ignore_pattern(const std::string& entry) {
  return Regex("\\A(?:" + entry.substr(3) + ")", "quantization_config ignore entry \"" + entry + "\"");
}

void check_ignore_patterns(const Reader& reader, const std::vector<std::string>& ignore) {
  for (const std::string& entry : ignore) {
    if (entry.rfind(kRegexPrefix, 0) != 0) continue;
    try {
      ignore_pattern(entry);
    } catch (const Error& error) {
      reader.malformed(fmt::format("ignore entry \"{}\" is not a valid regular expression ({})", entry,
                                   error.message()));
    }
  }
}

QuantizationScheme parse_compressed_tensors(const Reader& reader, const json& config) {
  const std::string format = reader.string(config, "format", "format");
  if (format != "float-quantized" && format != "naive-quantized")
    reader.unsupported(fmt::format("compressed-tensors format \"{}\" is not supported (Loom reads float-quantized: "
                                   "FP8 weights)",
                                   format));
  if (const json* sparsity = Reader::find(config, "sparsity_config"); sparsity != nullptr && !sparsity->empty())
    reader.unsupported(fmt::format("sparsity_config {} is not supported", sparsity->dump()));
  const json& groups = reader.object(config, "config_groups", "config_groups");
  if (groups.empty()) reader.malformed("\"config_groups\" is empty: nothing is quantized");
  QuantizationScheme scheme;
  bool first = true;
  for (const auto& [name, group] : groups.items()) {
    const QuantizationScheme next = group_scheme(reader, group, "config_groups." + name);
    if (!first && !same_scheme(scheme, next))
      reader.unsupported("config_groups with different schemes are not supported: Loom runs one FP8 scheme for "
                         "every Linear layer");
    scheme = next;
    first = false;
  }
  scheme.ignore = reader.strings(config, "ignore", "ignore");
  check_ignore_patterns(reader, scheme.ignore);
  if (const json* kv = Reader::find(config, "kv_cache_scheme"); kv != nullptr && !kv->is_null()) {
    const std::string strategy = read_float8_args(reader, *kv, "kv_cache_scheme");
    if (strategy != "tensor")
      reader.unsupported(fmt::format("kv_cache_scheme.strategy \"{}\" is not supported: one FP8 KV scale per "
                                     "tensor (k_scale, v_scale per layer) only", strategy));
    if (reader.boolean(*kv, "dynamic", "kv_cache_scheme.dynamic", false))
      reader.unsupported("kv_cache_scheme.dynamic true is not supported: the KV cache's scales come from the "
                         "checkpoint");
    scheme.kv_cache_scales = true;
  }
  return scheme;
}

QuantizationScheme parse_fbgemm_fp8(const Reader& reader, const json& config) {
  QuantizationScheme scheme;
  scheme.method = QuantizationMethod::kFbgemmFp8;
  scheme.weight_strategy = Fp8WeightStrategy::kChannel;
  scheme.activations = Fp8Activations::kDynamicPerToken;
  const json& bound = reader.require(config, "activation_scale_ub", "activation_scale_ub");
  if (!bound.is_number())
    reader.malformed(fmt::format("\"activation_scale_ub\" must be a number, got {}", bound.dump()));
  const double value = bound.get<double>();
  if (!(std::isfinite(value) && value > 0.0 && value <= 3.0e38))
    reader.malformed(fmt::format("\"activation_scale_ub\" must be finite and > 0, got {}", bound.dump()));
  scheme.activation_scale_ub = static_cast<float>(value);
  scheme.ignore = reader.strings(config, "modules_to_not_convert", "modules_to_not_convert");
  return scheme;
}

}  // namespace

struct IgnoreMatcher::Patterns {
  std::vector<Regex> regexes;  // compressed-tensors' "re:" entries
};

IgnoreMatcher::IgnoreMatcher(const QuantizationScheme& scheme)
    : scheme_(scheme), patterns_(std::make_unique<Patterns>()) {
  if (scheme.method == QuantizationMethod::kFbgemmFp8) return;
  for (const std::string& entry : scheme.ignore)
    if (entry.rfind(kRegexPrefix, 0) == 0) patterns_->regexes.push_back(ignore_pattern(entry));
}

IgnoreMatcher::~IgnoreMatcher() = default;

bool IgnoreMatcher::ignores(const std::string& module) const {
  for (const std::string& entry : scheme_.ignore) {
    if (entry == module) return true;
    // transformers' rule for modules_to_not_convert: a part of the name
    if (scheme_.method == QuantizationMethod::kFbgemmFp8 && !entry.empty() && module.find(entry) != std::string::npos)
      return true;
  }
  for (const Regex& regex : patterns_->regexes)
    if (!regex.find_all(module).empty()) return true;
  return false;
}

bool QuantizationScheme::ignores(const std::string& module) const { return IgnoreMatcher(*this).ignores(module); }

const char* quantization_method_name(QuantizationMethod method) {
  switch (method) {
    case QuantizationMethod::kNone: return "none";
    case QuantizationMethod::kCompressedTensors: return "compressed-tensors";
    case QuantizationMethod::kFbgemmFp8: return "fbgemm_fp8";
  }
  return "none";
}

const char* fp8_weight_strategy_name(Fp8WeightStrategy strategy) {
  return strategy == Fp8WeightStrategy::kTensor ? "tensor" : "channel";
}

const char* fp8_activations_name(Fp8Activations activations) {
  switch (activations) {
    case Fp8Activations::kNone: return "none";
    case Fp8Activations::kDynamicPerToken: return "dynamic per token";
    case Fp8Activations::kDynamicPerTensor: return "dynamic per tensor";
    case Fp8Activations::kStaticPerTensor: return "static per tensor";
  }
  return "none";
}

std::string describe(const QuantizationScheme& scheme) {
  if (!scheme.fp8()) return "none";
  std::string text = fmt::format("{} fp8: weights per {}, activations {}", quantization_method_name(scheme.method),
                                 fp8_weight_strategy_name(scheme.weight_strategy),
                                 fp8_activations_name(scheme.activations));
  if (scheme.activation_scale_ub > 0.0f) text += fmt::format(" (abs-max bound {})", scheme.activation_scale_ub);
  if (!scheme.ignore.empty())
    text += fmt::format(", {} ignore entr{}", scheme.ignore.size(), scheme.ignore.size() == 1 ? "y" : "ies");
  return text;
}

QuantizationScheme parse_quantization_config(const nlohmann::json& config, const std::string& path) {
  const Reader reader(path);
  if (!config.is_object()) reader.malformed(fmt::format("must be an object, got {}", config.dump()));
  const std::string method = reader.string(config, "quant_method", "quant_method");
  if (method == "compressed-tensors") return parse_compressed_tensors(reader, config);
  if (method == "fbgemm_fp8") return parse_fbgemm_fp8(reader, config);
  reader.unsupported(fmt::format("quant_method \"{}\" is not supported", method));
}

}  // namespace loom
