// JSON bodies of the workflow API into native types; every error names its field.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/workflow_request.h"
#include "util/error.h"

namespace loom::server {
namespace {

using Json = nlohmann::json;

// The message of the Error(kInvalidArgument) that `parse` throws.
std::string error_of(const std::function<void()>& parse) {
  try {
    parse();
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kInvalidArgument);
    return error.message();
  }
  ADD_FAILURE() << "no error";
  return {};
}

std::string spec_error(const std::string& body) {
  return error_of([&] { parse_workflow_spec(body); });
}
std::string progress_error(const std::string& body) {
  return error_of([&] { parse_workflow_progress(body); });
}
std::string hints_error(const Json& body) {
  return error_of([&] { parse_workflow_hints(body); });
}

TEST(WorkflowRequestTest, ParsesTheIssueExampleGraph) {
  const WorkflowSpec spec = parse_workflow_spec(R"({"agents": [
      {"name": "planner", "after": ["reviewer"]},
      {"name": "expresser", "after": ["executor1", "executor2"], "join": "all"},
      {"name": "reviewer", "after": ["expresser"], "join": "any"},
      {"name": "executor1", "after": null},
      {"name": "executor2", "join": null}]})");
  ASSERT_EQ(spec.agents.size(), 5u);
  EXPECT_EQ(spec.agents[0].name, "planner");
  EXPECT_EQ(spec.agents[0].after, (std::vector<std::string>{"reviewer"}));
  EXPECT_EQ(spec.agents[0].join, JoinKind::kAll);
  EXPECT_EQ(spec.agents[1].after, (std::vector<std::string>{"executor1", "executor2"}));
  EXPECT_EQ(spec.agents[1].join, JoinKind::kAll);
  EXPECT_EQ(spec.agents[2].join, JoinKind::kAny);
  EXPECT_TRUE(spec.agents[3].after.empty());
  EXPECT_EQ(spec.agents[4].join, JoinKind::kAll);
  EXPECT_TRUE(parse_workflow_spec(R"({"agents": []})").agents.empty());
}

TEST(WorkflowRequestTest, RejectsBadGraphBodiesNamingTheField) {
  EXPECT_TRUE(spec_error("{").starts_with("body: invalid JSON"));
  EXPECT_EQ(spec_error("[]"), "body: expected a JSON object");
  EXPECT_EQ(spec_error("{}"), "agents: required");
  EXPECT_EQ(spec_error(R"({"agents": {}})"), "agents: expected an array");
  EXPECT_EQ(spec_error(R"({"agents": [], "extra": 1})"), "extra: unknown field");
  EXPECT_EQ(spec_error(R"({"agents": [7]})"), "agents[0]: expected an object");
  EXPECT_EQ(spec_error(R"({"agents": [{"after": []}]})"), "agents[0].name: required");
  EXPECT_EQ(spec_error(R"({"agents": [{"name": ""}]})"), "agents[0].name: agent name is empty");
  EXPECT_EQ(spec_error(R"({"agents": [{"name": 3}]})"), "agents[0].name: expected a string");
  EXPECT_EQ(spec_error(R"({"agents": [{"name": "a"}, {"name": "b", "aftr": ["a"]}]})"),
            "agents[1].aftr: unknown field");
  EXPECT_EQ(spec_error(R"({"agents": [{"name": "a", "after": "b"}]})"),
            "agents[0].after: expected an array of agent names");
  EXPECT_EQ(spec_error(R"({"agents": [{"name": "a", "after": ["b", 1]}]})"), "agents[0].after[1]: expected a string");
  EXPECT_EQ(spec_error(R"({"agents": [{"name": "a", "after": ["b", "b"]}]})"),
            "agents[0].after[1]: \"b\" is listed twice");
  EXPECT_EQ(spec_error(R"({"agents": [{"name": "a", "join": "some"}]})"),
            "agents[0].join: expected \"all\" or \"any\", got \"some\"");
  Json too_many = {{"agents", Json::array()}};
  for (int32_t i = 0; i <= kMaxAgentsPerWorkflow; ++i) too_many["agents"].push_back({{"name", std::to_string(i)}});
  EXPECT_EQ(spec_error(too_many.dump()), "agents: 257 agents, at most 256");
}

