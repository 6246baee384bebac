// Swap preemption (scheduler.h policies 4 under PreemptionMode::kSwap, and 9):
// a preempted request's private blocks go to the host tier and it resumes
// where it was, computing no token twice, with the tokens it generates alone;
// swaps that cannot happen (no host tier, no host room, a failed copy) recompute
// and are counted; nothing leaks. The fake backend's K/V depend on every slot
// read, and the victim's freed blocks are reused by the other request, so a
// resume is right only if the host copies really came back.
#include <gtest/gtest.h>

#include <map>
#include <optional>

#include "engine/batch_builder.h"
#include "scheduler/scheduler.h"
#include "scheduler_fake_backend.h"
#include "scheduler_test_util.h"

namespace loom {
namespace {

using Tokens = std::vector<int32_t>;
using Kind = KvCacheManager::Transfer::Kind;
constexpr int32_t kBlockSize = 4;

Tokens prompt(int32_t length, int32_t seed) {
  Tokens tokens;
  for (int32_t i = 0; i < length; ++i) tokens.push_back((seed * 31 + i * 7 + 1) % test::FakeBackend::kVocabSize);
  return tokens;
}

// Drives scheduler, cache and fake backend as the engine does; planned
// transfers run after each step unless a test holds them.
class Harness {
 public:
  Harness(int32_t num_blocks, int32_t num_host_blocks, PreemptionMode mode,
          HostLoadPolicy policy = HostLoadPolicy::kBackground)
      : kv_caches(num_blocks, 0, kBlockSize), scheduler(config(mode, policy), kv_caches) {
    backend.allocate_kv_cache({num_blocks, kBlockSize});
    if (num_host_blocks > 0) {
      backend.allocate_host_kv_cache(KvPoolKind::kMain, num_host_blocks);
      cache.enable_host_tier(num_host_blocks);
    }
  }
  ~Harness() { EXPECT_EQ(cache.integrity_error(), ""); }

  static SchedulerConfig config(PreemptionMode mode, HostLoadPolicy policy) {
    SchedulerConfig config;
    config.max_batch_tokens = 64;
    config.host_load_policy = policy;
    config.preemption_mode = mode;
    return config;
  }

  void add(SchedulerRequestId id, const Tokens& tokens, int32_t max_new_tokens) {
    max_new_tokens_[id] = max_new_tokens;
    scheduler.add(id, tokens, "", kv_namespace_for_adapter(""), 0);
  }

  // Runs (copies + finishes) every planned transfer; `fail_loads`: loads fail.
  void run_transfers(bool fail_loads = false) {
    for (const auto& transfer : cache.take_transfers()) {
      const bool succeed = !(fail_loads && transfer.kind == Kind::kLoad);
      if (succeed)
        backend.copy_kv_blocks(KvPoolKind::kMain,
                               transfer.kind == Kind::kOffload ? KvCopyDirection::kDeviceToHost
                                                               : KvCopyDirection::kHostToDevice,
                               transfer.device_block_ids, transfer.host_block_ids);
      cache.finish_transfer(transfer.id, succeed);
    }
  }

  ScheduledBatch step(bool fail_loads = false) {
    ScheduledBatch plan = scheduler.plan();
    while (!plan.blocked_on_load.empty()) {  // kBlocking: the step waits for the copies, as the engine does
      run_transfers(fail_loads);
      plan = scheduler.resume_after_loads(std::move(plan));
    }
    if (!plan.empty()) {
      const Batch batch = build_batch(plan, scheduler, [](SchedulerRequestId) { return -1; });
      const ForwardResult result = backend.forward(batch);
      scheduler.complete_step(plan);
      for (const ScheduledRequest& entry : plan.requests) {
        num_computed[entry.id] += entry.num_new_tokens;
        if (entry.num_computed_tokens == 0) ++num_starts_from_zero[entry.id];
      }
      test::take_greedy_tokens(scheduler, plan, result, outputs, max_new_tokens_);
    }
    for (SchedulerRequestId id : plan.preempted) ++num_preempted[id];
    run_transfers(fail_loads);
    EXPECT_EQ(cache.integrity_error(), "");
    return plan;
  }
  void run_to_completion() {
    for (int i = 0; i < 1000 && scheduler.has_work(); ++i) step();
    ASSERT_FALSE(scheduler.has_work());
  }

