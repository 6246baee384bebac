#include "grammar/pushdown.h"

#include <unordered_map>

namespace loom::grammar {

Pushdown::Pushdown(const Grammar& grammar, PushdownLimits limits) : grammar_(grammar), limits_(limits) {
  nodes_.reserve(1024);
}

int32_t Pushdown::push_node(int32_t position, int32_t parent) {
  const int32_t depth = parent >= 0 ? nodes_[static_cast<size_t>(parent)].depth + 1 : 0;
  nodes_.push_back({position, parent, depth});
  return static_cast<int32_t>(nodes_.size() - 1);
}

void Pushdown::initial_state(StackSet& out) {
  out.clear();
  work_ = 0;
  for (int32_t start : grammar_.rule_alternatives[static_cast<size_t>(grammar_.root_rule)])
    expand(start, kNoParent, out, 0);
}

void Pushdown::expand(int32_t position, int32_t parent, StackSet& out) { expand(position, parent, out, 0); }

void Pushdown::expand(int32_t position, int32_t parent, StackSet& out, int32_t recursion) {
  if (out.overflow) return;
  if (++work_ > limits_.max_expansion_work || recursion > limits_.max_stack_depth) {
    out.overflow = true;
    return;
  }
  const Element element = grammar_.elements[static_cast<size_t>(position)];
  switch (element.kind) {
    case Element::Kind::kBytes: {
      for (int32_t top : out.tops) {
        const StackNode& existing = nodes_[static_cast<size_t>(top)];
        if (existing.position == position && existing.parent == parent) return;
      }
      if (static_cast<int32_t>(out.tops.size()) >= limits_.max_stacks) {
        out.overflow = true;
        return;
      }
      const int32_t id = push_node(position, parent);
      if (nodes_[static_cast<size_t>(id)].depth > limits_.max_stack_depth) {
        out.overflow = true;
        return;
      }
      out.tops.push_back(id);
      return;
    }
    case Element::Kind::kEnd:
      if (parent == kNoParent) {
        out.can_end = true;
      } else if (parent == kFrameBottom) {
        out.reached_bottom = true;
      } else {
        const StackNode resume = nodes_[static_cast<size_t>(parent)];
        expand(resume.position, resume.parent, out, recursion + 1);
      }
      return;
    case Element::Kind::kRule: {
      const bool tail_call = grammar_.elements[static_cast<size_t>(position) + 1].kind == Element::Kind::kEnd;
      const int32_t resume = tail_call ? parent : push_node(position + 1, parent);
      for (int32_t start : grammar_.rule_alternatives[static_cast<size_t>(element.value)])
        expand(start, resume, out, recursion + 1);
      return;
    }
  }
}

void Pushdown::advance(const StackSet& from, uint8_t byte, StackSet& out) {
  out.clear();
  work_ = 0;
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
    kept.push_back({node.position, parent, node.depth});
    const auto new_id = static_cast<int32_t>(kept.size() - 1);
    renamed.emplace(id, new_id);
    return new_id;
  };
  for (int32_t& top : state.tops) top = copy(copy, top);
  nodes_ = std::move(kept);
}

}  // namespace loom::grammar