TEST(WorkflowRequestTest, ParsesProgress) {
  const WorkflowProgress progress =
      parse_workflow_progress(R"({"running": ["executor1", "executor2"], "steps_to_execution": {"reviewer": 2, "planner": 3.0}})");
  EXPECT_EQ(progress.running, (std::vector<std::string>{"executor1", "executor2"}));
  EXPECT_EQ(progress.steps_to_execution, (std::map<std::string, int32_t, std::less<>>{{"planner", 3}, {"reviewer", 2}}));
  const WorkflowProgress empty = parse_workflow_progress(R"({"running": null})");
  EXPECT_TRUE(empty.running.empty());
  EXPECT_TRUE(empty.steps_to_execution.empty());
}

TEST(WorkflowRequestTest, RejectsBadProgressNamingTheField) {
  EXPECT_EQ(progress_error(R"({"runing": []})"), "runing: unknown field");
  EXPECT_EQ(progress_error(R"({"running": "a"})"), "running: expected an array of agent names");
  EXPECT_EQ(progress_error(R"({"running": ["a", 2]})"), "running[1]: expected a string");
  EXPECT_EQ(progress_error(R"({"running": ["a", "a"]})"), "running[1]: agent \"a\" listed twice");
  EXPECT_EQ(progress_error(R"({"running": [""]})"), "running[0]: agent name is empty");
  EXPECT_EQ(progress_error(R"({"steps_to_execution": [1]})"),
            "steps_to_execution: expected an object of agent name -> steps");
  EXPECT_EQ(progress_error(R"({"steps_to_execution": {"a": -1}})"), "steps_to_execution.a: -1 is outside [0, 1000000]");
  EXPECT_EQ(progress_error(R"({"steps_to_execution": {"a": 1000001}})"),
            "steps_to_execution.a: 1000001 is outside [0, 1000000]");
  EXPECT_EQ(progress_error(R"({"steps_to_execution": {"a": 1.5}})"), "steps_to_execution.a: expected an integer");
  EXPECT_EQ(progress_error(R"({"steps_to_execution": {"a": "1"}})"), "steps_to_execution.a: expected an integer");
  EXPECT_EQ(progress_error(R"({"steps_to_execution": {"a": true}})"), "steps_to_execution.a: expected an integer");
  EXPECT_EQ(progress_error(R"({"steps_to_execution": {"": 1}})"), "steps_to_execution: agent name is empty");
}

TEST(WorkflowRequestTest, ReadsRequestHints) {
  const WorkflowHints hints = parse_workflow_hints(
      Json{{"model", "m"}, {"prompt", "x"}, {"workflow", "wf-1"}, {"agent", "planner"}, {"fixed_prefix_tokens", 812}});
  EXPECT_EQ(hints.workflow, "wf-1");
  EXPECT_EQ(hints.agent, "planner");
  EXPECT_EQ(hints.fixed_prefix_tokens, 812);
  EXPECT_TRUE(hints.has_agent());
  const WorkflowHints none = parse_workflow_hints(Json{{"model", "m"}, {"workflow", nullptr}});
  EXPECT_TRUE(none.workflow.empty());
  EXPECT_FALSE(none.has_agent());
  EXPECT_EQ(none.fixed_prefix_tokens, std::nullopt);
  const WorkflowHints workflow_only = parse_workflow_hints(Json{{"workflow", "w"}, {"fixed_prefix_tokens", 0}});
  EXPECT_EQ(workflow_only.workflow, "w");
  EXPECT_FALSE(workflow_only.has_agent());
  EXPECT_EQ(workflow_only.fixed_prefix_tokens, 0);
}

TEST(WorkflowRequestTest, RejectsBadHintsNamingTheField) {
  EXPECT_EQ(hints_error(Json{{"workflow", 5}}), "workflow: expected a string");
  EXPECT_EQ(hints_error(Json{{"workflow", ""}}), "workflow: workflow id is empty");
  EXPECT_EQ(hints_error(Json{{"workflow", "a b"}}), "workflow: invalid workflow id \"a b\"");
  EXPECT_EQ(hints_error(Json{{"workflow", "w"}, {"agent", ""}}), "agent: agent name is empty");
  EXPECT_EQ(hints_error(Json{{"agent", "planner"}}), "agent: given without a workflow");
  EXPECT_EQ(hints_error(Json{{"workflow", "w"}, {"fixed_prefix_tokens", -3}}),
            "fixed_prefix_tokens: -3 is outside [0, 2147483647]");
  EXPECT_EQ(hints_error(Json{{"workflow", "w"}, {"fixed_prefix_tokens", "12"}}), "fixed_prefix_tokens: expected an integer");
}

