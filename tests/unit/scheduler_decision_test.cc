// Schedule, then apply: schedule() changes nothing and decides exactly what
// apply() then does (its ledger of free + cached blocks agrees with the cache
// through preemptions, shared prefixes and the forked residual member), and a
// step never evicts a prefix it admits a request onto.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "scheduler/scheduler.h"

namespace loom {
namespace {

using Tokens = std::vector<int32_t>;

// Everything schedule() could disturb, in comparable form.
struct CacheState {
  PerKvCache<std::vector<int32_t>> eviction_order;
  PerKvCache<int32_t> num_free_blocks, num_cached_blocks;
  bool operator==(const CacheState&) const = default;
};

CacheState cache_state(const KvCacheGroup& kv_caches) {
  CacheState state;
  kv_caches.for_each([&](KvCacheId id, const KvCacheManager& member) {
    state.eviction_order[id] = member.eviction_order();
    state.num_free_blocks[id] = member.stats().num_free_blocks;
    state.num_cached_blocks[id] = member.stats().num_cached_blocks;
  });
  return state;
}

bool same_actions(const SchedulerDecision& a, const SchedulerDecision& b) {
  if (a.actions.size() != b.actions.size()) return false;
  for (size_t i = 0; i < a.actions.size(); ++i) {
    const SchedulerAction& x = a.actions[i];
    const SchedulerAction& y = b.actions[i];
    if (x.kind != y.kind || x.id != y.id || x.num_new_tokens != y.num_new_tokens ||
        x.num_computed_tokens != y.num_computed_tokens || !(x.num_new_blocks == y.num_new_blocks) ||
        !(x.num_found_blocks == y.num_found_blocks) ||
        x.num_load_blocks != y.num_load_blocks)
      return false;
  }
  return true;
}

// Random requests over few shared prefixes, some forked, in pools small enough
// that steps preempt and evict; every step's decision is checked for purity
// and applied (apply() checks each action against the cache as it goes).
// With a host tier, transfers finish a step or two late (some fail), so
// requests wait on loads and start demand loads too.
class SchedulerDecisionTest : public ::testing::TestWithParam<bool> {};

TEST_P(SchedulerDecisionTest, ScheduleIsPureAndApplyCarriesItOutUnderPressure) {
  const bool with_host_tier = GetParam();
  PerKvCache<int64_t> num_loads_started;  // over all seeds: both members' loads were exercised
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    std::mt19937 rng(seed);
    const int32_t block_size = 4;
    KvCacheGroup kv_caches(10 + static_cast<int32_t>(seed % 5), 8, block_size);
    kv_caches.set_eviction_policy(seed % 2 ? KvEvictionPolicy::kWorkflow : KvEvictionPolicy::kLru);
    if (with_host_tier) {  // both members: forked requests wait on and load their rCache too
      KvBlockCounts num_host_blocks;
      num_host_blocks[KvCacheId::kMain] = 6 + static_cast<int32_t>(seed % 7);
      num_host_blocks[KvCacheId::kResidual] = 3 + static_cast<int32_t>(seed % 6);
      kv_caches.enable_host_tier(num_host_blocks);
    }
    std::vector<KvCacheGroup::MemberTransfer> in_flight;
    Scheduler scheduler(SchedulerConfig{12, 6, 3}, kv_caches);
    std::vector<Tokens> prefixes;
    for (int32_t p = 0; p < 3; ++p) {
      Tokens prefix;
      for (int32_t i = 0; i < 8; ++i) prefix.push_back(static_cast<int32_t>(rng() % 50));
      prefixes.push_back(prefix);
    }
    std::map<SchedulerRequestId, int32_t> num_left;
    SchedulerRequestId next_id = 1;
    int64_t num_steps = 0;
    for (int guard = 0; guard < 600 && (next_id <= 30 || scheduler.has_work()); ++guard) {
      if (next_id <= 30 && rng() % 2 == 0) {
        Tokens tokens = prefixes[rng() % prefixes.size()];
        for (uint32_t i = 0, n = 1 + rng() % 9; i < n; ++i) tokens.push_back(static_cast<int32_t>(rng() % 50));
        const uint32_t kind = rng() % 4;  // forked, activated (an aLoRA branch), isolated, base
        const bool forked = kind == 0;
        const std::string adapter = kind == 0 ? "f" + std::to_string(rng() % 2) : kind == 1 ? "x" : kind == 2 ? "a" : "";
        RequestKvKeys keys{forked ? KvKey::single("fork") : KvKey::single(kv_namespace_for_adapter(adapter)),
                           forked ? residual_kv_namespace(adapter) : ""};
        if (kind == 1) keys.key = activated_kv_key(adapter, 5 + static_cast<int32_t>(rng() % 6), block_size);
        scheduler.add(next_id, tokens, adapter, keys, static_cast<int32_t>(rng() % 3));
        num_left[next_id++] = 1 + static_cast<int32_t>(rng() % 6);
      }
      if (!scheduler.has_work()) {
        for (const auto& planned : in_flight) kv_caches.finish_transfer(planned.cache, planned.transfer.id, true);
        in_flight.clear();
        continue;
      }
      const CacheState before = cache_state(kv_caches);
      const SchedulerDecision decision = scheduler.schedule();
      ASSERT_TRUE(cache_state(kv_caches) == before) << "seed " << seed;
      ASSERT_TRUE(same_actions(scheduler.schedule(), decision)) << "seed " << seed;
      const ScheduledBatch batch = scheduler.apply(decision);
      ++num_steps;
      scheduler.complete_step(batch);
      for (const ScheduledRequest& entry : batch.requests) {
        if (!entry.samples_next_token) continue;
        if (--num_left.at(entry.id) == 0)
          scheduler.finish(entry.id);
        else
          scheduler.append_token(entry.id, static_cast<int32_t>(entry.id % 50));
      }
      std::vector<KvCacheGroup::MemberTransfer> still_in_flight;
      for (auto& planned : in_flight) {
        if (rng() % 3 == 0)
          still_in_flight.push_back(std::move(planned));
        else
          kv_caches.finish_transfer(planned.cache, planned.transfer.id, rng() % 8 != 0);
      }
      in_flight = std::move(still_in_flight);
      for (auto& planned : kv_caches.take_transfers()) {
        if (planned.transfer.kind == KvCacheManager::Transfer::Kind::kLoad) ++num_loads_started[planned.cache];
        in_flight.push_back(std::move(planned));
      }
      if (guard % 5 == 0) kv_caches.evict_all_cached();  // push prefixes to the host
      ASSERT_EQ(kv_caches.integrity_error(), "") << "seed " << seed;
    }
    for (const auto& planned : in_flight) kv_caches.finish_transfer(planned.cache, planned.transfer.id, true);
    EXPECT_FALSE(scheduler.has_work()) << "seed " << seed;
    EXPECT_GT(num_steps, 0);
  }
  if (with_host_tier) {
    for (KvCacheId id : kAllKvCaches) EXPECT_GT(num_loads_started[id], 0) << kv_cache_name(id);
  }
}

INSTANTIATE_TEST_SUITE_P(HostTier, SchedulerDecisionTest, ::testing::Bool());

// A running request's growth and a waiting request's admission in one step,
// with no free block: the growth evicts another cached prefix, never the one
// the admitted request reuses (it is held while the step is applied).
TEST(SchedulerDecisionStepTest, AStepDoesNotEvictThePrefixItAdmitsARequestOnto) {
  const int32_t block_size = 4;
  KvCacheGroup kv_caches(7, 0, block_size);
  KvCacheManager& cache = kv_caches.main();
  const Tokens shared = {1, 2, 3, 4, 5, 6, 7, 8};
  const Tokens other = {9, 10, 11, 12, 13, 14, 15, 16};
  for (const Tokens& tokens : {shared, other}) {  // shared is cached first: least recently used
    KvLease lease = cache.lock_prefix("base", tokens);
    ASSERT_TRUE(cache.allocate(lease, 2));
    cache.commit(lease, tokens, 8);
  }
  Scheduler scheduler(SchedulerConfig{9, 8, 8}, kv_caches);
  Tokens long_prompt;
  for (int32_t i = 0; i < 16; ++i) long_prompt.push_back(20 + i);
  scheduler.add(1, long_prompt, "", "base", 0);
  ScheduledBatch first = scheduler.plan();  // 9 of 16 tokens: 3 blocks, the last free ones
  ASSERT_EQ(first.requests.size(), 1u);
  EXPECT_EQ(first.requests[0].block_ids, (std::vector<int32_t>{4, 5, 6}));
  scheduler.complete_step(first);
  ASSERT_EQ(cache.stats().num_free_blocks, 0);

  Tokens reuse = shared;
  reuse.push_back(99);
  scheduler.add(2, reuse, "", "base", 0);
  const ScheduledBatch second = scheduler.plan();
  ASSERT_EQ(second.requests.size(), 2u);
  EXPECT_EQ(second.requests[0].id, 1);
  EXPECT_EQ(second.requests[1].id, 2);
  EXPECT_EQ(second.requests[1].num_prefix_hit_tokens, 8);
  EXPECT_EQ(second.requests[1].block_ids, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(second.requests[0].block_ids, (std::vector<int32_t>{4, 5, 6, 3}));
  EXPECT_EQ(cache.num_cached_prefix_tokens("base", other), 0);
  scheduler.complete_step(second);
  scheduler.finish(1);
  scheduler.finish(2);
  EXPECT_EQ(kv_caches.integrity_error(), "");
}

// A step whose earlier allocation needs every cached block, the waiting
// request's own prefix included: it does without that prefix (the oldest
// blocks) and is still admitted for what the budget leaves, as when the
// allocation had evicted the prefix first.
TEST(SchedulerDecisionStepTest, AnAdmissionGivesUpThePrefixTheStepsAllocationsNeed) {
  const int32_t block_size = 4;
  KvCacheGroup kv_caches(5, 0, block_size);
  KvCacheManager& cache = kv_caches.main();
  const Tokens shared = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const Tokens other = {21, 22, 23, 24, 25, 26, 27, 28};
  for (const Tokens& tokens : {shared, other}) {  // shared is cached first: least recently used
    KvLease lease = cache.lock_prefix("base", tokens);
    ASSERT_TRUE(cache.allocate(lease, static_cast<int32_t>(tokens.size()) / block_size));
    cache.commit(lease, tokens, static_cast<int32_t>(tokens.size()));
  }
  ASSERT_EQ(cache.stats().num_cached_blocks, 5);
  Scheduler scheduler(SchedulerConfig{20, 8, 8}, kv_caches);
  Tokens first;
  for (int32_t i = 0; i < 16; ++i) first.push_back(40 + i);
  scheduler.add(1, first, "", "base", 0);  // 16 new tokens: 4 of the 5 blocks
  Tokens reuse = shared;
  reuse.push_back(99);
  scheduler.add(2, reuse, "", "base", 0);  // the 4 tokens of budget left: one block
  const ScheduledBatch batch = scheduler.plan();
  ASSERT_EQ(batch.requests.size(), 2u);
  EXPECT_EQ(batch.requests[0].num_new_tokens, 16);
  EXPECT_EQ(batch.requests[1].id, 2);
  EXPECT_EQ(batch.requests[1].num_prefix_hit_tokens, 0);
  EXPECT_EQ(batch.requests[1].num_new_tokens, 4);
  scheduler.complete_step(batch);
  scheduler.finish(1);
  scheduler.finish(2);
  EXPECT_EQ(kv_caches.integrity_error(), "");
}

}  // namespace
}  // namespace loom
