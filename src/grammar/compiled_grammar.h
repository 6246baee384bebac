// A Grammar bound to a vocabulary, with the token masks precomputed for each
// (top position, parent position) pair the grammar can produce — xgrammar's
// adaptive mask cache, with a two-node context instead of a whole rule:
//
//   stack:  [ top: byte-class position p ] -> [ parent: resume position y ] -> rest...
//   frame:  [ p ] -> [ y ] -> BOTTOM (the rest, unknown at compile time)
//
// For each (p, y) a walk of the vocabulary trie inside that frame sorts tokens
// into accepted (whatever the rest of the stack), rejected, and uncertain
// (they pop below y with bytes left); at run time only the uncertain ones are
// checked against the full stack. Pairs that were not precomputed (over the
// budget) make the matcher walk the whole trie for that step: slower, same mask.
//
// Built on the HTTP handler thread (compile cost: one trie walk per pair, tens
// of ms per schema with a 128K vocabulary), then immutable and shared by every
// sequence that uses it (std::shared_ptr<const CompiledGrammar>): thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/pushdown.h"
#include "grammar/token_vocabulary.h"

namespace loom::grammar {

struct CompileBudget {
  int64_t max_total_visits = 40'000'000;  // trie nodes visited by all precomputation walks, plus their expansion steps
  int32_t max_cached_pairs = 4096;
  PushdownLimits pushdown;
};

struct PositionMask {
  std::vector<int32_t> accepted;   // token ids, when sparse
  std::vector<uint64_t> accepted_bits;  // the same as a bitmask over the vocabulary, when dense (then `accepted` is empty)
  std::vector<int32_t> uncertain;  // sorted by bytes (trie order)
};

class CompiledGrammar {
 public:
  // Throws Error(kCapacity) when the grammar's start state is over the pushdown limits.
  CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocabulary, CompileBudget budget = {});

  const Grammar& grammar() const { return grammar_; }
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }
  const PushdownLimits& pushdown_limits() const { return budget_.pushdown; }
  // The precomputed mask for a top at `position` whose parent node resumes at
  // `parent_position` (kNoParent: the top's rule is the root's frame); null if none.
  const PositionMask* position_mask(int32_t position, int32_t parent_position) const;
  int32_t num_cached_pairs() const { return static_cast<int32_t>(masks_.size()); }
  // Bytes of the precomputed masks (the bulk of a compiled grammar's memory).
  int64_t mask_bytes() const;

 private:
  void precompute();

  Grammar grammar_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  CompileBudget budget_;
  std::unordered_map<uint64_t, PositionMask> masks_;
};

}  // namespace loom::grammar
