// JSON bodies of the workflow API into the native types of
// workflow/workflow_spec.h. Runs on HTTP worker threads; pure functions.
//
//   PUT  /v1/workflows/{id}           parse_workflow_spec
//        {"agents": [{"name": "planner", "after": ["reviewer"]},
//                    {"name": "expresser", "after": ["executor1", "executor2"], "join": "all"}]}
//   POST /v1/workflows/{id}/progress  parse_workflow_progress
//        {"running": ["executor1"], "steps_to_execution": {"reviewer": 2}}
//   completions / chat bodies         parse_workflow_hints
//        {..., "workflow": "w1", "agent": "planner", "fixed_prefix_tokens": 812}
//
// Conventions as in openai_request: an absent or null field takes its default;
// an integer may be written 3 or 3.0. The workflow bodies are our own API, so
// unknown fields there are errors (a typo such as "aftr" would otherwise drop
// edges silently). Every problem throws Error(kInvalidArgument) whose message
// starts with the offending field ("agents[1].join: ..."); the HTTP layer
// turns it into a 400 (api_error_from).
//
// Checked here: JSON nesting, syntax and UTF-8 (server/json_input.h), JSON
// shape, names (workflow_spec.h rules), number ranges, repeats within one
// list, list lengths against `max_agents` (the registry's
// max_agents_per_workflow: agents, each `after`, running, steps_to_execution).
// Checked by WorkflowRegistry::declare (through AgentStepGraph): duplicate
// agents, unknown predecessors, the total of declared and implicit agents.
#pragma once

#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "workflow/workflow_spec.h"

namespace loom::server {

WorkflowSpec parse_workflow_spec(std::string_view body, int32_t max_agents = kMaxAgentsPerWorkflow);
WorkflowProgress parse_workflow_progress(std::string_view body, int32_t max_agents = kMaxAgentsPerWorkflow);
// The workflow fields of an already parsed completions / chat body (an object);
// all absent gives empty hints.
WorkflowHints parse_workflow_hints(const nlohmann::json& request_body);

}  // namespace loom::server
