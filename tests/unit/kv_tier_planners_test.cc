// The tiers beside KvCacheManager (kv/host_tier_planner.h,
// kv/disk_tier_planner.h), PrefixLocation (kv/prefix_location.h), the
// capacity ledger's loads by host block, and the scheduler's decisions that
// carry disk reads and prefetches (policies 7 and 8), applied only by apply().
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "kv/kv_cache_group.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_capacity_ledger.h"
#include "kv_test_tokens.h"
#include "scheduler/scheduler.h"

namespace loom {
namespace {

constexpr int32_t kBlock = test::kKvTestBlock;
using Tokens = test::KvTestTokens;
using test::block_tokens;
using Kind = KvTransfer::Kind;

class FakeDirectory : public KvBlockDirectory {
 public:
  bool contains(const KvBlockHash& hash) override { return blocks.count(hash) != 0; }
  std::set<KvBlockHash> blocks;
};

const KvKey kKey = KvKey::single("base");

// Computes and commits tokens, releases the lease, finishes every transfer
// (offloads "write" the blocks they name into `directory` when given).
void run(KvCacheManager& kv, const Tokens& tokens, FakeDirectory* directory = nullptr) {
  KvLease lease = kv.lock_prefix(kKey, tokens);
  ASSERT_TRUE(kv.allocate(lease, static_cast<int32_t>(tokens.size()) / kBlock - lease.num_blocks()));
  kv.commit(lease, tokens, static_cast<int32_t>(tokens.size()));
  lease.release();
  for (const KvTransfer& transfer : kv.take_transfers()) {
    if (directory != nullptr)
      for (const KvBlockHash& hash : transfer.block_hashes) directory->blocks.insert(hash);
    kv.finish_transfer(transfer.id, true);
  }
  ASSERT_EQ(kv.integrity_error(), "");
}

void enable_disk(KvCacheManager& kv, FakeDirectory& directory) {
  kv.enable_block_hashes({hash_string("model"), [](const std::string& ns) { return hash_string(ns); }});
  kv.enable_disk_tier({&directory});
}

TEST(PrefixLocationTest, CountsEachTierAndNamesTheHostBlocksALoadWouldFetch) {
  KvCacheManager kv(8, kBlock);
  kv.enable_host_tier(8);
  const Tokens tokens = block_tokens(0, 3);
  run(kv, tokens);
  PrefixLocation location = kv.prefix_location(kKey, tokens);
  EXPECT_EQ(location.num_device_blocks(), 3);
  EXPECT_EQ(location.device_block_ids, kv.lock_prefix(kKey, tokens).block_ids());
  EXPECT_TRUE(location.host_block_ids.empty());

  kv.evict_all_cached();  // backed up: all three move to the host
  location = kv.prefix_location(kKey, tokens);
  EXPECT_EQ(location.num_device_blocks(), 0);
  ASSERT_EQ(location.num_host_blocks(), 3);
  std::vector<int32_t> host_blocks;
  for (const RadixNode* node : kv.tree().match_any_tier(kKey, tokens)) host_blocks.push_back(node->host_block_id);
  EXPECT_EQ(location.host_block_ids, host_blocks);
  EXPECT_EQ(location.num_host_tokens(), 12);

  ASSERT_EQ(kv.host_tier()->start_load(kKey, tokens, 2), 2);
  location = kv.prefix_location(kKey, tokens);
  EXPECT_EQ(location.num_loading_blocks, 2);
  EXPECT_EQ(location.num_loading_tokens(), 8);
  EXPECT_EQ(location.host_block_ids, std::vector<int32_t>{host_blocks[2]});
  for (const KvTransfer& transfer : kv.take_transfers()) kv.finish_transfer(transfer.id, true);
  location = kv.prefix_location(kKey, tokens);
  EXPECT_EQ(location.num_device_blocks(), 2);
  EXPECT_EQ(location.num_loading_blocks, 0);
  EXPECT_EQ(location.num_host_blocks(), 1);
  EXPECT_EQ(kv.integrity_error(), "");
}

TEST(PrefixLocationTest, LooksOnDiskOnlyWhenAsked) {
  FakeDirectory directory;
  KvCacheManager writer(8, kBlock);
  writer.enable_host_tier(8);
  enable_disk(writer, directory);
  const Tokens tokens = block_tokens(0, 3);
  run(writer, tokens, &directory);
  KvCacheManager reader(8, kBlock);
  reader.enable_host_tier(8);
  enable_disk(reader, directory);
  EXPECT_EQ(reader.prefix_location(kKey, tokens, PrefixLookup::kTree).num_disk_blocks, 0);
  EXPECT_EQ(reader.prefix_location(kKey, tokens).num_disk_blocks, 3);
  ASSERT_EQ(reader.disk_tier()->start_read(kKey, tokens, 2), 2);
  const PrefixLocation location = reader.prefix_location(kKey, tokens);
  EXPECT_EQ(location.num_reading_blocks, 2);
  EXPECT_EQ(location.num_disk_blocks, 1);
  EXPECT_EQ(location.num_loading_tokens(), 8);  // a request waits on reads as on loads
  EXPECT_EQ(location.num_disk_tokens(), 4);
}

TEST(KvTierPlannersTest, EachTierOwnsItsTransfersAndTheManagerMergesThemInPlanningOrder) {
  FakeDirectory directory;
  KvCacheManager writer(8, kBlock);
  writer.enable_host_tier(8);
  enable_disk(writer, directory);
  const Tokens on_disk = block_tokens(0, 2), on_host = block_tokens(100, 2);
  run(writer, on_disk, &directory);
  KvCacheManager kv(8, kBlock);
  kv.enable_host_tier(8);
  enable_disk(kv, directory);
  run(kv, on_host);
  kv.evict_all_cached();
  ASSERT_EQ(kv.disk_tier()->start_read(kKey, on_disk, 8), 2);
  ASSERT_EQ(kv.host_tier()->start_load(kKey, on_host, 8), 2);
  EXPECT_EQ(kv.disk_tier()->num_transfers_in_flight(), 1);
  EXPECT_EQ(kv.host_tier()->num_transfers_in_flight(), 1);
  const std::vector<KvTransfer> transfers = kv.take_transfers();
  ASSERT_EQ(transfers.size(), 2u);
  EXPECT_EQ(transfers[0].kind, Kind::kDiskRead);
  EXPECT_EQ(transfers[1].kind, Kind::kLoad);
  EXPECT_LT(transfers[0].id, transfers[1].id);
  EXPECT_TRUE(kv.disk_tier()->owns(transfers[0].id));
  EXPECT_FALSE(kv.host_tier()->owns(transfers[0].id));
  EXPECT_TRUE(kv.host_tier()->owns(transfers[1].id));
  EXPECT_EQ(kv.disk_tier()->held_host_blocks(), transfers[0].host_block_ids);
  EXPECT_EQ(kv.integrity_error(), "");
  kv.finish_transfer(transfers[1].id, true);
  kv.finish_transfer(transfers[0].id, true);
  EXPECT_EQ(kv.num_transfers_in_flight(), 0);
  EXPECT_EQ(kv.prefix_location(kKey, on_disk).num_host_blocks(), 2);  // the read joined the tree
  EXPECT_EQ(kv.prefix_location(kKey, on_host).num_device_blocks(), 2);
  EXPECT_EQ(kv.stats().num_disk_read_blocks, 2);
  EXPECT_EQ(kv.stats().num_loaded_blocks, 2);
  EXPECT_EQ(kv.integrity_error(), "");
}

TEST(KvTierPlannersTest, TouchPrefixMarksUsedWithoutHolding) {
  KvCacheManager kv(4, kBlock);
  const Tokens a = block_tokens(0, 2), b = block_tokens(100, 2);
  run(kv, a);
  run(kv, b);
  const std::vector<int32_t> a_blocks = kv.prefix_location(kKey, a).device_block_ids;
  EXPECT_EQ(kv.eviction_order().front(), a_blocks.back());  // a is older
  kv.touch_prefix(kKey, a);
  for (int32_t block : a_blocks) EXPECT_EQ(kv.block_ref_count(block), 0);
  EXPECT_EQ(kv.num_available_blocks(), 4);
  const std::vector<int32_t> order = kv.eviction_order();
  EXPECT_EQ(order.back(), a_blocks.front());  // now the newest
  EXPECT_EQ(order.front(), kv.prefix_location(kKey, b).device_block_ids.back());
}

TEST(KvTierPlannersTest, LatePrefetchesAreCountedOnlyWhenAsked) {
  KvCacheManager kv(4, kBlock);
  kv.enable_host_tier(4);
  const Tokens a = block_tokens(0, 2);
  run(kv, a);
  kv.set_agent_fixed_prefix("w/a", kKey, a, 8);
  kv.evict_all_cached();
  ASSERT_EQ(kv.prefetch_agent("w/a", 8), 2);
  EXPECT_EQ(kv.prefix_location(kKey, a).num_loading_blocks, 2);  // a query: counts nothing
  EXPECT_EQ(kv.stats().num_prefetch_late_blocks, 0);
  kv.count_late_prefetch(kKey, a);
  kv.count_late_prefetch(kKey, a);
  EXPECT_EQ(kv.stats().num_prefetch_late_blocks, 2);  // once per block
}

TEST(KvCapacityLedgerTest, APlannedLoadMarksItsHostBlocksLoading) {
  KvCacheGroup group(8, 0, kBlock);
  group.enable_host_tier({{8, 0}});
  const Tokens a = block_tokens(0, 2);
  run(group.main(), a);
  group.evict_all_cached();
  const PrefixLocation location = group.main().prefix_location(kKey, a);
  ASSERT_EQ(location.num_host_blocks(), 2);
  KvCapacityLedger ledger(group);
  EXPECT_FALSE(ledger.is_loading(KvCacheId::kMain, location));
  ledger.mark_loading(KvCacheId::kMain, location.host_block_ids[1]);
  EXPECT_FALSE(ledger.is_loading(KvCacheId::kMain, location));  // the first block is what a request waits on
  ledger.mark_loading(KvCacheId::kMain, location.host_block_ids[0]);
  EXPECT_TRUE(ledger.is_loading(KvCacheId::kMain, location));
  EXPECT_EQ(group.num_transfers_in_flight(), 0);  // the ledger changes nothing
}

TEST(SchedulerTierActionsTest, DiskReadsArePlannedThenApplied) {
  FakeDirectory directory;
  KvCacheManager writer(8, kBlock);
  writer.enable_host_tier(8);
  enable_disk(writer, directory);
  const Tokens prompt = block_tokens(0, 4);
  run(writer, prompt, &directory);
  KvCacheGroup group(16, 0, kBlock);
  group.enable_host_tier({{8, 0}});
  enable_disk(group.main(), directory);
  Scheduler scheduler(SchedulerConfig{}, group);
  scheduler.add(1, prompt, "", "base", 0);
  scheduler.add(2, block_tokens(1000, 2), "", "base", 1);
  const SchedulerDecision walk = scheduler.schedule_disk_reads();
  EXPECT_TRUE(walk.starts_disk_walk);
  ASSERT_EQ(walk.actions.size(), 2u);  // rank order
  EXPECT_EQ(walk.actions[0].kind, SchedulerAction::Kind::kReadFromDisk);
  EXPECT_EQ(walk.actions[0].id, 1);
  EXPECT_EQ(walk.actions[1].id, 2);
  EXPECT_EQ(group.num_transfers_in_flight(), 0);  // deciding starts nothing
  const ScheduledBatch applied = scheduler.apply(walk);
  EXPECT_EQ(applied.num_disk_read_blocks, 3);  // the last token is not looked up
  EXPECT_TRUE(applied.requests.empty());
  EXPECT_EQ(group.num_transfers_in_flight(), 1);
  EXPECT_EQ(group.integrity_error(), "");
}

TEST(SchedulerTierActionsTest, PrefetchesRideOnTheDecisionAndStartInApply) {
  KvCacheGroup group(8, 0, kBlock);
  group.enable_host_tier({{8, 0}});
  const Tokens a = block_tokens(0, 2);
  run(group.main(), a);
  group.main().set_agent_fixed_prefix("w/a", kKey, a, 8);
  group.evict_all_cached();
  Scheduler scheduler(SchedulerConfig{}, group);
  PrefetchRequest prefetch;
  prefetch.agent_keys = {"w/a"};
  prefetch.max_bytes = 1000;
  prefetch.bytes_per_block[KvCacheId::kMain] = 1000;  // the budget holds one block
  const SchedulerDecision decision = scheduler.schedule(prefetch);
  EXPECT_EQ(decision.prefetch.agent_keys, std::vector<std::string>{"w/a"});
  EXPECT_EQ(group.num_transfers_in_flight(), 0);
  scheduler.apply(decision);
  const std::vector<KvCacheGroup::MemberTransfer> transfers = group.take_transfers();
  ASSERT_EQ(transfers.size(), 1u);
  EXPECT_EQ(transfers[0].transfer.kind, Kind::kLoad);
  EXPECT_EQ(transfers[0].transfer.reason, KvLoadReason::kPrefetch);
  EXPECT_EQ(transfers[0].transfer.device_block_ids.size(), 1u);
}

TEST(SchedulerTierActionsTest, WithoutAHostTierNothingIsPrefetched) {
  KvCacheGroup group(8, 0, kBlock);
  Scheduler scheduler(SchedulerConfig{}, group);
  PrefetchRequest prefetch;
  prefetch.agent_keys = {"w/a"};
  prefetch.max_bytes = 1000;
  prefetch.bytes_per_block[KvCacheId::kMain] = 10;
  EXPECT_TRUE(scheduler.schedule(prefetch).prefetch.agent_keys.empty());
}

}  // namespace
}  // namespace loom
