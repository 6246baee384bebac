// The agent step graph of one workflow and its steps-to-execution (KVFlow §3.1).
//
// Each agent lists the agents it runs `after` and a join: `all` waits for every
// predecessor (max + 1), `any` for the first (min + 1). Steps-to-execution
// estimates how many agent steps from now an agent runs next; the KV cache
// keeps the fixed prefixes of small values longest.
//
// The rule (what steps_to_execution() computes):
//
//   1. Anchors. Every running agent has 0; an explicit value overrides
//      (running or not). Anchors ignore their predecessors.
//   2. any: min over predecessors + 1.
//   3. all: max over the *pending* predecessors + 1. A predecessor is pending
//      when some anchor leads to it without passing through the joining agent
//      itself: it still has to run before the join. A predecessor that only the
//      join itself leads to (around a cycle), or that nothing leads to, has
//      already delivered for this round: its branch finished.
//   4. Far. An agent that no anchor leads to (under rules 2-3) gets kStepsFar:
//      disconnected agents, agents only upstream of the running ones in an
//      acyclic graph, a self-loop that is not running, and joins that wait on
//      each other's output (a deadlock the graph alone cannot break).
//
// Values are the least solution of rules 1-3, computed in increasing order
// (Knuth's generalisation of Dijkstra: an `any` agent settles with its first
// settled predecessor, an `all` agent with its last pending one), so cycles
// terminate and every finite value is at most max(anchor) + num_agents.
//
// Diamond (planner fans out to e1 and e2; expresser joins them):
//
//   planner ──> e1 ──┐
//      │             ├──(all)──> expresser
//      └──────> e2 ──┘
//
//   running {planner}                 e1 1, e2 1, expresser 2
//   running {e1, e2}                  expresser 1, planner far
//   running {e1} (e2 already done)    expresser 1: e2 is not pending, nothing
//                                     running leads to it; e2 far
//   running {e1}, e2 explicitly 3     expresser 4 (any: 1)
//
// KVFlow Fig. 1 cycle (planner after reviewer closes the loop):
//
//   planner ──> executor ──> expresser ──> reviewer ──┐
//      ^──────────────────────────────────────────────┘
//
//   running {executor}                expresser 1, reviewer 2, planner 3
//
// The same cycle with the diamond inside (planner -> e1, e2 -> expresser):
//
//   running {e1}                      expresser 1, reviewer 2, planner 3, e2 4
//
//   e2 is reached only through expresser, so it already ran in this round: the
//   join waits for e1 alone, and e2 runs next after the next planner.
//
// Self-loop: `a after [a, b]` with b running: a 1 (the loop itself is never
// pending); `a after [a]` alone: 0 when running, else far.
//
// Thread: immutable after construction; safe to share between threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <map>
#include <vector>

#include "workflow/workflow_spec.h"

namespace loom {

class AgentStepGraph {
 public:
  // An empty graph (no agents).
  AgentStepGraph() = default;
  // Validates and indexes `spec`. Throws Error(kInvalidArgument) naming the
  // field ("agents[1].name: agent \"planner\" is declared twice ...") for an
  // empty or invalid name, a duplicate agent, a repeated predecessor, or more
  // than `max_agents` agents (declared or implicit; so no agent has more
  // predecessors either). An agent named only in some `after`
  // list is declared implicitly (no predecessors, join all): it gets the next
  // index after the declared agents, in order of first mention, so
  // {"planner" after ["reviewer"]} declares "reviewer" as agent 1.
  explicit AgentStepGraph(const WorkflowSpec& spec, int32_t max_agents = kMaxAgentsPerWorkflow);

  int32_t num_agents() const { return static_cast<int32_t>(names_.size()); }
  // Agent names in declaration order; agent index i is names()[i].
  const std::vector<std::string>& names() const { return names_; }
  std::optional<int32_t> index_of(std::string_view name) const;
  const std::vector<int32_t>& predecessors(int32_t agent) const { return predecessors_[agent]; }
  const std::vector<int32_t>& successors(int32_t agent) const { return successors_[agent]; }
  JoinKind join(int32_t agent) const { return joins_[agent]; }

  // Steps-to-execution of every agent, indexed like names(), under the rule
  // above. Names in `progress` that the graph does not declare are ignored.
  // Precondition: check_workflow_progress(progress) passes (explicit values in
  // [0, kMaxExplicitSteps]); violating it throws Error(kInvalidArgument).
  std::vector<int32_t> steps_to_execution(const WorkflowProgress& progress) const;

 private:
  bool waits_for_all(int32_t agent) const;
  // Agents reachable from `anchors` along successor edges, never entering `blocked`.
  std::vector<bool> reachable_avoiding(const std::vector<bool>& is_anchor, int32_t blocked) const;

  std::vector<std::string> names_;
  std::map<std::string, int32_t, std::less<>> index_by_name_;
  std::vector<std::vector<int32_t>> predecessors_;
  std::vector<std::vector<int32_t>> successors_;
  std::vector<JoinKind> joins_;
};

}  // namespace loom
