// The forked rCache's host tier through the scheduler (scheduler.h policy 6
// in every member): a forked request whose rCache prefix was evicted to the
// host waits while it loads and then hits its whole prefix in both members;
// the bCache and the rCache load together when both were evicted; a failed
// rCache load recomputes. The fake backend's device K/V of a pool are
// scrambled after the eviction, so a hit can only be right if the host copy
// of that pool really came back.
#include <gtest/gtest.h>

#include <algorithm>
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
constexpr int32_t kSlot = 0;  // the forked adapter's slot

Tokens prompt(int32_t length, int32_t seed) {
  Tokens tokens;
  for (int32_t i = 0; i < length; ++i) tokens.push_back((seed * 29 + i * 11 + 5) % test::FakeBackend::kVocabSize);
  return tokens;
}

KvPoolKind pool_of(KvCacheId id) { return id == KvCacheId::kMain ? KvPoolKind::kMain : KvPoolKind::kResidual; }

// Drives scheduler, group and fake backend the way the engine does, for
// requests of one forked adapter "A"; the test decides when planned
// transfers run (copy + finish_transfer in their member).
class Harness {
 public:
  // num_host_blocks == 0: no host tier in either member.
  Harness(int32_t num_blocks, int32_t num_host_blocks)
      : kv_caches(num_blocks, num_blocks, kBlockSize), scheduler(config(), kv_caches) {
    backend.allocate_kv_cache({num_blocks, kBlockSize});
    backend.allocate_residual_cache({num_blocks, kBlockSize, 8});
    if (num_host_blocks > 0) {
      backend.allocate_host_kv_cache(KvPoolKind::kMain, num_host_blocks);
      backend.allocate_host_kv_cache(KvPoolKind::kResidual, num_host_blocks);
      KvBlockCounts host_blocks;
      host_blocks[KvCacheId::kMain] = host_blocks[KvCacheId::kResidual] = num_host_blocks;
      kv_caches.enable_host_tier(host_blocks);
    }
  }
  ~Harness() { EXPECT_EQ(kv_caches.integrity_error(), ""); }

  static SchedulerConfig config() {
    SchedulerConfig config;
    config.max_batch_tokens = 64;
    return config;
  }

  void add(SchedulerRequestId id, const Tokens& tokens, int32_t max_new_tokens) {
    max_new_tokens_[id] = max_new_tokens;
    scheduler.add(id, tokens, "A", RequestKvKeys{KvKey::single(kForkedBaseKvNamespace), residual_kv_namespace("A")},
                  0);
  }

  // Takes every planned transfer; runs (copies + finishes) those of `kind`
  // now and keeps the others pending. `succeed` = false finishes them as failed.
  void run_transfers(std::optional<Kind> kind = std::nullopt, bool succeed = true) {
    for (auto& planned : kv_caches.take_transfers()) pending_.push_back(std::move(planned));
    std::vector<KvCacheGroup::MemberTransfer> keep;
    for (auto& planned : pending_) {
      const KvCacheManager::Transfer& transfer = planned.transfer;
      if (kind && transfer.kind != *kind) {
        keep.push_back(std::move(planned));
        continue;
      }
      if (succeed)
        backend.copy_kv_blocks(pool_of(planned.cache),
                               transfer.kind == Kind::kOffload ? KvCopyDirection::kDeviceToHost
                                                               : KvCopyDirection::kHostToDevice,
                               transfer.device_block_ids, transfer.host_block_ids);
      kv_caches.finish_transfer(planned.cache, transfer.id, succeed);
    }
    pending_ = std::move(keep);
  }