  // After every request ended: the pools are as they started (cached blocks aside, which evict).
  void expect_no_leaks() {
    const KvCacheStats stats = cache.stats();
    EXPECT_EQ(stats.num_in_use_blocks, 0);
    EXPECT_EQ(stats.num_host_swap_blocks, 0);
    EXPECT_EQ(cache.num_transfers_in_flight(), 0);
    cache.evict_all_cached();
    EXPECT_EQ(cache.stats().num_free_blocks, cache.num_total_blocks());
    if (cache.host_tier() != nullptr) {
      EXPECT_EQ(cache.host_tier()->swap_space().num_swaps(), 0);
    }
  }

  KvCacheGroup kv_caches;
  KvCacheManager& cache = kv_caches.main();
  Scheduler scheduler;
  test::FakeBackend backend;
  std::map<SchedulerRequestId, Tokens> outputs;
  std::map<SchedulerRequestId, int32_t> num_computed;          // tokens each request's steps computed
  std::map<SchedulerRequestId, int32_t> num_starts_from_zero;  // steps computing from token 0
  std::map<SchedulerRequestId, int32_t> num_preempted;

 private:
  std::map<SchedulerRequestId, int32_t> max_new_tokens_;
};

Tokens run_alone(const Tokens& tokens, int32_t max_new_tokens) {
  Harness alone(64, 0, PreemptionMode::kRecompute);
  alone.add(1, tokens, max_new_tokens);
  alone.run_to_completion();
  return alone.outputs.at(1);
}

// 6 device blocks of 4: requests of 11 and 9 prompt tokens growing by 11 cannot both fit. 1 needs
// its fourth block first (at 12 tokens), when 2, the victim, holds 10: a partial block to swap.
constexpr int32_t kPromptLength = 9, kFirstPromptLength = 11, kNewTokens = 11;
constexpr int32_t kTokensOnce = kPromptLength + kNewTokens - 1;  // each token computed once (the last is not fed)

void add_two(Harness& h) {
  h.add(1, prompt(kFirstPromptLength, 4), kNewTokens);
  h.add(2, prompt(kPromptLength, 5), kNewTokens);
}

void expect_alone_outputs(Harness& h) {
  EXPECT_EQ(h.outputs.at(1), run_alone(prompt(kFirstPromptLength, 4), kNewTokens));
  EXPECT_EQ(h.outputs.at(2), run_alone(prompt(kPromptLength, 5), kNewTokens));
}

TEST(SchedulerSwapTest, SwappedRequestResumesWithoutRecomputingAndMatches) {
  Harness h(6, 32, PreemptionMode::kSwap);
  add_two(h);
  h.run_to_completion();
  EXPECT_GT(h.scheduler.num_swap_preemptions(), 0);
  EXPECT_EQ(h.scheduler.num_preemptions(), h.scheduler.num_swap_preemptions());
  EXPECT_EQ(h.scheduler.num_swap_fallbacks(), 0);
  EXPECT_GT(h.num_preempted[2], 0);
  // Nothing computed twice: the prompt once, each generated token once.
  EXPECT_EQ(h.num_computed.at(1), kFirstPromptLength + kNewTokens - 1);
  EXPECT_EQ(h.num_computed.at(2), kTokensOnce);
  EXPECT_EQ(h.num_starts_from_zero.at(2), 1);
  EXPECT_GT(h.cache.stats().num_swapped_out_blocks, 0);
  EXPECT_EQ(h.cache.stats().num_swapped_in_blocks, h.cache.stats().num_swapped_out_blocks);
  expect_alone_outputs(h);
  h.expect_no_leaks();
}

TEST(SchedulerSwapTest, RecomputeComputesThePreemptedPromptAgainWithTheSameTokens) {
  Harness h(6, 32, PreemptionMode::kRecompute);
  add_two(h);
  h.run_to_completion();
  EXPECT_GT(h.scheduler.num_preemptions(), 0);
  EXPECT_EQ(h.scheduler.num_swap_preemptions(), 0);
  EXPECT_EQ(h.scheduler.num_swap_fallbacks(), 0);  // recompute was asked: no fallback
  EXPECT_GT(h.num_preempted.at(2), 0);
  EXPECT_EQ(h.num_computed.at(1), kFirstPromptLength + kNewTokens - 1);
  EXPECT_GT(h.num_computed.at(2), kTokensOnce);  // readmitted from token 0: it re-hits its full blocks only
  expect_alone_outputs(h);
  h.expect_no_leaks();
}

TEST(SchedulerSwapTest, BlockingHostLoadsWaitForTheSwapInAndMatch) {
  Harness h(6, 32, PreemptionMode::kSwap, HostLoadPolicy::kBlocking);
  add_two(h);
  h.run_to_completion();
  EXPECT_GT(h.scheduler.num_swap_preemptions(), 0);
  EXPECT_EQ(h.scheduler.num_swap_fallbacks(), 0);
  EXPECT_EQ(h.num_computed.at(2), kTokensOnce);
  expect_alone_outputs(h);
  h.expect_no_leaks();
}

TEST(SchedulerSwapTest, SwapInWaitsWhileItsCopyIsInFlightAndOthersRun) {
  Harness h(6, 32, PreemptionMode::kSwap);
  add_two(h);
  // Step until 2 is swapped out, then until it starts swapping in.
  int guard = 0;
  while (h.scheduler.num_swapped() == 0 && ++guard < 100) h.step();
  ASSERT_EQ(h.scheduler.num_swapped(), 1);
  bool saw_wait = false;
  while (h.scheduler.contains(1) && ++guard < 200) {
    ScheduledBatch plan = h.scheduler.plan();
    if (!plan.waiting_on_load.empty()) {  // its swap-in started: 2 waits, the step runs without it
      EXPECT_EQ(plan.waiting_on_load, std::vector<SchedulerRequestId>{2});
      for (const ScheduledRequest& entry : plan.requests) EXPECT_NE(entry.id, 2);
      EXPECT_FALSE(h.scheduler.is_running(2));
      saw_wait = true;
      break;
    }
    // Not yet: run this plan as step() would (1 runs alone).
    const Batch batch = build_batch(plan, h.scheduler, [](SchedulerRequestId) { return -1; });
    const ForwardResult result = h.backend.forward(batch);
    h.scheduler.complete_step(plan);
    std::map<SchedulerRequestId, int32_t> max_new{{1, kNewTokens}, {2, kNewTokens}};
    test::take_greedy_tokens(h.scheduler, plan, result, h.outputs, max_new);
    h.run_transfers();
  }
  EXPECT_TRUE(saw_wait);
  h.run_to_completion();
  EXPECT_EQ(h.scheduler.num_swap_fallbacks(), 0);
  expect_alone_outputs(h);
  h.expect_no_leaks();
}

TEST(SchedulerSwapTest, WithoutAHostTierSwapFallsBackToRecomputeAndCountsIt) {
  Harness h(6, 0, PreemptionMode::kSwap);
  add_two(h);
  h.run_to_completion();
  EXPECT_GT(h.scheduler.num_preemptions(), 0);
  EXPECT_EQ(h.scheduler.num_swap_preemptions(), 0);
  EXPECT_EQ(h.scheduler.num_swap_fallbacks(), h.scheduler.num_preemptions());
  expect_alone_outputs(h);
  h.expect_no_leaks();
}

TEST(SchedulerSwapTest, AFullHostTierFallsBackToRecomputeAndCountsIt) {
  // One host block: a swap takes it (evicting a backup) while the other request is also preempted.
  Harness h(7, 1, PreemptionMode::kSwap);
  add_two(h);
  h.add(3, prompt(kPromptLength, 6), kNewTokens);
  h.run_to_completion();
  EXPECT_GT(h.scheduler.num_swap_fallbacks(), 0);  // at swap-out (no host room) or swap-in (prefix evicted)
  EXPECT_GT(h.scheduler.num_swap_preemptions(), 0);  // the one host block held its private block
  expect_alone_outputs(h);
  EXPECT_EQ(h.outputs.at(3), run_alone(prompt(kPromptLength, 6), kNewTokens));
  h.expect_no_leaks();
}

TEST(SchedulerSwapTest, AFailedSwapInRecomputesWithTheSameTokens) {
  Harness h(6, 32, PreemptionMode::kSwap);
  add_two(h);
  int guard = 0;
  while (h.scheduler.num_swapped() == 0 && ++guard < 100) h.step();
  ASSERT_EQ(h.scheduler.num_swapped(), 1);
  // Every load fails from now on until 2 fell back (its swap-in, or the loads of its committed prefix).
  while (h.scheduler.num_swap_fallbacks() == 0 && h.scheduler.has_work() && ++guard < 200) h.step(/*fail_loads=*/true);
  EXPECT_EQ(h.scheduler.num_swap_fallbacks(), 1);
  h.run_to_completion();
  expect_alone_outputs(h);
  h.expect_no_leaks();
}

// The swap space takes free host blocks, then host-only backups, never more than there are.
TEST(SchedulerSwapTest, SwapOutRefusesWhatTheHostPoolCannotTake) {
  KvCacheManager cache(8, kBlockSize);
  cache.enable_host_tier(2);
  KvLease lease = cache.lock_prefix("base", Tokens{});
  ASSERT_TRUE(cache.allocate(lease, 3));
  HostSwapSpace& swaps = cache.host_tier()->swap_space();
  EXPECT_FALSE(swaps.swap_out(lease.block_ids()).has_value());  // 3 private blocks, 2 host blocks
  EXPECT_EQ(cache.integrity_error(), "");
  const std::optional<int64_t> first = swaps.swap_out(std::span<const int32_t>(lease.block_ids()).first(2));
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(swaps.state(*first), HostSwapSpace::State::kSwappingOut);
  EXPECT_FALSE(swaps.swap_out(std::span<const int32_t>(lease.block_ids()).subspan(2)).has_value());  // pool held
  lease.release();  // its first two blocks stay pinned by the copy
  EXPECT_EQ(cache.integrity_error(), "");
  EXPECT_EQ(cache.stats().num_in_use_blocks, 2);
  for (const auto& transfer : cache.take_transfers()) cache.finish_transfer(transfer.id, true);
  EXPECT_EQ(swaps.state(*first), HostSwapSpace::State::kOnHost);
  EXPECT_EQ(cache.stats().num_in_use_blocks, 0);
  swaps.drop(*first);
  EXPECT_EQ(cache.stats().num_host_used_blocks, 0);
  EXPECT_EQ(cache.integrity_error(), "");
}

TEST(SchedulerSwapTest, CancelledWhileSwappedLeaksNothing) {
  Harness h(6, 32, PreemptionMode::kSwap);
  add_two(h);
  int guard = 0;
  while (h.scheduler.num_swapped() == 0 && ++guard < 100) h.step();
  ASSERT_EQ(h.scheduler.num_swapped(), 1);
  EXPECT_TRUE(h.scheduler.finish(2));
  EXPECT_EQ(h.cache.integrity_error(), "");
  h.run_to_completion();
  EXPECT_EQ(h.outputs.at(1), run_alone(prompt(kFirstPromptLength, 4), kNewTokens));
  h.expect_no_leaks();
}

}  // namespace
}  // namespace loom
