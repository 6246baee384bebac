#include "server/workflow_hint_aliases.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "util/error.h"

namespace loom::server {
namespace {

using Json = nlohmann::json;

constexpr const char* kLoomActionType = "loom.workflow";
constexpr const char* kLoomActionVersion = "1.0";
constexpr const char* kProtocolVersion = "0.1";

const Json* member(const Json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

const Json& required(const Json& object, const char* key, const std::string& where) {
  const Json* value = member(object, key);
  if (!value) fail(ErrorKind::kInvalidArgument, "{}.{}: required", where, key);
  return *value;
}

std::string required_string(const Json& object, const char* key, const std::string& where) {
  const Json& value = required(object, key, where);
  if (!value.is_string()) fail(ErrorKind::kInvalidArgument, "{}.{}: expected a string", where, key);
  return value.get<std::string>();
}

void collect_agent_hints(const Json& hints, HintSources& sources) {
  if (!hints.is_object()) fail(ErrorKind::kInvalidArgument, "agent_hints: expected an object");
  if (const Json* workflow = member(hints, "workflow_id")) sources.workflow.push_back({workflow, "agent_hints.workflow_id"});
  if (const Json* agent = member(hints, "agent_id")) sources.agent.push_back({agent, "agent_hints.agent_id"});
}

void collect_loom_action(const Json& payload, const std::string& where, HintSources& sources) {
  for (const auto& [key, value] : payload.items()) {
    const std::string field = fmt::format("{}.{}", where, key);
    if (value.is_null()) continue;
    if (key == "workflow") sources.workflow.push_back({&value, field});
    else if (key == "agent") sources.agent.push_back({&value, field});
    else if (key == "fixed_prefix_tokens") sources.fixed_prefix_tokens.push_back({&value, field});
    else fail(ErrorKind::kInvalidArgument, "{}: unknown field", field);
  }
}

void collect_kv_hints(const Json& envelope, HintSources& sources) {
  if (!envelope.is_object()) fail(ErrorKind::kInvalidArgument, "kv_hints: expected an object");
  const std::string protocol = required_string(envelope, "protocol_version", "kv_hints");
  required_string(envelope, "message_id", "kv_hints");
  const Json& actions = required(envelope, "actions", "kv_hints");
  if (!actions.is_array()) fail(ErrorKind::kInvalidArgument, "kv_hints.actions: expected an array");
  bool seen_loom_action = false;
  for (size_t i = 0; i < actions.size(); ++i) {
    const std::string where = fmt::format("kv_hints.actions[{}]", i);
    const Json& action = actions[i];
    if (!action.is_object()) fail(ErrorKind::kInvalidArgument, "{}: expected an object", where);
    required_string(action, "action_id", where);
    const std::string type = required_string(action, "action_type", where);
    const std::string version = required_string(action, "action_version", where);
    const Json& payload = required(action, "payload", where);
    if (!payload.is_object()) fail(ErrorKind::kInvalidArgument, "{}.payload: expected an object", where);
    if (type != kLoomActionType) continue;
    if (protocol != kProtocolVersion)
      fail(ErrorKind::kInvalidArgument, "kv_hints.protocol_version: \"{}\"; {} is read under \"{}\"", protocol,
           kLoomActionType, kProtocolVersion);
    if (version != kLoomActionVersion)
      fail(ErrorKind::kInvalidArgument, "{}.action_version: \"{}\"; {} has version \"{}\"", where, version,
           kLoomActionType, kLoomActionVersion);
    if (seen_loom_action) fail(ErrorKind::kInvalidArgument, "{}: a second {} action", where, kLoomActionType);
    seen_loom_action = true;
    collect_loom_action(payload, where + ".payload", sources);
  }
}

}  // namespace

void collect_hint_aliases(const Json& body, HintSources& sources) {
  if (const Json* hints = member(body, "agent_hints")) collect_agent_hints(*hints, sources);
  if (const Json* envelope = member(body, "kv_hints")) collect_kv_hints(*envelope, sources);
}

}  // namespace loom::server
