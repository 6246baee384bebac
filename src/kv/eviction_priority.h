// The order in which the radix tree evicts its evictable leaves (KVFlow;
// docs/design.md §2).
//
// Every node carries `fixed_steps`: kDynamicNodeSteps when it lies on no
// agent's fixed prefix (a "dynamic suffix"), else the smallest
// steps-to-execution of the agents whose fixed prefix passes through it. An
// agent's value sits on the last block of its fixed prefix and reaches every
// ancestor as the min over children:
//
//   [sys0] ── [sys1] ── [plan0] ── [plan1]*planner=3 ── [dyn]      (dyn: -1)
//   min 1     min 1   └─ [exec0]*executor=1 ── [dyn]
//                         1
//
// An eviction key orders the evictable set: the smallest key goes first.
//   kLru:      (0, 0, last_access, node_id)                   plain LRU
//   kWorkflow: dynamic (0, 0, last_access, node_id)           dynamic suffixes first, LRU
//              fixed   (1, -fixed_steps, last_access, node_id) furthest first, LRU within
//
// Thread: any (pure functions).
#pragma once

#include <array>
#include <cstdint>
#include <limits>

namespace loom {

enum class KvEvictionPolicy : uint8_t { kLru, kWorkflow };

// fixed_steps of a node on no agent's fixed prefix.
inline constexpr int32_t kDynamicNodeSteps = -1;
// Steps of an agent whose steps were never set, or that is "far" (== kStepsFar).
inline constexpr int32_t kFarAgentSteps = std::numeric_limits<int32_t>::max();

using EvictionKey = std::array<int64_t, 4>;

// The first element of a reserved node's key (held for a waiting request,
// radix_tree.h): under either policy it goes after every unreserved node.
inline constexpr int64_t kReservedEvictionBand = 2;

inline EvictionKey eviction_key(KvEvictionPolicy policy, int32_t fixed_steps, int64_t last_access,
                                int64_t node_id) {
  if (policy == KvEvictionPolicy::kLru || fixed_steps == kDynamicNodeSteps) return {0, 0, last_access, node_id};
  return {1, -static_cast<int64_t>(fixed_steps), last_access, node_id};
}

// The fixed_steps of a node from one more contribution (an agent's steps or a
// child's fixed_steps): min, where kDynamicNodeSteps means "none".
inline int32_t combine_fixed_steps(int32_t a, int32_t b) {
  if (a == kDynamicNodeSteps) return b;
  if (b == kDynamicNodeSteps) return a;
  return a < b ? a : b;
}

}  // namespace loom
