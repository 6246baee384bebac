// libFuzzer target: the workflow API's bodies (server/workflow_request.h):
// each input as a PUT /v1/workflows/{id} step graph, a POST .../progress body
// and the workflow hints of a completions body; accepted graphs and progress
// go into a fresh WorkflowRegistry as the routes do.
#include <string_view>

#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "server/workflow_request.h"
#include "util/json_nesting.h"
#include "workflow/workflow_registry.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  loom::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  loom::fuzz::run_clean([&] { loom::check_json_nesting(body, "the body"); });
  if (loom::json_nesting_depth(body) > loom::kMaxJsonNesting) return 0;

  loom::WorkflowRegistry registry;
  loom::fuzz::run_clean([&] {
    const loom::WorkflowSpec spec = loom::server::parse_workflow_spec(body);
    registry.declare("w1", spec);
  });
  loom::fuzz::run_clean([&] {
    const loom::WorkflowProgress progress = loom::server::parse_workflow_progress(body);
    registry.post_progress("w1", progress);
    registry.post_progress("w2", progress);
  });
  loom::fuzz::run_clean([&] {
    const nlohmann::json json = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!json.is_object()) return;
    const loom::WorkflowHints hints = loom::server::parse_workflow_hints(json);
    if (hints.has_agent()) registry.note_request(hints.workflow, hints.agent);
  });
  const auto snapshot = registry.snapshot();
  (void)snapshot->agents_with_steps(0, 8);
  return 0;
}
