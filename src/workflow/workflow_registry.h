// The workflows the server knows, and every agent's steps-to-execution
// (KVFlow §3.1, §3.3; docs/design.md §2).
//
//   HTTP threads                                     engine thread
//   ─────────────                                    ─────────────
//   PUT    /v1/workflows/{id}          declare()     snapshot() ──> WorkflowSnapshot
//   POST   /v1/workflows/{id}/progress post_progress()   (immutable, shared; one
//   DELETE /v1/workflows/{id}          end()              mutex-guarded pointer copy)
//   completions with workflow/agent    note_request()  version() (lock-free)
//
// A workflow is keyed by its id; agent names are scoped per workflow, so two
// clients' "planner" never collide. A workflow comes to exist on its first
// declare, post_progress or note_request, and ends on end() or after `ttl`
// without any of those calls (expiry runs at the start of every mutating call
// and in expire_unseen()).
//
// Who runs now:
//   - Once progress was posted for a workflow, its `running` list and explicit
//     `steps_to_execution` stand until the next post (requests change nothing).
//   - Before that, requests drive it: a request's agent A joins the running set,
//     and A's declared predecessors leave it (A follows them, so they are done),
//     as do agents the graph does not declare (nothing says when those finish, so
//     the latest request stands for them). With no graph declared this means
//     "the agent of the latest request runs". Agents stay running after their
//     request finishes, until a successor's request arrives: they mark where the
//     workflow is.
//
// Steps per agent: the declared graph's steps_to_execution() (agent_step_graph.h)
// for declared agents (kStepsFar included); undeclared agents appear only while
// running (0) or explicitly given.
//
// Thread: every method is safe from any thread. Mutating calls serialize on one
// mutex and do the graph work there; snapshot()/version() never wait for it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "workflow/agent_step_graph.h"
#include "workflow/workflow_spec.h"

namespace loom {

using WorkflowClock = std::function<std::chrono::steady_clock::time_point()>;

struct WorkflowRegistryConfig {
  std::chrono::steady_clock::duration ttl = std::chrono::minutes(10);  // unseen this long: expired
  // Workflows known at once (--max-workflows). A new one beyond: declare and
  // post_progress fail (kCapacity, nothing changes); note_request does not
  // track it (the request is served anyway). Existing workflows are unaffected.
  int32_t max_workflows = 10000;
  WorkflowClock clock;           // empty: std::chrono::steady_clock::now
  // Agents per workflow graph, declared or implicit (--max-workflow-agents;
  // >= 1), and entries in each list of a progress update.
  int32_t max_agents_per_workflow = kMaxAgentsPerWorkflow;
};

// One workflow's steps at one version. Immutable; owned by shared_ptr.
struct WorkflowSteps {
  bool has_graph = false;          // a graph was declared
  bool follows_requests = true;    // no progress posted yet: requests move `running`
  std::vector<std::string> running;                               // as used for the values below
  std::map<std::string, int32_t, std::less<>> steps_by_agent;     // agent -> steps (kStepsFar: far)
  std::vector<std::pair<int32_t, std::string>> agents_by_steps;   // the same, ordered by (steps, agent)

  bool operator==(const WorkflowSteps&) const = default;
};

// One (workflow, agent) and its steps; the views stay valid while the snapshot lives.
struct AgentSteps {
  std::string_view workflow;
  std::string_view agent;
  int32_t steps_to_execution = kStepsFar;
};

// Every workflow's steps at one version. Immutable, cheap to hold; lookups
// allocate nothing.
class WorkflowSnapshot {
 public:
  WorkflowSnapshot() = default;
  WorkflowSnapshot(uint64_t version, std::map<std::string, std::shared_ptr<const WorkflowSteps>, std::less<>> workflows)
      : version_(version), workflows_(std::move(workflows)) {}

