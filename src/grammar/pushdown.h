// The byte-level pushdown automaton that runs a Grammar: a state is a set of
// stacks, each a chain of StackNodes (the top's position is a byte-class
// element; below it, the positions to resume after each rule returns).
//
// Nodes live in one append-only arena owned by the Pushdown and never move
// parents: a node's parent always has a smaller id, so truncating the arena to
// an earlier size (mark/truncate) discards exactly the stacks created since,
// which is how the mask walks explore the vocabulary trie depth first and
// roll back. A rule reference followed by the end of its alternative (a tail
// call, e.g. the loop of x*) pushes no return node, so right recursion runs in
// constant stack.
//
// Ambiguous grammars ((a|aa)*, x?{5,99}) reach the same place by many paths.
// One expansion pass (initial_state, advance) enters each (rule reference,
// parent node) and returns to each parent node once, so converging paths share
// their work and return nodes; and a state holds each distinct stack once,
// compared by content (hash, then the positions), as equal stacks built in
// different passes have different ids. Counted apart, the stacks would
// multiply with every byte.
//
// Not thread-safe: one Pushdown per matcher (per sequence) or per compile.
#pragma once

#include <cstdint>
#include <vector>

#include "grammar/grammar.h"

namespace loom::grammar {

constexpr int32_t kNoParent = -1;     // below the root rule: popping it ends the grammar
constexpr int32_t kFrameBottom = -2;  // mask precomputation: the unknown rest of a stack

struct StackNode {
  int32_t position = 0;  // top node: a kBytes element; below: where to resume
  int32_t parent = kNoParent;
  int32_t depth = 0;
  uint32_t hash = 0;  // of the positions from this node down: equal stacks, equal hashes
};

struct StackSet {
  std::vector<int32_t> tops;    // node ids
  bool can_end = false;         // a path finished the root rule
  bool reached_bottom = false;  // a path popped below kFrameBottom (precomputation only)
  bool overflow = false;        // over PushdownLimits: the state counts as dead

  bool has_stacks() const { return !overflow && !tops.empty(); }
  bool alive() const { return !overflow && (!tops.empty() || can_end); }
  void clear() {
    tops.clear();
    can_end = reached_bottom = overflow = false;
  }
};

struct PushdownLimits {
  int32_t max_stacks = 512;          // stacks in one state
  int32_t max_stack_depth = 2048;    // nested rules on one stack
  int32_t max_expansion_work = 200000;  // expansion steps for one byte
};

class Pushdown {
 public:
  Pushdown(const Grammar& grammar, PushdownLimits limits = {});

  // The state before any byte: the root rule's alternatives.
  void initial_state(StackSet& out);
  // out = the state after `byte` from `from` (out is cleared first; must not be `from`).
  void advance(const StackSet& from, uint8_t byte, StackSet& out);

  int32_t push_node(int32_t position, int32_t parent);
  const StackNode& node(int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  size_t mark() const { return nodes_.size(); }
  void truncate(size_t mark) { nodes_.resize(mark); }
  // Rebuilds the arena with only the stacks of `state` (ids are rewritten).
  void compact(StackSet& state);

  const Grammar& grammar() const { return grammar_; }
  int64_t work() const { return work_; }  // expansion steps of the last initial_state or advance

 private:
  struct Expanded {
    uint32_t pass = 0;
    int32_t position = 0, parent = 0;
  };
  struct TopSlot {
    uint32_t pass = 0;
    int32_t top = 0;
  };

  void begin_pass();
  // False when this pass already expanded the rule reference at `position` under `parent`
  // (position kPop: already returned to `parent`).
  bool first_expansion(int32_t position, int32_t parent);
  void grow_expanded();
  // The slot of this pass's top equal to (position, parent), else the free slot for it.
  TopSlot& find_top(int32_t position, int32_t parent);
  void expand(int32_t position, int32_t parent, StackSet& out, int32_t recursion);
  uint32_t stack_hash(int32_t id) const { return id >= 0 ? nodes_[static_cast<size_t>(id)].hash : static_cast<uint32_t>(id); }
  // Whether the stacks from two node ids down hold the same positions (costs expansion work).
  bool same_stack(int32_t a, int32_t b);

  const Grammar& grammar_;
  PushdownLimits limits_;
  std::vector<StackNode> nodes_;
  int64_t work_ = 0;
  std::vector<Expanded> expanded_;  // open addressing (power-of-two size); slots of other passes are free
  size_t num_expanded_ = 0;
  std::vector<TopSlot> top_slots_;  // by stack hash; over twice max_stacks
  uint32_t pass_ = 0;
};

}  // namespace loom::grammar
