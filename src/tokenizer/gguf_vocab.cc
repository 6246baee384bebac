// Tokenizer::from_gguf: the tokenizer.ggml.* metadata of a GGUF file, turned
// into the tokenizer.json + tokenizer_config.json that Hugging Face would ship
// for the same model, then loaded like any HF tokenizer.
#include <spdlog/spdlog.h>

#include "formats/gguf.h"
#include "tokenizer/families.h"
#include "tokenizer/gguf_vocab.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace loom {
namespace {

// llama.cpp's token types.
constexpr int64_t kTokenTypeControl = 3;
constexpr int64_t kTokenTypeUserDefined = 4;

// Metadata is read straight from the map so that this file depends only on
// the GgufFile struct, not on the reader's implementation.
const GgufValue* find_value(const GgufFile& gguf, const std::string& key) {
  const auto it = gguf.metadata.find(key);
  return it == gguf.metadata.end() ? nullptr : &it->second;
}

std::optional<int64_t> optional_int(const GgufFile& gguf, const std::string& key) {
  const GgufValue* value = find_value(gguf, key);
  if (value == nullptr) return std::nullopt;
  if (const auto* v = std::get_if<int64_t>(value)) return *v;
  if (const auto* v = std::get_if<uint64_t>(value)) return static_cast<int64_t>(*v);
  fail(ErrorKind::kFormat, "{}: metadata {} is not an integer", gguf.path, key);
}

std::optional<bool> optional_bool(const GgufFile& gguf, const std::string& key) {
  const GgufValue* value = find_value(gguf, key);
  if (value == nullptr) return std::nullopt;
  if (const auto* v = std::get_if<bool>(value)) return *v;
  fail(ErrorKind::kFormat, "{}: metadata {} is not a bool", gguf.path, key);
}

std::string optional_string(const GgufFile& gguf, const std::string& key) {
  const GgufValue* value = find_value(gguf, key);
  if (value == nullptr) return {};
  if (const auto* v = std::get_if<std::string>(value)) return *v;
  fail(ErrorKind::kFormat, "{}: metadata {} is not a string", gguf.path, key);
}

const std::vector<std::string>& string_array(const GgufFile& gguf, const std::string& key) {
  const GgufValue* value = find_value(gguf, key);
  if (value == nullptr) fail(ErrorKind::kFormat, "{}: metadata {} is missing", gguf.path, key);
  if (const auto* v = std::get_if<std::vector<std::string>>(value)) return *v;
  fail(ErrorKind::kFormat, "{}: metadata {} is not a string array", gguf.path, key);
}

std::vector<int64_t> int_array(const GgufFile& gguf, const std::string& key) {
  const GgufValue* value = find_value(gguf, key);
  if (value == nullptr) return {};
  if (const auto* v = std::get_if<std::vector<int64_t>>(value)) return *v;
  fail(ErrorKind::kFormat, "{}: metadata {} is not an integer array", gguf.path, key);
}

std::optional<std::string> token_at(const std::vector<std::string>& tokens, std::optional<int64_t> id) {
  if (!id || *id < 0 || static_cast<size_t>(*id) >= tokens.size()) return std::nullopt;
  return tokens[static_cast<size_t>(*id)];
}

}  // namespace

