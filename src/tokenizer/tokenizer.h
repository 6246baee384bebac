// Byte-level BPE tokenizer (Hugging Face tokenizer.json and GGUF vocabularies).
//
// Thread safety: a Tokenizer is immutable after construction; encode/decode may
// be called from any number of threads at once (HTTP workers tokenize).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat_template.h"
#include "util/cache_gauge.h"

namespace loom {

struct GgufFile;

using TokenId = int32_t;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Loads tokenizer.json; tokenizer_config.json (same directory, optional)
  // supplies the chat template, bos/eos tokens and add_bos_token. Throws
  // Error(kFormat) naming the file for malformed JSON, Error(kUnsupported) for
  // a model type or pre-tokenizer we do not implement.
  static std::shared_ptr<const Tokenizer> from_hf_directory(const std::string& directory);
  static std::shared_ptr<const Tokenizer> from_hf_json_file(const std::string& tokenizer_json_path,
                                                            const std::string& tokenizer_config_path = {});
  // The vocabulary embedded in a GGUF file (tokenizer.ggml.*, model "gpt2").
  static std::shared_ptr<const Tokenizer> from_gguf(const GgufFile& gguf);

  // Text -> ids. Added/special tokens appearing literally in `text` map to their
  // ids (as HF does when they are "special": true, or "normalized": false).
  // add_special_tokens prepends BOS when the tokenizer is configured to do so
  // (as HF's post-processor would).
  virtual std::vector<TokenId> encode(std::string_view text, bool add_special_tokens = true) const = 0;

  // Ids -> text. Invalid UTF-8 at the end is replaced by U+FFFD, as HF does.
  virtual std::string decode(const std::vector<TokenId>& ids, bool skip_special_tokens = false) const = 0;

  // The raw bytes a token stands for (byte-level decoded; may be a partial UTF-8 character).
  virtual std::string token_bytes(TokenId id) const = 0;
  // The token's string as stored in the vocabulary ("Ġthe").
  virtual std::string token_text(TokenId id) const = 0;
  virtual std::optional<TokenId> token_to_id(std::string_view token) const = 0;
  virtual bool is_special(TokenId id) const = 0;

  virtual int vocab_size() const = 0;
  virtual std::optional<TokenId> bos_token_id() const = 0;
  // Tokens that end generation (eos plus e.g. <|im_end|>, <|eot_id|> when present).
  virtual std::vector<TokenId> eos_token_ids() const = 0;

  // The built-in template guessed from the model's (ChatML when it has none):
  // the native fallback; serving renders model_chat_templates() with Jinja.
  virtual const ChatTemplate& chat_template() const = 0;
  // The model's own chat templates and special-token strings.
  virtual const ModelChatTemplates& model_chat_templates() const = 0;

  // The vocabulary as a Hugging Face tokenizer.json (for `loom convert`): HF
  // `tokenizers` loads it and encodes exactly as this tokenizer does.
  virtual std::string to_hf_tokenizer_json() const = 0;
  // Matching tokenizer_config.json (chat_template, bos/eos, add_bos_token).
  virtual std::string to_hf_tokenizer_config_json() const = 0;

  // Its caches of encodings (thread-safe; bounded), for /metrics.
  virtual std::vector<CacheGauge> cache_gauges() const { return {}; }
};

// Streams text from ids without ever splitting a UTF-8 character: bytes of an
// incomplete character are held back until the character completes.
// One instance per sequence; not thread-safe.
class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special_tokens = true);
  // Appends a token; returns the newly completed text (possibly empty).
  std::string push(TokenId id);
  // Returns whatever is held back (invalid trailing bytes become U+FFFD).
  std::string flush();

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;
};

}  // namespace loom
