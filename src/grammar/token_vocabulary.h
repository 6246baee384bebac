// The vocabulary as the matcher sees it: each token's raw bytes (byte-level
// decoded, so a token may hold half a UTF-8 character) arranged as a byte trie
// in preorder, so that a mask walk can skip every token under a rejected prefix.
//
// Built once per tokenizer (from_tokenizer takes ~100 ms for 128K tokens) and
// shared read-only by every compiled grammar: immutable, thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom {
class Tokenizer;
}

namespace loom::grammar {

class TokenVocabulary {
 public:
  struct TrieNode {
    uint8_t byte = 0;
    int32_t depth = 0;        // 1 for the first byte of a token
    int32_t subtree_end = 0;  // preorder index just past this node's subtree
    int32_t tokens_begin = 0, tokens_end = 0;  // range of trie_tokens() ending here
  };

  // token_bytes[id] for every id; `excluded[id]` marks tokens a constrained
  // output may never contain (special tokens; empty tokens are excluded
  // anyway); `end_ids` are the tokens that end the output (allowed exactly
  // where the grammar may end).
  TokenVocabulary(std::vector<std::string> token_bytes, const std::vector<bool>& excluded,
                  std::vector<int32_t> end_ids);
  // Special tokens excluded, the tokenizer's EOS ids as end ids.
  static std::shared_ptr<const TokenVocabulary> from_tokenizer(const Tokenizer& tokenizer);

  int32_t size() const { return static_cast<int32_t>(token_bytes_.size()); }
  const std::string& bytes(int32_t id) const { return token_bytes_[static_cast<size_t>(id)]; }
  const std::vector<int32_t>& end_ids() const { return end_ids_; }
  const std::vector<TrieNode>& trie() const { return trie_; }
  const std::vector<int32_t>& trie_tokens() const { return trie_tokens_; }
  int32_t max_token_bytes() const { return max_token_bytes_; }

 private:
  std::vector<std::string> token_bytes_;
  std::vector<int32_t> end_ids_;
  std::vector<TrieNode> trie_;
  std::vector<int32_t> trie_tokens_;
  int32_t max_token_bytes_ = 0;
};

}  // namespace loom::grammar
