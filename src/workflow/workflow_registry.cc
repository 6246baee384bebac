#include "workflow/workflow_registry.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "util/error.h"

namespace loom {

struct WorkflowRegistry::WorkflowState {
  std::shared_ptr<const AgentStepGraph> graph;  // null: none declared
  bool has_posted_progress = false;
  WorkflowProgress progress;                    // posted, or `running` derived from requests
  TimePoint last_seen;
  std::shared_ptr<const WorkflowSteps> steps;   // what the snapshot shows
};

namespace {

std::shared_ptr<const WorkflowSteps> compute_steps(const AgentStepGraph* graph, const WorkflowProgress& progress,
                                                   bool follows_requests) {
  auto steps = std::make_shared<WorkflowSteps>();
  steps->has_graph = graph != nullptr;
  steps->follows_requests = follows_requests;
  steps->running = progress.running;
  if (graph != nullptr) {
    const std::vector<int32_t> values = graph->steps_to_execution(progress);
    for (int32_t agent = 0; agent < graph->num_agents(); ++agent)
      steps->steps_by_agent.emplace(graph->names()[agent], values[agent]);
  }
  // Undeclared agents: explicit values win over running (as in the graph).
  for (const auto& [agent, value] : progress.steps_to_execution)
    if (graph == nullptr || !graph->index_of(agent)) steps->steps_by_agent.emplace(agent, value);
  for (const std::string& agent : progress.running)
    if (graph == nullptr || !graph->index_of(agent)) steps->steps_by_agent.emplace(agent, 0);
  steps->agents_by_steps.reserve(steps->steps_by_agent.size());
  for (const auto& [agent, value] : steps->steps_by_agent) steps->agents_by_steps.emplace_back(value, agent);
  std::sort(steps->agents_by_steps.begin(), steps->agents_by_steps.end());
  return steps;
}

}  // namespace

const WorkflowSteps* WorkflowSnapshot::workflow(std::string_view workflow) const {
  const auto it = workflows_.find(workflow);
  return it == workflows_.end() ? nullptr : it->second.get();
}

std::vector<std::string> WorkflowSnapshot::workflow_ids() const {
  std::vector<std::string> ids;
  ids.reserve(workflows_.size());
  for (const auto& [id, steps] : workflows_) ids.push_back(id);
  return ids;
}

std::optional<int32_t> WorkflowSnapshot::steps_to_execution(std::string_view workflow, std::string_view agent) const {
  const WorkflowSteps* steps = this->workflow(workflow);
  if (steps == nullptr) return std::nullopt;
  const auto it = steps->steps_by_agent.find(agent);
  if (it == steps->steps_by_agent.end()) return std::nullopt;
  return it->second;
}

std::vector<AgentSteps> WorkflowSnapshot::agents_with_steps(int32_t min_steps, int32_t max_steps) const {
  std::vector<AgentSteps> found;
  for (const auto& [workflow, steps] : workflows_) {
    const auto& agents = steps->agents_by_steps;
    auto it = std::lower_bound(agents.begin(), agents.end(), min_steps,
                               [](const std::pair<int32_t, std::string>& entry, int32_t value) {
                                 return entry.first < value;
                               });
    for (; it != agents.end() && it->first <= max_steps; ++it)
      found.push_back(AgentSteps{workflow, it->second, it->first});
  }
  std::sort(found.begin(), found.end(), [](const AgentSteps& a, const AgentSteps& b) {
    return std::tie(a.steps_to_execution, a.workflow, a.agent) < std::tie(b.steps_to_execution, b.workflow, b.agent);
  });
  return found;
}

WorkflowRegistry::WorkflowRegistry(WorkflowRegistryConfig config)
    : config_(std::move(config)), snapshot_(std::make_shared<WorkflowSnapshot>()) {
  if (config_.max_workflows < 0)
    fail(ErrorKind::kInvalidArgument, "max_workflows: {} is negative", config_.max_workflows);
  if (config_.max_agents_per_workflow < 1)
    fail(ErrorKind::kInvalidArgument, "max_agents_per_workflow: {} is below 1", config_.max_agents_per_workflow);
  if (config_.ttl <= std::chrono::steady_clock::duration::zero())
    fail(ErrorKind::kInvalidArgument, "workflow ttl must be positive");
}

WorkflowRegistry::~WorkflowRegistry() = default;

WorkflowRegistry::TimePoint WorkflowRegistry::now() const {
  return config_.clock ? config_.clock() : std::chrono::steady_clock::now();
}

void WorkflowRegistry::declare(std::string_view workflow, const WorkflowSpec& spec) {
  check_workflow_id(workflow, "workflow");
  auto graph = std::make_shared<const AgentStepGraph>(spec, config_.max_agents_per_workflow);
  const TimePoint time = now();
  std::lock_guard lock(mutex_);
  expire_locked(time);
  bool created = false;
  WorkflowState* state = find_or_create(workflow, time, created);
  if (state == nullptr)
    throw Error(ErrorKind::kCapacity,
                fmt::format("workflow \"{}\" is new and {} workflows are known already (the server's "
                            "--max-workflows)",
                            workflow, config_.max_workflows),
                "DELETE finished workflows, or wait for idle ones to expire");
  state->graph = std::move(graph);
  state->last_seen = time;
  update_steps(*state, created);
}

void WorkflowRegistry::post_progress(std::string_view workflow, const WorkflowProgress& progress) {
  check_workflow_id(workflow, "workflow");
  check_workflow_progress(progress, config_.max_agents_per_workflow);
  const TimePoint time = now();
  std::lock_guard lock(mutex_);
  expire_locked(time);
  bool created = false;
  WorkflowState* state = find_or_create(workflow, time, created);
  if (state == nullptr)
    throw Error(ErrorKind::kCapacity,
                fmt::format("workflow \"{}\" is new and {} workflows are known already (the server's "
                            "--max-workflows)",
                            workflow, config_.max_workflows),
                "DELETE finished workflows, or wait for idle ones to expire");
  state->has_posted_progress = true;
  state->progress = progress;
  state->last_seen = time;
  update_steps(*state, created);
}

bool WorkflowRegistry::end(std::string_view workflow) {
  std::lock_guard lock(mutex_);
  expire_locked(now());
  const auto it = workflows_.find(workflow);
  if (it == workflows_.end()) return false;
  workflows_.erase(it);
  publish();
  return true;
}

bool WorkflowRegistry::note_request(std::string_view workflow, std::string_view agent) {
  WorkflowHints hints;
  hints.workflow = workflow;
  hints.agent = agent;
  check_workflow_hints(hints);
  if (workflow.empty()) return false;
  const TimePoint time = now();
  std::lock_guard lock(mutex_);
  expire_locked(time);
  bool created = false;
  WorkflowState* state = find_or_create(workflow, time, created);
  if (state == nullptr) return false;
  state->last_seen = time;
  if (agent.empty() || state->has_posted_progress) {
    if (created) publish();
    return true;
  }

  std::vector<std::string> running;
  const AgentStepGraph* graph = state->graph.get();
  const std::optional<int32_t> arriving = graph ? graph->index_of(agent) : std::nullopt;
  for (const std::string& name : state->progress.running) {
    if (name == agent) {  // keeps its place: the order is part of what a snapshot shows
      running.push_back(name);
      continue;
    }
    const std::optional<int32_t> index = graph ? graph->index_of(name) : std::nullopt;
    if (!index) continue;
    if (arriving) {
      const std::vector<int32_t>& predecessors = graph->predecessors(*arriving);
      if (std::find(predecessors.begin(), predecessors.end(), *index) != predecessors.end()) continue;
    }
    running.push_back(name);
  }
  if (std::find(running.begin(), running.end(), agent) == running.end()) running.emplace_back(agent);
  if (running != state->progress.running || created) {
    state->progress.running = std::move(running);
    update_steps(*state, created);
  }
  return true;
}

int32_t WorkflowRegistry::expire_unseen() {
  std::lock_guard lock(mutex_);
  return expire_locked(now());
}

std::shared_ptr<const WorkflowSnapshot> WorkflowRegistry::snapshot() const {
  std::lock_guard lock(snapshot_mutex_);
  return snapshot_;
}

WorkflowRegistry::WorkflowState* WorkflowRegistry::find_or_create(std::string_view workflow, TimePoint now,
                                                                  bool& created) {
  created = false;
  const auto it = workflows_.find(workflow);
  if (it != workflows_.end()) return it->second.get();
  if (workflows_.size() >= static_cast<size_t>(config_.max_workflows)) return nullptr;
  auto state = std::make_unique<WorkflowState>();
  state->last_seen = now;
  state->steps = compute_steps(nullptr, state->progress, true);
  WorkflowState* created_state = state.get();
  workflows_.emplace(std::string(workflow), std::move(state));
  created = true;
  return created_state;
}

int32_t WorkflowRegistry::expire_locked(TimePoint now) {
  int32_t num_expired = 0;
  for (auto it = workflows_.begin(); it != workflows_.end();) {
    if (now - it->second->last_seen >= config_.ttl) {
      it = workflows_.erase(it);
      ++num_expired;
    } else {
      ++it;
    }
  }
  if (num_expired > 0) publish();
  return num_expired;
}

void WorkflowRegistry::update_steps(WorkflowState& state, bool must_publish) {
  std::shared_ptr<const WorkflowSteps> steps =
      compute_steps(state.graph.get(), state.progress, !state.has_posted_progress);
  if (*steps == *state.steps && !must_publish) return;
  state.steps = std::move(steps);
  publish();
}

void WorkflowRegistry::publish() {
  std::map<std::string, std::shared_ptr<const WorkflowSteps>, std::less<>> workflows;
  for (const auto& [name, state] : workflows_) workflows.emplace_hint(workflows.end(), name, state->steps);
  const uint64_t version = version_.load(std::memory_order_relaxed) + 1;
  auto snapshot = std::make_shared<const WorkflowSnapshot>(version, std::move(workflows));
  {
    std::lock_guard lock(snapshot_mutex_);
    snapshot_ = std::move(snapshot);
  }
  version_.store(version, std::memory_order_release);
}

}  // namespace loom
