#include "workflow/agent_step_graph.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <set>
#include <utility>

#include "util/error.h"

namespace loom {

AgentStepGraph::AgentStepGraph(const WorkflowSpec& spec, int32_t max_agents) {
  const size_t limit = static_cast<size_t>(std::max(max_agents, 0));
  if (spec.agents.size() > limit)
    fail(ErrorKind::kInvalidArgument, "agents: {} agents, at most {}", spec.agents.size(), limit);
  names_.reserve(spec.agents.size());
  for (size_t i = 0; i < spec.agents.size(); ++i) {
    const std::string& name = spec.agents[i].name;
    check_agent_name(name, fmt::format("agents[{}].name", i));
    const auto [it, inserted] = index_by_name_.emplace(name, static_cast<int32_t>(i));
    if (!inserted)
      fail(ErrorKind::kInvalidArgument, "agents[{}].name: agent \"{}\" is declared twice (first as agents[{}])", i,
           name, it->second);
    names_.push_back(name);
    joins_.push_back(spec.agents[i].join);
  }
  // An agent named only in an `after` list is declared implicitly (no
  // predecessors, join all), after the declared ones, in order of first mention.
  for (size_t i = 0; i < spec.agents.size(); ++i) {
    const std::vector<std::string>& after = spec.agents[i].after;
    for (size_t j = 0; j < after.size(); ++j) {
      check_agent_name(after[j], fmt::format("agents[{}].after[{}]", i, j));
      if (index_by_name_.emplace(after[j], static_cast<int32_t>(names_.size())).second) {
        names_.push_back(after[j]);
        joins_.push_back(JoinKind::kAll);
        // Checked as names appear, so a huge `after` list stops at the limit.
        if (names_.size() > limit)
          fail(ErrorKind::kInvalidArgument, "agents: {} agents (declared or named in \"after\"), at most {}",
               names_.size(), limit);
      }
    }
  }
  predecessors_.resize(names_.size());
  successors_.resize(names_.size());
  for (size_t i = 0; i < spec.agents.size(); ++i) {
    const std::vector<std::string>& after = spec.agents[i].after;
    for (size_t j = 0; j < after.size(); ++j) {
      const int32_t predecessor = *index_of(after[j]);
      std::vector<int32_t>& predecessors = predecessors_[i];
      if (std::find(predecessors.begin(), predecessors.end(), predecessor) != predecessors.end())
        fail(ErrorKind::kInvalidArgument, "agents[{}].after[{}]: \"{}\" is listed twice", i, j, after[j]);
      predecessors.push_back(predecessor);
      successors_[predecessor].push_back(static_cast<int32_t>(i));
    }
  }
}

std::optional<int32_t> AgentStepGraph::index_of(std::string_view name) const {
  const auto it = index_by_name_.find(name);
  if (it == index_by_name_.end()) return std::nullopt;
  return it->second;
}

// With one predecessor all = any: the predecessor is pending exactly when it
// can settle before the join.
bool AgentStepGraph::waits_for_all(int32_t agent) const {
  return joins_[agent] == JoinKind::kAll && predecessors_[agent].size() >= 2;
}

std::vector<bool> AgentStepGraph::reachable_avoiding(const std::vector<bool>& is_anchor, int32_t blocked) const {
  std::vector<bool> reached(names_.size(), false);
  std::vector<int32_t> stack;
  for (int32_t agent = 0; agent < num_agents(); ++agent) {
    if (is_anchor[agent] && agent != blocked) {
      reached[agent] = true;
      stack.push_back(agent);
    }
  }
  while (!stack.empty()) {
    const int32_t agent = stack.back();
    stack.pop_back();
    for (const int32_t successor : successors_[agent]) {
      if (successor == blocked || reached[successor]) continue;
      reached[successor] = true;
      stack.push_back(successor);
    }
  }
  return reached;
}

std::vector<int32_t> AgentStepGraph::steps_to_execution(const WorkflowProgress& progress) const {
  const size_t num = names_.size();
  std::vector<int32_t> steps(num, kStepsFar);
  std::vector<bool> is_anchor(num, false);
  for (const std::string& name : progress.running) {
    if (const std::optional<int32_t> agent = index_of(name)) {
      steps[*agent] = 0;
      is_anchor[*agent] = true;
    }
  }
  for (const auto& [name, value] : progress.steps_to_execution) {
    if (value < 0 || value > kMaxExplicitSteps)
      fail(ErrorKind::kInvalidArgument, "steps_to_execution.{}: {} is outside [0, {}]", name, value,
           kMaxExplicitSteps);
    if (const std::optional<int32_t> agent = index_of(name)) {
      steps[*agent] = value;
      is_anchor[*agent] = true;
    }
  }

  // How many pending predecessors each `all` agent still waits for (rule 3),
  // and whether a predecessor counts for it.
  std::vector<int32_t> num_pending_left(num, 0);
  std::vector<std::vector<bool>> is_pending(num);
  for (int32_t agent = 0; agent < num_agents(); ++agent) {
    if (is_anchor[agent] || !waits_for_all(agent)) continue;
    const std::vector<bool> reached = reachable_avoiding(is_anchor, agent);
    is_pending[agent].assign(num, false);
    for (const int32_t predecessor : predecessors_[agent]) {
      if (!reached[predecessor]) continue;
      is_pending[agent][predecessor] = true;
      ++num_pending_left[agent];
    }
  }

  // Settle agents in increasing steps; ties by index keep the order deterministic.
  using Entry = std::pair<int32_t, int32_t>;  // (steps, agent)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> queue;
  for (int32_t agent = 0; agent < num_agents(); ++agent)
    if (is_anchor[agent]) queue.emplace(steps[agent], agent);
  std::vector<bool> settled(num, false);
  std::vector<int32_t> max_pending_steps(num, 0);
  while (!queue.empty()) {
    const auto [value, agent] = queue.top();
    queue.pop();
    if (settled[agent]) continue;
    settled[agent] = true;
    steps[agent] = value;
    for (const int32_t successor : successors_[agent]) {
      if (settled[successor] || is_anchor[successor]) continue;
      if (!waits_for_all(successor)) {
        if (value + 1 < steps[successor]) {
          steps[successor] = value + 1;
          queue.emplace(value + 1, successor);
        }
        continue;
      }
      if (!is_pending[successor][agent]) continue;
      max_pending_steps[successor] = std::max(max_pending_steps[successor], value);
      if (--num_pending_left[successor] == 0) queue.emplace(max_pending_steps[successor] + 1, successor);
    }
  }
  for (int32_t agent = 0; agent < num_agents(); ++agent)
    if (!settled[agent]) steps[agent] = kStepsFar;
  return steps;
}

}  // namespace loom