  ScheduledBatch step() {
    ScheduledBatch plan = scheduler.plan();
    if (!plan.empty()) {
      const Batch batch = build_batch(plan, scheduler, [](SchedulerRequestId) {
        return SequenceSharing{kSlot, KvSharing::kForked, 0};
      });
      const ForwardResult result = backend.forward(batch);
      scheduler.complete_step(plan);
      for (const ScheduledRequest& entry : plan.requests)
        if (entry.num_prefix_hit_tokens >= 0) admitted[entry.id] = entry;
      test::take_greedy_tokens(scheduler, plan, result, outputs, max_new_tokens_);
    }
    EXPECT_EQ(kv_caches.integrity_error(), "");
    return plan;
  }
  // Steps (running transfers as they come) until nothing is left.
  void run_to_completion() {
    for (int i = 0; i < 1000 && scheduler.has_work(); ++i) {
      step();
      run_transfers();
    }
    ASSERT_FALSE(scheduler.has_work());
  }

  // Runs `tokens` once and backs every committed block of both members up to the host.
  void warm_up(const Tokens& tokens) {
    add(100, tokens, 1);
    run_to_completion();
    run_transfers();
  }
  // Evicts `member`'s cached blocks to the host and forgets its device K/V.
  void evict_to_host(KvCacheId member) {
    kv_caches[member].evict_all_cached();
    backend.scramble_kv(pool_of(member));
    EXPECT_EQ(kv_caches[member].stats().num_cached_blocks, 0);
  }
  PrefixLocation status(KvCacheId member, const Tokens& tokens) {
    const KvKey key = member == KvCacheId::kMain ? KvKey::single(kForkedBaseKvNamespace)
                                                 : KvKey::single(residual_kv_namespace("A"));
    return kv_caches[member].prefix_location(key, tokens);
  }

  KvCacheGroup kv_caches;
  Scheduler scheduler;
  test::FakeBackend backend;
  std::map<SchedulerRequestId, Tokens> outputs;
  std::map<SchedulerRequestId, ScheduledRequest> admitted;  // each request's entry in the step that admitted it

 private:
  std::map<SchedulerRequestId, int32_t> max_new_tokens_;
  std::vector<KvCacheGroup::MemberTransfer> pending_;
};

// What a forked request generates on a fresh cache (no reuse at all).
Tokens reference_output(const Tokens& tokens, int32_t max_new_tokens) {
  Harness fresh(64, 0);
  fresh.add(1, tokens, max_new_tokens);
  fresh.run_to_completion();
  return fresh.outputs.at(1);
}

Tokens with_suffix(Tokens tokens, const Tokens& suffix) {
  tokens.insert(tokens.end(), suffix.begin(), suffix.end());
  return tokens;
}

TEST(SchedulerResidualHostTierTest, RCacheOnTheHostLoadsBackWhileTheBCacheStaysAndBothHit) {
  Harness h(/*num_blocks=*/16, /*num_host_blocks=*/16);
  const Tokens shared = prompt(12, 1);  // 3 blocks in each member
  h.warm_up(shared);
  EXPECT_EQ(h.kv_caches[KvCacheId::kResidual].stats().num_offloaded_blocks, 3);
  h.evict_to_host(KvCacheId::kResidual);
  EXPECT_EQ(h.status(KvCacheId::kResidual, shared).num_host_tokens(), 12);
  EXPECT_EQ(h.status(KvCacheId::kMain, shared).num_device_tokens(), 12);

  const Tokens request = with_suffix(shared, {5, 6, 7});
  h.add(1, request, 3);
  ScheduledBatch plan = h.step();  // its rCache prefix starts loading; it waits
  EXPECT_EQ(plan.waiting_on_load, std::vector<SchedulerRequestId>{1});
  EXPECT_TRUE(plan.requests.empty());
  EXPECT_EQ(h.status(KvCacheId::kResidual, shared).num_loading_tokens(), 12);
  h.run_transfers(Kind::kOffload);  // the load stays in flight
  plan = h.step();                  // still loading: it waits again
  EXPECT_EQ(plan.waiting_on_load, std::vector<SchedulerRequestId>{1});

  h.run_transfers();  // the load lands
  plan = h.step();
  EXPECT_TRUE(plan.waiting_on_load.empty());
  const ScheduledRequest& entry = h.admitted.at(1);
  EXPECT_EQ(entry.num_prefix_hit_tokens, 12);  // the rCache came from the host, not recomputed
  EXPECT_EQ(entry.num_computed_tokens, 12);
  EXPECT_EQ(entry.num_residual_present_tokens, 12);
  h.run_to_completion();
  EXPECT_EQ(h.outputs.at(1), reference_output(request, 3));
  EXPECT_EQ(h.kv_caches[KvCacheId::kResidual].stats().num_loaded_blocks, 3);
  EXPECT_EQ(h.kv_caches[KvCacheId::kMain].stats().num_loaded_blocks, 0);  // the bCache never left the device
}

