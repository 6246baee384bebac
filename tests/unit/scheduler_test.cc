// Scheduler + KV cache manager driven through the batch builder and a fake
// backend whose tokens depend on every K/V slot it reads.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "engine/batch_builder.h"
#include "scheduler/scheduler.h"
#include "scheduler_fake_backend.h"
#include "scheduler_test_util.h"

namespace loom {
namespace {

using Tokens = std::vector<int32_t>;

std::vector<int32_t> prompt(int32_t length, int32_t seed) {
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < length; ++i) tokens.push_back((seed * 31 + i * 7) % test::FakeBackend::kVocabSize);
  return tokens;
}

// Runs requests to completion the way the engine does.
class Harness {
 public:
  Harness(int32_t num_blocks, int32_t block_size, SchedulerConfig config)
      : kv_caches(num_blocks, 0, block_size), scheduler(config, kv_caches) {
    backend.allocate_kv_cache({num_blocks, block_size});
  }
  ~Harness() { EXPECT_EQ(cache.integrity_error(), ""); }

  void add(SchedulerRequestId id, const Tokens& tokens, int32_t max_new_tokens, const std::string& adapter = "",
           int32_t priority = 0) {
    max_new_tokens_[id] = max_new_tokens;
    slots_[id] = adapter.empty() ? -1 : static_cast<int32_t>(adapter.size());
    scheduler.add(id, tokens, adapter, kv_namespace_for_adapter(adapter), priority);
  }

  ScheduledBatch step() {
    ScheduledBatch plan = scheduler.plan();
    const Batch batch = build_batch(plan, scheduler, [&](SchedulerRequestId id) { return slots_.at(id); });
    const ForwardResult result = backend.forward(batch);
    scheduler.complete_step(plan);
    for (const ScheduledRequest& entry : plan.requests)
      if (entry.num_prefix_hit_tokens >= 0) prefix_hits[entry.id] = entry.num_prefix_hit_tokens;
    test::take_greedy_tokens(scheduler, plan, result, outputs, max_new_tokens_);
    EXPECT_EQ(cache.integrity_error(), "");
    return plan;
  }

  std::vector<ScheduledBatch> run_to_end() {
    std::vector<ScheduledBatch> plans;
    for (int guard = 0; scheduler.has_work() && guard < 10000; ++guard) plans.push_back(step());
    EXPECT_FALSE(scheduler.has_work());
    return plans;
  }

  KvCacheGroup kv_caches;
  KvCacheManager& cache = kv_caches.main();
  Scheduler scheduler;
  test::FakeBackend backend;
  std::map<SchedulerRequestId, Tokens> outputs;
  std::map<SchedulerRequestId, int32_t> prefix_hits;

