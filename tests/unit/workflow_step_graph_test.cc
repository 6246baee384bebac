// AgentStepGraph: validation and steps-to-execution (join all/any, cycles,
// branches, self-loops, disconnected agents), exact values.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <map>
#include <string>
#include <vector>

#include "util/error.h"
#include "workflow/agent_step_graph.h"

namespace loom {
namespace {

constexpr int32_t kFar = kStepsFar;

AgentSpec agent(std::string name, std::vector<std::string> after = {}, JoinKind join = JoinKind::kAll) {
  return AgentSpec{std::move(name), std::move(after), join};
}

// Steps of every agent by name.
std::map<std::string, int32_t> steps_of(const AgentStepGraph& graph, std::vector<std::string> running,
                                        std::map<std::string, int32_t, std::less<>> explicit_steps = {}) {
  WorkflowProgress progress;
  progress.running = std::move(running);
  progress.steps_to_execution = std::move(explicit_steps);
  const std::vector<int32_t> steps = graph.steps_to_execution(progress);
  std::map<std::string, int32_t> by_name;
  for (int32_t i = 0; i < graph.num_agents(); ++i) by_name[graph.names()[i]] = steps[i];
  return by_name;
}

// The message of the Error(kInvalidArgument) that building `spec` throws.
std::string build_error(const WorkflowSpec& spec) {
  try {
    AgentStepGraph graph(spec);
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kInvalidArgument);
    return error.message();
  }
  ADD_FAILURE() << "no error";
  return {};
}

// KVFlow Fig. 1: Planner -> Executor -> Expresser -> Reviewer -> Planner.
WorkflowSpec fig1_cycle() {
  return {{agent("planner", {"reviewer"}), agent("executor", {"planner"}), agent("expresser", {"executor"}),
           agent("reviewer", {"expresser"})}};
}

// planner -> e1, e2 -> expresser (join given).
WorkflowSpec diamond(JoinKind join) {
  return {{agent("planner"), agent("e1", {"planner"}), agent("e2", {"planner"}),
           agent("expresser", {"e1", "e2"}, join)}};
}

TEST(WorkflowStepGraphTest, IndexesAgentsInDeclarationOrder) {
  const AgentStepGraph graph(diamond(JoinKind::kAny));
  EXPECT_EQ(graph.num_agents(), 4);
  EXPECT_EQ(graph.names(), (std::vector<std::string>{"planner", "e1", "e2", "expresser"}));
  EXPECT_EQ(graph.index_of("e2"), 2);
  EXPECT_EQ(graph.index_of("nobody"), std::nullopt);
  EXPECT_EQ(graph.predecessors(3), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(graph.successors(0), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(graph.join(3), JoinKind::kAny);
  EXPECT_EQ(graph.join(0), JoinKind::kAll);
}

TEST(WorkflowStepGraphTest, RejectsBadGraphsNamingTheField) {
  EXPECT_EQ(build_error({{agent("planner"), agent("planner")}}),
            "agents[1].name: agent \"planner\" is declared twice (first as agents[0])");
  EXPECT_EQ(build_error({{agent("planner"), agent("")}}), "agents[1].name: agent name is empty");
  EXPECT_EQ(build_error({{agent("a"), agent("b", {"a", ""})}}), "agents[1].after[1]: agent name is empty");
  EXPECT_EQ(build_error({{agent("a"), agent("b", {"a", "a"})}}), "agents[1].after[1]: \"a\" is listed twice");
  EXPECT_EQ(build_error({{agent("bad\nname")}}), "agents[0].name: invalid agent name");
  WorkflowSpec too_many;
  for (int32_t i = 0; i <= kMaxAgentsPerWorkflow; ++i) too_many.agents.push_back(agent(fmt::format("a{}", i)));
  EXPECT_EQ(build_error(too_many), "agents: 257 agents, at most 256");
  // Implicit agents count too.
  WorkflowSpec too_many_implicit;
  too_many_implicit.agents.push_back(agent("a0"));
  for (int32_t i = 1; i <= kMaxAgentsPerWorkflow; ++i) too_many_implicit.agents[0].after.push_back(fmt::format("a{}", i));
  EXPECT_EQ(build_error(too_many_implicit), "agents: 257 agents (declared or named in \"after\"), at most 256");
}

TEST(WorkflowStepGraphTest, DeclaresAgentsNamedOnlyInAfterImplicitly) {
  // The issue's own example body: reviewer, executor1 and executor2 are never declared.
  const AgentStepGraph graph({{agent("planner", {"reviewer"}), agent("expresser", {"executor1", "executor2"})}});
  EXPECT_EQ(graph.names(), (std::vector<std::string>{"planner", "expresser", "reviewer", "executor1", "executor2"}));
  EXPECT_EQ(graph.predecessors(0), (std::vector<int32_t>{2}));
  EXPECT_EQ(graph.predecessors(1), (std::vector<int32_t>{3, 4}));
  EXPECT_TRUE(graph.predecessors(2).empty());
  EXPECT_EQ(graph.join(3), JoinKind::kAll);
  EXPECT_EQ(steps_of(graph, {"reviewer", "executor1", "executor2"}),
            (std::map<std::string, int32_t>{
                {"planner", 1}, {"expresser", 1}, {"reviewer", 0}, {"executor1", 0}, {"executor2", 0}}));
  // Named in `after` before its own declaration: declared once, at its own index.
  const AgentStepGraph later({{agent("planner", {"reviewer"}), agent("reviewer", {"planner"})}});
  EXPECT_EQ(later.names(), (std::vector<std::string>{"planner", "reviewer"}));
  EXPECT_EQ(later.predecessors(1), (std::vector<int32_t>{0}));
  EXPECT_EQ(steps_of(later, {"planner"}), (std::map<std::string, int32_t>{{"planner", 0}, {"reviewer", 1}}));
}

TEST(WorkflowStepGraphTest, KvflowFig1CycleCountsStepsAroundTheLoop) {
  const AgentStepGraph graph(fig1_cycle());
  EXPECT_EQ(steps_of(graph, {"executor"}),
            (std::map<std::string, int32_t>{{"planner", 3}, {"executor", 0}, {"expresser", 1}, {"reviewer", 2}}));
  EXPECT_EQ(steps_of(graph, {"reviewer"}),
            (std::map<std::string, int32_t>{{"planner", 1}, {"executor", 2}, {"expresser", 3}, {"reviewer", 0}}));
  // Nothing running: nothing can be predicted.
  EXPECT_EQ(steps_of(graph, {}), (std::map<std::string, int32_t>{
                                     {"planner", kFar}, {"executor", kFar}, {"expresser", kFar}, {"reviewer", kFar}}));
}

TEST(WorkflowStepGraphTest, ExplicitStepsAnchorLikeRunningAgents) {
  const AgentStepGraph graph(fig1_cycle());
  // Planner explicitly 5 away, nothing running: the loop continues from it.
  EXPECT_EQ(steps_of(graph, {}, {{"planner", 5}}),
            (std::map<std::string, int32_t>{{"planner", 5}, {"executor", 6}, {"expresser", 7}, {"reviewer", 8}}));
  // The explicit value wins over `running`; an anchor ignores its predecessors.
  EXPECT_EQ(steps_of(graph, {"executor", "reviewer"}, {{"executor", 4}}),
            (std::map<std::string, int32_t>{{"planner", 1}, {"executor", 4}, {"expresser", 5}, {"reviewer", 0}}));
  // Names the graph does not declare are ignored.
  EXPECT_EQ(steps_of(graph, {"stranger"}, {{"other", 1}, {"reviewer", 2}}),
            (std::map<std::string, int32_t>{{"planner", 3}, {"executor", 4}, {"expresser", 5}, {"reviewer", 2}}));
}

TEST(WorkflowStepGraphTest, DiamondJoinAllTakesMaxOfPendingBranches) {
  const AgentStepGraph graph(diamond(JoinKind::kAll));
  EXPECT_EQ(steps_of(graph, {"planner"}),
            (std::map<std::string, int32_t>{{"planner", 0}, {"e1", 1}, {"e2", 1}, {"expresser", 2}}));
  EXPECT_EQ(steps_of(graph, {"e1", "e2"}),
            (std::map<std::string, int32_t>{{"planner", kFar}, {"e1", 0}, {"e2", 0}, {"expresser", 1}}));
  // e2 already finished: nothing running leads to it, so the join waits for e1 only.
  EXPECT_EQ(steps_of(graph, {"e1"}),
            (std::map<std::string, int32_t>{{"planner", kFar}, {"e1", 0}, {"e2", kFar}, {"expresser", 1}}));
  // e2 still 3 steps away: the join waits for the slower branch.
  EXPECT_EQ(steps_of(graph, {"e1"}, {{"e2", 3}}),
            (std::map<std::string, int32_t>{{"planner", kFar}, {"e1", 0}, {"e2", 3}, {"expresser", 4}}));
}

TEST(WorkflowStepGraphTest, DiamondJoinAnyTakesMinOfBranches) {
  const AgentStepGraph graph(diamond(JoinKind::kAny));
  EXPECT_EQ(steps_of(graph, {"planner"}),
            (std::map<std::string, int32_t>{{"planner", 0}, {"e1", 1}, {"e2", 1}, {"expresser", 2}}));
  EXPECT_EQ(steps_of(graph, {"e1"}, {{"e2", 3}}),
            (std::map<std::string, int32_t>{{"planner", kFar}, {"e1", 0}, {"e2", 3}, {"expresser", 1}}));
  EXPECT_EQ(steps_of(graph, {}, {{"e1", 6}, {"e2", 2}}),
            (std::map<std::string, int32_t>{{"planner", kFar}, {"e1", 6}, {"e2", 2}, {"expresser", 3}}));
}

TEST(WorkflowStepGraphTest, JoinAllWaitsForTheLongerPathToAPendingBranch) {
  // a -> b -> c; the join needs a and c; a is running, so c is two steps out.
  const AgentStepGraph graph({{agent("a"), agent("b", {"a"}), agent("c", {"b"}), agent("join", {"a", "c"})}});
  EXPECT_EQ(steps_of(graph, {"a"}), (std::map<std::string, int32_t>{{"a", 0}, {"b", 1}, {"c", 2}, {"join", 3}}));
  const AgentStepGraph any_graph(
      {{agent("a"), agent("b", {"a"}), agent("c", {"b"}), agent("join", {"a", "c"}, JoinKind::kAny)}});
  EXPECT_EQ(steps_of(any_graph, {"a"}), (std::map<std::string, int32_t>{{"a", 0}, {"b", 1}, {"c", 2}, {"join", 1}}));
}

TEST(WorkflowStepGraphTest, DiamondInsideACycleWaitsOnlyForThisRoundsBranches) {
  // planner -> e1, e2 -> expresser (all) -> reviewer -> planner.
  const AgentStepGraph graph({{agent("planner", {"reviewer"}), agent("e1", {"planner"}), agent("e2", {"planner"}),
                               agent("expresser", {"e1", "e2"}), agent("reviewer", {"expresser"})}});
  // e2 is reached only through the join: it already ran this round.
  EXPECT_EQ(steps_of(graph, {"e1"}), (std::map<std::string, int32_t>{
                                         {"planner", 3}, {"e1", 0}, {"e2", 4}, {"expresser", 1}, {"reviewer", 2}}));
  EXPECT_EQ(steps_of(graph, {"planner"}), (std::map<std::string, int32_t>{
                                              {"planner", 0}, {"e1", 1}, {"e2", 1}, {"expresser", 2}, {"reviewer", 3}}));
  EXPECT_EQ(steps_of(graph, {"reviewer"}),
            (std::map<std::string, int32_t>{{"planner", 1}, {"e1", 2}, {"e2", 2}, {"expresser", 3}, {"reviewer", 0}}));
  // e2 explicitly still 2 steps away in this round: the join waits for it.
  EXPECT_EQ(steps_of(graph, {"e1"}, {{"e2", 2}}),
            (std::map<std::string, int32_t>{{"planner", 5}, {"e1", 0}, {"e2", 2}, {"expresser", 3}, {"reviewer", 4}}));
}

TEST(WorkflowStepGraphTest, ConditionalBranchTakesEitherPath) {
  // KVFlow Fig. 3(a), lower workflow: planner -> e1 | e2 -> expresser (any) -> planner.
  const AgentStepGraph graph({{agent("planner", {"expresser"}), agent("e1", {"planner"}), agent("e2", {"planner"}),
                               agent("expresser", {"e1", "e2"}, JoinKind::kAny)}});
  EXPECT_EQ(steps_of(graph, {"e2"}),
            (std::map<std::string, int32_t>{{"planner", 2}, {"e1", 3}, {"e2", 0}, {"expresser", 1}}));
  EXPECT_EQ(steps_of(graph, {"expresser"}),
            (std::map<std::string, int32_t>{{"planner", 1}, {"e1", 2}, {"e2", 2}, {"expresser", 0}}));
}

TEST(WorkflowStepGraphTest, SelfLoopIsNeverItsOwnPendingPredecessor) {
  const AgentStepGraph graph({{agent("b"), agent("loop", {"loop", "b"}), agent("solo", {"solo"})}});
  EXPECT_EQ(steps_of(graph, {"b"}), (std::map<std::string, int32_t>{{"b", 0}, {"loop", 1}, {"solo", kFar}}));
  EXPECT_EQ(steps_of(graph, {"solo", "loop"}), (std::map<std::string, int32_t>{{"b", kFar}, {"loop", 0}, {"solo", 0}}));
  const AgentStepGraph any_graph({{agent("b"), agent("loop", {"loop", "b"}, JoinKind::kAny)}});
  EXPECT_EQ(steps_of(any_graph, {"b"}), (std::map<std::string, int32_t>{{"b", 0}, {"loop", 1}}));
}

TEST(WorkflowStepGraphTest, DisconnectedAndUpstreamAgentsAreFar) {
  const AgentStepGraph graph({{agent("a"), agent("b", {"a"}), agent("c", {"b"}), agent("loner")}});
  EXPECT_EQ(steps_of(graph, {"b"}), (std::map<std::string, int32_t>{{"a", kFar}, {"b", 0}, {"c", 1}, {"loner", kFar}}));
  EXPECT_EQ(steps_of(graph, {"loner"}),
            (std::map<std::string, int32_t>{{"a", kFar}, {"b", kFar}, {"c", kFar}, {"loner", 0}}));
}

TEST(WorkflowStepGraphTest, JoinsWaitingOnEachOtherAreFar) {
  // x needs a and b; y needs a and c; b follows y, c follows x: a deadlock.
  const AgentStepGraph graph({{agent("a"), agent("x", {"a", "b"}), agent("y", {"a", "c"}), agent("b", {"y"}),
                               agent("c", {"x"})}});
  EXPECT_EQ(steps_of(graph, {"a"}),
            (std::map<std::string, int32_t>{{"a", 0}, {"x", kFar}, {"y", kFar}, {"b", kFar}, {"c", kFar}}));
  // Told that b is next, the deadlock resolves.
  EXPECT_EQ(steps_of(graph, {"a"}, {{"b", 1}}),
            (std::map<std::string, int32_t>{{"a", 0}, {"x", 2}, {"y", 4}, {"b", 1}, {"c", 3}}));
}

TEST(WorkflowStepGraphTest, RejectsExplicitStepsOutOfRange) {
  const AgentStepGraph graph(fig1_cycle());
  WorkflowProgress progress;
  progress.steps_to_execution["planner"] = -1;
  EXPECT_THROW(graph.steps_to_execution(progress), Error);
  progress.steps_to_execution["planner"] = kMaxExplicitSteps;
  EXPECT_EQ(graph.steps_to_execution(progress),
            (std::vector<int32_t>{kMaxExplicitSteps, kMaxExplicitSteps + 1, kMaxExplicitSteps + 2,
                                  kMaxExplicitSteps + 3}));
}

TEST(WorkflowStepGraphTest, LongChainStaysExactAndEmptyGraphIsFine) {
  WorkflowSpec chain;
  chain.agents.push_back(agent("a0", {fmt::format("a{}", kMaxAgentsPerWorkflow - 1)}));
  for (int32_t i = 1; i < kMaxAgentsPerWorkflow; ++i)
    chain.agents.push_back(agent(fmt::format("a{}", i), {fmt::format("a{}", i - 1)}));
  const AgentStepGraph graph(chain);
  WorkflowProgress progress;
  progress.running = {"a10"};
  const std::vector<int32_t> steps = graph.steps_to_execution(progress);
  for (int32_t i = 0; i < kMaxAgentsPerWorkflow; ++i)
    EXPECT_EQ(steps[i], (i - 10 + kMaxAgentsPerWorkflow) % kMaxAgentsPerWorkflow) << i;
  EXPECT_TRUE(AgentStepGraph(WorkflowSpec{}).steps_to_execution(progress).empty());
}

}  // namespace
}  // namespace loom
