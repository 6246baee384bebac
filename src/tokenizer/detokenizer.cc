#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace loom {

IncrementalDetokenizer::IncrementalDetokenizer(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special_tokens)
    : tokenizer_(std::move(tokenizer)), skip_special_tokens_(skip_special_tokens) {}

std::string IncrementalDetokenizer::push(TokenId id) {
  if (skip_special_tokens_ && tokenizer_->is_special(id)) return {};
  pending_ += tokenizer_->token_bytes(id);
  // Emit everything up to a character that may still be completing; invalid
  // bytes become U+FFFD now, as the full decode() would render them.
  const size_t complete = utf8::complete_prefix_length(pending_);
  std::string text = utf8::to_valid_lossy(std::string_view(pending_).substr(0, complete));
  pending_.erase(0, complete);
  return text;
}

std::string IncrementalDetokenizer::flush() {
  std::string text = utf8::to_valid_lossy(pending_);
  pending_.clear();
  return text;
}

}  // namespace loom
