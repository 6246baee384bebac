#include "grammar/token_vocabulary.h"

#include <algorithm>

#include "tokenizer/tokenizer.h"

namespace loom::grammar {

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes, const std::vector<bool>& excluded,
                                 std::vector<int32_t> end_ids)
    : token_bytes_(std::move(token_bytes)), end_ids_(std::move(end_ids)) {
  std::vector<int32_t> ids;
  for (size_t id = 0; id < token_bytes_.size(); ++id)
    if (!token_bytes_[id].empty() && !(id < excluded.size() && excluded[id]) &&
        std::find(end_ids_.begin(), end_ids_.end(), static_cast<int32_t>(id)) == end_ids_.end())
      ids.push_back(static_cast<int32_t>(id));
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return token_bytes_[static_cast<size_t>(a)] < token_bytes_[static_cast<size_t>(b)];
  });
  // Sorted strings -> preorder trie: keep the path of open nodes, close those
  // deeper than the common prefix with the previous string.
  std::vector<int32_t> open;  // node index per depth - 1
  const std::string* previous = nullptr;
  auto close_to = [&](size_t depth) {
    while (open.size() > depth) {
      trie_[static_cast<size_t>(open.back())].subtree_end = static_cast<int32_t>(trie_.size());
      open.pop_back();
    }
  };
  for (int32_t id : ids) {
    const std::string& bytes = token_bytes_[static_cast<size_t>(id)];
    max_token_bytes_ = std::max(max_token_bytes_, static_cast<int32_t>(bytes.size()));
    size_t common = 0;
    if (previous)
      while (common < previous->size() && common < bytes.size() && (*previous)[common] == bytes[common]) ++common;
    close_to(common);
    for (size_t depth = common; depth < bytes.size(); ++depth) {
      TrieNode node;
      node.byte = static_cast<uint8_t>(bytes[depth]);
      node.depth = static_cast<int32_t>(depth + 1);
      node.tokens_begin = node.tokens_end = static_cast<int32_t>(trie_tokens_.size());
      trie_.push_back(node);
      open.push_back(static_cast<int32_t>(trie_.size() - 1));
    }
    // Tokens are appended in order, so the open leaf's range grows at the end.
    TrieNode& leaf = trie_[static_cast<size_t>(open.back())];
    if (leaf.tokens_begin == leaf.tokens_end) leaf.tokens_begin = static_cast<int32_t>(trie_tokens_.size());
    trie_tokens_.push_back(id);
    leaf.tokens_end = static_cast<int32_t>(trie_tokens_.size());
    previous = &bytes;
  }
  close_to(0);
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::from_tokenizer(const Tokenizer& tokenizer) {
  const int size = tokenizer.vocab_size();
  std::vector<std::string> bytes(static_cast<size_t>(size));
  std::vector<bool> excluded(static_cast<size_t>(size), false);
  for (int id = 0; id < size; ++id) {
    excluded[static_cast<size_t>(id)] = tokenizer.is_special(id);
    if (!excluded[static_cast<size_t>(id)]) bytes[static_cast<size_t>(id)] = tokenizer.token_bytes(id);
  }
  return std::make_shared<const TokenVocabulary>(std::move(bytes), excluded, tokenizer.eos_token_ids());
}

}  // namespace loom::grammar
