// Added tokens ("added_tokens" of tokenizer.json: special tokens such as
// <|im_start|> and user-added ones) and how HF splits them out of the text
// before pre-tokenization: leftmost-longest matching, first of the tokens with
// "normalized": false on the raw text, then of those with "normalized": true on
// the normalized text; lstrip / rstrip / single_word as HF applies them.
//
// Thread safety: immutable after construction.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom {

using TokenId = int32_t;

struct AddedToken {
  TokenId id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// A span of the input: an added token or plain text.
struct TextSegment {
  std::string text;
  TokenId added_token_id = -1;  // >= 0 when the segment is an added token
  bool starts_input = false;    // begins at offset 0 of the whole input
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  // `normalize` maps a normalized token's content to its normalized form.
  template <typename NormalizeFn>
  AddedVocabulary(std::vector<AddedToken> tokens, NormalizeFn&& normalize);

  // Splits out tokens with normalized == `normalized_pass` (the pass's token
  // set) from one plain-text segment.
  void split(const TextSegment& segment, bool normalized_pass, std::vector<TextSegment>& out) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  const AddedToken* find_by_id(TokenId id) const;
  const AddedToken* find_by_content(std::string_view content) const;
  // The token's text as HF's id_to_token and decode see it: the normalized
  // content for "normalized": true tokens, else the content.
  const std::string* text_by_id(TokenId id) const;

  static AddedToken token_from_json(const nlohmann::json& value);
  static nlohmann::json token_to_json(const AddedToken& token);

 private:
  struct Pattern {
    std::string text;
    size_t token_index;
  };
  struct Matcher {
    // Patterns by first byte, longest first (leftmost-longest matching).
    std::vector<std::vector<Pattern>> by_first_byte = std::vector<std::vector<Pattern>>(256);
    bool empty = true;
  };
  void build_matchers();
  void find_matches(const TextSegment& segment, const Matcher& matcher, std::vector<TextSegment>& out) const;

  std::vector<AddedToken> tokens_;
  std::vector<std::string> normalized_contents_;
  std::unordered_map<TokenId, size_t> index_by_id_;
  std::unordered_map<std::string, size_t> index_by_content_;
  Matcher raw_matcher_;
  Matcher normalized_matcher_;
};

template <typename NormalizeFn>
AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens, NormalizeFn&& normalize) : tokens_(std::move(tokens)) {
  normalized_contents_.reserve(tokens_.size());
  for (const AddedToken& token : tokens_) {
    normalized_contents_.push_back(token.normalized ? normalize(token.content) : token.content);
  }
  build_matchers();
}

}  // namespace loom
