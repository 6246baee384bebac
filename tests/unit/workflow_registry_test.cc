// WorkflowRegistry: declare / progress / end / note_request, per-workflow agent
// scoping, TTL expiry on an injected clock, snapshots and versions.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "util/error.h"
#include "workflow/workflow_registry.h"

namespace loom {
namespace {

using namespace std::chrono_literals;
constexpr int32_t kFar = kStepsFar;

AgentSpec agent(std::string name, std::vector<std::string> after = {}, JoinKind join = JoinKind::kAll) {
  return AgentSpec{std::move(name), std::move(after), join};
}

WorkflowSpec fig1_cycle() {
  return {{agent("planner", {"reviewer"}), agent("executor", {"planner"}), agent("expresser", {"executor"}),
           agent("reviewer", {"expresser"})}};
}

WorkflowProgress progress(std::vector<std::string> running, std::map<std::string, int32_t, std::less<>> steps = {}) {
  WorkflowProgress result;
  result.running = std::move(running);
  result.steps_to_execution = std::move(steps);
  return result;
}

class WorkflowRegistryTest : public ::testing::Test {
 protected:
  WorkflowRegistryConfig config(int32_t max_workflows = 16) {
    WorkflowRegistryConfig config;
    config.ttl = 60s;
    config.max_workflows = max_workflows;
    config.clock = [this] { return now_; };
    return config;
  }
  // Every agent's steps in `workflow` (empty when unknown).
  static std::map<std::string, int32_t> steps(const WorkflowRegistry& registry, std::string_view workflow) {
    const WorkflowSteps* steps = registry.snapshot()->workflow(workflow);
    if (steps == nullptr) return {};
    return {steps->steps_by_agent.begin(), steps->steps_by_agent.end()};
  }
  static ErrorKind error_kind(const std::function<void()>& call) {
    try {
      call();
    } catch (const Error& error) {
      return error.kind();
    }
    ADD_FAILURE() << "no error";
    return ErrorKind::kInternal;
  }

