// KvPools' host tier over both members, with the fake backend (no model):
// how --host-kv-memory is split between the main pool and the rCache pool,
// that each member's transfers run through the KvTransferWorker on its own
// backend pool (KvPoolKind) even when the members' transfer ids collide, that
// prefetch covers the rCache under one byte budget, and the host figures the
// engine's gauges report per kind.
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/kv_pools.h"
#include "engine/step_stats.h"
#include "scheduler_fake_backend.h"

namespace loom {
namespace {

using Tokens = std::vector<int32_t>;
constexpr int32_t kBlockSize = 4;
constexpr int32_t kRank = 8;
// The fake backend: 8 bytes per main token, 2 * rank per rCache token.
constexpr int64_t kMainBlockBytes = 8 * kBlockSize;               // 32
constexpr int64_t kResidualBlockBytes = 2 * kRank * kBlockSize;   // 64
constexpr int32_t kMainBlocks = 30;                               // 960 device bytes
constexpr int32_t kResidualBlocks = 5;                            // 320 device bytes: a quarter of them

EngineConfig config_with_host(int64_t host_bytes) {
  EngineConfig config;
  config.block_size = kBlockSize;
  config.num_kv_blocks = kMainBlocks;
  config.num_residual_kv_blocks = kResidualBlocks;
  config.max_lora_rank = kRank;
  config.host_kv_cache_bytes = host_bytes;
  return config;
}

KvPoolLayout layout_of(const KvPools& pools, bool with_residual = true) {
  return pools.layout(KvPoolSizing{with_residual, 0, kRank});
}

KvBlockCounts counts(int32_t main, int32_t residual) {
  KvBlockCounts blocks;
  blocks[KvCacheId::kMain] = main;
  blocks[KvCacheId::kResidual] = residual;
  return blocks;
}

ErrorKind error_kind_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& error) {
    return error.kind();
  }
  ADD_FAILURE() << "no loom::Error thrown";
  return ErrorKind::kInternal;
}

TEST(KvPoolsHostTierTest, TheHostBudgetIsSplitLikeTheDevicePools) {
  test::FakeBackend backend;
  auto host_blocks = [&](const EngineConfig& config, bool with_residual = true) {
    const KvPools pools(backend, config);
    return pools.num_host_blocks(layout_of(pools, with_residual));
  };
  EXPECT_EQ(host_blocks(config_with_host(0)), counts(0, 0));  // no host tier at all
  // Auto: 2560 bytes over 960 + 320 device bytes, twice each device pool.
  EXPECT_EQ(host_blocks(config_with_host(2560)), counts(2 * kMainBlocks, 2 * kResidualBlocks));
  EngineConfig config = config_with_host(2560);
  config.host_residual_kv_cache_bytes = 2 * kResidualBlockBytes;  // explicit share
  EXPECT_EQ(host_blocks(config), counts((2560 - 2 * kResidualBlockBytes) / kMainBlockBytes, 2));
  config.host_residual_kv_cache_bytes = 0;  // none for the rCache: the main pool gets it all
  EXPECT_EQ(host_blocks(config), counts(2560 / kMainBlockBytes, 0));
  // No rCache pool, or a backend without an rCache host tier: the main pool gets it all.
  EXPECT_EQ(host_blocks(config_with_host(2560), /*with_residual=*/false), counts(2560 / kMainBlockBytes, 0));
  backend.declares_residual_host_tier = false;
  EXPECT_EQ(host_blocks(config_with_host(2560)), counts(2560 / kMainBlockBytes, 0));
  backend.declares_residual_host_tier = true;
  // Block counts (tests): the main pool's exactly, the rCache's the same multiple of its pool or exactly.
  config = config_with_host(0);
  config.num_host_kv_blocks = 60;
  EXPECT_EQ(host_blocks(config), counts(60, 10));
  config.num_host_residual_kv_blocks = 7;
  EXPECT_EQ(host_blocks(config), counts(60, 7));
  // Refusals: a share over the budget, a share that holds no block, nothing left for the main pool.
  config = config_with_host(2560);
  config.host_residual_kv_cache_bytes = 2561;
  EXPECT_EQ(error_kind_of([&] { host_blocks(config); }), ErrorKind::kInvalidArgument);
  config.host_residual_kv_cache_bytes = kResidualBlockBytes - 1;
  EXPECT_EQ(error_kind_of([&] { host_blocks(config); }), ErrorKind::kCapacity);
  config.host_residual_kv_cache_bytes = 2560;
  EXPECT_EQ(error_kind_of([&] { host_blocks(config); }), ErrorKind::kCapacity);
}

