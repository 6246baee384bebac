// Where other engines' request fields carry Loom's workflow hints
// (workflow_request.h's `workflow`, `agent`, `fixed_prefix_tokens`), so a
// framework that adopted theirs reaches Loom's workflow-aware KV:
//
//   SGLang's `agent_hints` (RFC sgl-project/sglang#24656, PR #24993, not merged):
//     {"agent_hints": {"workflow_id": "w1", "agent_id": "planner", "step_id": ..., ...}}
//     workflow_id -> workflow, agent_id -> agent; its other members are accepted
//     and not used (the proposal's list of fields is still moving).
//   vLLM's `kv_hints` envelope (vllm/v1/kv_hints/protocol.py, protocol "0.1";
//   SGLang proposes the same envelope):
//     {"kv_hints": {"protocol_version": "0.1", "message_id": "m1", "actions": [
//        {"action_id": "a1", "action_type": "loom.workflow", "action_version": "1.0",
//         "payload": {"workflow": "w1", "agent": "planner", "fixed_prefix_tokens": 812}}]}}
//     Actions of other types are checked for the envelope's shape and not used,
//     as vLLM leaves actions outside its own namespace to their owner.
//
// A malformed envelope, or a `loom.workflow` action that is not version "1.0"
// under protocol "0.1", throws Error(kInvalidArgument) whose message starts
// with the field ("kv_hints.actions[0].payload.agent: ..."). Pure functions;
// HTTP handler threads.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace loom::server {

// One value given for a hint and the field it was read from ("agent_hints.workflow_id").
struct HintValue {
  const nlohmann::json* value = nullptr;  // into the request body, which outlives it
  std::string field;
};

// Every value given for each hint, in the order: Loom's field, agent_hints, kv_hints.
struct HintSources {
  std::vector<HintValue> workflow, agent, fixed_prefix_tokens;
};

// Adds what `body`'s agent_hints and kv_hints give to `sources`.
void collect_hint_aliases(const nlohmann::json& body, HintSources& sources);

}  // namespace loom::server