 private:
  std::map<SchedulerRequestId, int32_t> max_new_tokens_, slots_;
};

// What a request generates alone with plenty of room.
Tokens run_alone(const Tokens& tokens, int32_t max_new_tokens, const std::string& adapter = "") {
  Harness harness(64, 4, {});
  harness.add(1, tokens, max_new_tokens, adapter);
  harness.run_to_end();
  return harness.outputs[1];
}

std::vector<int32_t> new_token_counts(const ScheduledBatch& plan) {
  std::vector<int32_t> counts;
  for (const auto& entry : plan.requests) counts.push_back(entry.num_new_tokens);
  return counts;
}

TEST(SchedulerTest, ChunkedPrefillSplitsByTheTokenBudget) {
  Harness harness(16, 4, {.max_batch_tokens = 4});
  harness.add(1, prompt(10, 1), 3);
  const auto plans = harness.run_to_end();
  ASSERT_EQ(plans.size(), 5u);  // 4 + 4 + 2 prompt tokens, then two decodes
  EXPECT_EQ(new_token_counts(plans[0]), (std::vector<int32_t>{4}));
  EXPECT_EQ(plans[0].requests[0].block_ids, (std::vector<int32_t>{0}));
  EXPECT_FALSE(plans[0].requests[0].samples_next_token);
  EXPECT_EQ(new_token_counts(plans[1]), (std::vector<int32_t>{4}));
  EXPECT_EQ(plans[1].requests[0].num_computed_tokens, 4);
  EXPECT_EQ(new_token_counts(plans[2]), (std::vector<int32_t>{2}));
  EXPECT_TRUE(plans[2].requests[0].samples_next_token);
  EXPECT_EQ(plans[2].requests[0].block_ids, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(harness.outputs[1], run_alone(prompt(10, 1), 3));
  EXPECT_EQ(harness.cache.stats().num_in_use_blocks, 0);
}

TEST(SchedulerTest, DecodesGoFirstAndPrefillTakesTheRest) {
  Harness harness(32, 4, {.max_batch_tokens = 6});
  harness.add(1, prompt(3, 1), 4);
  harness.step();  // request 1 prefilled, now decoding
  harness.add(2, prompt(12, 2), 2);
  const ScheduledBatch plan = harness.step();
  ASSERT_EQ(plan.requests.size(), 2u);
  EXPECT_EQ(plan.requests[0].id, 1);
  EXPECT_EQ(plan.requests[0].num_new_tokens, 1);
  EXPECT_EQ(plan.requests[1].id, 2);
  EXPECT_EQ(plan.requests[1].num_new_tokens, 5);
  harness.run_to_end();
  EXPECT_EQ(harness.outputs[1], run_alone(prompt(3, 1), 4));
  EXPECT_EQ(harness.outputs[2], run_alone(prompt(12, 2), 2));
}

TEST(SchedulerTest, SecondRequestWithTheSamePrefixHitsAndMatches) {
  Harness harness(32, 4, {});
  Tokens shared = prompt(13, 3);
  harness.add(1, shared, 5);
  harness.run_to_end();
  Tokens longer = shared;
  longer.push_back(5);
  harness.backend.num_forward_calls = 0;
  harness.add(2, shared, 5);
  harness.add(3, longer, 5);
  harness.run_to_end();
  EXPECT_EQ(harness.prefix_hits[1], 0);
  EXPECT_EQ(harness.prefix_hits[2], 12);  // whole blocks, never the last prompt token
  EXPECT_EQ(harness.prefix_hits[3], 12);
  EXPECT_EQ(harness.outputs[2], harness.outputs[1]);
  EXPECT_EQ(harness.outputs[3], run_alone(longer, 5));
}

TEST(SchedulerTest, PreemptedRequestResumesToTheSameTokens) {
  // 6 blocks of 4: two requests growing to 20 tokens each cannot both fit.
  Harness harness(6, 4, {});
  harness.add(1, prompt(9, 4), 11);
  harness.add(2, prompt(9, 5), 11);
  const auto plans = harness.run_to_end();
  EXPECT_GT(harness.scheduler.num_preemptions(), 0);
  // The victim is the later arrival (same priority).
  for (const auto& plan : plans)
    for (SchedulerRequestId id : plan.preempted) EXPECT_EQ(id, 2);
  EXPECT_EQ(harness.outputs[1], run_alone(prompt(9, 4), 11));
  EXPECT_EQ(harness.outputs[2], run_alone(prompt(9, 5), 11));
  EXPECT_EQ(harness.cache.stats().num_in_use_blocks, 0);
}

TEST(SchedulerTest, PriorityPicksWhoRunsAndWhoIsPreempted) {
  Harness harness(6, 4, {.max_running_requests = 1});
  harness.add(1, prompt(5, 6), 2, "", 5);
  harness.add(2, prompt(5, 7), 2, "", 1);
  ScheduledBatch plan = harness.step();
  ASSERT_EQ(plan.requests.size(), 1u);
  EXPECT_EQ(plan.requests[0].id, 2);  // lower value first, despite arriving later
  harness.run_to_end();

  Harness tight(6, 4, {});
  tight.add(1, prompt(9, 8), 11, "", 0);
  tight.add(2, prompt(9, 9), 11, "", -1);  // later but more important: request 1 is the victim
  const auto plans = tight.run_to_end();
  EXPECT_GT(tight.scheduler.num_preemptions(), 0);
  for (const auto& step_plan : plans)
    for (SchedulerRequestId id : step_plan.preempted) EXPECT_EQ(id, 1);
  EXPECT_EQ(tight.outputs[1], run_alone(prompt(9, 8), 11));
}

TEST(SchedulerTest, MaxLorasPerBatchIsRespected) {
  Harness harness(64, 4, {.max_loras_per_batch = 2});
  harness.add(1, prompt(6, 1), 4, "a");
  harness.add(2, prompt(6, 2), 4, "bb");
  harness.add(3, prompt(6, 3), 4, "ccc");  // waits: a third adapter
  harness.add(4, prompt(6, 4), 4, "a");    // passes it: adapter a already runs
  harness.add(5, prompt(6, 5), 4, "");     // the base model does not count
  const ScheduledBatch first = harness.step();
  std::set<SchedulerRequestId> admitted;
  for (const auto& entry : first.requests) admitted.insert(entry.id);
  EXPECT_EQ(admitted, (std::set<SchedulerRequestId>{1, 2, 4, 5}));
  harness.run_to_end();
  EXPECT_EQ(harness.outputs[3].size(), 4u);
  EXPECT_EQ(harness.outputs[3], run_alone(prompt(6, 3), 4, "ccc"));
  EXPECT_NE(harness.outputs[1], run_alone(prompt(6, 1), 4, "bb"));  // adapters change the fake K/V
}

TEST(SchedulerTest, MaxRunningRequestsAndTokenBudget) {
  Harness harness(64, 4, {.max_batch_tokens = 8, .max_running_requests = 2});
  for (SchedulerRequestId id = 1; id <= 4; ++id) harness.add(id, prompt(3, static_cast<int32_t>(id)), 3);
  const auto plans = harness.run_to_end();
  for (const auto& plan : plans) {
    EXPECT_LE(plan.requests.size(), 2u);
    EXPECT_LE(plan.num_tokens(), 8);
  }
  for (SchedulerRequestId id = 1; id <= 4; ++id)
    EXPECT_EQ(harness.outputs[id], run_alone(prompt(3, static_cast<int32_t>(id)), 3));
}

TEST(SchedulerTest, AWaitingRequestWithoutRoomBlocksLaterOnes) {
  Harness harness(4, 4, {});
  harness.add(1, prompt(12, 1), 2);  // 3 blocks
  harness.add(2, prompt(8, 2), 2);   // 2 blocks: only 1 left
  harness.add(3, prompt(2, 3), 2);   // would fit, but FCFS keeps it behind request 2
  const ScheduledBatch first = harness.step();
  ASSERT_EQ(first.requests.size(), 1u);
  EXPECT_EQ(first.requests[0].id, 1);
  EXPECT_EQ(first.requests[0].block_ids, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(harness.scheduler.num_waiting(), 2);
  harness.run_to_end();
  for (SchedulerRequestId id = 1; id <= 3; ++id) EXPECT_EQ(harness.outputs[id].size(), 2u);
  EXPECT_EQ(harness.outputs[2], run_alone(prompt(8, 2), 2));
}

TEST(SchedulerTest, CancellationAtAnyPointFreesEverything) {
  Harness harness(16, 4, {.max_batch_tokens = 4});
  harness.add(1, prompt(10, 1), 8);  // cancelled mid-prefill
  harness.add(2, prompt(3, 2), 8);   // cancelled mid-decode
  harness.add(3, prompt(3, 3), 8);   // cancelled while waiting
  harness.step();
  EXPECT_TRUE(harness.scheduler.finish(1));
  EXPECT_TRUE(harness.scheduler.finish(3));
  harness.step();
  harness.step();
  EXPECT_TRUE(harness.scheduler.is_running(2));
  EXPECT_TRUE(harness.scheduler.finish(2));
  EXPECT_FALSE(harness.scheduler.finish(2));
  EXPECT_FALSE(harness.scheduler.has_work());
  const KvCacheStats stats = harness.cache.stats();
  EXPECT_EQ(stats.num_in_use_blocks, 0);
  EXPECT_EQ(stats.num_free_blocks + stats.num_cached_blocks, 16);
  EXPECT_EQ(harness.cache.evict_all_cached(), stats.num_cached_blocks);
  EXPECT_EQ(harness.cache.stats().num_free_blocks, 16);
}

}  // namespace
}  // namespace loom
