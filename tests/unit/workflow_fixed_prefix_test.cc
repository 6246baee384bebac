// FixedPrefixTracker: explicit fixed_prefix_tokens, detection from the agent's
// recent prompts, per-workflow scoping and bounded history.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "util/error.h"
#include "workflow/fixed_prefix_tracker.h"

namespace loom {
namespace {

using Tokens = std::vector<int32_t>;

// A prompt: `num_fixed` tokens of the system part (100, 101, ...) then `dynamic`.
Tokens prompt(int32_t num_fixed, const Tokens& dynamic) {
  Tokens tokens;
  for (int32_t i = 0; i < num_fixed; ++i) tokens.push_back(100 + i);
  tokens.insert(tokens.end(), dynamic.begin(), dynamic.end());
  return tokens;
}

FixedPrefix detected(int32_t num_tokens) { return {num_tokens, FixedPrefixSource::kDetected}; }
FixedPrefix explicit_prefix(int32_t num_tokens) { return {num_tokens, FixedPrefixSource::kExplicit}; }
// An agent's first prompt counts as fixed whole, until a second one shows its fixed part.
FixedPrefix first(const Tokens& prompt) { return {static_cast<int32_t>(prompt.size()), FixedPrefixSource::kFirstPrompt}; }

TEST(WorkflowFixedPrefixTest, DetectsTheCommonPrefixOfRecentPrompts) {
  FixedPrefixTracker tracker;
  EXPECT_EQ(tracker.observe("w", "planner", prompt(6, {1, 2, 3})), first(prompt(6, {1, 2, 3})));
  EXPECT_EQ(tracker.observe("w", "planner", prompt(6, {7, 8})), detected(6));
  // This prompt shares 8 tokens with the previous one, but only 6 with the first.
  EXPECT_EQ(tracker.observe("w", "planner", prompt(6, {7, 8, 9})), detected(6));
  EXPECT_EQ(tracker.observe("w", "planner", prompt(6, {7, 8, 5})), detected(6));
  // The first prompt has left the window of 4; prompts 2-5 all start with 6 + {7, 8}.
  EXPECT_EQ(tracker.observe("w", "planner", prompt(6, {7, 8, 4})), detected(8));
}

TEST(WorkflowFixedPrefixTest, AnOutlierLowersTheValueUntilItLeavesTheWindow) {
  FixedPrefixTrackerConfig config;
  config.num_prompts_compared = 3;
  FixedPrefixTracker tracker(config);
  tracker.observe("w", "a", prompt(10, {1}));
  EXPECT_EQ(tracker.observe("w", "a", prompt(10, {2})), detected(10));
  EXPECT_EQ(tracker.observe("w", "a", prompt(3, {9, 9})), detected(3));  // the system prompt changed
  EXPECT_EQ(tracker.observe("w", "a", prompt(3, {9, 9, 1})), detected(3));
  EXPECT_EQ(tracker.observe("w", "a", prompt(3, {9, 9, 2})), detected(5));
  EXPECT_EQ(tracker.observe("w", "a", Tokens{}), detected(0));
  EXPECT_EQ(tracker.observe("w", "a", Tokens{}), detected(0));
  EXPECT_EQ(tracker.observe("w", "a", Tokens{}), detected(0));
}

TEST(WorkflowFixedPrefixTest, ExplicitValuesWinAndAreClampedToThePrompt) {
  FixedPrefixTracker tracker;
  EXPECT_EQ(tracker.observe("w", "a", prompt(6, {1}), 4), explicit_prefix(4));
  EXPECT_EQ(tracker.observe("w", "a", prompt(6, {2}), 50), explicit_prefix(7));
  EXPECT_EQ(tracker.observe("w", "a", prompt(6, {3}), 0), explicit_prefix(0));
  // Explicit prompts still feed the history.
  EXPECT_EQ(tracker.observe("w", "a", prompt(6, {4})), detected(6));
  EXPECT_THROW(tracker.observe("w", "a", prompt(6, {4}), -1), Error);
}

TEST(WorkflowFixedPrefixTest, AgentsAreScopedPerWorkflow) {
  FixedPrefixTracker tracker;
  tracker.observe("client-a", "planner", prompt(5, {1}));
  EXPECT_EQ(tracker.observe("client-b", "planner", prompt(9, {1})), first(prompt(9, {1})));
  EXPECT_EQ(tracker.observe("client-a", "planner", prompt(5, {2})), detected(5));
  EXPECT_EQ(tracker.observe("client-b", "planner", prompt(9, {2})), detected(9));
  EXPECT_EQ(tracker.observe("client-a", "executor", prompt(5, {2})), first(prompt(5, {2})));
  EXPECT_EQ(tracker.num_tracked_agents(), 3);
}

TEST(WorkflowFixedPrefixTest, LatestGivesThePrefixTokensForPrefetch) {
  FixedPrefixTracker tracker;
  EXPECT_EQ(tracker.latest("w", "a"), std::nullopt);
  tracker.observe("w", "a", Tokens{5, 6, 7, 8});
  auto latest = tracker.latest("w", "a");
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->prefix, first(Tokens{5, 6, 7, 8}));
  EXPECT_EQ(Tokens(latest->tokens.begin(), latest->tokens.end()), (Tokens{5, 6, 7, 8}));
  tracker.observe("w", "a", Tokens{5, 6, 9});
  latest = tracker.latest("w", "a");
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->prefix, detected(2));
  EXPECT_EQ(Tokens(latest->tokens.begin(), latest->tokens.end()), (Tokens{5, 6}));
  EXPECT_EQ(tracker.latest("w", "b"), std::nullopt);
  EXPECT_EQ(tracker.latest("v", "a"), std::nullopt);
}