// Commits `tokens` into member `id` under `key` (as a finished request would), planning backups.
void commit_blocks(KvCacheManager& member, const KvKey& key, const Tokens& tokens) {
  KvLease lease = member.lock_prefix(key, tokens);
  ASSERT_TRUE(member.allocate(lease, static_cast<int32_t>(tokens.size()) / kBlockSize - lease.num_blocks()));
  member.commit(lease, tokens, static_cast<int32_t>(tokens.size()));
}

struct Fixture {
  explicit Fixture(EngineConfig config) : pools(backend, config) { pools.allocate(layout_of(pools)); }
  ~Fixture() { EXPECT_EQ(pools.caches().integrity_error(), ""); }
  KvCacheManager& member(KvCacheId id) { return pools.caches()[id]; }
  // The copies the backend ran on `pool` in `direction`, their device block ids sorted.
  std::vector<std::vector<int32_t>> copies(KvPoolKind pool, KvCopyDirection direction) const {
    std::vector<std::vector<int32_t>> found;
    for (const test::FakeBackend::Copy& copy : backend.copies())
      if (copy.pool == pool && copy.direction == direction) {
        found.push_back(copy.device_block_ids);
        std::sort(found.back().begin(), found.back().end());
      }
    return found;
  }

  test::FakeBackend backend;
  KvPools pools;
};

const KvKey kBCacheKey = KvKey::single(kForkedBaseKvNamespace);
const KvKey kRCacheKey = KvKey::single(residual_kv_namespace("A"));

TEST(KvPoolsHostTierTest, EachMembersTransfersRunOnItsOwnPool) {
  Fixture f(config_with_host(2560));
  EXPECT_EQ(f.backend.num_host_kv_blocks(KvPoolKind::kMain), 2 * kMainBlocks);
  EXPECT_EQ(f.backend.num_host_kv_blocks(KvPoolKind::kResidual), 2 * kResidualBlocks);
  EXPECT_EQ(f.member(KvCacheId::kResidual).host_tier()->num_host_blocks(), 2 * kResidualBlocks);
  ASSERT_TRUE(f.pools.has_host_tier());

  // A forked request's 3 blocks in each member: each member plans its transfer 1.
  const Tokens tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  KvLease filler = f.member(KvCacheId::kMain).lock_prefix("base", Tokens{});
  ASSERT_TRUE(f.member(KvCacheId::kMain).allocate(filler, 2));  // so that main's block ids differ from the rCache's
  commit_blocks(f.member(KvCacheId::kMain), kBCacheKey, tokens);
  commit_blocks(f.member(KvCacheId::kResidual), kRCacheKey, tokens);
  std::vector<int32_t> main_blocks, residual_blocks;
  for (const RadixNode* node : f.member(KvCacheId::kMain).tree().match_any_tier(kBCacheKey, tokens))
    main_blocks.push_back(node->block_id);
  for (const RadixNode* node : f.member(KvCacheId::kResidual).tree().match_any_tier(kRCacheKey, tokens))
    residual_blocks.push_back(node->block_id);
  std::sort(main_blocks.begin(), main_blocks.end());
  std::sort(residual_blocks.begin(), residual_blocks.end());
  ASSERT_NE(main_blocks, residual_blocks);
  EXPECT_TRUE(f.pools.has_transfers_in_flight());
  f.pools.pump_transfers();
  f.pools.drain_transfers();
  EXPECT_FALSE(f.pools.has_transfers_in_flight());
  using BlockLists = std::vector<std::vector<int32_t>>;
  EXPECT_EQ(f.copies(KvPoolKind::kMain, KvCopyDirection::kDeviceToHost), BlockLists{main_blocks});
  EXPECT_EQ(f.copies(KvPoolKind::kResidual, KvCopyDirection::kDeviceToHost), BlockLists{residual_blocks});
  for (KvCacheId id : kAllKvCaches) EXPECT_EQ(f.member(id).stats().num_offloaded_blocks, 3) << kv_cache_name(id);

  // The rCache evicted to the host and loaded back on demand: a residual load only.
  f.member(KvCacheId::kResidual).evict_all_cached();
  ASSERT_EQ(f.member(KvCacheId::kResidual).prefix_location(kRCacheKey, tokens).num_host_tokens(), 12);
  const RequestKvKeys keys{kBCacheKey, residual_kv_namespace("A")};
  EXPECT_EQ(f.pools.caches().start_load(keys, tokens, counts(0, 3), KvCacheManager::LoadReason::kDemand), counts(0, 3));
  f.pools.pump_transfers();
  f.pools.drain_transfers();
  const std::vector<std::vector<int32_t>> loads = f.copies(KvPoolKind::kResidual, KvCopyDirection::kHostToDevice);
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_EQ(loads[0].size(), 3u);
  EXPECT_TRUE(f.copies(KvPoolKind::kMain, KvCopyDirection::kHostToDevice).empty());
  EXPECT_EQ(f.member(KvCacheId::kResidual).prefix_location(kRCacheKey, tokens).num_device_tokens(), 12);
  EXPECT_EQ(f.member(KvCacheId::kResidual).stats().num_loaded_blocks, 3);
  EXPECT_EQ(f.member(KvCacheId::kMain).stats().num_loaded_blocks, 0);
}