TEST(SchedulerResidualHostTierTest, BCacheAndRCacheLoadTogether) {
  Harness h(16, 16);
  const Tokens shared = prompt(12, 2);
  h.warm_up(shared);
  h.evict_to_host(KvCacheId::kMain);
  h.evict_to_host(KvCacheId::kResidual);

  const Tokens request = with_suffix(shared, {9});
  h.add(1, request, 2);
  h.add(2, prompt(6, 3), 2);  // arrives later, nothing cached: passes the waiting one
  const ScheduledBatch plan = h.step();
  EXPECT_EQ(plan.waiting_on_load, std::vector<SchedulerRequestId>{1});
  ASSERT_EQ(plan.requests.size(), 1u);
  EXPECT_EQ(plan.requests[0].id, 2);
  EXPECT_EQ(h.status(KvCacheId::kMain, shared).num_loading_tokens(), 12);
  EXPECT_EQ(h.status(KvCacheId::kResidual, shared).num_loading_tokens(), 12);
  h.run_to_completion();
  EXPECT_EQ(h.admitted.at(1).num_prefix_hit_tokens, 12);
  EXPECT_EQ(h.outputs.at(1), reference_output(request, 2));
  EXPECT_EQ(h.outputs.at(2), reference_output(prompt(6, 3), 2));
  for (KvCacheId member : kAllKvCaches) EXPECT_EQ(h.kv_caches[member].stats().num_loaded_blocks, 3);
}

TEST(SchedulerResidualHostTierTest, FailedRCacheLoadRecomputesWithTheBCacheStillPresent) {
  Harness h(16, 16);
  const Tokens shared = prompt(12, 4);
  h.warm_up(shared);
  h.evict_to_host(KvCacheId::kResidual);
  const Tokens request = with_suffix(shared, {3});
  h.add(1, request, 2);
  EXPECT_EQ(h.step().waiting_on_load, std::vector<SchedulerRequestId>{1});
  h.run_transfers(std::nullopt, /*succeed=*/false);
  EXPECT_TRUE(h.step().waiting_on_load.empty());
  const ScheduledRequest& entry = h.admitted.at(1);
  EXPECT_EQ(entry.num_prefix_hit_tokens, 0);       // the suspect rCache copies are gone: recompute
  EXPECT_EQ(entry.num_kv_present_tokens, 12);      // ... writing only the rCache (the bCache is there)
  EXPECT_EQ(entry.num_residual_present_tokens, 0);
  h.run_to_completion();
  EXPECT_EQ(h.outputs.at(1), reference_output(request, 2));
  EXPECT_EQ(h.kv_caches[KvCacheId::kResidual].stats().num_failed_transfers, 1);
}

// Without a host tier the rCache evicted is simply lost: the baseline the tests above improve on.
TEST(SchedulerResidualHostTierTest, WithoutAHostTierAnEvictedRCacheIsRecomputed) {
  Harness h(16, 0);
  const Tokens shared = prompt(12, 5);
  h.warm_up(shared);
  h.evict_to_host(KvCacheId::kResidual);
  EXPECT_EQ(h.status(KvCacheId::kResidual, shared).num_host_tokens(), 0);
  const Tokens request = with_suffix(shared, {8});
  h.add(1, request, 2);
  EXPECT_TRUE(h.step().waiting_on_load.empty());
  EXPECT_EQ(h.admitted.at(1).num_prefix_hit_tokens, 0);
  h.run_to_completion();
  EXPECT_EQ(h.outputs.at(1), reference_output(request, 2));
}

}  // namespace
}  // namespace loom
