#include "grammar/pushdown.h"

#include <algorithm>
#include <unordered_map>

namespace loom::grammar {

Pushdown::Pushdown(const Grammar& grammar, PushdownLimits limits) : grammar_(grammar), limits_(limits) {
  nodes_.reserve(1024);
  size_t slots = 64;
  while (slots < 2 * static_cast<size_t>(std::max(limits_.max_stacks, 1))) slots *= 2;
  top_slots_.resize(slots);
}

namespace {

constexpr int32_t kPop = -1;  // first_expansion's position for a return to a parent node

uint32_t node_hash(int32_t position, uint32_t below) {
  const uint64_t h = (static_cast<uint64_t>(below) << 32 | static_cast<uint32_t>(position)) * 0x9E3779B97F4A7C15ull;
  return static_cast<uint32_t>(h >> 32);
}

}  // namespace

int32_t Pushdown::push_node(int32_t position, int32_t parent) {
  const int32_t depth = parent >= 0 ? nodes_[static_cast<size_t>(parent)].depth + 1 : 0;
  nodes_.push_back({position, parent, depth, node_hash(position, stack_hash(parent))});
  return static_cast<int32_t>(nodes_.size() - 1);
}

void Pushdown::begin_pass() {
  work_ = 0;
  num_expanded_ = 0;
  if (++pass_ == 0) {  // wrapped: forget every slot
    std::fill(expanded_.begin(), expanded_.end(), Expanded{});
    std::fill(top_slots_.begin(), top_slots_.end(), TopSlot{});
    pass_ = 1;
  }
}

bool Pushdown::first_expansion(int32_t position, int32_t parent) {
  if (2 * (num_expanded_ + 1) > expanded_.size()) grow_expanded();
  const size_t mask = expanded_.size() - 1;
  for (size_t i = node_hash(position, static_cast<uint32_t>(parent)) & mask;; i = (i + 1) & mask) {
    Expanded& slot = expanded_[i];
    if (slot.pass != pass_) {
      slot = {pass_, position, parent};
      ++num_expanded_;
      return true;
    }
    if (slot.position == position && slot.parent == parent) return false;
  }
}

void Pushdown::grow_expanded() {
  std::vector<Expanded> old = std::move(expanded_);
  expanded_.assign(std::max<size_t>(64, 2 * old.size()), Expanded{});
  num_expanded_ = 0;
  for (const Expanded& slot : old)
    if (slot.pass == pass_) first_expansion(slot.position, slot.parent);
}

Pushdown::TopSlot& Pushdown::find_top(int32_t position, int32_t parent) {
  const uint32_t hash = node_hash(position, stack_hash(parent));
  const size_t mask = top_slots_.size() - 1;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    TopSlot& slot = top_slots_[i];
    if (slot.pass != pass_) return slot;
    const StackNode& existing = nodes_[static_cast<size_t>(slot.top)];
    if (existing.hash == hash && existing.position == position && same_stack(existing.parent, parent)) return slot;
  }
}

void Pushdown::initial_state(StackSet& out) {
  out.clear();
  begin_pass();
  for (int32_t start : grammar_.rule_alternatives[static_cast<size_t>(grammar_.root_rule)])
    expand(start, kNoParent, out, 0);
}

void Pushdown::expand(int32_t position, int32_t parent, StackSet& out, int32_t recursion) {
  if (out.overflow) return;
  if (++work_ > limits_.max_expansion_work || recursion > limits_.max_stack_depth) {
    out.overflow = true;
    return;
  }
  const Element element = grammar_.elements[static_cast<size_t>(position)];
  switch (element.kind) {
    case Element::Kind::kBytes: {
      TopSlot& slot = find_top(position, parent);
      if (slot.pass == pass_) return;  // an equal stack is there already
      if (work_ > limits_.max_expansion_work || static_cast<int32_t>(out.tops.size()) >= limits_.max_stacks) {
        out.overflow = true;
        return;
      }
      const int32_t id = push_node(position, parent);
      if (nodes_[static_cast<size_t>(id)].depth > limits_.max_stack_depth) {
        out.overflow = true;
        return;
      }
      slot = {pass_, id};
      out.tops.push_back(id);
      return;
    }
    case Element::Kind::kEnd:
      if (parent == kNoParent) {
        out.can_end = true;
      } else if (parent == kFrameBottom) {
        out.reached_bottom = true;
      } else if (first_expansion(kPop, parent)) {
        const StackNode resume = nodes_[static_cast<size_t>(parent)];
        expand(resume.position, resume.parent, out, recursion + 1);
      }
      return;
    case Element::Kind::kRule: {
      if (!first_expansion(position, parent)) return;
      const bool tail_call = grammar_.elements[static_cast<size_t>(position) + 1].kind == Element::Kind::kEnd;
      const int32_t resume = tail_call ? parent : push_node(position + 1, parent);
      for (int32_t start : grammar_.rule_alternatives[static_cast<size_t>(element.value)])
        expand(start, resume, out, recursion + 1);
      return;
    }
  }
}

bool Pushdown::same_stack(int32_t a, int32_t b) {
  while (a != b) {
    if (a < 0 || b < 0 || ++work_ > limits_.max_expansion_work) return false;
    const StackNode& x = nodes_[static_cast<size_t>(a)];
    const StackNode& y = nodes_[static_cast<size_t>(b)];
    if (x.position != y.position || x.depth != y.depth) return false;
    a = x.parent;
    b = y.parent;
  }
  return true;
}

void Pushdown::advance(const StackSet& from, uint8_t byte, StackSet& out) {
  out.clear();
  begin_pass();
  if (from.overflow) {
    out.overflow = true;
    return;
  }
  for (int32_t top : from.tops) {
    const StackNode node = nodes_[static_cast<size_t>(top)];
    if (grammar_.byte_class_at(node.position).has(byte)) expand(node.position + 1, node.parent, out, 0);
  }
}

void Pushdown::compact(StackSet& state) {
  std::vector<StackNode> kept;
  std::unordered_map<int32_t, int32_t> renamed;
  // Parents first (recursively), so a parent's new id stays below its child's.
  auto copy = [&](auto&& self, int32_t id) -> int32_t {
    if (id < 0) return id;
    if (auto it = renamed.find(id); it != renamed.end()) return it->second;
    const StackNode node = nodes_[static_cast<size_t>(id)];
    const int32_t parent = self(self, node.parent);
    kept.push_back({node.position, parent, node.depth, node.hash});
    const auto new_id = static_cast<int32_t>(kept.size() - 1);
    renamed.emplace(id, new_id);
    return new_id;
  };
  for (int32_t& top : state.tops) top = copy(copy, top);
  nodes_ = std::move(kept);
}

}  // namespace loom::grammar
