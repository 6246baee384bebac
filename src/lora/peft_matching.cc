#include "lora/peft_matching.h"

#include <cmath>
#include <memory>
#include <utility>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "util/error.h"

namespace loom {

namespace {

bool is_attention_target(LoraTarget target) { return static_cast<int>(target) <= static_cast<int>(LoraTarget::kO); }

// One compiled Python-syntax regex. Python's re.match anchors at the start
// (PCRE2_ANCHORED); re.fullmatch also at the end (PCRE2_ENDANCHORED).
class CompiledRegex {
 public:
  CompiledRegex(const std::string& pattern, const std::string& source) {
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), 0, &error_code,
                          &error_offset, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR buffer[256];
      pcre2_get_error_message(error_code, buffer, sizeof(buffer));
      fail(ErrorKind::kFormat, "{}: regex '{}' does not compile at offset {}: {}", source, pattern, error_offset,
           reinterpret_cast<const char*>(buffer));
    }
    match_data_ = pcre2_match_data_create_from_pattern(code_, nullptr);
  }
  ~CompiledRegex() {
    pcre2_match_data_free(match_data_);
    pcre2_code_free(code_);
  }
  CompiledRegex(const CompiledRegex&) = delete;
  CompiledRegex& operator=(const CompiledRegex&) = delete;

  bool fullmatch(const std::string& text) const { return run(text, PCRE2_ANCHORED | PCRE2_ENDANCHORED) >= 0; }
  bool match(const std::string& text) const { return run(text, PCRE2_ANCHORED) >= 0; }

  // re.match, then the text of capture group `group` (empty optional if no match or group unset).
  std::optional<std::string> match_group(const std::string& text, int group) const {
    if (run(text, PCRE2_ANCHORED) < 0) return std::nullopt;
    PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data_);
    if (ovector[2 * group] == PCRE2_UNSET) return std::nullopt;
    return text.substr(ovector[2 * group], ovector[2 * group + 1] - ovector[2 * group]);
  }

 private:
  int run(const std::string& text, uint32_t options) const {
    return pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, options, match_data_,
                       nullptr);
  }
  pcre2_code* code_ = nullptr;
  pcre2_match_data* match_data_ = nullptr;
};

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// key in names or key.endswith("." + name) for some name.
bool matches_name_list(const std::vector<std::string>& names, const std::string& key) {
  for (const std::string& name : names)
    if (key == name || ends_with(key, "." + name)) return true;
  return false;
}

template <typename Value>
std::vector<std::string> keys_in_order(const std::map<std::string, Value>& pattern,
                                       const std::vector<std::string>& order) {
  if (order.size() == pattern.size()) {
    bool consistent = true;
    for (const std::string& key : order) consistent = consistent && pattern.count(key) == 1;
    if (consistent) return order;
  }
  std::vector<std::string> keys;
  for (const auto& [key, value] : pattern) keys.push_back(key);
  return keys;
}

}  // namespace

struct PeftModuleMatcher::Impl {
  const LoraConfig& config;
  std::string source;
  std::unique_ptr<CompiledRegex> target_regex;
  std::unique_ptr<CompiledRegex> exclude_regex;
  // Layer-index extractors for layers_to_transform (group 1 is the index), by layers_pattern entry.
  std::vector<std::pair<std::string, std::unique_ptr<CompiledRegex>>> layer_index_regexes;
  std::vector<std::pair<std::string, std::unique_ptr<CompiledRegex>>> rank_keys, alpha_keys;

  Impl(const LoraConfig& lora_config, std::string source_name)
      : config(lora_config), source(std::move(source_name)) {}

  // A layers_pattern with its own group, "(layers)", moves group 1 off the
  // index: PEFT's int(group(1)) then raises, and so does this (cleanly).
  std::optional<int> layer_index(const std::string& key) const {
    for (const auto& [pattern, regex] : layer_index_regexes) {
      const std::optional<std::string> index = regex->match_group(key, 1);
      if (!index) continue;
      const bool is_index = !index->empty() && index->size() <= 9 &&
                            index->find_first_not_of("0123456789") == std::string::npos;
      if (!is_index)
        fail(ErrorKind::kFormat, "{}: layers_pattern '{}' captures '{}' from module {} where a layer index belongs",
             source, pattern, *index, key);
      return std::stoi(*index);
    }
    return std::nullopt;
  }

