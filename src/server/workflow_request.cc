#include "server/workflow_request.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "util/error.h"

namespace loom::server {
namespace {

using Json = nlohmann::json;

Json parse_object(std::string_view body) {
  Json json;
  try {
    json = Json::parse(body);
  } catch (const Json::parse_error& error) {
    fail(ErrorKind::kInvalidArgument, "body: invalid JSON ({})", error.what());
  }
  if (!json.is_object()) fail(ErrorKind::kInvalidArgument, "body: expected a JSON object");
  return json;
}

bool has(const Json& object, const char* key) { return object.contains(key) && !object[key].is_null(); }

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

// An integer in [min, max]; a whole float (3.0) counts.
int64_t read_integer(const Json& value, std::string_view field, int64_t min, int64_t max) {
  int64_t number = 0;
  if (value.is_number_integer()) {
    number = value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                 ? INT64_MAX
                 : value.get<int64_t>();
  } else if (value.is_number_float() && std::isfinite(value.get<double>()) &&
             value.get<double>() == std::trunc(value.get<double>()) && std::fabs(value.get<double>()) < 9.0e18) {
    number = static_cast<int64_t>(value.get<double>());
  } else {
    fail(ErrorKind::kInvalidArgument, "{}: expected an integer", field);
  }
  if (number < min || number > max)
    fail(ErrorKind::kInvalidArgument, "{}: {} is outside [{}, {}]", field, number, min, max);
  return number;
}

JoinKind read_join(const Json& value, std::string_view field) {
  const std::string join = read_string(value, field);
  if (join == "all") return JoinKind::kAll;
  if (join == "any") return JoinKind::kAny;
  fail(ErrorKind::kInvalidArgument, "{}: expected \"all\" or \"any\", got \"{}\"", field, join);
}

AgentSpec read_agent(const Json& object, size_t index) {
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

WorkflowSpec parse_workflow_spec(std::string_view body) {
  const Json json = parse_object(body);
  reject_unknown_fields(json, {"agents"}, "");
  if (!has(json, "agents")) fail(ErrorKind::kInvalidArgument, "agents: required");
  const Json& agents = json["agents"];
  if (!agents.is_array()) fail(ErrorKind::kInvalidArgument, "agents: expected an array");
  if (agents.size() > static_cast<size_t>(kMaxAgentsPerWorkflow))
    fail(ErrorKind::kInvalidArgument, "agents: {} agents, at most {}", agents.size(), kMaxAgentsPerWorkflow);
  WorkflowSpec spec;
  for (size_t i = 0; i < agents.size(); ++i) spec.agents.push_back(read_agent(agents[i], i));
  return spec;
}

WorkflowProgress parse_workflow_progress(std::string_view body) {
  const Json json = parse_object(body);
  reject_unknown_fields(json, {"running", "steps_to_execution"}, "");
  WorkflowProgress progress;
  if (has(json, "running")) {
    const Json& running = json["running"];
    if (!running.is_array()) fail(ErrorKind::kInvalidArgument, "running: expected an array of agent names");
    if (running.size() > static_cast<size_t>(kMaxAgentsPerWorkflow))
      fail(ErrorKind::kInvalidArgument, "running: {} agents, at most {}", running.size(), kMaxAgentsPerWorkflow);
    for (size_t i = 0; i < running.size(); ++i)
      progress.running.push_back(read_string(running[i], fmt::format("running[{}]", i)));
  }
  if (has(json, "steps_to_execution")) {
    const Json& steps = json["steps_to_execution"];
    if (!steps.is_object())
      fail(ErrorKind::kInvalidArgument, "steps_to_execution: expected an object of agent name -> steps");
    if (steps.size() > static_cast<size_t>(kMaxAgentsPerWorkflow))
      fail(ErrorKind::kInvalidArgument, "steps_to_execution: {} agents, at most {}", steps.size(),
           kMaxAgentsPerWorkflow);
    for (const auto& [agent, value] : steps.items()) {
      check_agent_name(agent, "steps_to_execution");
      const std::string field = fmt::format("steps_to_execution.{}", agent);
      progress.steps_to_execution[agent] = static_cast<int32_t>(read_integer(value, field, 0, kMaxExplicitSteps));
    }
  }
  check_workflow_progress(progress);
  return progress;
}

WorkflowHints parse_workflow_hints(const nlohmann::json& request_body) {
  WorkflowHints hints;
  if (!request_body.is_object()) return hints;
  if (has(request_body, "workflow")) {
    hints.workflow = read_string(request_body["workflow"], "workflow");
    check_workflow_id(hints.workflow, "workflow");
  }
  if (has(request_body, "agent")) {
    hints.agent = read_string(request_body["agent"], "agent");
    check_agent_name(hints.agent, "agent");
  }
  if (has(request_body, "fixed_prefix_tokens"))
    hints.fixed_prefix_tokens =
        static_cast<int32_t>(read_integer(request_body["fixed_prefix_tokens"], "fixed_prefix_tokens", 0, INT32_MAX));
  check_workflow_hints(hints);
  return hints;
}

}  // namespace loom::server
