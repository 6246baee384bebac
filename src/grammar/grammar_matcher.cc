#include "grammar/grammar_matcher.h"

#include <algorithm>

#include "grammar/mask_walk.h"
#include "util/error.h"

namespace loom::grammar {
namespace {
constexpr size_t kCompactAboveNodes = 1 << 16;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), pushdown_(grammar_->grammar(), grammar_->pushdown_limits()) {
  pushdown_.initial_state(state_);
}

void GrammarMatcher::fail_over_limits() const {
  const PushdownLimits& limits = grammar_->pushdown_limits();
  fail(ErrorKind::kCapacity,
       "structured output: the grammar is too ambiguous or nests too deeply to follow past this point (over {} "
       "stacks, depth {} or {} expansion steps per byte)",
       limits.max_stacks, limits.max_stack_depth, limits.max_expansion_work);
}

bool GrammarMatcher::advance_bytes(std::string_view bytes) {
  if (terminated_) return false;
  if (bytes.empty()) return true;
  const size_t mark = pushdown_.mark();
  const StackSet* from = &state_;
  StackSet* to = &scratch_a_;
  for (char byte : bytes) {
    pushdown_.advance(*from, static_cast<uint8_t>(byte), *to);
    if (!to->alive()) {
      pushdown_.truncate(mark);
      if (to->overflow) fail_over_limits();
      return false;
    }
    from = to;
    to = (to == &scratch_a_) ? &scratch_b_ : &scratch_a_;
  }
  state_ = *from;
  if (pushdown_.mark() > kCompactAboveNodes) pushdown_.compact(state_);
  return true;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) { return advance_bytes(bytes); }

bool GrammarMatcher::accept_token(int32_t token) {
  const TokenVocabulary& vocabulary = grammar_->vocabulary();
  if (token < 0 || token >= vocabulary.size() || terminated_) return false;
  const auto& end_ids = vocabulary.end_ids();
  if (std::find(end_ids.begin(), end_ids.end(), token) != end_ids.end()) {
    if (!can_end()) return false;
    terminated_ = true;
    return true;
  }
  const std::string& bytes = vocabulary.bytes(token);
  if (bytes.empty()) return false;  // special and empty tokens are never part of a constrained output
  return advance_bytes(bytes);
}

void GrammarMatcher::fill_next_token_bitmask(std::vector<uint64_t>& bitmask) {
  const TokenVocabulary& vocabulary = grammar_->vocabulary();
  bitmask.assign((static_cast<size_t>(vocabulary.size()) + 63) / 64, 0);
  if (terminated_) return;
  // Distinct (position, parent position) pairs of the tops.
  std::vector<std::pair<int32_t, int32_t>> pairs;
  bool need_full_walk = false;
  std::vector<const PositionMask*> masks;
  for (int32_t top : state_.tops) {
    const StackNode& node = pushdown_.node(top);
    const int32_t parent_position = node.parent == kNoParent ? kNoParent : pushdown_.node(node.parent).position;
    const std::pair<int32_t, int32_t> pair{node.position, parent_position};
    if (std::find(pairs.begin(), pairs.end(), pair) != pairs.end()) continue;
    pairs.push_back(pair);
    const PositionMask* mask = grammar_->position_mask(pair.first, pair.second);
    if (!mask) {
      need_full_walk = true;
      break;
    }
    masks.push_back(mask);
  }
  if (need_full_walk) {
    std::vector<int32_t> accepted;
    int64_t unlimited = INT64_MAX;
    classify_vocabulary(pushdown_, state_, vocabulary, accepted, nullptr, unlimited);
    for (int32_t id : accepted) set_bit(bitmask, id);
  } else {
    for (const PositionMask* mask : masks) {
      if (!mask->accepted_bits.empty()) {
        for (size_t w = 0; w < bitmask.size(); ++w) bitmask[w] |= mask->accepted_bits[w];
      } else {
        for (int32_t id : mask->accepted) set_bit(bitmask, id);
      }
    }
    for (const PositionMask* mask : masks) check_tokens(pushdown_, state_, vocabulary, mask->uncertain, bitmask);
  }
  if (state_.can_end)
    for (int32_t id : vocabulary.end_ids())
      if (id >= 0 && id < vocabulary.size()) set_bit(bitmask, id);
}

}  // namespace loom::grammar
