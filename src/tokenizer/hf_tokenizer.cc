#include "tokenizer/hf_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tokenizer/utf8.h"
#include "util/error.h"
#include "util/json_nesting.h"

namespace loom {
namespace {

// Added tokens sit just past the model's vocabulary; the bound keeps
// id + 1 (the vocabulary size) far from overflowing, as BpeModel's does.
constexpr int64_t kMaxAddedTokenId = 1 << 24;

// Tokens that end a turn or a document in the families we serve.
constexpr const char* kEndOfTurnTokens[] = {"<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>",
                                            "<|eom_id|>", "</s>"};

// tokenizer_config.json spells a token as "text" or {"content": "text", ...}.
std::optional<std::string> config_token(const nlohmann::json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return std::nullopt;
  const auto& value = config.at(key);
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string())
    return value["content"].get<std::string>();
  return std::nullopt;
}

// The template named `name` ("default": also a plain string, or else the
// list's first entry); "" when there is none.
std::string config_chat_template(const nlohmann::json& config, const std::string& name = "default") {
  if (!config.is_object() || !config.contains("chat_template")) return {};
  const auto& value = config.at("chat_template");
  if (value.is_string()) return name == "default" ? value.get<std::string>() : std::string();
  if (value.is_array()) {  // [{"name": "default", "template": ...}, ...]
    const auto template_of = [](const nlohmann::json& entry) {
      const auto it = entry.find("template");
      return it != entry.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    for (const auto& entry : value) {
      if (!entry.is_object()) continue;
      const auto it = entry.find("name");
      if (it != entry.end() && it->is_string() && *it == name) return template_of(entry);
    }
    if (name == "default" && !value.empty() && value[0].is_object()) return template_of(value[0]);
  }
  return {};
}

}  // namespace

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail(ErrorKind::kNotFound, "{}: cannot open file", path);
  std::stringstream buffer;
  buffer << file.rdbuf();
  const std::string bytes = buffer.str();
  check_json_nesting(bytes, path, ErrorKind::kFormat);
  try {
    return nlohmann::json::parse(bytes);
  } catch (const nlohmann::json::exception& error) {
    fail(ErrorKind::kFormat, "{}: malformed JSON: {}", path, error.what());
  }
}

HfTokenizer::HfTokenizer(nlohmann::json tokenizer_json, nlohmann::json config, const std::string& context)
    : skeleton_(std::move(tokenizer_json)), config_(std::move(config)) {
  try {
    if (!skeleton_.is_object() || !skeleton_.contains("model"))
      fail(ErrorKind::kFormat, "{}: tokenizer.json has no \"model\"", context);
    model_ = BpeModel::from_json(skeleton_.at("model"), context);
    skeleton_.erase("model");
    normalizer_ = Normalizer::from_json(skeleton_.value("normalizer", nlohmann::json()), context);
    pre_tokenizer_ = PreTokenizer::from_json(skeleton_.value("pre_tokenizer", nlohmann::json()), context);
    post_processor_ = PostProcessor::from_json(skeleton_.value("post_processor", nlohmann::json()), context);
    decoder_ = Decoder::from_json(skeleton_.value("decoder", nlohmann::json()), context);
    std::vector<AddedToken> added_tokens;
    for (const auto& value : skeleton_.value("added_tokens", nlohmann::json::array())) {
      const nlohmann::json& id = value.at("id");
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxAddedTokenId)
        fail(ErrorKind::kFormat, "{}: added token id {} is not an integer in [0, {}]", context, id.dump(),
             kMaxAddedTokenId);
      added_tokens.push_back(AddedVocabulary::token_from_json(value));
    }
    vocab_size_ = model_->num_ids();
    for (const AddedToken& token : added_tokens) vocab_size_ = std::max(vocab_size_, token.id + 1);
    // Ids the post-processor inserts reach the engine as prompt tokens.
    for (const std::vector<TokenId>* ids : {&post_processor_.prefix_ids(), &post_processor_.suffix_ids()})
      for (TokenId id : *ids)
        if (id < 0 || id >= vocab_size_)
          fail(ErrorKind::kFormat, "{}: post_processor adds token id {}, outside the vocabulary (size {})",
               context, id, vocab_size_);
    added_vocabulary_ = AddedVocabulary(std::move(added_tokens),
                                        [this](const std::string& content) { return normalizer_.apply(content); });
    load_config(context);
  } catch (const nlohmann::json::exception& error) {
    fail(ErrorKind::kFormat, "{}: unexpected tokenizer JSON: {}", context, error.what());
  }
}

void HfTokenizer::load_config(const std::string& context) {
  if (const auto bos = config_token(config_, "bos_token")) bos_id_ = token_to_id(*bos);
  if (!bos_id_ && post_processor_.prefix_ids().size() == 1) bos_id_ = post_processor_.prefix_ids()[0];
  if (const auto eos = config_token(config_, "eos_token")) {
    if (const auto id = token_to_id(*eos)) eos_ids_.push_back(*id);
  }
  for (const char* name : kEndOfTurnTokens) {
    const AddedToken* token = added_vocabulary_.find_by_content(name);
    if (token != nullptr && token->special &&
        std::find(eos_ids_.begin(), eos_ids_.end(), token->id) == eos_ids_.end()) {
      eos_ids_.push_back(token->id);
    }
  }
  add_bos_from_config_ = config_.is_object() && config_.value("add_bos_token", false) &&
                         post_processor_.prefix_ids().empty() && bos_id_.has_value();
  const std::string bos_text = bos_id_ ? token_text(*bos_id_) : std::string();
  chat_template_ = ChatTemplate::from_jinja(config_chat_template(config_), bos_text);

  ModelChatTemplates& templates = model_chat_templates_;
  templates.default_source = config_chat_template(config_);
  templates.has_model_template = !templates.default_source.empty();
  if (!templates.has_model_template) templates.default_source = chat_template_.jinja();
  templates.tool_use_source = config_chat_template(config_, "tool_use");
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    if (const auto token = config_token(config_, key)) templates.special_tokens.emplace_back(key, *token);
  }
}