// A kv_hints envelope (vLLM's protocol 0.1) whose one action is `action`.
Json kv_hints(const Json& action) {
  return Json{{"protocol_version", "0.1"}, {"message_id", "m-1"}, {"actions", Json::array({action})}};
}
Json loom_action(const Json& payload) {
  return Json{{"action_id", "a-1"}, {"action_type", "loom.workflow"}, {"action_version", "1.0"}, {"payload", payload}};
}

TEST(WorkflowRequestTest, ReadsSglangAgentHintsAndVllmKvHintsAsAliases) {
  const WorkflowHints sglang = parse_workflow_hints(Json{
      {"agent_hints", {{"workflow_id", "wf-1"}, {"agent_id", "planner"}, {"step_id", "s3"}, {"cache_ttl_ms", 5000}}}});
  EXPECT_EQ(sglang.workflow, "wf-1");
  EXPECT_EQ(sglang.agent, "planner");
  EXPECT_EQ(sglang.fixed_prefix_tokens, std::nullopt);

  const Json other_action = {{"action_id", "retain"}, {"action_type", "vllm.set_priority"}, {"action_version", "1.0"},
                             {"payload", {{"target", "request_cached"}, {"value", 10}}}};
  Json envelope = kv_hints(loom_action({{"workflow", "wf-2"}, {"agent", "coder"}, {"fixed_prefix_tokens", 64}}));
  envelope["actions"].insert(envelope["actions"].begin(), other_action);
  const WorkflowHints vllm = parse_workflow_hints(Json{{"kv_hints", envelope}});
  EXPECT_EQ(vllm.workflow, "wf-2");
  EXPECT_EQ(vllm.agent, "coder");
  EXPECT_EQ(vllm.fixed_prefix_tokens, 64);

  // Actions for others only, and another protocol version for them: nothing for Loom.
  Json foreign = kv_hints(other_action);
  foreign["protocol_version"] = "0.2";
  EXPECT_TRUE(parse_workflow_hints(Json{{"kv_hints", foreign}}).workflow.empty());

  // Every spelling at once, agreeing.
  const WorkflowHints all = parse_workflow_hints(
      Json{{"workflow", "w"}, {"agent", "a"}, {"agent_hints", {{"workflow_id", "w"}, {"agent_id", "a"}}},
           {"kv_hints", kv_hints(loom_action({{"workflow", "w"}, {"fixed_prefix_tokens", 3}}))}});
  EXPECT_EQ(all.workflow, "w");
  EXPECT_EQ(all.agent, "a");
  EXPECT_EQ(all.fixed_prefix_tokens, 3);
}

TEST(WorkflowRequestTest, RejectsBadAliasesNamingTheField) {
  EXPECT_EQ(hints_error(Json{{"agent_hints", "w"}}), "agent_hints: expected an object");
  EXPECT_EQ(hints_error(Json{{"agent_hints", {{"workflow_id", 7}}}}), "agent_hints.workflow_id: expected a string");
  EXPECT_EQ(hints_error(Json{{"agent_hints", {{"workflow_id", "a b"}}}}),
            "agent_hints.workflow_id: invalid workflow id \"a b\"");
  EXPECT_EQ(hints_error(Json{{"agent_hints", {{"agent_id", "planner"}}}}),
            "agent_hints.agent_id: given without a workflow");
  EXPECT_EQ(hints_error(Json{{"workflow", "w1"}, {"agent_hints", {{"workflow_id", "w2"}}}}),
            "agent_hints.workflow_id: \"w2\" differs from workflow (\"w1\")");

  EXPECT_EQ(hints_error(Json{{"kv_hints", Json::array()}}), "kv_hints: expected an object");
  EXPECT_EQ(hints_error(Json{{"kv_hints", {{"message_id", "m"}, {"actions", Json::array()}}}}),
            "kv_hints.protocol_version: required");
  Json no_payload = kv_hints({{"action_id", "x"}, {"action_type", "vllm.set_priority"}, {"action_version", "1.0"}});
  EXPECT_EQ(hints_error(Json{{"kv_hints", no_payload}}), "kv_hints.actions[0].payload: required");
  Json old_version = kv_hints(loom_action({{"workflow", "w"}}));
  old_version["actions"][0]["action_version"] = "0.9";
  EXPECT_EQ(hints_error(Json{{"kv_hints", old_version}}),
            "kv_hints.actions[0].action_version: \"0.9\"; loom.workflow has version \"1.0\"");
  Json new_protocol = kv_hints(loom_action({{"workflow", "w"}}));
  new_protocol["protocol_version"] = "0.2";
  EXPECT_EQ(hints_error(Json{{"kv_hints", new_protocol}}),
            "kv_hints.protocol_version: \"0.2\"; loom.workflow is read under \"0.1\"");
  EXPECT_EQ(hints_error(Json{{"kv_hints", kv_hints(loom_action({{"workflw", "w"}}))}}),
            "kv_hints.actions[0].payload.workflw: unknown field");
  EXPECT_EQ(hints_error(Json{{"kv_hints", kv_hints(loom_action({{"workflow", "w"}, {"fixed_prefix_tokens", -1}}))}}),
            "kv_hints.actions[0].payload.fixed_prefix_tokens: -1 is outside [0, 2147483647]");
  EXPECT_EQ(hints_error(Json{{"fixed_prefix_tokens", 4},
                             {"kv_hints", kv_hints(loom_action({{"workflow", "w"}, {"fixed_prefix_tokens", 5}}))}}),
            "kv_hints.actions[0].payload.fixed_prefix_tokens: 5 differs from fixed_prefix_tokens (4)");
}