GgufTokenizerJson gguf_tokenizer_json(const GgufFile& gguf) {
  const std::string model = optional_string(gguf, "tokenizer.ggml.model");
  if (model != "gpt2") {
    fail(ErrorKind::kUnsupported, "{}: tokenizer.ggml.model '{}' is not supported (only gpt2 byte-level BPE)",
         gguf.path, model);
  }
  const std::vector<std::string>& tokens = string_array(gguf, "tokenizer.ggml.tokens");
  const std::vector<std::string>& merges = string_array(gguf, "tokenizer.ggml.merges");
  const std::vector<int64_t> token_types = int_array(gguf, "tokenizer.ggml.token_type");
  if (!token_types.empty() && token_types.size() != tokens.size()) {
    fail(ErrorKind::kFormat, "{}: tokenizer.ggml.token_type has {} entries for {} tokens", gguf.path,
         token_types.size(), tokens.size());
  }
  const std::string pre = optional_string(gguf, "tokenizer.ggml.pre");
  auto family = family_from_gguf_pre(pre);
  if (!family) {
    spdlog::warn("{}: tokenizer.ggml.pre '{}' is unknown; pre-tokenizing with the GPT-2 regex", gguf.path, pre);
    family = PreTokenizerFamily::kGpt2;
  }

  // JSON strings must be UTF-8 (byte-level vocabularies always are): a hostile
  // file's raw bytes would otherwise make serialising the tokenizer throw later.
  for (const std::vector<std::string>* list : {&tokens, &merges})
    for (size_t i = 0; i < list->size(); ++i)
      if (!utf8::is_valid((*list)[i]))
        fail(ErrorKind::kFormat, "{}: tokenizer.ggml.{} entry {} is not valid UTF-8", gguf.path,
             list == &tokens ? "tokens" : "merges", i);

  nlohmann::json vocab = nlohmann::json::object();
  nlohmann::json added_tokens = nlohmann::json::array();
  for (size_t id = 0; id < tokens.size(); ++id) {
    vocab[tokens[id]] = id;
    const int64_t type = token_types.empty() ? 1 : token_types[id];
    if (type == kTokenTypeControl || type == kTokenTypeUserDefined) {
      AddedToken token;
      token.id = static_cast<TokenId>(id);
      token.content = tokens[id];
      token.special = type == kTokenTypeControl;
      token.normalized = false;
      added_tokens.push_back(AddedVocabulary::token_to_json(token));
    }
  }
  nlohmann::json merges_json = nlohmann::json::array();
  for (const std::string& merge : merges) {
    const size_t space = merge.find(' ');
    if (space == std::string::npos) fail(ErrorKind::kFormat, "{}: merge '{}' is not of the form 'a b'", gguf.path, merge);
    merges_json.push_back({merge.substr(0, space), merge.substr(space + 1)});
  }

  const auto bos_id = optional_int(gguf, "tokenizer.ggml.bos_token_id");
  const auto eos_id = optional_int(gguf, "tokenizer.ggml.eos_token_id");
  const auto bos = token_at(tokens, bos_id);
  const auto eos = token_at(tokens, eos_id);
  // llama.cpp adds BOS for Llama-3 vocabularies unless the file says otherwise.
  const bool add_bos = optional_bool(gguf, "tokenizer.ggml.add_bos_token").value_or(*family == PreTokenizerFamily::kLlama3);

  GgufTokenizerJson out;
  out.tokenizer_json = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", std::move(added_tokens)},
      {"normalizer", family_normalizer_json(*family)},
      {"pre_tokenizer", family_pre_tokenizer_json(*family)},
      {"post_processor", nullptr},
      {"decoder", byte_level_decoder_json()},
      {"model", byte_level_bpe_model_json(std::move(vocab), std::move(merges_json), *family)}};
  nlohmann::json byte_level_processor = {
      {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  if (add_bos && bos) {
    nlohmann::json template_processor = {
        {"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", *bos}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair",
         {{{"SpecialToken", {{"id", *bos}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
          {{"SpecialToken", {{"id", *bos}, {"type_id", 1}}}},
          {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
        {"special_tokens", {{*bos, {{"id", *bos}, {"ids", {*bos_id}}, {"tokens", {*bos}}}}}}};
    out.tokenizer_json["post_processor"] = {{"type", "Sequence"},
                                            {"processors", {byte_level_processor, template_processor}}};
  } else {
    out.tokenizer_json["post_processor"] = byte_level_processor;
  }

  out.config_json = {{"add_bos_token", add_bos},
                     {"add_eos_token", false},
                     {"clean_up_tokenization_spaces", false},
                     {"model_max_length", 131072},
                     {"tokenizer_class", "PreTrainedTokenizerFast"}};
  if (bos) out.config_json["bos_token"] = *bos;
  if (eos) out.config_json["eos_token"] = *eos;
  if (const auto pad = token_at(tokens, optional_int(gguf, "tokenizer.ggml.padding_token_id")))
    out.config_json["pad_token"] = *pad;
  const std::string chat_template = optional_string(gguf, "tokenizer.chat_template");
  if (!chat_template.empty()) out.config_json["chat_template"] = utf8::to_valid_lossy(chat_template);
  // llama.cpp's convert script stores a "tool_use" template under its own key: the list form, as transformers has it.
  const std::string tool_use = optional_string(gguf, "tokenizer.chat_template.tool_use");
  if (!chat_template.empty() && !tool_use.empty())
    out.config_json["chat_template"] = nlohmann::json::array(
        {{{"name", "default"}, {"template", utf8::to_valid_lossy(chat_template)}},
         {{"name", "tool_use"}, {"template", utf8::to_valid_lossy(tool_use)}}});
  return out;
}

std::shared_ptr<const Tokenizer> Tokenizer::from_gguf(const GgufFile& gguf) {
  GgufTokenizerJson json = gguf_tokenizer_json(gguf);
  return std::make_shared<HfTokenizer>(std::move(json.tokenizer_json), std::move(json.config_json), gguf.path);
}

}  // namespace loom
