// Scheduler with KV sharing keys: activated (aLoRA) branches in the main
// cache, and forked (ForkKV) requests holding a bCache lease in the main
// manager plus an rCache lease in the residual manager. The first tests check
// plans; the last ones run plans through the batch builder and the fake
// backend, whose write masks prove that present entries hold the right data.
#include <gtest/gtest.h>

#include <map>
#include <numeric>

#include "engine/batch_builder.h"
#include "scheduler/scheduler.h"
#include "scheduler_fake_backend.h"
#include "scheduler_test_util.h"

namespace loom {
namespace {

using Tokens = std::vector<int32_t>;
using Ids = std::vector<int32_t>;
using Counts = std::map<std::string, int32_t>;

Tokens make_tokens(int32_t length, int32_t seed) {
  Tokens tokens(static_cast<size_t>(length));
  std::iota(tokens.begin(), tokens.end(), seed * 1000);
  return tokens;
}
Tokens concat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
RequestKvKeys forked_kv(const std::string& adapter) {
  return {KvKey::single(kForkedBaseKvNamespace), residual_kv_namespace(adapter)};
}
RequestKvKeys plain_kv(KvKey key) { return {std::move(key), ""}; }

// Plays the engine without a backend: every sampled token is appended until
// the request has its max_new_tokens.
class Harness {
 public:
  Harness(int32_t num_blocks, int32_t num_residual_blocks, int32_t block_size, SchedulerConfig config)
      : kv_caches(num_blocks, num_residual_blocks, block_size), scheduler(config, kv_caches) {}
  ~Harness() {
    EXPECT_EQ(cache.integrity_error(), "");
    EXPECT_EQ(residual.integrity_error(), "");
  }

  void add(SchedulerRequestId id, const Tokens& tokens, int32_t max_new_tokens, const std::string& adapter,
           RequestKvKeys kv, int32_t priority = 0) {
    max_new_tokens_[id] = max_new_tokens;
    forked_[id] = !kv.residual_namespace.empty();
    scheduler.add(id, tokens, adapter, std::move(kv), priority);
  }

  ScheduledBatch step() {
    ScheduledBatch plan = scheduler.plan();
    for (const ScheduledRequest& entry : plan.requests) {
      if (entry.num_prefix_hit_tokens >= 0) prefix_hits[entry.id] = entry.num_prefix_hit_tokens;
      if (!forked_.at(entry.id)) {
        EXPECT_EQ(entry.num_kv_present_tokens, entry.num_computed_tokens);
        EXPECT_TRUE(entry.residual_block_ids.empty());
        EXPECT_EQ(entry.num_residual_present_tokens, 0);
      } else {
        EXPECT_GE(entry.num_kv_present_tokens, entry.num_computed_tokens);
        EXPECT_GE(entry.num_residual_present_tokens, entry.num_computed_tokens);
        EXPECT_GE(static_cast<int32_t>(entry.residual_block_ids.size()) * residual.block_size(),
                  entry.num_computed_tokens + entry.num_new_tokens);
      }
    }
    scheduler.complete_step(plan);
    for (const ScheduledRequest& entry : plan.requests) {
      if (!entry.samples_next_token) continue;
      Tokens& out = outputs[entry.id];
      out.push_back(static_cast<int32_t>(entry.id * 100 + static_cast<int64_t>(out.size())));
      if (static_cast<int32_t>(out.size()) >= max_new_tokens_.at(entry.id))
        scheduler.finish(entry.id);
      else
        scheduler.append_token(entry.id, out.back());
    }
    EXPECT_EQ(cache.integrity_error(), "");
    EXPECT_EQ(residual.integrity_error(), "");
    return plan;
  }

  void run_to_end() {
    for (int guard = 0; scheduler.has_work() && guard < 1000; ++guard) step();
    EXPECT_FALSE(scheduler.has_work());
  }

  KvCacheGroup kv_caches;
  KvCacheManager& cache = kv_caches.main();
  KvCacheManager& residual = *kv_caches.residual();
  Scheduler scheduler;
  std::map<SchedulerRequestId, Tokens> outputs;
  std::map<SchedulerRequestId, int32_t> prefix_hits;

