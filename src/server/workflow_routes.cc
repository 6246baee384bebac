#include "server/workflow_routes.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "server/json_output.h"
#include "server/workflow_request.h"

namespace loom::server {
namespace {

using Json = nlohmann::json;

WorkflowRegistry& registry_of(Engine& engine) {
  try {
    return engine.workflows();
  } catch (const Error& error) {
    throw ApiError(501, error.what(), "invalid_request_error", "", "not_implemented");
  }
}

std::string checked_id(std::string_view id) {
  if (!is_valid_workflow_id(id))
    throw ApiError(400,
                   fmt::format("workflow id \"{}\" must be 1..{} characters of [A-Za-z0-9._:-]", id,
                               kMaxWorkflowNameBytes),
                   "invalid_request_error", "id");
  return std::string(id);
}

ApiError unknown_workflow(std::string_view id) {
  return ApiError(404,
                  fmt::format("workflow '{}' is unknown (never declared or used, deleted, or expired after the TTL)", id),
                  "invalid_request_error", "id", "not_found");
}

Json steps_json(const std::string& id, const WorkflowSteps& steps) {
  Json by_agent = Json::object();
  for (const auto& [agent, value] : steps.steps_by_agent)
    by_agent[agent] = value == kStepsFar ? Json(nullptr) : Json(value);
  return Json{{"id", id},
              {"object", "workflow"},
              {"has_graph", steps.has_graph},
              {"follows_requests", steps.follows_requests},
              {"running", steps.running},
              {"steps_to_execution", by_agent}};
}

std::string current_state(WorkflowRegistry& registry, const std::string& id) {
  const std::shared_ptr<const WorkflowSnapshot> snapshot = registry.snapshot();
  const WorkflowSteps* steps = snapshot->workflow(id);
  if (!steps) throw unknown_workflow(id);
  return dump_json(steps_json(id, *steps));
}

}  // namespace

ApiError workflow_api_error(const Error& error) {
  // A new workflow over --max-workflows: 503 with its own code; nothing changed.
  if (error.kind() == ErrorKind::kCapacity)
    return ApiError(503, error.what(), "server_error", "", "too_many_workflows");
  if (error.kind() != ErrorKind::kInvalidArgument) return api_error_from(error);
  const std::string message = error.what();
  const size_t colon = message.find(':');
  std::string param;
  // The field is the message's first word when it is followed by ':' ("agents[1].join: ...").
  if (colon != std::string::npos && colon > 0 && message.find(' ') > colon) param = message.substr(0, colon);
  if (param == "body") param.clear();
  return ApiError(400, message, "invalid_request_error", param);
}

std::string put_workflow(Engine& engine, std::string_view id_text, std::string_view body) {
  WorkflowRegistry& registry = registry_of(engine);
  const std::string id = checked_id(id_text);
  try {
    registry.declare(id, parse_workflow_spec(body, registry.max_agents_per_workflow()));
  } catch (const Error& error) {
    throw workflow_api_error(error);
  }
  return current_state(registry, id);
}

std::string post_workflow_progress(Engine& engine, std::string_view id_text, std::string_view body) {
  WorkflowRegistry& registry = registry_of(engine);
  const std::string id = checked_id(id_text);
  WorkflowProgress progress;
  try {
    progress = parse_workflow_progress(body, registry.max_agents_per_workflow());
  } catch (const Error& error) {
    throw workflow_api_error(error);
  }
  // Progress for a workflow nobody declared or used is most likely a typo in
  // the id: say so instead of starting a new workflow.
  registry.expire_unseen();
  if (!registry.snapshot()->workflow(id)) throw unknown_workflow(id);
  try {
    registry.post_progress(id, progress);
  } catch (const Error& error) {
    throw workflow_api_error(error);
  }
  return current_state(registry, id);
}

std::string get_workflow(Engine& engine, std::string_view id_text) {
  WorkflowRegistry& registry = registry_of(engine);
  const std::string id = checked_id(id_text);
  registry.expire_unseen();
  return current_state(registry, id);
}

std::string list_workflows(Engine& engine) {
  WorkflowRegistry& registry = registry_of(engine);
  registry.expire_unseen();
  const std::shared_ptr<const WorkflowSnapshot> snapshot = registry.snapshot();
  Json data = Json::array();
  for (const std::string& id : snapshot->workflow_ids()) data.push_back(steps_json(id, *snapshot->workflow(id)));
  return dump_json(Json{{"object", "list"}, {"data", data}});
}

std::string delete_workflow(Engine& engine, std::string_view id_text) {
  WorkflowRegistry& registry = registry_of(engine);
  const std::string id = checked_id(id_text);
  registry.expire_unseen();
  if (!registry.end(id)) throw unknown_workflow(id);
  return dump_json(Json{{"id", id}, {"object", "workflow.deleted"}, {"deleted", true}});
}

}  // namespace loom::server
