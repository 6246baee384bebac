#include "tokenizer/added_vocabulary.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace loom {
namespace {

// The last code point of text[0, end) (end > 0, valid UTF-8).
uint32_t code_point_before(std::string_view text, size_t end) {
  size_t begin = end - 1;
  while (begin > 0 && (static_cast<uint8_t>(text[begin]) & 0xC0) == 0x80) --begin;
  uint32_t code_point = 0;
  utf8::decode_code_point(text, begin, code_point);
  return code_point;
}

// Start of the run of whitespace that ends at `end` (HF's `\s*$`).
size_t whitespace_run_start(std::string_view text, size_t end) {
  while (end > 0) {
    size_t begin = end - 1;
    while (begin > 0 && (static_cast<uint8_t>(text[begin]) & 0xC0) == 0x80) --begin;
    uint32_t code_point = 0;
    utf8::decode_code_point(text, begin, code_point);
    if (!utf8::is_whitespace(code_point)) break;
    end = begin;
  }
  return end;
}

// End of the run of whitespace that starts at `begin` (HF's `^\s*`).
size_t whitespace_run_end(std::string_view text, size_t begin) {
  while (begin < text.size()) {
    uint32_t code_point = 0;
    const size_t length = utf8::decode_code_point(text, begin, code_point);
    if (!utf8::is_whitespace(code_point)) break;
    begin += length;
  }
  return begin;
}

}  // namespace

void AddedVocabulary::build_matchers() {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& token = tokens_[i];
    index_by_id_.emplace(token.id, i);
    index_by_content_.emplace(token.content, i);
    const std::string& pattern = normalized_contents_[i];
    if (pattern.empty()) continue;
    Matcher& matcher = token.normalized ? normalized_matcher_ : raw_matcher_;
    matcher.by_first_byte[static_cast<uint8_t>(pattern[0])].push_back({pattern, i});
    matcher.empty = false;
  }
  for (Matcher* matcher : {&raw_matcher_, &normalized_matcher_}) {
    for (auto& patterns : matcher->by_first_byte) {
      std::stable_sort(patterns.begin(), patterns.end(),
                       [](const Pattern& a, const Pattern& b) { return a.text.size() > b.text.size(); });
    }
  }
}

const AddedToken* AddedVocabulary::find_by_id(TokenId id) const {
  const auto it = index_by_id_.find(id);
  return it == index_by_id_.end() ? nullptr : &tokens_[it->second];
}

const std::string* AddedVocabulary::text_by_id(TokenId id) const {
  const auto it = index_by_id_.find(id);
  return it == index_by_id_.end() ? nullptr : &normalized_contents_[it->second];
}

const AddedToken* AddedVocabulary::find_by_content(std::string_view content) const {
  const auto it = index_by_content_.find(std::string(content));
  return it == index_by_content_.end() ? nullptr : &tokens_[it->second];
}

void AddedVocabulary::split(const TextSegment& segment, bool normalized_pass, std::vector<TextSegment>& out) const {
  const Matcher& matcher = normalized_pass ? normalized_matcher_ : raw_matcher_;
  if (matcher.empty || segment.added_token_id >= 0) {
    out.push_back(segment);
    return;
  }
  find_matches(segment, matcher, out);
}

// Mirrors tokenizers' AddedVocabulary::find_matches: the scan resumes after
// each pattern match (before any rstrip), and skipped single_word matches are
// not retried at a later offset inside themselves.
void AddedVocabulary::find_matches(const TextSegment& segment, const Matcher& matcher,
                                   std::vector<TextSegment>& out) const {
  const std::string& text = segment.text;
  size_t emitted_until = 0;
  size_t scan = 0;
  const auto emit = [&](size_t begin, size_t end, TokenId id) {
    out.push_back({text.substr(begin, end - begin), id, segment.starts_input && begin == 0});
  };
  while (scan < text.size()) {
    const Pattern* found = nullptr;
    for (const Pattern& pattern : matcher.by_first_byte[static_cast<uint8_t>(text[scan])]) {
      if (text.compare(scan, pattern.text.size(), pattern.text) == 0) {
        found = &pattern;
        break;
      }
    }
    if (found == nullptr) {
      ++scan;
      continue;
    }
    const AddedToken& token = tokens_[found->token_index];
    size_t begin = scan;
    size_t end = scan + found->text.size();
    scan = end;
    if (token.single_word) {
      const bool word_before = begin > 0 && utf8::is_word_char(code_point_before(text, begin));
      uint32_t next_code_point = 0;
      const bool word_after =
          end < text.size() && (utf8::decode_code_point(text, end, next_code_point), utf8::is_word_char(next_code_point));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) begin = std::max(whitespace_run_start(text, begin), emitted_until);
    if (token.rstrip) end = whitespace_run_end(text, end);
    if (emitted_until < begin) emit(emitted_until, begin, -1);
    emit(begin, end, token.id);
    emitted_until = end;
  }
  if (emitted_until < text.size()) emit(emitted_until, text.size(), -1);
}

AddedToken AddedVocabulary::token_from_json(const nlohmann::json& value) {
  AddedToken token;
  token.id = value.at("id").get<TokenId>();
  token.content = value.at("content").get<std::string>();
  token.special = value.value("special", false);
  token.lstrip = value.value("lstrip", false);
  token.rstrip = value.value("rstrip", false);
  token.single_word = value.value("single_word", false);
  token.normalized = value.value("normalized", !token.special);
  return token;
}

nlohmann::json AddedVocabulary::token_to_json(const AddedToken& token) {
  nlohmann::json value;
  value["id"] = token.id;
  value["content"] = token.content;
  value["single_word"] = token.single_word;
  value["lstrip"] = token.lstrip;
  value["rstrip"] = token.rstrip;
  value["normalized"] = token.normalized;
  value["special"] = token.special;
  return value;
}

}  // namespace loom