 private:
  std::map<SchedulerRequestId, int32_t> max_new_tokens_;
  std::map<SchedulerRequestId, bool> forked_;
};

const ScheduledRequest& only(const ScheduledBatch& plan) {
  EXPECT_EQ(plan.requests.size(), 1u);
  return plan.requests.at(0);
}

TEST(SchedulerSharingTest, ActivatedAndBaseRequestsShareBlocksBeforeTheStart) {
  Harness harness(32, 1, 16, {});
  const Tokens first = make_tokens(64, 1), second = make_tokens(64, 2);
  const KvKey key = activated_kv_key("x", 37, 16);
  // base -> aLoRA: the aLoRA request hits the two full blocks before its start.
  harness.add(1, first, 1, "", plain_kv(KvKey::single("base")));
  harness.run_to_end();
  harness.add(2, first, 2, "x", plain_kv(key));
  const ScheduledRequest entry = only(harness.step());
  EXPECT_EQ(entry.num_prefix_hit_tokens, 32);
  EXPECT_EQ(entry.num_computed_tokens, 32);
  EXPECT_EQ(entry.block_ids, (Ids{0, 1, 4, 5}));
  harness.run_to_end();
  // aLoRA -> base on another prompt.
  harness.add(3, second, 1, "x", plain_kv(key));
  harness.run_to_end();
  harness.add(4, second, 1, "", plain_kv(KvKey::single("base")));
  harness.run_to_end();
  EXPECT_EQ(harness.prefix_hits.at(3), 0);
  EXPECT_EQ(harness.prefix_hits.at(4), 32);
  // The same aLoRA start again hits its branch too (up to the last prompt token).
  harness.add(5, first, 1, "x", plain_kv(key));
  harness.run_to_end();
  EXPECT_EQ(harness.prefix_hits.at(5), 48);
  EXPECT_EQ(harness.cache.stats().num_blocks_by_namespace, (Counts{{"alora/x@37", 4}, {"base", 8}}));
}

TEST(SchedulerSharingTest, SecondForkedAgentInheritsTheBaseCacheAndAllocatesResidualBlocksOnly) {
  Harness harness(16, 16, 4, {});
  const Tokens context = make_tokens(12, 1);
  harness.add(1, concat(context, {50}), 1, "A", forked_kv("A"));
  const ScheduledRequest first = only(harness.step());
  EXPECT_EQ(first.num_computed_tokens, 0);
  EXPECT_EQ(first.num_new_tokens, 13);
  EXPECT_EQ(first.block_ids, (Ids{0, 1, 2, 3}));
  EXPECT_EQ(first.residual_block_ids, (Ids{0, 1, 2, 3}));
  EXPECT_EQ(first.num_kv_present_tokens, 0);
  EXPECT_EQ(first.num_residual_present_tokens, 0);
  EXPECT_FALSE(harness.scheduler.has_work());
  EXPECT_EQ(harness.cache.stats().num_blocks_by_namespace, (Counts{{"fork", 3}}));
  EXPECT_EQ(harness.residual.stats().num_blocks_by_namespace, (Counts{{"resid/A", 3}}));

  harness.add(2, concat(context, {60}), 2, "B", forked_kv("B"));
  const ScheduledRequest second = only(harness.step());
  EXPECT_EQ(second.num_prefix_hit_tokens, 0);
  EXPECT_EQ(second.num_computed_tokens, 0);  // no rCache of B yet: the forward runs over everything
  EXPECT_EQ(second.num_new_tokens, 13);
  EXPECT_EQ(second.block_ids, (Ids{0, 1, 2, 3}));  // A's bCache blocks + one for the last token
  EXPECT_EQ(second.num_kv_present_tokens, 12);     // ... which B must not write
  EXPECT_EQ(second.residual_block_ids, (Ids{3, 4, 5, 6}));
  EXPECT_EQ(second.num_residual_present_tokens, 0);
  EXPECT_EQ(harness.cache.stats().num_in_use_blocks, 4);
  EXPECT_EQ(harness.cache.stats().num_free_blocks, 12);  // one main block taken for 13 tokens
  EXPECT_EQ(harness.residual.stats().num_free_blocks, 9);

  const ScheduledRequest decode = only(harness.step());
  EXPECT_EQ(decode.num_computed_tokens, 13);
  EXPECT_EQ(decode.num_new_tokens, 1);
  EXPECT_EQ(decode.num_kv_present_tokens, 13);
  EXPECT_EQ(decode.num_residual_present_tokens, 13);
  EXPECT_EQ(decode.residual_block_ids, (Ids{3, 4, 5, 6}));
  EXPECT_FALSE(harness.scheduler.has_work());
  EXPECT_EQ(harness.cache.stats().num_blocks_by_namespace, (Counts{{"fork", 3}}));
  EXPECT_EQ(harness.residual.stats().num_blocks_by_namespace, (Counts{{"resid/A", 3}, {"resid/B", 3}}));
}

TEST(SchedulerSharingTest, BaseCacheEvictedWhileResidualSurvivesRecomputesWithoutRewritingResiduals) {
  Harness harness(16, 16, 4, {.max_batch_tokens = 4});
  const Tokens tokens = concat(make_tokens(12, 1), {50});
  harness.add(1, tokens, 1, "A", forked_kv("A"));
  harness.run_to_end();
  EXPECT_EQ(harness.cache.evict_all_cached(), 3);
  EXPECT_EQ(harness.residual.stats().num_cached_blocks, 3);

  harness.add(2, tokens, 1, "A", forked_kv("A"));
  struct Expected {
    int32_t num_cached;
    Ids block_ids, residual_block_ids;
  };
  const std::vector<Expected> steps{
      {0, {0}, {0, 1, 2}}, {4, {0, 1}, {0, 1, 2}}, {8, {0, 1, 2}, {0, 1, 2}}, {12, {0, 1, 2, 3}, {0, 1, 2, 3}}};
  for (const Expected& expected : steps) {
    const ScheduledRequest entry = only(harness.step());
    EXPECT_EQ(entry.num_computed_tokens, expected.num_cached);
    EXPECT_EQ(entry.block_ids, expected.block_ids);
    EXPECT_EQ(entry.residual_block_ids, expected.residual_block_ids);
    EXPECT_EQ(entry.num_kv_present_tokens, expected.num_cached);
    EXPECT_EQ(entry.num_residual_present_tokens, 12);  // partial hit: the rCache is not rewritten
  }
  EXPECT_EQ(harness.prefix_hits.at(2), 0);
  EXPECT_FALSE(harness.scheduler.has_work());
  EXPECT_EQ(harness.cache.stats().num_cached_blocks, 3);
}

TEST(SchedulerSharingTest, ResidualEvictedWhileBaseCacheSurvivesRecomputesWithoutRewritingBaseCache) {
  Harness harness(16, 16, 4, {});
  const Tokens tokens = concat(make_tokens(12, 1), {50});
  harness.add(1, tokens, 1, "A", forked_kv("A"));
  harness.run_to_end();
  EXPECT_EQ(harness.residual.evict_all_cached(), 3);

  harness.add(2, tokens, 1, "A", forked_kv("A"));
  const ScheduledRequest entry = only(harness.step());
  EXPECT_EQ(entry.num_computed_tokens, 0);
  EXPECT_EQ(entry.num_new_tokens, 13);
  EXPECT_EQ(entry.block_ids, (Ids{0, 1, 2, 3}));
  EXPECT_EQ(entry.num_kv_present_tokens, 12);
  EXPECT_EQ(entry.residual_block_ids, (Ids{0, 1, 2, 3}));
  EXPECT_EQ(entry.num_residual_present_tokens, 0);
  EXPECT_EQ(harness.residual.stats().num_cached_blocks, 3);
}

TEST(SchedulerSharingTest, ShortResidualPoolPreemptsAForkedRequest) {
  Harness harness(32, 4, 4, {});
  harness.add(1, make_tokens(8, 1), 3, "A", forked_kv("A"));
  harness.add(2, make_tokens(8, 2), 3, "B", forked_kv("B"));
  harness.add(3, make_tokens(8, 3), 3, "", plain_kv(KvKey::single("base")), /*priority=*/5);
  ScheduledBatch plan = harness.step();
  ASSERT_EQ(plan.requests.size(), 3u);
  EXPECT_EQ(plan.requests[0].residual_block_ids, (Ids{0, 1}));
  EXPECT_EQ(plan.requests[1].residual_block_ids, (Ids{2, 3}));
  EXPECT_EQ(harness.residual.stats().num_free_blocks, 0);

  // A's decode needs a third rCache block: the base request 3 ranks worst but
  // holds no rCache, so B (the worst-ranked forked request) goes.
  plan = harness.step();
  EXPECT_EQ(plan.preempted, (std::vector<SchedulerRequestId>{2}));
  ASSERT_EQ(plan.requests.size(), 2u);
  EXPECT_EQ(plan.requests[0].id, 1);
  EXPECT_EQ(plan.requests[0].residual_block_ids, (Ids{0, 1, 3}));  // B's leaf block, evicted
  EXPECT_EQ(plan.requests[1].id, 3);
  EXPECT_TRUE(harness.scheduler.is_running(3));
  EXPECT_FALSE(harness.scheduler.is_running(2));
  EXPECT_EQ(harness.scheduler.num_preemptions(), 1);

  harness.run_to_end();
  for (SchedulerRequestId id : {1, 2, 3}) EXPECT_EQ(harness.outputs.at(id).size(), 3u);
  EXPECT_EQ(harness.scheduler.num_preemptions(), 1);
}

TEST(SchedulerSharingTest, ForkedRequestWaitsWhenTheResidualPoolCannotHoldItsPrompt) {
  Harness harness(32, 2, 4, {});
  harness.add(1, make_tokens(12, 1), 1, "A", forked_kv("A"));  // needs 3 rCache blocks of 2
  harness.add(2, make_tokens(8, 2), 1, "", plain_kv(KvKey::single("base")), /*priority=*/1);
  ScheduledBatch plan = harness.step();
  // FCFS: the forked request blocks admission of the later one.
  EXPECT_TRUE(plan.requests.empty());
  EXPECT_EQ(harness.scheduler.num_waiting(), 2);
  EXPECT_EQ(harness.cache.stats().num_in_use_blocks, 0);
  EXPECT_EQ(harness.residual.stats().num_in_use_blocks, 0);
  harness.scheduler.finish(1);
  harness.run_to_end();
  EXPECT_EQ(harness.outputs.at(2).size(), 1u);
}


// Runs requests through build_batch and the fake backend (the engine's loop).
class BatchHarness {
 public:
  BatchHarness(int32_t num_blocks, int32_t num_residual_blocks, int32_t block_size, SchedulerConfig config)
      : kv_caches(num_blocks, num_residual_blocks, block_size),
        scheduler(config, kv_caches),
        block_size_(block_size) {
    backend.allocate_kv_cache({num_blocks, block_size});
    backend.allocate_residual_cache({num_residual_blocks, block_size, 16});
  }
  ~BatchHarness() {
    EXPECT_EQ(cache.integrity_error(), "");
    EXPECT_EQ(residual.integrity_error(), "");
  }

