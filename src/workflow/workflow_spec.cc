#include "workflow/workflow_spec.h"

#include <algorithm>
#include <set>

#include "util/error.h"

namespace loom {

const char* join_kind_name(JoinKind join) { return join == JoinKind::kAll ? "all" : "any"; }

bool is_valid_workflow_id(std::string_view id) {
  if (id.empty() || id.size() > static_cast<size_t>(kMaxWorkflowNameBytes)) return false;
  for (const char c : id) {
    const bool is_alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!is_alnum && c != '.' && c != '_' && c != ':' && c != '-') return false;
  }
  return true;
}

bool is_valid_agent_name(std::string_view name) {
  if (name.empty() || name.size() > static_cast<size_t>(kMaxWorkflowNameBytes)) return false;
  for (const char c : name) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) return false;
  }
  return true;
}

void check_workflow_id(std::string_view id, std::string_view field) {
  if (id.empty()) fail(ErrorKind::kInvalidArgument, "{}: workflow id is empty", field);
  if (!is_valid_workflow_id(id))
    throw Error(ErrorKind::kInvalidArgument, fmt::format("{}: invalid workflow id \"{}\"", field, id),
                fmt::format("use 1 to {} characters from A-Z a-z 0-9 . _ : -", kMaxWorkflowNameBytes));
}

void check_agent_name(std::string_view name, std::string_view field) {
  if (name.empty()) fail(ErrorKind::kInvalidArgument, "{}: agent name is empty", field);
  if (!is_valid_agent_name(name))
    throw Error(ErrorKind::kInvalidArgument, fmt::format("{}: invalid agent name", field),
                fmt::format("use 1 to {} bytes without control characters", kMaxWorkflowNameBytes));
}

void check_workflow_progress(const WorkflowProgress& progress, int32_t max_agents) {
  const size_t limit = static_cast<size_t>(std::max(max_agents, 0));
  if (progress.running.size() > limit)
    fail(ErrorKind::kInvalidArgument, "running: {} agents, at most {}", progress.running.size(), limit);
  if (progress.steps_to_execution.size() > limit)
    fail(ErrorKind::kInvalidArgument, "steps_to_execution: {} agents, at most {}",
         progress.steps_to_execution.size(), limit);
  std::set<std::string_view> seen;
  for (size_t i = 0; i < progress.running.size(); ++i) {
    const std::string field = fmt::format("running[{}]", i);
    check_agent_name(progress.running[i], field);
    if (!seen.insert(progress.running[i]).second)
      fail(ErrorKind::kInvalidArgument, "{}: agent \"{}\" listed twice", field, progress.running[i]);
  }
  for (const auto& [agent, steps] : progress.steps_to_execution) {
    const std::string field = fmt::format("steps_to_execution.{}", agent);
    check_agent_name(agent, "steps_to_execution");
    if (steps < 0 || steps > kMaxExplicitSteps)
      fail(ErrorKind::kInvalidArgument, "{}: {} is outside [0, {}]", field, steps, kMaxExplicitSteps);
  }
}

void check_workflow_hints(const WorkflowHints& hints) {
  if (!hints.workflow.empty()) check_workflow_id(hints.workflow, "workflow");
  if (!hints.agent.empty()) {
    if (hints.workflow.empty())
      throw Error(ErrorKind::kInvalidArgument, "agent: given without a workflow",
                  "agent names are scoped per workflow; add \"workflow\"");
    check_agent_name(hints.agent, "agent");
  }
  if (hints.fixed_prefix_tokens && *hints.fixed_prefix_tokens < 0)
    fail(ErrorKind::kInvalidArgument, "fixed_prefix_tokens: {} is negative", *hints.fixed_prefix_tokens);
}

}  // namespace loom
