// The per-sequence state of a structured-output constraint.
//
// Ownership and threads: a GrammarMatcher shares its CompiledGrammar
// (immutable, any thread) and owns its own pushdown state; it is not
// thread-safe — one matcher per sequence, used by one thread at a time (the
// engine thread, or a mask worker while the engine thread waits for it).
//
// Protocol per step: fill_next_token_bitmask() -> the sampler picks a token
// whose bit is set -> accept_token(token). End tokens (the vocabulary's
// end_ids) are allowed exactly when can_end(); is_completed() means nothing
// but the end is possible any more (the output is complete: stop).
//
// The pushdown limits bound the work of one byte. A token whose bytes take the
// state over them (a grammar too ambiguous or nested too deeply to follow) is
// neither accepted nor refused: accept_token throws Error(kCapacity). The
// precomputed masks cannot see that coming and may offer such a token; a token
// that accept_token refuses (false) was never offered.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "grammar/compiled_grammar.h"
#include "grammar/pushdown.h"

namespace loom::grammar {

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Advances by the token's bytes. Returns false (state unchanged) when the
  // grammar rejects it. An end token is accepted when can_end(): the matcher is then terminated.
  // Throws Error(kCapacity) (state unchanged) when the token's state is over the pushdown limits.
  bool accept_token(int32_t token);
  // Advances by raw bytes (tests, prefilled text). False (state unchanged) on rejection;
  // Error(kCapacity) over the limits, as accept_token.
  bool accept_bytes(std::string_view bytes);

  // bitmask: ceil(vocabulary size / 64) words, bit i set = token i allowed now.
  void fill_next_token_bitmask(std::vector<uint64_t>& bitmask);

  bool can_end() const { return !terminated_ && state_.can_end; }
  bool is_completed() const { return terminated_ || (state_.can_end && !state_.has_stacks()); }
  bool is_terminated() const { return terminated_; }
  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  bool advance_bytes(std::string_view bytes);
  [[noreturn]] void fail_over_limits() const;

  std::shared_ptr<const CompiledGrammar> grammar_;
  Pushdown pushdown_;
  StackSet state_;
  StackSet scratch_a_, scratch_b_;
  bool terminated_ = false;
};

}  // namespace loom::grammar