  std::chrono::steady_clock::time_point now_{std::chrono::hours(1)};
};

TEST_F(WorkflowRegistryTest, RequestsMoveTheRunningAgentAroundTheCycle) {
  WorkflowRegistry registry(config());
  registry.declare("w1", fig1_cycle());
  EXPECT_EQ(steps(registry, "w1"), (std::map<std::string, int32_t>{
                                       {"planner", kFar}, {"executor", kFar}, {"expresser", kFar}, {"reviewer", kFar}}));
  EXPECT_TRUE(registry.note_request("w1", "executor"));
  EXPECT_EQ(steps(registry, "w1"),
            (std::map<std::string, int32_t>{{"planner", 3}, {"executor", 0}, {"expresser", 1}, {"reviewer", 2}}));
  // The expresser follows the executor: the executor is done.
  EXPECT_TRUE(registry.note_request("w1", "expresser"));
  EXPECT_EQ(registry.snapshot()->workflow("w1")->running, (std::vector<std::string>{"expresser"}));
  EXPECT_EQ(steps(registry, "w1"),
            (std::map<std::string, int32_t>{{"planner", 2}, {"executor", 3}, {"expresser", 0}, {"reviewer", 1}}));
  EXPECT_TRUE(registry.snapshot()->workflow("w1")->follows_requests);
  EXPECT_TRUE(registry.snapshot()->workflow("w1")->has_graph);
}

TEST_F(WorkflowRegistryTest, ParallelBranchesRunTogetherUntilTheirJoinArrives) {
  WorkflowRegistry registry(config());
  registry.declare("w", {{agent("planner", {"reviewer"}), agent("e1", {"planner"}), agent("e2", {"planner"}),
                          agent("expresser", {"e1", "e2"}), agent("reviewer", {"expresser"})}});
  registry.note_request("w", "planner");
  registry.note_request("w", "e1");
  registry.note_request("w", "e2");
  EXPECT_EQ(registry.snapshot()->workflow("w")->running, (std::vector<std::string>{"e1", "e2"}));
  EXPECT_EQ(steps(registry, "w"), (std::map<std::string, int32_t>{
                                      {"planner", 3}, {"e1", 0}, {"e2", 0}, {"expresser", 1}, {"reviewer", 2}}));
  const uint64_t version = registry.version();
  registry.note_request("w", "e1");  // e1 calls the model again: nothing moves
  EXPECT_EQ(registry.snapshot()->workflow("w")->running, (std::vector<std::string>{"e1", "e2"}));
  EXPECT_EQ(registry.version(), version);
  registry.note_request("w", "expresser");
  EXPECT_EQ(registry.snapshot()->workflow("w")->running, (std::vector<std::string>{"expresser"}));
  EXPECT_EQ(steps(registry, "w"), (std::map<std::string, int32_t>{
                                      {"planner", 2}, {"e1", 3}, {"e2", 3}, {"expresser", 0}, {"reviewer", 1}}));
}

TEST_F(WorkflowRegistryTest, WithoutAGraphTheLatestRequestsAgentRuns) {
  WorkflowRegistry registry(config());
  EXPECT_TRUE(registry.note_request("w", "a"));
  EXPECT_EQ(steps(registry, "w"), (std::map<std::string, int32_t>{{"a", 0}}));
  EXPECT_TRUE(registry.note_request("w", "b"));
  EXPECT_EQ(steps(registry, "w"), (std::map<std::string, int32_t>{{"b", 0}}));
  EXPECT_EQ(registry.snapshot()->steps_to_execution("w", "a"), std::nullopt);
  EXPECT_FALSE(registry.snapshot()->workflow("w")->has_graph);
  // An agent the graph does not declare leaves when the next request arrives.
  registry.declare("w", fig1_cycle());
  EXPECT_EQ(steps(registry, "w")["b"], 0);
  registry.note_request("w", "planner");
  EXPECT_EQ(registry.snapshot()->workflow("w")->running, (std::vector<std::string>{"planner"}));
  EXPECT_EQ(registry.snapshot()->steps_to_execution("w", "b"), std::nullopt);
  EXPECT_EQ(registry.snapshot()->steps_to_execution("w", "reviewer"), 3);
}

TEST_F(WorkflowRegistryTest, PostedProgressStandsUntilTheNextPost) {
  WorkflowRegistry registry(config());
  registry.declare("w", fig1_cycle());
  registry.note_request("w", "planner");
  registry.post_progress("w", progress({"reviewer"}, {{"executor", 5}, {"outsider", 7}}));
  const std::map<std::string, int32_t> posted{
      {"planner", 1}, {"executor", 5}, {"expresser", 6}, {"reviewer", 0}, {"outsider", 7}};
  EXPECT_EQ(steps(registry, "w"), posted);
  EXPECT_FALSE(registry.snapshot()->workflow("w")->follows_requests);
  const uint64_t version = registry.version();
  EXPECT_TRUE(registry.note_request("w", "expresser"));  // refreshes the TTL only
  EXPECT_EQ(steps(registry, "w"), posted);
  EXPECT_EQ(registry.version(), version);
  registry.post_progress("w", progress({"expresser", "helper"}));
  EXPECT_EQ(steps(registry, "w"), (std::map<std::string, int32_t>{
                                      {"planner", 2}, {"executor", 3}, {"expresser", 0}, {"reviewer", 1}, {"helper", 0}}));
  // Progress for an unknown workflow creates it (no graph: only the named agents).
  registry.post_progress("fresh", progress({"x"}, {{"y", 2}}));
  EXPECT_EQ(steps(registry, "fresh"), (std::map<std::string, int32_t>{{"x", 0}, {"y", 2}}));
}

TEST_F(WorkflowRegistryTest, AgentNamesAreScopedPerWorkflow) {
  WorkflowRegistry registry(config());
  registry.declare("client-a", fig1_cycle());
  registry.declare("client-b", fig1_cycle());
  registry.note_request("client-a", "planner");
  registry.note_request("client-b", "reviewer");
  const auto snapshot = registry.snapshot();
  EXPECT_EQ(snapshot->steps_to_execution("client-a", "planner"), 0);
  EXPECT_EQ(snapshot->steps_to_execution("client-b", "planner"), 1);
  EXPECT_EQ(snapshot->steps_to_execution("client-a", "reviewer"), 3);
  EXPECT_EQ(snapshot->steps_to_execution("client-b", "reviewer"), 0);
  EXPECT_EQ(snapshot->steps_to_execution("client-c", "planner"), std::nullopt);
  EXPECT_EQ(snapshot->num_workflows(), 2);
}

TEST_F(WorkflowRegistryTest, AgentsWithStepsOrdersAcrossWorkflows) {
  WorkflowRegistry registry(config());
  registry.declare("b", fig1_cycle());
  registry.declare("a", fig1_cycle());
  registry.note_request("b", "planner");
  registry.note_request("a", "executor");
  const auto snapshot = registry.snapshot();
  std::vector<std::string> next;
  for (const AgentSteps& entry : snapshot->agents_with_steps(1, 2))
    next.push_back(fmt::format("{}/{}={}", entry.workflow, entry.agent, entry.steps_to_execution));
  EXPECT_EQ(next, (std::vector<std::string>{"a/expresser=1", "b/executor=1", "a/reviewer=2", "b/expresser=2"}));
  EXPECT_EQ(snapshot->agents_with_steps(0, 0).size(), 2u);
  EXPECT_TRUE(snapshot->agents_with_steps(4, kFar - 1).empty());
}

TEST_F(WorkflowRegistryTest, EndForgetsAWorkflow) {
  WorkflowRegistry registry(config());
  registry.declare("w", fig1_cycle());
  const auto before = registry.snapshot();
  EXPECT_TRUE(registry.end("w"));
  EXPECT_FALSE(registry.end("w"));
  EXPECT_EQ(registry.snapshot()->workflow("w"), nullptr);
  EXPECT_GT(registry.version(), before->version());
  ASSERT_NE(before->workflow("w"), nullptr);  // a held snapshot stays valid
  EXPECT_EQ(before->workflow("w")->steps_by_agent.size(), 4u);
}

TEST_F(WorkflowRegistryTest, UnseenWorkflowsExpireAfterTheTtl) {
  WorkflowRegistry registry(config());
  registry.declare("old", fig1_cycle());
  now_ += 30s;
  registry.note_request("young", "a");
  now_ += 30s - 1ns;
  EXPECT_EQ(registry.expire_unseen(), 0);
  registry.note_request("old", "");  // a request without an agent refreshes the TTL
  now_ += 60s - 1ns;
  EXPECT_EQ(registry.snapshot()->num_workflows(), 2);
  const uint64_t version = registry.version();
  // "young" is past its TTL (90 s unseen), "old" 1 ns short of it: any call expires "young".
  registry.note_request("other", "");
  EXPECT_EQ(registry.snapshot()->workflow("young"), nullptr);
  EXPECT_NE(registry.snapshot()->workflow("old"), nullptr);
  EXPECT_GT(registry.version(), version);
  now_ += 1ns;
  EXPECT_EQ(registry.expire_unseen(), 1);
  EXPECT_EQ(registry.snapshot()->workflow("old"), nullptr);
  EXPECT_EQ(registry.snapshot()->num_workflows(), 1);  // "other"
}

TEST_F(WorkflowRegistryTest, VersionChangesOnlyWhenStepsChange) {
  WorkflowRegistry registry(config());
  EXPECT_EQ(registry.version(), registry.snapshot()->version());
  registry.declare("w", fig1_cycle());
  const uint64_t declared = registry.version();
  EXPECT_EQ(registry.snapshot()->version(), declared);
  registry.note_request("w", "planner");
  const uint64_t planner = registry.version();
  EXPECT_GT(planner, declared);
  registry.note_request("w", "planner");
  registry.note_request("w", "");
  registry.declare("w", fig1_cycle());  // same graph, same steps
  EXPECT_EQ(registry.version(), planner);
  registry.post_progress("w", progress({"planner"}));  // same steps, but requests no longer move it
  EXPECT_GT(registry.version(), planner);
  EXPECT_EQ(registry.snapshot()->version(), registry.version());
}

TEST_F(WorkflowRegistryTest, BadInputChangesNothing) {
  WorkflowRegistry registry(config());
  registry.declare("w", fig1_cycle());
  registry.note_request("w", "planner");
  const auto before = registry.snapshot();
  EXPECT_EQ(error_kind([&] { registry.declare("w", {{agent("a", {"b", "b"})}}); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(error_kind([&] { registry.declare("bad id", fig1_cycle()); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(error_kind([&] { registry.declare("", fig1_cycle()); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(error_kind([&] { registry.post_progress("w", progress({"a", "a"})); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(error_kind([&] { registry.post_progress("w", progress({}, {{"a", -2}})); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(error_kind([&] { registry.note_request("w", std::string("a\0b", 3)); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(error_kind([&] { registry.note_request("", "planner"); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(registry.version(), before->version());
  EXPECT_EQ(steps(registry, "w")["reviewer"], 3);
  EXPECT_FALSE(registry.note_request("", ""));
}

TEST_F(WorkflowRegistryTest, RejectsBadConfig) {
  WorkflowRegistryConfig bad = config();
  bad.ttl = 0s;
  EXPECT_EQ(error_kind([&] { WorkflowRegistry registry(bad); }), ErrorKind::kInvalidArgument);
  bad = config(-1);
  EXPECT_EQ(error_kind([&] { WorkflowRegistry registry(bad); }), ErrorKind::kInvalidArgument);
}

TEST_F(WorkflowRegistryTest, AgentCapBoundsGraphsAndProgress) {
  EXPECT_EQ(WorkflowRegistryConfig{}.max_workflows, 10000);  // --max-workflows default
  EXPECT_EQ(WorkflowRegistryConfig{}.max_agents_per_workflow, 256);
  WorkflowRegistryConfig bad = config();
  bad.max_agents_per_workflow = 0;
  EXPECT_EQ(error_kind([&] { WorkflowRegistry registry(bad); }), ErrorKind::kInvalidArgument);

  WorkflowRegistryConfig capped = config();
  capped.max_agents_per_workflow = 3;
  WorkflowRegistry registry(capped);
  EXPECT_EQ(registry.max_agents_per_workflow(), 3);
  registry.declare("ok", {{agent("a", {"b", "c"})}});  // 3 agents, 2 implicit
  EXPECT_EQ(error_kind([&] { registry.declare("w", fig1_cycle()); }), ErrorKind::kInvalidArgument);
  // Implicit agents count, so one agent's predecessors are bounded too.
  EXPECT_EQ(error_kind([&] { registry.declare("w", {{agent("a", {"b", "c", "d"})}}); }),
            ErrorKind::kInvalidArgument);
  EXPECT_EQ(error_kind([&] { registry.post_progress("ok", progress({"a", "b", "c", "d"})); }),
            ErrorKind::kInvalidArgument);
  EXPECT_EQ(error_kind([&] { registry.post_progress("ok", progress({}, {{"a", 1}, {"b", 1}, {"c", 1}, {"d", 1}})); }),
            ErrorKind::kInvalidArgument);
  EXPECT_EQ(registry.snapshot()->workflow("w"), nullptr);  // nothing was created by the refused calls
  registry.post_progress("ok", progress({"a", "b", "c"}));
  EXPECT_EQ(registry.snapshot()->steps_to_execution("ok", "a"), 0);
}

TEST_F(WorkflowRegistryTest, FullRegistryRefusesNewWorkflowsButServesRequests) {
  WorkflowRegistry registry(config(2));
  registry.declare("a", fig1_cycle());
  EXPECT_TRUE(registry.note_request("b", "x"));
  EXPECT_EQ(error_kind([&] { registry.declare("c", fig1_cycle()); }), ErrorKind::kCapacity);
  EXPECT_EQ(error_kind([&] { registry.post_progress("c", progress({"x"})); }), ErrorKind::kCapacity);
  EXPECT_FALSE(registry.note_request("c", "x"));
  EXPECT_EQ(registry.snapshot()->workflow("c"), nullptr);
  registry.declare("a", fig1_cycle());  // known ones still change
  EXPECT_TRUE(registry.end("b"));
  EXPECT_TRUE(registry.note_request("c", "x"));
  EXPECT_EQ(registry.snapshot()->steps_to_execution("c", "x"), 0);
}

TEST_F(WorkflowRegistryTest, ConcurrentWritersAndASnapshotReader) {
  WorkflowRegistry registry(config(64));
  for (int32_t w = 0; w < 4; ++w) registry.declare(fmt::format("w{}", w), fig1_cycle());
  const std::vector<std::string> order{"planner", "executor", "expresser", "reviewer"};
  std::atomic<bool> done{false};
  std::atomic<int64_t> num_bad{0};
  std::thread reader([&] {
    uint64_t last_version = 0;
    while (!done.load()) {
      const auto snapshot = registry.snapshot();
      if (snapshot->version() < last_version) ++num_bad;
      last_version = snapshot->version();
      for (int32_t w = 0; w < 4; ++w) {
        const WorkflowSteps* steps = snapshot->workflow(fmt::format("w{}", w));
        // Exactly one agent runs; the others are 1, 2, 3 steps away.
        int64_t sum = 0;
        if (steps != nullptr)
          for (const auto& [name, value] : steps->steps_by_agent) sum += value;
        if (steps == nullptr || (steps->running.size() == 1 && sum != 6)) ++num_bad;
      }
    }
  });
  std::vector<std::thread> writers;
  for (int32_t w = 0; w < 4; ++w)
    writers.emplace_back([&, w] {
      for (int32_t i = 0; i < 2000; ++i) registry.note_request(fmt::format("w{}", w), order[i % 4]);
    });
  for (std::thread& writer : writers) writer.join();
  done = true;
  reader.join();
  EXPECT_EQ(num_bad.load(), 0);
  EXPECT_EQ(registry.snapshot()->workflow("w2")->running, (std::vector<std::string>{"reviewer"}));
}

}  // namespace
}  // namespace loom