std::vector<TokenId> HfTokenizer::encode(std::string_view input, bool add_special_tokens) const {
  std::string text = utf8::is_valid(input) ? std::string(input) : utf8::to_valid_lossy(input);
  std::vector<TextSegment> raw_segments;
  added_vocabulary_.split({std::move(text), -1, true}, /*normalized_pass=*/false, raw_segments);
  std::vector<TextSegment> segments;
  for (TextSegment& segment : raw_segments) {
    if (segment.added_token_id < 0) segment.text = normalizer_.apply(segment.text);
    added_vocabulary_.split(segment, /*normalized_pass=*/true, segments);
  }
  std::vector<TokenId> ids;
  ids.reserve(input.size() / 3 + 4);
  for (const TextSegment& segment : segments) {
    if (segment.added_token_id >= 0) {
      ids.push_back(segment.added_token_id);
      continue;
    }
    if (segment.text.empty()) continue;
    for (const std::string& word : pre_tokenizer_.split(segment.text, segment.starts_input))
      model_->encode_word(word, ids);
  }
  if (add_special_tokens) {
    post_processor_.apply(ids);
    if (add_bos_from_config_) ids.insert(ids.begin(), *bos_id_);
  }
  return ids;
}

std::string HfTokenizer::decode(const std::vector<TokenId>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (TokenId id : ids) {
    if (const AddedToken* token = added_vocabulary_.find_by_id(id)) {
      if (!(skip_special_tokens && token->special)) tokens.push_back(*added_vocabulary_.text_by_id(id));
      continue;
    }
    const std::string& text = model_->id_to_token(id);
    if (!text.empty()) tokens.push_back(text);  // HF drops unknown ids
  }
  if (decoder_.empty()) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) joined += ' ';
      joined += tokens[i];
    }
    return joined;
  }
  return decoder_.decode(std::move(tokens));
}

std::string HfTokenizer::token_bytes(TokenId id) const {
  const std::string text = token_text(id);
  if (text.empty()) return {};
  return decoder_.token_bytes(text);
}

std::string HfTokenizer::token_text(TokenId id) const {
  if (const std::string* text = added_vocabulary_.text_by_id(id)) return *text;
  return model_->id_to_token(id);
}

std::optional<TokenId> HfTokenizer::token_to_id(std::string_view token) const {
  if (const AddedToken* added = added_vocabulary_.find_by_content(token)) return added->id;
  return model_->token_to_id(token);
}

bool HfTokenizer::is_special(TokenId id) const {
  const AddedToken* token = added_vocabulary_.find_by_id(id);
  return token != nullptr && token->special;
}

std::string HfTokenizer::to_hf_tokenizer_json() const {
  nlohmann::json out = skeleton_;
  out["model"] = model_->to_json();
  return out.dump(2);
}

std::string HfTokenizer::to_hf_tokenizer_config_json() const {
  nlohmann::json out = config_.is_object() ? config_ : nlohmann::json::object();
  if (config_chat_template(out).empty()) out["chat_template"] = chat_template_.jinja();  // keeps the list form
  if (bos_id_ && !out.contains("bos_token")) out["bos_token"] = token_text(*bos_id_);
  if (!eos_ids_.empty() && !out.contains("eos_token")) out["eos_token"] = token_text(eos_ids_.front());
  if (!out.contains("tokenizer_class")) out["tokenizer_class"] = "PreTrainedTokenizerFast";
  return out.dump(2);
}

// --- factories ---------------------------------------------------------------

std::shared_ptr<const Tokenizer> Tokenizer::from_hf_json_file(const std::string& tokenizer_json_path,
                                                              const std::string& tokenizer_config_path) {
  // Without an explicit config, the one beside tokenizer.json (if any) applies.
  std::string config_path = tokenizer_config_path;
  if (config_path.empty()) {
    const auto beside = std::filesystem::path(tokenizer_json_path).parent_path() / "tokenizer_config.json";
    if (std::filesystem::exists(beside)) config_path = beside.string();
  }
  nlohmann::json config;
  if (!config_path.empty()) config = read_json_file(config_path);
  return std::make_shared<HfTokenizer>(read_json_file(tokenizer_json_path), std::move(config), tokenizer_json_path);
}

std::shared_ptr<const Tokenizer> Tokenizer::from_hf_directory(const std::string& directory) {
  namespace fs = std::filesystem;
  const fs::path tokenizer_path = fs::path(directory) / "tokenizer.json";
  if (!fs::exists(tokenizer_path))
    fail(ErrorKind::kNotFound, "{}: no tokenizer.json in the model directory", directory);
  const fs::path config_path = fs::path(directory) / "tokenizer_config.json";
  nlohmann::json config = fs::exists(config_path) ? read_json_file(config_path.string()) : nlohmann::json::object();
  // transformers 5 saves the chat template beside the config.
  const fs::path jinja_path = fs::path(directory) / "chat_template.jinja";
  if (config_chat_template(config).empty() && fs::exists(jinja_path)) {
    std::ifstream file(jinja_path, std::ios::binary);
    std::stringstream buffer;
    buffer << file.rdbuf();
    config["chat_template"] = buffer.str();
  }
  return std::make_shared<HfTokenizer>(read_json_file(tokenizer_path.string()), std::move(config),
                                       tokenizer_path.string());
}

}  // namespace loom
