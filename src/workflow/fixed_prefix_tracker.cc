#include "workflow/fixed_prefix_tracker.h"

#include <algorithm>

#include "util/error.h"

namespace loom {

FixedPrefixTracker::FixedPrefixTracker(FixedPrefixTrackerConfig config) : config_(config) {
  if (config_.num_prompts_compared < 2)
    fail(ErrorKind::kInvalidArgument, "num_prompts_compared: {} is below 2", config_.num_prompts_compared);
  if (config_.max_tracked_agents < 1)
    fail(ErrorKind::kInvalidArgument, "max_tracked_agents: {} is below 1", config_.max_tracked_agents);
  if (config_.max_prefix_tokens < 1)
    fail(ErrorKind::kInvalidArgument, "max_prefix_tokens: {} is below 1", config_.max_prefix_tokens);
}

FixedPrefix FixedPrefixTracker::observe(std::string_view workflow, std::string_view agent,
                                        std::span<const int32_t> prompt, std::optional<int32_t> explicit_tokens) {
  if (explicit_tokens && *explicit_tokens < 0)
    fail(ErrorKind::kInvalidArgument, "fixed_prefix_tokens: {} is negative", *explicit_tokens);
  auto workflow_it = workflows_.find(workflow);
  if (workflow_it == workflows_.end()) workflow_it = workflows_.emplace(std::string(workflow), AgentMap{}).first;
  AgentMap& agents = workflow_it->second;
  auto agent_it = agents.find(agent);
  const bool is_new = agent_it == agents.end();
  if (is_new) {
    agent_it = agents.emplace(std::string(agent), AgentHistory{}).first;
    agent_it->second.lru_position = lru_.emplace(lru_.end(), std::string(workflow), std::string(agent));
  } else {
    lru_.splice(lru_.end(), lru_, agent_it->second.lru_position);
  }
  AgentHistory& history = agent_it->second;

  const size_t num_kept = std::min(prompt.size(), static_cast<size_t>(config_.max_prefix_tokens));
  if (!is_new) {
    const auto [mismatch, unused] =
        std::mismatch(prompt.begin(), prompt.begin() + num_kept, history.latest_prompt.begin(),
                      history.latest_prompt.end());
    history.common_lengths.push_back(static_cast<int32_t>(mismatch - prompt.begin()));
    while (history.common_lengths.size() > static_cast<size_t>(config_.num_prompts_compared - 1))
      history.common_lengths.pop_front();
  }
  history.latest_prompt.assign(prompt.begin(), prompt.begin() + num_kept);

  FixedPrefix prefix;
  if (explicit_tokens) {
    prefix.num_tokens = static_cast<int32_t>(std::min<int64_t>(*explicit_tokens, static_cast<int64_t>(prompt.size())));
    prefix.source = FixedPrefixSource::kExplicit;
  } else if (!history.common_lengths.empty()) {
    prefix.num_tokens = *std::min_element(history.common_lengths.begin(), history.common_lengths.end());
    prefix.source = FixedPrefixSource::kDetected;
  } else {
    prefix.num_tokens = static_cast<int32_t>(num_kept);
    prefix.source = FixedPrefixSource::kFirstPrompt;
  }
  history.latest_prefix = prefix;

  if (lru_.size() > static_cast<size_t>(config_.max_tracked_agents)) forget_least_recent();
  return prefix;
}

std::optional<FixedPrefixTracker::Latest> FixedPrefixTracker::latest(std::string_view workflow,
                                                                     std::string_view agent) const {
  const auto workflow_it = workflows_.find(workflow);
  if (workflow_it == workflows_.end()) return std::nullopt;
  const auto agent_it = workflow_it->second.find(agent);
  if (agent_it == workflow_it->second.end()) return std::nullopt;
  const AgentHistory& history = agent_it->second;
  const size_t num_tokens = std::min(static_cast<size_t>(history.latest_prefix.num_tokens), history.latest_prompt.size());
  return Latest{history.latest_prefix, std::span<const int32_t>(history.latest_prompt.data(), num_tokens)};
}

void FixedPrefixTracker::forget_workflow(std::string_view workflow) {
  const auto workflow_it = workflows_.find(workflow);
  if (workflow_it == workflows_.end()) return;
  for (const auto& [agent, history] : workflow_it->second) lru_.erase(history.lru_position);
  workflows_.erase(workflow_it);
}

int32_t FixedPrefixTracker::forget_workflows_if(const std::function<bool(std::string_view workflow)>& should_forget) {
  int32_t num_forgotten = 0;
  for (auto it = workflows_.begin(); it != workflows_.end();) {
    if (!should_forget(it->first)) {
      ++it;
      continue;
    }
    for (const auto& [agent, history] : it->second) lru_.erase(history.lru_position);
    it = workflows_.erase(it);
    ++num_forgotten;
  }
  return num_forgotten;
}

void FixedPrefixTracker::forget_least_recent() {
  const auto& [workflow, agent] = lru_.front();
  const auto workflow_it = workflows_.find(workflow);
  workflow_it->second.erase(agent);
  if (workflow_it->second.empty()) workflows_.erase(workflow_it);
  lru_.pop_front();
}

}  // namespace loom
