// The Tokenizer implementation: a Hugging Face tokenizer.json pipeline
// (added tokens -> normalizer -> pre-tokenizer -> BPE -> post-processor, and a
// decoder chain back). GGUF vocabularies and synthetic tokenizers are first
// expressed as tokenizer.json, so one code path serves all three sources and
// to_hf_tokenizer_json() reproduces exactly what is encoded.
//
// Thread safety: immutable after construction except the BPE word cache, which
// is internally locked; all methods may be called concurrently.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace loom {

class HfTokenizer final : public Tokenizer {
 public:
  // `tokenizer_json`: a parsed tokenizer.json. `config`: a parsed
  // tokenizer_config.json or null. `context` names the source in errors.
  // Throws Error(kFormat) for missing or ill-typed fields, Error(kUnsupported)
  // for components we do not implement.
  HfTokenizer(nlohmann::json tokenizer_json, nlohmann::json config, const std::string& context);

  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens = true) const override;
  std::string decode(const std::vector<TokenId>& ids, bool skip_special_tokens = false) const override;
  std::string token_bytes(TokenId id) const override;
  std::string token_text(TokenId id) const override;
  std::optional<TokenId> token_to_id(std::string_view token) const override;
  bool is_special(TokenId id) const override;
  int vocab_size() const override { return vocab_size_; }
  std::optional<TokenId> bos_token_id() const override { return bos_id_; }
  std::vector<TokenId> eos_token_ids() const override { return eos_ids_; }
  const ChatTemplate& chat_template() const override { return chat_template_; }
  const ModelChatTemplates& model_chat_templates() const override { return model_chat_templates_; }
  std::string to_hf_tokenizer_json() const override;
  std::string to_hf_tokenizer_config_json() const override;
  std::vector<CacheGauge> cache_gauges() const override { return {model_->cache_gauge()}; }

 private:
  void load_config(const std::string& context);

  nlohmann::json skeleton_;  // tokenizer.json without the model (rebuilt from model_ on export)
  nlohmann::json config_;
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  AddedVocabulary added_vocabulary_;
  PostProcessor post_processor_;
  Decoder decoder_;
  bool add_bos_from_config_ = false;  // config's add_bos_token where the post-processor adds none
  std::optional<TokenId> bos_id_;
  std::vector<TokenId> eos_ids_;
  ChatTemplate chat_template_;
  ModelChatTemplates model_chat_templates_;
  int vocab_size_ = 0;
};

// Reads and parses a JSON file; Error(kNotFound) if absent, Error(kFormat) if malformed.
nlohmann::json read_json_file(const std::string& path);

}  // namespace loom