  // `adapter` "" with slot -1 is the base model.
  void add(SchedulerRequestId id, const Tokens& tokens, int32_t max_new_tokens, const std::string& adapter,
           SequenceSharing sharing) {
    max_new_tokens_[id] = max_new_tokens;
    sharing_[id] = sharing;
    RequestKvKeys kv{KvKey::single(kBaseKvNamespace), ""};
    if (sharing.adapter_slot >= 0) {
      switch (sharing.sharing) {
        case KvSharing::kIsolated: kv.key = KvKey::single(isolated_kv_namespace(adapter)); break;
        case KvSharing::kActivated: kv.key = activated_kv_key(adapter, sharing.invocation_start, block_size_); break;
        case KvSharing::kBase: break;
        case KvSharing::kForked: kv = forked_kv(adapter); break;
      }
    }
    scheduler.add(id, tokens, sharing.adapter_slot >= 0 ? adapter : "", std::move(kv), 0);
  }

  void run_to_end() {
    for (int guard = 0; scheduler.has_work() && guard < 1000; ++guard) step();
    EXPECT_FALSE(scheduler.has_work());
  }

  void step() {
    const ScheduledBatch plan = scheduler.plan();
    const Batch batch = build_batch(plan, scheduler, [&](SchedulerRequestId id) { return sharing_.at(id); });
    const ForwardResult result = backend.forward(batch);
    scheduler.complete_step(plan);
    for (const ScheduledRequest& entry : plan.requests)
      if (entry.num_prefix_hit_tokens >= 0) prefix_hits[entry.id] = entry.num_prefix_hit_tokens;
    test::take_greedy_tokens(scheduler, plan, result, outputs, max_new_tokens_);
    EXPECT_EQ(cache.integrity_error(), "");
    EXPECT_EQ(residual.integrity_error(), "");
  }