  // Increases whenever any agent's steps change (or a workflow appears or ends).
  uint64_t version() const { return version_; }
  int32_t num_workflows() const { return static_cast<int32_t>(workflows_.size()); }
  // nullptr when the workflow is unknown (never seen, ended or expired).
  const WorkflowSteps* workflow(std::string_view workflow) const;
  // nullopt when the workflow or the agent is unknown; kStepsFar when declared
  // but unreachable.
  std::optional<int32_t> steps_to_execution(std::string_view workflow, std::string_view agent) const;
  // Agents with steps in [min_steps, max_steps] across all workflows, ordered
  // by steps, then workflow, then agent (e.g. (1, 1): the agents that run
  // next, to prefetch their prefixes).
  std::vector<AgentSteps> agents_with_steps(int32_t min_steps, int32_t max_steps) const;
  // Every workflow's id, in order.
  std::vector<std::string> workflow_ids() const;

 private:
  uint64_t version_ = 0;
  std::map<std::string, std::shared_ptr<const WorkflowSteps>, std::less<>> workflows_;
};

class WorkflowRegistry {
 public:
  // Throws Error(kInvalidArgument) for a ttl <= 0, max_workflows < 0 or
  // max_agents_per_workflow < 1.
  explicit WorkflowRegistry(WorkflowRegistryConfig config = {});
  ~WorkflowRegistry();
  WorkflowRegistry(const WorkflowRegistry&) = delete;
  WorkflowRegistry& operator=(const WorkflowRegistry&) = delete;

  // PUT: declares or replaces the step graph. Progress state (posted or from
  // requests) is kept. Throws Error(kInvalidArgument) for a bad id or graph
  // (more than max_agents_per_workflow agents included; nothing changes then),
  // Error(kCapacity) for a new workflow when max_workflows are known.
  void declare(std::string_view workflow, const WorkflowSpec& spec);
  // POST progress: from now on `progress` says who runs (see above). Creates the
  // workflow if unknown. Throws like declare() (check_workflow_progress rules).
  void post_progress(std::string_view workflow, const WorkflowProgress& progress);
  // DELETE: forgets the workflow. False when it was not known.
  bool end(std::string_view workflow);
  // A request of `agent` ("" = none) in `workflow` arrived: refreshes the TTL
  // and, while no progress was posted, moves `running` (see above). Creates the
  // workflow if unknown. False when it could not be tracked (max_workflows
  // known); the request is served anyway. Throws Error(kInvalidArgument) for a
  // bad id or name (check_workflow_hints rules).
  bool note_request(std::string_view workflow, std::string_view agent);
  // Drops workflows unseen for `ttl`; returns how many.
  int32_t expire_unseen();

  // The current steps of every workflow. Cheap (one pointer copy under a
  // mutex that no graph work holds); hold it for as long as it is used.
  std::shared_ptr<const WorkflowSnapshot> snapshot() const;
  // The version of the current snapshot, without locking: call snapshot()
  // again only when it differs from the one held.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }

  int32_t max_workflows() const { return config_.max_workflows; }
  int32_t max_agents_per_workflow() const { return config_.max_agents_per_workflow; }

 private:
  struct WorkflowState;
  using TimePoint = std::chrono::steady_clock::time_point;

  TimePoint now() const;
  // Finds `workflow`, creating it (unpublished, `created` set) when there is
  // room; nullptr when full. Caller holds mutex_.
  WorkflowState* find_or_create(std::string_view workflow, TimePoint now, bool& created);
  int32_t expire_locked(TimePoint now);
  // Recomputes `state`'s steps and publishes a new snapshot if they changed
  // (or `must_publish`). Caller holds mutex_.
  void update_steps(WorkflowState& state, bool must_publish);
  // Publishes the current steps of every workflow as a new version. Caller holds mutex_.
  void publish();

  WorkflowRegistryConfig config_;
  mutable std::mutex mutex_;  // guards workflows_; taken by mutating calls only
  std::map<std::string, std::unique_ptr<WorkflowState>, std::less<>> workflows_;
  mutable std::mutex snapshot_mutex_;  // guards snapshot_ only
  std::shared_ptr<const WorkflowSnapshot> snapshot_;
  std::atomic<uint64_t> version_{0};
};

}  // namespace loom