TEST(KvPoolsHostTierTest, PrefetchLoadsTheRCacheOfTheNextAgentWithinOneByteBudget) {
  EngineConfig config = config_with_host(2560);
  config.prefetch_agents = 1;
  config.prefetch_max_bytes = 3 * kMainBlockBytes + kResidualBlockBytes;  // the bCache prefix and one rCache block
  Fixture f(config);
  const Tokens tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const RequestKvKeys keys{kBCacheKey, residual_kv_namespace("A")};
  for (KvCacheId id : kAllKvCaches) commit_blocks(f.member(id), keys.key_in(id), tokens);
  f.pools.caches().set_agent_fixed_prefix("w/a", keys, tokens, 12);  // in both members
  f.pools.drain_transfers();  // the backups
  f.pools.caches().evict_all_cached();
  for (KvCacheId id : kAllKvCaches) ASSERT_EQ(f.member(id).prefix_location(keys.key_in(id), tokens).num_host_tokens(), 12);

  Scheduler scheduler(SchedulerConfig{}, f.pools.caches());  // it starts the prefetches (policy 8)
  scheduler.plan(f.pools.prefetch_request({{"w/a", 1}, {"w/b", kStepsFar}}));
  f.pools.drain_transfers();
  EXPECT_EQ(f.member(KvCacheId::kMain).stats().num_prefetched_blocks, 3);
  EXPECT_EQ(f.member(KvCacheId::kResidual).stats().num_prefetched_blocks, 1);  // what the budget left
  EXPECT_EQ(f.copies(KvPoolKind::kResidual, KvCopyDirection::kHostToDevice).size(), 1u);
  // The next step's prefetch takes the rest of the rCache prefix.
  scheduler.plan(f.pools.prefetch_request({{"w/a", 1}}));
  f.pools.drain_transfers();
  EXPECT_EQ(f.member(KvCacheId::kResidual).stats().num_prefetched_blocks, 3);
  EXPECT_EQ(f.member(KvCacheId::kResidual).prefix_location(keys.key_in(KvCacheId::kResidual), tokens).num_device_tokens(),
            12);
}

TEST(KvPoolsHostTierTest, GaugesReportHostBytesPerKindAndCountersOverBothMembers) {
  Fixture f(config_with_host(2560));
  const Tokens tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  commit_blocks(f.member(KvCacheId::kMain), kBCacheKey, tokens);
  commit_blocks(f.member(KvCacheId::kResidual), kRCacheKey, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  f.pools.drain_transfers();
  const PerKvCache<KvCacheStats> stats = f.pools.caches().stats();
  EXPECT_EQ(stats[KvCacheId::kMain].num_host_total_blocks, 2 * kMainBlocks);
  EXPECT_EQ(stats[KvCacheId::kResidual].num_host_total_blocks, 2 * kResidualBlocks);
  EXPECT_EQ(stats[KvCacheId::kMain].num_host_used_blocks, 2);
  EXPECT_EQ(stats[KvCacheId::kResidual].num_host_used_blocks, 3);

  EngineGauges gauges;
  gauges.kv_stats = stats;
  gauges.kv_bytes_per_block[KvCacheId::kMain] = f.pools.bytes_per_block(KvCacheId::kMain);
  gauges.kv_bytes_per_block[KvCacheId::kResidual] = f.pools.bytes_per_block(KvCacheId::kResidual);
  gauges.block_size = kBlockSize;
  EngineMetrics metrics;
  gauges.apply_to(metrics);
  EXPECT_EQ(metrics.kv_bytes_host, 2 * kMainBlockBytes);
  EXPECT_EQ(metrics.kv_bytes_host_residual, 3 * kResidualBlockBytes);
  EXPECT_EQ(metrics.num_offloaded_tokens, (2 + 3) * kBlockSize);
}

}  // namespace
}  // namespace loom
