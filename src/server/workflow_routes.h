// The workflow API's routes (KVFlow; docs/design.md §2) on top of the
// engine's WorkflowRegistry. http_server.cc maps them:
//
//   PUT    /v1/workflows/{id}           put_workflow       declare or replace the step graph
//   POST   /v1/workflows/{id}/progress  post_workflow_progress  who runs now (+ explicit steps)
//   GET    /v1/workflows/{id}           get_workflow       current steps
//   DELETE /v1/workflows/{id}           delete_workflow    end it
//   GET    /v1/workflows                list_workflows     {"object": "list", "data": [every known workflow's state]}
//
// PUT, POST and GET answer 200 with the workflow's state:
//   {"id": "w1", "object": "workflow", "has_graph": true, "follows_requests": false,
//    "running": ["executor"], "steps_to_execution": {"executor": 0, "expresser": 1, "lonely": null}}
// (null: kStepsFar, nothing running leads to the agent). DELETE answers
//   {"id": "w1", "object": "workflow.deleted", "deleted": true}.
// Unknown workflows (never seen, ended, expired after the TTL) get 404 on
// POST progress, GET and DELETE; PUT creates. Bad ids and bodies get 400 with
// `param` naming the field.
//
// Runs on HTTP worker threads; the registry is thread-safe. Every function
// returns the JSON body of a 200 and throws ApiError otherwise.
#pragma once

#include <string>
#include <string_view>

#include "engine/engine.h"
#include "server/api_error.h"

namespace loom::server {

std::string put_workflow(Engine& engine, std::string_view id, std::string_view body);
std::string post_workflow_progress(Engine& engine, std::string_view id, std::string_view body);
std::string get_workflow(Engine& engine, std::string_view id);
std::string delete_workflow(Engine& engine, std::string_view id);
std::string list_workflows(Engine& engine);

// A loom::Error from parsing or validating workflow fields as an ApiError
// (kInvalidArgument -> 400 with `param` = the field its message starts with,
// e.g. "agents[1].join"; other kinds as api_error_from).
ApiError workflow_api_error(const Error& error);

}  // namespace loom::server