TEST(WorkflowFixedPrefixTest, ForgetsWorkflowsAndTheLeastRecentAgents) {
  FixedPrefixTrackerConfig config;
  config.max_tracked_agents = 2;
  FixedPrefixTracker tracker(config);
  tracker.observe("w", "a", prompt(4, {1}));
  tracker.observe("w", "b", prompt(4, {1}));
  tracker.observe("w", "a", prompt(4, {2}));  // b is now the least recent
  tracker.observe("v", "c", prompt(4, {1}));
  EXPECT_EQ(tracker.num_tracked_agents(), 2);
  EXPECT_EQ(tracker.latest("w", "b"), std::nullopt);
  EXPECT_EQ(tracker.latest("w", "a")->prefix, detected(4));
  tracker.forget_workflow("w");
  EXPECT_EQ(tracker.num_tracked_agents(), 1);
  EXPECT_EQ(tracker.observe("w", "a", prompt(4, {3})), first(prompt(4, {3})));
  EXPECT_NE(tracker.latest("v", "c"), std::nullopt);
  tracker.forget_workflow("nothing");
  EXPECT_EQ(tracker.num_tracked_agents(), 2);
}

TEST(WorkflowFixedPrefixTest, ForgetsWorkflowsByPredicate) {
  FixedPrefixTracker tracker;
  tracker.observe("keep", "a", prompt(4, {1}));
  tracker.observe("drop-1", "a", prompt(4, {1}));
  tracker.observe("drop-1", "b", prompt(4, {1}));
  tracker.observe("drop-2", "a", prompt(4, {1}));
  EXPECT_EQ(tracker.forget_workflows_if([](std::string_view workflow) { return workflow.starts_with("drop"); }), 2);
  EXPECT_EQ(tracker.num_tracked_agents(), 1);
  EXPECT_NE(tracker.latest("keep", "a"), std::nullopt);
  EXPECT_EQ(tracker.latest("drop-1", "b"), std::nullopt);
  EXPECT_EQ(tracker.observe("keep", "a", prompt(4, {2})), detected(4));
}

TEST(WorkflowFixedPrefixTest, KeepsAtMostMaxPrefixTokensPerAgent) {
  FixedPrefixTrackerConfig config;
  config.max_prefix_tokens = 5;
  FixedPrefixTracker tracker(config);
  tracker.observe("w", "a", prompt(8, {1}));
  EXPECT_EQ(tracker.observe("w", "a", prompt(8, {2})), detected(5));
  EXPECT_EQ(tracker.observe("w", "a", prompt(3, {2})), detected(3));
  EXPECT_EQ(tracker.latest("w", "a")->tokens.size(), 3u);
}

TEST(WorkflowFixedPrefixTest, RejectsBadBounds) {
  FixedPrefixTrackerConfig config;
  config.num_prompts_compared = 1;
  EXPECT_THROW(FixedPrefixTracker{config}, Error);
  config = {};
  config.max_tracked_agents = 0;
  EXPECT_THROW(FixedPrefixTracker{config}, Error);
  config = {};
  config.max_prefix_tokens = 0;
  EXPECT_THROW(FixedPrefixTracker{config}, Error);
}

}  // namespace
}  // namespace loom
