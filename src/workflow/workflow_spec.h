// Native types for the workflow API (KVFlow; docs/design.md §2). The server
// fills them from JSON (server/workflow_request.h); nothing here knows JSON.
//
//   PUT  /v1/workflows/{id}           -> WorkflowSpec
//        {"agents": [{"name": "planner", "after": ["reviewer"]},
//                    {"name": "expresser", "after": ["executor1", "executor2"], "join": "all"}, ...]}
//   POST /v1/workflows/{id}/progress  -> WorkflowProgress
//        {"running": ["executor1"], "steps_to_execution": {"reviewer": 2}}
//   DELETE /v1/workflows/{id}         -> (the id only)
//   completions / chat body fields    -> WorkflowHints
//        {"workflow": "w1", "agent": "planner", "fixed_prefix_tokens": 812, ...}
//
// Agent names are scoped per workflow: ("w1", "planner") and ("w2", "planner")
// are different agents. A workflow id doubles as the client scope of KVFlow §3.3.
//
// The validators below check names and numbers only; the graph itself
// (duplicate agents, repeated predecessors; an agent named only in an `after`
// list is declared implicitly) is checked by AgentStepGraph's constructor.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

// How an agent's steps-to-execution follow from its predecessors'
// (workflow/agent_step_graph.h has the full rule).
enum class JoinKind : uint8_t {
  kAll,  // runs once every predecessor of the current round has run: max(...) + 1
  kAny,  // runs after the first predecessor that runs: min(...) + 1
};

const char* join_kind_name(JoinKind join);  // "all" / "any"

// Steps-to-execution of an agent nothing running leads to (it may never run
// again in this workflow). Larger than every finite value; never added to.
inline constexpr int32_t kStepsFar = std::numeric_limits<int32_t>::max();
// Largest explicit steps_to_execution a client may post.
inline constexpr int32_t kMaxExplicitSteps = 1'000'000;
// Default largest number of agents one workflow may have: declared or named in
// `after` lists, and in each of a progress update's lists (bounds the graph
// work done per update and the memory per workflow). WorkflowRegistryConfig::
// max_agents_per_workflow (--max-workflow-agents) sets the server's.
inline constexpr int32_t kMaxAgentsPerWorkflow = 256;
// Longest workflow id / agent name, in bytes.
inline constexpr int32_t kMaxWorkflowNameBytes = 128;

// One agent of a declared step graph.
struct AgentSpec {
  std::string name;                // non-empty, unique within the workflow
  std::vector<std::string> after;  // predecessors; each a declared agent, no repeats
  JoinKind join = JoinKind::kAll;  // irrelevant with fewer than two predecessors
};

// Body of PUT /v1/workflows/{id}: the whole agent step graph, in declaration
// order (which breaks ties wherever an order is needed).
struct WorkflowSpec {
  std::vector<AgentSpec> agents;
};

// Body of POST /v1/workflows/{id}/progress. Names need not be declared in the
// graph: an undeclared agent is an isolated one (0 while running, its explicit
// value if given, else unknown). An agent both running and given an explicit
// value takes the explicit value.
struct WorkflowProgress {
  std::vector<std::string> running;                                     // no repeats
  std::map<std::string, int32_t, std::less<>> steps_to_execution;       // values in [0, kMaxExplicitSteps]
};

// Workflow fields of one completions / chat request.
struct WorkflowHints {
  std::string workflow;                        // "" = the request belongs to no workflow
  std::string agent;                           // "" = none; requires a workflow
  std::optional<int32_t> fixed_prefix_tokens;  // >= 0: the prompt's first N tokens are the agent's fixed part

  bool has_agent() const { return !workflow.empty() && !agent.empty(); }
};

// True for 1..kMaxWorkflowNameBytes bytes of [A-Za-z0-9._:-] (an id travels
// in a URL path, so it stays URL-safe).
bool is_valid_workflow_id(std::string_view id);
// True for 1..kMaxWorkflowNameBytes bytes without ASCII control characters.
bool is_valid_agent_name(std::string_view name);

// Throw Error(kInvalidArgument) naming `field` (e.g. "agents[2].name") when
// the value breaks the rule above / the bounds of its struct. `max_agents`
// bounds each of a progress update's lists.
void check_workflow_id(std::string_view id, std::string_view field);
void check_agent_name(std::string_view name, std::string_view field);
void check_workflow_progress(const WorkflowProgress& progress, int32_t max_agents = kMaxAgentsPerWorkflow);
void check_workflow_hints(const WorkflowHints& hints);

}  // namespace loom
