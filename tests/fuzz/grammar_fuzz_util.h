// Shared by the grammar compiler fuzz targets: a small byte vocabulary, and a
// short random-walk of the matcher over what a compiled grammar allows, so
// the masks and the pushdown run on whatever the compiler accepted.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "grammar/compiled_grammar.h"
#include "grammar/grammar_matcher.h"

namespace loom::fuzz {

inline std::shared_ptr<const grammar::TokenVocabulary> grammar_vocabulary() {
  static const auto vocabulary = [] {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
    for (const char* t : {"{\"", "\":", "\",", "\"}", "true", "null", "12", "ab", "\xc3", "\xc3\xa9", "\xa9\"", "[]"})
      tokens.push_back(t);
    tokens.push_back("");
    return std::make_shared<const grammar::TokenVocabulary>(
        tokens, std::vector<bool>(tokens.size(), false), std::vector<int32_t>{static_cast<int32_t>(tokens.size() - 1)});
  }();
  return vocabulary;
}

// Compiles with tight limits and walks up to 16 steps, always taking the
// lowest allowed token (deterministic).
inline void exercise_grammar(grammar::Grammar built) {
  grammar::CompileBudget budget;
  budget.max_total_visits = 200000;
  const auto compiled = std::make_shared<const grammar::CompiledGrammar>(std::move(built), grammar_vocabulary(), budget);
  grammar::GrammarMatcher matcher(compiled);
  std::vector<uint64_t> mask;
  for (int step = 0; step < 16 && !matcher.is_completed(); ++step) {
    matcher.fill_next_token_bitmask(mask);
    int32_t token = -1;
    for (size_t w = 0; w < mask.size() && token < 0; ++w)
      if (mask[w]) token = static_cast<int32_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(mask[w])));
    if (token < 0) break;
    if (!matcher.accept_token(token)) std::abort();  // the mask offered a token the matcher refuses
  }
}

inline grammar::GrammarLimits fuzz_grammar_limits() {
  grammar::GrammarLimits limits;
  limits.max_elements = 20000;
  limits.max_repetition = 200;
  return limits;
}

}  // namespace loom::fuzz
