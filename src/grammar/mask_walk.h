// Walks of the vocabulary from a pushdown state: which tokens the state accepts.
// Used to precompute per-position masks (compiled_grammar) and at run time
// (grammar_matcher). Not thread-safe (they use the caller's Pushdown arena,
// and leave it as they found it).
#pragma once

#include <cstdint>
#include <vector>

#include "grammar/pushdown.h"
#include "grammar/token_vocabulary.h"

namespace loom::grammar {

// Every token of the vocabulary trie from `start`: accepted ones (all bytes
// consumed, state alive, or a path popped below the frame exactly at the
// token's end) to `accepted`; "uncertain" ones (a path popped below the frame
// with bytes left: they depend on the rest of the stack) to `uncertain` when
// not null. Each trie node visited costs one unit of `visit_budget` plus the
// pushdown's expansion steps for its byte; returns false, leaving partial
// results, when it runs out.
bool classify_vocabulary(Pushdown& pushdown, const StackSet& start, const TokenVocabulary& vocabulary,
                         std::vector<int32_t>& accepted, std::vector<int32_t>* uncertain, int64_t& visit_budget);

// Sets in `bitmask` the bits of the tokens of `ids` (sorted by bytes) that
// `start` (a full state: no frame bottom) accepts; ids already set are skipped.
void check_tokens(Pushdown& pushdown, const StackSet& start, const TokenVocabulary& vocabulary,
                  const std::vector<int32_t>& ids, std::vector<uint64_t>& bitmask);

inline void set_bit(std::vector<uint64_t>& bitmask, int32_t id) {
  bitmask[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
}
inline bool test_bit(const std::vector<uint64_t>& bitmask, int32_t id) {
  return (bitmask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1;
}

}  // namespace loom::grammar