  const std::string* pattern_key(
      const std::vector<std::pair<std::string, std::unique_ptr<CompiledRegex>>>& keys,
      const std::string& key) const {
    for (const auto& [pattern, regex] : keys)
      if (regex->match(key)) return &pattern;
    return nullptr;
  }
};

PeftModuleMatcher::PeftModuleMatcher(const LoraConfig& config, std::string source)
    : impl_(new Impl(config, source)) {
  try {
    if (!config.target_modules_regex.empty())
      impl_->target_regex = std::make_unique<CompiledRegex>(config.target_modules_regex, source);
    if (!config.exclude_modules_regex.empty())
      impl_->exclude_regex = std::make_unique<CompiledRegex>(config.exclude_modules_regex, source);
    if (config.layers_pattern.empty()) {
      // Lazy: the first numbered segment is the layer index.
      impl_->layer_index_regexes.emplace_back("", std::make_unique<CompiledRegex>(R"(.*?\.[^.]*\.(\d+)\.)", source));
    } else {
      for (const std::string& pattern : config.layers_pattern)
        impl_->layer_index_regexes.emplace_back(
            pattern, std::make_unique<CompiledRegex>(fmt::format(R"((?:^|.*?\.){}\.(\d+)\.)", pattern), source));
    }
    for (const std::string& key : keys_in_order(config.rank_pattern, config.rank_pattern_order))
      impl_->rank_keys.emplace_back(key, std::make_unique<CompiledRegex>(fmt::format(R"((.*\.)?({})$)", key), source));
    for (const std::string& key : keys_in_order(config.alpha_pattern, config.alpha_pattern_order))
      impl_->alpha_keys.emplace_back(key,
                                     std::make_unique<CompiledRegex>(fmt::format(R"((.*\.)?({})$)", key), source));
  } catch (...) {
    delete impl_;
    throw;
  }
}

PeftModuleMatcher::~PeftModuleMatcher() { delete impl_; }

bool PeftModuleMatcher::targets(const std::string& key) const {
  const LoraConfig& config = impl_->config;
  if (impl_->exclude_regex ? impl_->exclude_regex->fullmatch(key) : matches_name_list(config.exclude_modules, key))
    return false;
  if (impl_->target_regex) return impl_->target_regex->fullmatch(key);
  if (!matches_name_list(config.target_modules, key)) return false;
  if (config.layers_to_transform.empty()) return true;
  std::optional<int> index = impl_->layer_index(key);
  if (!index) return false;
  for (int layer : config.layers_to_transform)
    if (layer == *index) return true;
  return false;
}

int PeftModuleMatcher::rank_for(const std::string& key) const {
  const std::string* pattern = impl_->pattern_key(impl_->rank_keys, key);
  return pattern ? impl_->config.rank_pattern.at(*pattern) : impl_->config.rank;
}

float PeftModuleMatcher::alpha_for(const std::string& key) const {
  const std::string* pattern = impl_->pattern_key(impl_->alpha_keys, key);
  return pattern ? impl_->config.alpha_pattern.at(*pattern) : impl_->config.alpha;
}

const char* lora_target_module_name(LoraTarget target) {
  static constexpr const char* kNames[kNumLoraTargets] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                          "gate_proj", "up_proj", "down_proj"};
  return kNames[static_cast<int>(target)];
}

std::string lora_module_path(int layer, LoraTarget target) {
  return fmt::format("model.layers.{}.{}.{}", layer, is_attention_target(target) ? "self_attn" : "mlp",
                     lora_target_module_name(target));
}

