#include "grammar/compiled_grammar.h"

#include <set>

#include "grammar/mask_walk.h"
#include "util/error.h"

namespace loom::grammar {

int64_t CompiledGrammar::mask_bytes() const {
  int64_t bytes = 0;
  for (const auto& [key, mask] : masks_)
    bytes += static_cast<int64_t>(sizeof(key) + sizeof(mask) + mask.accepted.capacity() * sizeof(int32_t) +
                                  mask.accepted_bits.capacity() * sizeof(uint64_t) +
                                  mask.uncertain.capacity() * sizeof(int32_t));
  return bytes;
}
namespace {

uint64_t pair_key(int32_t position, int32_t parent_position) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(position)) << 32) | static_cast<uint32_t>(parent_position);
}

// For each rule, the positions its frames' parent node can resume at
// (kNoParent for the root): after each non-tail reference to it, and through
// tail references whatever the calling rule's parents are.
std::vector<std::set<int32_t>> parent_positions(const Grammar& grammar) {
  std::vector<int32_t> rule_of(grammar.elements.size(), 0);
  for (int32_t r = 0; r < grammar.num_rules(); ++r)
    for (int32_t start : grammar.rule_alternatives[static_cast<size_t>(r)])
      for (int32_t p = start;; ++p) {
        rule_of[static_cast<size_t>(p)] = r;
        if (grammar.elements[static_cast<size_t>(p)].kind == Element::Kind::kEnd) break;
      }
  std::vector<std::set<int32_t>> parents(static_cast<size_t>(grammar.num_rules()));
  parents[static_cast<size_t>(grammar.root_rule)].insert(kNoParent);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t p = 0; p + 1 < grammar.elements.size(); ++p) {
      const Element& element = grammar.elements[p];
      if (element.kind != Element::Kind::kRule) continue;
      auto& target = parents[static_cast<size_t>(element.value)];
      const size_t before = target.size();
      if (grammar.elements[p + 1].kind == Element::Kind::kEnd) {
        const auto& caller = parents[static_cast<size_t>(rule_of[p])];
        target.insert(caller.begin(), caller.end());
      } else {
        target.insert(static_cast<int32_t>(p + 1));
      }
      changed |= target.size() != before;
    }
  }
  return parents;
}

}  // namespace

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocabulary,
                                 CompileBudget budget)
    : grammar_(std::move(grammar)), vocabulary_(std::move(vocabulary)), budget_(budget) {
  Pushdown pushdown(grammar_, budget_.pushdown);
  StackSet start;
  pushdown.initial_state(start);
  if (start.overflow)
    fail(ErrorKind::kCapacity, "the grammar nests too deeply or is too ambiguous at its start (over the matcher's limits)");
  precompute();
}

const PositionMask* CompiledGrammar::position_mask(int32_t position, int32_t parent_position) const {
  const auto it = masks_.find(pair_key(position, parent_position));
  return it == masks_.end() ? nullptr : &it->second;
}

void CompiledGrammar::precompute() {
  const auto parents = parent_positions(grammar_);
  const size_t words = (static_cast<size_t>(vocabulary_->size()) + 63) / 64;
  int64_t visits_left = budget_.max_total_visits;
  Pushdown pushdown(grammar_, budget_.pushdown);
  for (int32_t r = 0; r < grammar_.num_rules(); ++r) {
    for (int32_t start : grammar_.rule_alternatives[static_cast<size_t>(r)]) {
      for (int32_t p = start; grammar_.elements[static_cast<size_t>(p)].kind != Element::Kind::kEnd; ++p) {
        if (grammar_.elements[static_cast<size_t>(p)].kind != Element::Kind::kBytes) continue;
        for (int32_t parent_position : parents[static_cast<size_t>(r)]) {
          if (visits_left <= 0 || static_cast<int32_t>(masks_.size()) >= budget_.max_cached_pairs) return;
          pushdown.truncate(0);
          const int32_t parent =
              parent_position == kNoParent ? kNoParent : pushdown.push_node(parent_position, kFrameBottom);
          StackSet frame;
          frame.tops.push_back(pushdown.push_node(p, parent));
          PositionMask mask;
          const bool complete =
              classify_vocabulary(pushdown, frame, *vocabulary_, mask.accepted, &mask.uncertain, visits_left);
          if (!complete) continue;
          if (mask.accepted.size() * 32 > static_cast<size_t>(vocabulary_->size())) {
            mask.accepted_bits.assign(words, 0);
            for (int32_t id : mask.accepted) set_bit(mask.accepted_bits, id);
            mask.accepted.clear();
            mask.accepted.shrink_to_fit();
          }
          masks_.emplace(pair_key(p, parent_position), std::move(mask));
        }
      }
    }
  }
}

}  // namespace loom::grammar