// Bodies nlohmann rejects: the failure names the field it hit and no raw body
// bytes reach the message. A number beyond double's range used to
// escape as a non-loom exception (a 500).
TEST(WorkflowRequestTest, MalformedJsonNamesTheFieldWithoutRawBytes) {
  const std::string bad_name = spec_error("{\"agents\": [{\"name\": \"a\xff\"}]}");
  EXPECT_TRUE(bad_name.starts_with("agents[0].name: invalid JSON")) << bad_name;
  EXPECT_EQ(bad_name.find('\xff'), std::string::npos);
  EXPECT_TRUE(spec_error(R"({"agents": [{"name": "a", "after": ["b", "\ud800"]}]})").starts_with("agents[0].after[1]: "));
  EXPECT_TRUE(spec_error("{\"agents\": [], \"\xc3\": 1}").starts_with("body: invalid JSON"));  // a bad key
  EXPECT_TRUE(progress_error(R"({"steps_to_execution": {"a": 1e999}})").starts_with("steps_to_execution.a: "));
  EXPECT_TRUE(progress_error(R"({"steps_to_execution": {"a": -1e999}})").starts_with("steps_to_execution.a: "));
  EXPECT_TRUE(progress_error("{\"running\": [\"a\", \"\xed\xa0\x80\"]}").starts_with("running[1]: "));
  EXPECT_EQ(progress_error(R"({"steps_to_execution": {"a": 1e30}})"),
            "steps_to_execution.a: 1e+30 is outside [0, 1000000]");
  EXPECT_EQ(progress_error(R"({"steps_to_execution": {"a": 18446744073709551615}})"),
            "steps_to_execution.a: 18446744073709551615 is outside [0, 1000000]");
  // Nesting deeper than the guard's limit never reaches the parser.
  const std::string deep = "{\"agents\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  const std::string nested = spec_error(deep);
  EXPECT_TRUE(nested.starts_with("body: ")) << nested;
  EXPECT_NE(nested.find("deeper than 64"), std::string::npos) << nested;
}

TEST(WorkflowRequestTest, AgentCapFromTheRegistry) {
  EXPECT_EQ(error_of([] { parse_workflow_spec(R"({"agents": [{"name": "a"}, {"name": "b"}, {"name": "c"}]})", 2); }),
            "agents: 3 agents, at most 2");
  EXPECT_EQ(error_of([] { parse_workflow_spec(R"({"agents": [{"name": "a", "after": ["b", "c", "d"]}]})", 2); }),
            "agents[0].after: 3 predecessors, at most 2");
  EXPECT_EQ(error_of([] { parse_workflow_progress(R"({"running": ["a", "b", "c"]})", 2); }),
            "running: 3 agents, at most 2");
  EXPECT_EQ(error_of([] { parse_workflow_progress(R"({"steps_to_execution": {"a": 1, "b": 1, "c": 1}})", 2); }),
            "steps_to_execution: 3 agents, at most 2");
  EXPECT_EQ(parse_workflow_spec(R"({"agents": [{"name": "a"}, {"name": "b"}]})", 2).agents.size(), 2u);
}

}  // namespace
}  // namespace loom::server