  KvCacheGroup kv_caches;
  KvCacheManager& cache = kv_caches.main();
  KvCacheManager& residual = *kv_caches.residual();
  Scheduler scheduler;
  test::FakeBackend backend;
  std::map<SchedulerRequestId, Tokens> outputs;
  std::map<SchedulerRequestId, int32_t> prefix_hits;

 private:
  int32_t block_size_;
  std::map<SchedulerRequestId, int32_t> max_new_tokens_;
  std::map<SchedulerRequestId, SequenceSharing> sharing_;
};

Tokens fake_prompt(int32_t length, int32_t seed) {
  Tokens tokens;
  for (int32_t i = 0; i < length; ++i) tokens.push_back((seed * 31 + i * 7) % test::FakeBackend::kVocabSize);
  return tokens;
}

Tokens run_alone(const Tokens& tokens, int32_t max_new_tokens, const std::string& adapter, SequenceSharing sharing) {
  BatchHarness harness(64, 64, 4, {});
  harness.add(1, tokens, max_new_tokens, adapter, sharing);
  harness.run_to_end();
  return harness.outputs.at(1);
}

TEST(SchedulerSharingBatchTest, ForkedAgentsMatchRunningAloneThroughPartialHits) {
  const Tokens context = fake_prompt(13, 1);
  const Tokens prompt_a = concat(context, {5}), prompt_b = concat(context, {6});
  const SequenceSharing agent_a{0, KvSharing::kForked, 0}, agent_b{1, KvSharing::kForked, 0};
  const Tokens alone_a = run_alone(prompt_a, 6, "A", agent_a), alone_b = run_alone(prompt_b, 6, "B", agent_b);
  EXPECT_NE(alone_a, alone_b);

  BatchHarness harness(32, 32, 4, {.max_batch_tokens = 5});
  harness.add(1, prompt_a, 6, "A", agent_a);
  harness.run_to_end();
  harness.add(2, prompt_b, 6, "B", agent_b);  // inherits A's bCache for the context
  harness.add(3, prompt_a, 6, "A", agent_a);  // full hit
  harness.run_to_end();
  EXPECT_EQ(harness.outputs.at(1), alone_a);
  EXPECT_EQ(harness.outputs.at(2), alone_b);
  EXPECT_EQ(harness.outputs.at(3), alone_a);
  EXPECT_EQ(harness.prefix_hits.at(2), 0);
  EXPECT_EQ(harness.prefix_hits.at(3), 12);

  // bCache gone, rCache kept (and the reverse): recompute, write only what is missing.
  harness.cache.evict_all_cached();
  harness.add(4, prompt_a, 6, "A", agent_a);
  harness.run_to_end();
  EXPECT_EQ(harness.outputs.at(4), alone_a);
  harness.residual.evict_all_cached();
  harness.add(5, prompt_b, 6, "B", agent_b);
  harness.run_to_end();
  EXPECT_EQ(harness.outputs.at(5), alone_b);
  EXPECT_EQ(harness.prefix_hits.at(4), 0);
  EXPECT_EQ(harness.prefix_hits.at(5), 0);
}

TEST(SchedulerSharingBatchTest, MixedModesInOneBatchMatchRunningAlone) {
  const Tokens context = fake_prompt(18, 2);
  struct Case {
    std::string adapter;
    SequenceSharing sharing;
    Tokens tokens;
  };
  const std::vector<Case> cases{
      {"", {-1, KvSharing::kIsolated, 0}, concat(context, {1})},
      {"iso", {2, KvSharing::kIsolated, 0}, concat(context, {2})},
      {"act", {3, KvSharing::kActivated, 10}, concat(context, {3})},  // start inside block 2
      {"act", {3, KvSharing::kActivated, 16}, concat(context, {4})},  // block-aligned start
      {"ica", {4, KvSharing::kBase, 0}, concat(context, {5})},
      {"frk", {0, KvSharing::kForked, 0}, concat(context, {6})},
  };
  std::vector<Tokens> alone;
  for (const Case& c : cases) alone.push_back(run_alone(c.tokens, 4, c.adapter, c.sharing));

  BatchHarness harness(64, 32, 4, {});
  for (size_t round = 0; round < 2; ++round) {  // all at once, then again over a warm cache
    for (size_t i = 0; i < cases.size(); ++i) {
      const SchedulerRequestId id = static_cast<SchedulerRequestId>(round * 10 + i);
      harness.add(id, cases[i].tokens, 4, cases[i].adapter, cases[i].sharing);
    }
    harness.run_to_end();
    for (size_t i = 0; i < cases.size(); ++i)
      EXPECT_EQ(harness.outputs.at(static_cast<SchedulerRequestId>(round * 10 + i)), alone[i]) << "case " << i;
  }
  // Warm round: every request hit its own full blocks (19 tokens: 4 blocks, the last token never cached).
  for (size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(harness.prefix_hits.at(static_cast<SchedulerRequestId>(10 + i)), 16);
  // Another activated adapter hits the base blocks before its start's block (written by base-keyed requests).
  const SequenceSharing other{5, KvSharing::kActivated, 10};
  harness.add(30, cases[2].tokens, 4, "act2", other);
  harness.run_to_end();
  EXPECT_EQ(harness.prefix_hits.at(30), 8);
  EXPECT_EQ(harness.outputs.at(30), run_alone(cases[2].tokens, 4, "act2", other));
}

}  // namespace
}  // namespace loom
