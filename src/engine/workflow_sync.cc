#include "engine/workflow_sync.h"

#include <cmath>

namespace loom {
namespace {

std::string_view workflow_of_key(std::string_view agent_key) { return agent_key.substr(0, agent_key.find('/')); }

}  // namespace

WorkflowRegistryConfig workflow_registry_config(const EngineConfig& config) {
  WorkflowRegistryConfig registry;
  double seconds = config.workflow_ttl_seconds;
  if (!(seconds > 0.0))  // NaN included
    fail(ErrorKind::kInvalidArgument, "workflow ttl must be > 0 seconds, got {}", seconds);
  seconds = std::min(seconds, 1.0e9);  // ~30 years: "never", without overflowing the clock's duration
  registry.ttl = std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
  registry.max_workflows = config.max_workflows;
  registry.max_agents_per_workflow = config.max_workflow_agents;
  return registry;
}

WorkflowSync::WorkflowSync(WorkflowRegistry& registry, const EngineConfig& config)
    : registry_(registry),
      eviction_policy_(config.workflow_aware_eviction ? KvEvictionPolicy::kWorkflow : KvEvictionPolicy::kLru),
      block_size_(config.block_size) {}

void WorkflowSync::reset(KvCacheGroup& caches) {
  caches.set_eviction_policy(eviction_policy_);
  pushed_agent_steps_.clear();
  steps_pushed_ = false;
}

void WorkflowSync::sync(KvCacheGroup& caches) {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_expiry_ >= std::chrono::seconds(1)) {
    last_expiry_ = now;
    registry_.expire_unseen();
  }
  if (steps_pushed_ && snapshot_ && snapshot_->version() == registry_.version()) return;
  std::shared_ptr<const WorkflowSnapshot> snapshot = registry_.snapshot();
  auto is_gone = [&](std::string_view workflow) { return snapshot->workflow(workflow) == nullptr; };

  // Every agent with a value now; agents that lost theirs (an undeclared agent
  // that stopped running, a graph replaced without it) become far, so their
  // prefixes do not keep the priority of an agent about to run.
  std::map<std::string, int32_t> steps;
  for (const AgentSteps& agent : snapshot->agents_with_steps(0, kStepsFar))
    steps[fmt::format("{}/{}", agent.workflow, agent.agent)] = agent.steps_to_execution;
  std::map<std::string, int32_t> changed;
  bool any_gone = false;
  for (auto it = pushed_agent_steps_.begin(); it != pushed_agent_steps_.end();) {
    if (is_gone(workflow_of_key(it->first))) {
      any_gone = true;
      it = pushed_agent_steps_.erase(it);
      continue;
    }
    if (!steps.count(it->first) && it->second != kStepsFar) {
      it->second = kStepsFar;
      changed[it->first] = kStepsFar;
    }
    ++it;
  }
  for (const auto& [key, value] : steps) {
    auto [it, inserted] = pushed_agent_steps_.try_emplace(key, value);
    if (inserted || it->second != value) {
      it->second = value;
      changed[key] = value;
    }
  }
  if (!changed.empty()) caches.set_agent_steps(changed);
  // Ended or expired workflows: their agents' prefixes become ordinary cached
  // blocks, and their prompt history goes.
  const bool any_tracked_gone = prefix_tracker_.forget_workflows_if(is_gone) > 0;
  if (any_gone || any_tracked_gone)
    caches.forget_agents([&](const std::string& agent_key) { return is_gone(workflow_of_key(agent_key)); });
  snapshot_ = std::move(snapshot);
  steps_pushed_ = true;
}

void WorkflowSync::observe_hints(PendingRequest& request) {
  const EngineRequest& hints = request.request;
  if (hints.workflow.empty() || hints.agent.empty()) return;
  request.agent_key = fmt::format("{}/{}", hints.workflow, hints.agent);
  const FixedPrefix prefix =
      prefix_tracker_.observe(hints.workflow, hints.agent, hints.prompt_tokens, hints.fixed_prefix_tokens);
  request.num_fixed_prefix_tokens = prefix.num_tokens;
}

void WorkflowSync::declare_fixed_prefixes(const ScheduledBatch& batch, const ActiveRequests& active,
                                          KvCacheGroup& caches) {
  for (const ScheduledRequest& entry : batch.requests) {
    auto it = active.find(entry.id);
    if (it == active.end()) continue;
    const PendingRequest& request = *it->second;
    const int32_t num_fixed = request.num_fixed_prefix_tokens;
    if (request.agent_key.empty() || num_fixed < block_size_) continue;
    // Only steps that committed fixed-prefix blocks, or that found them cached
    // at admission (the agent's key may point at an older copy), change anything.
    const bool admitted_now = entry.num_prefix_hit_tokens >= 0;
    if (!admitted_now && entry.num_computed_tokens >= num_fixed) continue;
    // A workflow the registry does not know (full, or ended meanwhile) gets no agents.
    if (!snapshot_ || !snapshot_->workflow(request.request.workflow)) continue;
    caches.set_agent_fixed_prefix(request.agent_key, request.kv_plan.kv,
                                  std::span<const KvTokenId>(request.request.prompt_tokens), num_fixed);
    // An agent's first prefix: make sure the group has its steps (they may
    // have arrived before any prefix of it did).
    auto steps = pushed_agent_steps_.find(request.agent_key);
    if (steps != pushed_agent_steps_.end()) caches.set_agent_steps({{steps->first, steps->second}});
  }
}

}  // namespace loom
