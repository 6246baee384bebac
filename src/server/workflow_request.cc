#include "server/workflow_request.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "server/json_input.h"
#include "server/json_output.h"
#include "server/workflow_hint_aliases.h"
#include "util/error.h"

namespace loom::server {
namespace {

using Json = nlohmann::json;

// Nesting guard, then a parse that names the field a failure hit
// (server/json_input.h): invalid UTF-8, 1e999, bad syntax.
Json parse_object(std::string_view body) {
  JsonSyntaxError error;
  std::optional<Json> json = parse_json_text(body, error);
  if (!json) fail(ErrorKind::kInvalidArgument, "{}: {}", error.field.empty() ? "body" : error.field, error.message);
  if (!json->is_object()) fail(ErrorKind::kInvalidArgument, "body: expected a JSON object");
  return std::move(*json);
}

bool has(const Json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && !it->is_null();
}

void reject_unknown_fields(const Json& object, std::initializer_list<std::string_view> known, std::string_view where) {
  for (const auto& [key, value] : object.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end())
      fail(ErrorKind::kInvalidArgument, "{}{}: unknown field", where, key);
  }
}

std::string read_string(const Json& value, std::string_view field) {
  if (!value.is_string()) fail(ErrorKind::kInvalidArgument, "{}: expected a string", field);
  return value.get<std::string>();
}

// An integer in [min, max]; a whole float (3.0) counts. Values beyond int64
// (18446744073709551615, 1e30) are reported as written, never cast.
int64_t read_integer(const Json& value, std::string_view field, int64_t min, int64_t max) {
  const auto outside = [&] {
    fail(ErrorKind::kInvalidArgument, "{}: {} is outside [{}, {}]", field, dump_json(value), min, max);
  };
  int64_t number = 0;
  if (value.is_number_unsigned()) {
    if (value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) outside();
    number = static_cast<int64_t>(value.get<uint64_t>());
  } else if (value.is_number_integer()) {
    number = value.get<int64_t>();
  } else if (value.is_number_float() && std::isfinite(value.get<double>()) &&
             value.get<double>() == std::trunc(value.get<double>())) {
    // [-2^63, 2^63) is int64's range: compare before casting.
    if (value.get<double>() < -0x1p63 || value.get<double>() >= 0x1p63) outside();
    number = static_cast<int64_t>(value.get<double>());
  } else {
    fail(ErrorKind::kInvalidArgument, "{}: expected an integer", field);
  }
  if (number < min || number > max) outside();
  return number;
}

JoinKind read_join(const Json& value, std::string_view field) {
  const std::string join = read_string(value, field);
  if (join == "all") return JoinKind::kAll;
  if (join == "any") return JoinKind::kAny;
  fail(ErrorKind::kInvalidArgument, "{}: expected \"all\" or \"any\", got \"{}\"", field, join);
}

AgentSpec read_agent(const Json& object, size_t index, int32_t max_agents) {
  const std::string where = fmt::format("agents[{}]", index);
  if (!object.is_object()) fail(ErrorKind::kInvalidArgument, "{}: expected an object", where);
  reject_unknown_fields(object, {"name", "after", "join"}, where + ".");
  AgentSpec agent;
  if (!has(object, "name")) fail(ErrorKind::kInvalidArgument, "{}.name: required", where);
  agent.name = read_string(object["name"], where + ".name");
  check_agent_name(agent.name, where + ".name");
  if (has(object, "after")) {
    const Json& after = object["after"];
    if (!after.is_array()) fail(ErrorKind::kInvalidArgument, "{}.after: expected an array of agent names", where);
    if (after.size() > static_cast<size_t>(max_agents))
      fail(ErrorKind::kInvalidArgument, "{}.after: {} predecessors, at most {}", where, after.size(), max_agents);
    std::set<std::string> seen;
    for (size_t j = 0; j < after.size(); ++j) {
      const std::string field = fmt::format("{}.after[{}]", where, j);
      std::string predecessor = read_string(after[j], field);
      check_agent_name(predecessor, field);
      if (!seen.insert(predecessor).second)
        fail(ErrorKind::kInvalidArgument, "{}: \"{}\" is listed twice", field, predecessor);
      agent.after.push_back(std::move(predecessor));
    }
  }
  if (has(object, "join")) agent.join = read_join(object["join"], where + ".join");
  return agent;
}

}  // namespace

