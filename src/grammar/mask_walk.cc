#include "grammar/mask_walk.h"

namespace loom::grammar {

bool classify_vocabulary(Pushdown& pushdown, const StackSet& start, const TokenVocabulary& vocabulary,
                         std::vector<int32_t>& accepted, std::vector<int32_t>* uncertain, int64_t& visit_budget) {
  const auto& trie = vocabulary.trie();
  const auto& trie_tokens = vocabulary.trie_tokens();
  const size_t levels = static_cast<size_t>(vocabulary.max_token_bytes()) + 1;
  std::vector<StackSet> states(levels);
  std::vector<char> carried(levels, 0);  // a path left the frame above this depth
  std::vector<size_t> marks(levels, 0);
  states[0] = start;
  marks[0] = pushdown.mark();
  const size_t base_mark = marks[0];
  bool complete = true;
  size_t i = 0;
  while (i < trie.size()) {
    if (--visit_budget < 0) {
      complete = false;
      break;
    }
    const TokenVocabulary::TrieNode& node = trie[i];
    const auto depth = static_cast<size_t>(node.depth);
    pushdown.truncate(marks[depth - 1]);
    StackSet& state = states[depth];
    pushdown.advance(states[depth - 1], node.byte, state);
    visit_budget -= pushdown.work();
    const bool bottom_here = state.reached_bottom && !state.overflow;
    const bool carry = carried[depth - 1] || bottom_here;
    const bool ok = !state.overflow && (state.alive() || bottom_here);
    for (int32_t t = node.tokens_begin; t < node.tokens_end; ++t) {
      const int32_t id = trie_tokens[static_cast<size_t>(t)];
      if (ok) accepted.push_back(id);
      else if (carried[depth - 1] && uncertain) uncertain->push_back(id);
    }
    if (!state.has_stacks()) {
      if (carry && uncertain)
        for (int32_t t = trie[i].tokens_end; t < (node.subtree_end < static_cast<int32_t>(trie.size())
                                                      ? trie[static_cast<size_t>(node.subtree_end)].tokens_begin
                                                      : static_cast<int32_t>(trie_tokens.size()));
             ++t)
          uncertain->push_back(trie_tokens[static_cast<size_t>(t)]);
      i = static_cast<size_t>(node.subtree_end);
      continue;
    }
    carried[depth] = carry;
    marks[depth] = pushdown.mark();
    ++i;
  }
  pushdown.truncate(base_mark);
  return complete;
}

void check_tokens(Pushdown& pushdown, const StackSet& start, const TokenVocabulary& vocabulary,
                  const std::vector<int32_t>& ids, std::vector<uint64_t>& bitmask) {
  if (ids.empty()) return;
  const size_t levels = static_cast<size_t>(vocabulary.max_token_bytes()) + 1;
  std::vector<StackSet> states(levels);
  std::vector<size_t> marks(levels, 0);
  states[0] = start;
  marks[0] = pushdown.mark();
  const size_t base_mark = marks[0];
  const std::string* previous = nullptr;
  size_t computed = 0;  // states[0..computed] hold the previous token's prefixes
  for (int32_t id : ids) {
    if (test_bit(bitmask, id)) continue;
    const std::string& bytes = vocabulary.bytes(id);
    size_t depth = 0;
    if (previous)
      while (depth < computed && depth < previous->size() && depth < bytes.size() && (*previous)[depth] == bytes[depth])
        ++depth;
    pushdown.truncate(marks[depth]);
    while (depth < bytes.size() && states[depth].has_stacks()) {
      pushdown.advance(states[depth], static_cast<uint8_t>(bytes[depth]), states[depth + 1]);
      ++depth;
      marks[depth] = pushdown.mark();
    }
    computed = depth;
    previous = &bytes;
    if (depth == bytes.size() && states[depth].alive()) set_bit(bitmask, id);
  }
  pushdown.truncate(base_mark);
}

}  // namespace loom::grammar