std::vector<std::string> peft_module_paths(const ModelConfig& base) {
  std::vector<std::string> paths = {"model", "model.embed_tokens", "model.layers"};
  for (int layer = 0; layer < base.num_layers; ++layer) {
    const std::string prefix = fmt::format("model.layers.{}", layer);
    paths.push_back(prefix);
    paths.push_back(prefix + ".self_attn");
    for (LoraTarget target : {LoraTarget::kQ, LoraTarget::kK, LoraTarget::kV, LoraTarget::kO})
      paths.push_back(lora_module_path(layer, target));
    if (base.qk_norm) {
      paths.push_back(prefix + ".self_attn.q_norm");
      paths.push_back(prefix + ".self_attn.k_norm");
    }
    paths.push_back(prefix + ".mlp");
    for (LoraTarget target : {LoraTarget::kGate, LoraTarget::kUp, LoraTarget::kDown})
      paths.push_back(lora_module_path(layer, target));
    paths.push_back(prefix + ".mlp.act_fn");
    paths.push_back(prefix + ".input_layernorm");
    paths.push_back(prefix + ".post_attention_layernorm");
  }
  paths.insert(paths.end(), {"model.norm", "model.rotary_emb", "lm_head"});
  return paths;
}

int lora_in_features(const ModelConfig& base, LoraTarget target) {
  switch (target) {
    case LoraTarget::kO: return base.q_size();
    case LoraTarget::kDown: return base.intermediate_size;
    default: return base.hidden_size;
  }
}

int lora_out_features(const ModelConfig& base, LoraTarget target) {
  switch (target) {
    case LoraTarget::kQ: return base.q_size();
    case LoraTarget::kK:
    case LoraTarget::kV: return base.kv_size();
    case LoraTarget::kGate:
    case LoraTarget::kUp: return base.intermediate_size;
    default: return base.hidden_size;
  }
}

float lora_scale(float alpha, int rank, bool use_rslora) {
  // PEFT computes in Python doubles, then the multiply happens in the model dtype.
  const double scale = use_rslora ? static_cast<double>(alpha) / std::sqrt(static_cast<double>(rank))
                                  : static_cast<double>(alpha) / rank;
  return static_cast<float>(scale);
}

LoraAdapterPlan plan_lora_modules(const LoraConfig& config, const ModelConfig& base, const std::string& source) {
  PeftModuleMatcher matcher(config, source);
  LoraAdapterPlan plan(base.num_layers);
  int num_targeted = 0;
  for (const std::string& path : peft_module_paths(base)) {
    if (!matcher.targets(path)) continue;
    std::optional<std::pair<int, LoraTarget>> slot;
    for (int layer = 0; layer < base.num_layers && !slot; ++layer)
      for (int t = 0; t < kNumLoraTargets && !slot; ++t)
        if (path == lora_module_path(layer, static_cast<LoraTarget>(t))) slot.emplace(layer, static_cast<LoraTarget>(t));
    if (!slot) {
      const bool is_embedding = path == "model.embed_tokens" || path == "lm_head";
      throw Error(ErrorKind::kUnsupported,
                  fmt::format("{}: target_modules selects module '{}', which Loom cannot adapt", source, path),
                  is_embedding ? "LoRA on embed_tokens / lm_head is not supported; target only the attention and "
                                 "MLP projections (q,k,v,o,gate,up,down_proj)"
                               : "only the projections q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj and "
                                 "down_proj can carry LoRA weights");
    }
    const int rank = matcher.rank_for(path);
    const float alpha = matcher.alpha_for(path);
    if (rank <= 0) fail(ErrorKind::kFormat, "{}: rank {} for module {} is not positive", source, rank, path);
    plan[slot->first][static_cast<int>(slot->second)] =
        LoraModulePlan{rank, alpha, lora_scale(alpha, rank, config.use_rslora)};
    ++num_targeted;
  }
  if (num_targeted == 0) {
    throw Error(ErrorKind::kFormat,
                fmt::format("{}: target_modules {} match no module of the base model ({} layers)", source,
                            config.target_modules_regex.empty()
                                ? fmt::format("[{}]", fmt::join(config.target_modules, ", "))
                                : "'" + config.target_modules_regex + "'",
                            base.num_layers),
                "is the adapter made for another architecture?");
  }
  return plan;
}

}  // namespace loom
