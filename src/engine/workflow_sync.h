// The engine's half of the workflow-aware KV cache (KVFlow; docs/design.md §2): keeps
// the KvCacheGroup's agent state in step with the WorkflowRegistry.
//   - sync(): the registry's steps-to-execution -> KvCacheGroup::set_agent_steps,
//     ended workflows' agents forgotten (KvCacheGroup::forget_agents);
//   - observe_hints(): at admission, the request's agent key and fixed prefix
//     (FixedPrefixTracker: explicit or detected fixed prompt part);
//   - declare_fixed_prefixes(): after a step, the fixed prefixes whose blocks it
//     committed (or found cached) -> KvCacheGroup::set_agent_fixed_prefix.
//
// Agent keys are "workflow/agent": workflow ids never contain '/'
// (is_valid_workflow_id), so the first '/' splits a key.
//
// Ownership: the registry (thread-safe, fed by the HTTP routes) belongs to the
// engine and outlives this; the group is passed to each call, since the engine
// replaces it when the pools change (then reset()).
// Thread: engine thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "engine/engine_request.h"
#include "kv/kv_cache_group.h"
#include "scheduler/scheduler.h"
#include "workflow/fixed_prefix_tracker.h"
#include "workflow/workflow_registry.h"

namespace loom {

// The registry's settings from EngineConfig (workflow_ttl_seconds, max_workflows,
// max_workflow_agents; a ttl <= 0 or NaN throws Error(kInvalidArgument), as the
// registry does for bad caps).
WorkflowRegistryConfig workflow_registry_config(const EngineConfig& config);

class WorkflowSync {
 public:
  WorkflowSync(WorkflowRegistry& registry, const EngineConfig& config);

  // After the pools were (re)allocated: the new group gets the eviction policy
  // (--eviction-policy) and this forgets what it pushed to the old one.
  void reset(KvCacheGroup& caches);
  // Once per step, before Scheduler::plan (its allocations evict by the current
  // steps): expires workflows (at most once a second) and, when the registry's
  // version moved, pushes changed steps and forgets agents of ended workflows.
  void sync(KvCacheGroup& caches);
  // At admission: sets request.agent_key and request.num_fixed_prefix_tokens.
  void observe_hints(PendingRequest& request);
  // After Scheduler::complete_step(batch): declares the fixed prefixes whose
  // blocks this step committed (or found cached at admission) to the group.
  void declare_fixed_prefixes(const ScheduledBatch& batch, const ActiveRequests& active, KvCacheGroup& caches);

  // Agent key -> steps-to-execution, as last pushed to the group (prefetch reads it).
  const std::map<std::string, int32_t>& agent_steps() const { return pushed_agent_steps_; }

 private:
  WorkflowRegistry& registry_;
  const KvEvictionPolicy eviction_policy_;
  const int32_t block_size_;
  FixedPrefixTracker prefix_tracker_;
  std::shared_ptr<const WorkflowSnapshot> snapshot_;  // as last pushed to the group
  bool steps_pushed_ = false;                         // snapshot_'s steps are in the group
  std::map<std::string, int32_t> pushed_agent_steps_; // agent key -> steps, as pushed
  std::chrono::steady_clock::time_point last_expiry_{};
};

}  // namespace loom