WorkflowSpec parse_workflow_spec(std::string_view body, int32_t max_agents) {
  const Json json = parse_object(body);
  reject_unknown_fields(json, {"agents"}, "");
  if (!has(json, "agents")) fail(ErrorKind::kInvalidArgument, "agents: required");
  const Json& agents = json["agents"];
  if (!agents.is_array()) fail(ErrorKind::kInvalidArgument, "agents: expected an array");
  if (agents.size() > static_cast<size_t>(max_agents))
    fail(ErrorKind::kInvalidArgument, "agents: {} agents, at most {}", agents.size(), max_agents);
  WorkflowSpec spec;
  for (size_t i = 0; i < agents.size(); ++i) spec.agents.push_back(read_agent(agents[i], i, max_agents));
  return spec;
}

WorkflowProgress parse_workflow_progress(std::string_view body, int32_t max_agents) {
  const Json json = parse_object(body);
  reject_unknown_fields(json, {"running", "steps_to_execution"}, "");
  WorkflowProgress progress;
  if (has(json, "running")) {
    const Json& running = json["running"];
    if (!running.is_array()) fail(ErrorKind::kInvalidArgument, "running: expected an array of agent names");
    if (running.size() > static_cast<size_t>(max_agents))
      fail(ErrorKind::kInvalidArgument, "running: {} agents, at most {}", running.size(), max_agents);
    for (size_t i = 0; i < running.size(); ++i)
      progress.running.push_back(read_string(running[i], fmt::format("running[{}]", i)));
  }
  if (has(json, "steps_to_execution")) {
    const Json& steps = json["steps_to_execution"];
    if (!steps.is_object())
      fail(ErrorKind::kInvalidArgument, "steps_to_execution: expected an object of agent name -> steps");
    if (steps.size() > static_cast<size_t>(max_agents))
      fail(ErrorKind::kInvalidArgument, "steps_to_execution: {} agents, at most {}", steps.size(), max_agents);
    for (const auto& [agent, value] : steps.items()) {
      check_agent_name(agent, "steps_to_execution");
      const std::string field = fmt::format("steps_to_execution.{}", agent);
      progress.steps_to_execution[agent] = static_cast<int32_t>(read_integer(value, field, 0, kMaxExplicitSteps));
    }
  }
  check_workflow_progress(progress, max_agents);
  return progress;
}

WorkflowHints parse_workflow_hints(const nlohmann::json& request_body) {
  WorkflowHints hints;
  if (!request_body.is_object()) return hints;
  HintSources sources;
  if (has(request_body, "workflow")) sources.workflow.push_back({&request_body["workflow"], "workflow"});
  if (has(request_body, "agent")) sources.agent.push_back({&request_body["agent"], "agent"});
  if (has(request_body, "fixed_prefix_tokens"))
    sources.fixed_prefix_tokens.push_back({&request_body["fixed_prefix_tokens"], "fixed_prefix_tokens"});
  collect_hint_aliases(request_body, sources);
  // Each value is checked under its own field; two fields that name one hint must agree.
  const auto agree = [](const std::vector<HintValue>& values) {
    for (const HintValue& value : values)
      if (*value.value != *values.front().value)
        fail(ErrorKind::kInvalidArgument, "{}: {} differs from {} ({})", value.field, dump_json(*value.value),
             values.front().field, dump_json(*values.front().value));
  };
  for (const HintValue& value : sources.workflow) {
    hints.workflow = read_string(*value.value, value.field);
    check_workflow_id(hints.workflow, value.field);
  }
  agree(sources.workflow);
  for (const HintValue& value : sources.agent) {
    hints.agent = read_string(*value.value, value.field);
    check_agent_name(hints.agent, value.field);
  }
  agree(sources.agent);
  if (!sources.agent.empty() && sources.workflow.empty())
    fail(ErrorKind::kInvalidArgument, "{}: given without a workflow", sources.agent.front().field);
  for (const HintValue& value : sources.fixed_prefix_tokens)
    hints.fixed_prefix_tokens = static_cast<int32_t>(read_integer(*value.value, value.field, 0, INT32_MAX));
  agree(sources.fixed_prefix_tokens);
  check_workflow_hints(hints);
  return hints;
}

}  // namespace loom::server
