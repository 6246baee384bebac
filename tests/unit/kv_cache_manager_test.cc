// KV cache manager: block pool, radix tree, leases, LRU eviction, integrity.
#include <gtest/gtest.h>

#include "kv/kv_cache_manager.h"

namespace loom {
namespace {

using Ids = std::vector<int32_t>;

class KvCacheManagerTest : public ::testing::Test {
 protected:
  // 6 blocks of 2 tokens.
  KvCacheManager cache{6, 2};

  void TearDown() override { EXPECT_EQ(cache.integrity_error(), ""); }

  // A lease over `tokens`, fully computed and committed (the cached prefix is reused).
  KvLease compute(const std::string& ns, const std::vector<int32_t>& tokens) {
    KvLease lease = cache.lock_prefix(ns, tokens);
    const int32_t needed = (static_cast<int32_t>(tokens.size()) + 1) / 2 - lease.num_blocks();
    EXPECT_TRUE(cache.allocate(lease, needed));
    cache.commit(lease, tokens, static_cast<int32_t>(tokens.size()));
    return lease;
  }
};

TEST_F(KvCacheManagerTest, AllocatesLowestIdsAndCountsEveryBlock) {
  KvLease lease = cache.lock_prefix("base", std::vector<int32_t>{1, 2, 3});
  EXPECT_EQ(lease.num_blocks(), 0);
  ASSERT_TRUE(cache.allocate(lease, 2));
  EXPECT_EQ(lease.block_ids(), (Ids{0, 1}));
  KvCacheStats stats = cache.stats();
  EXPECT_EQ(stats.num_free_blocks, 4);
  EXPECT_EQ(stats.num_in_use_blocks, 2);
  EXPECT_EQ(stats.num_cached_blocks, 0);
  // Only the first block is full: one node; the partial block stays private.
  cache.commit(lease, std::vector<int32_t>{1, 2, 3}, 3);
  EXPECT_EQ(lease.num_committed_blocks(), 1);
  EXPECT_EQ(cache.tree().num_nodes(), 1);
  lease.release();
  stats = cache.stats();
  EXPECT_EQ(stats.num_free_blocks, 5);
  EXPECT_EQ(stats.num_cached_blocks, 1);
  EXPECT_EQ(stats.num_in_use_blocks, 0);
}

TEST_F(KvCacheManagerTest, SecondRequestWithTheSamePrefixHits) {
  compute("base", {1, 2, 3, 4, 5}).release();  // blocks 0 [1,2], 1 [3,4] cached; 2 (partial) freed
  EXPECT_EQ(cache.num_cached_prefix_tokens("base", std::vector<int32_t>{1, 2, 3, 4, 9, 9}), 4);
  EXPECT_EQ(cache.num_cached_prefix_tokens("base", std::vector<int32_t>{1, 2, 7, 4}), 2);
  KvLease lease = cache.lock_prefix("base", std::vector<int32_t>{1, 2, 3, 4, 9});
  EXPECT_EQ(lease.num_cached_tokens(), 4);
  EXPECT_EQ(lease.block_ids(), (Ids{0, 1}));
  ASSERT_TRUE(cache.allocate(lease, 1));
  EXPECT_EQ(lease.block_ids(), (Ids{0, 1, 2}));
  EXPECT_EQ(cache.stats().num_in_use_blocks, 3);
}

TEST_F(KvCacheManagerTest, NamespacesDoNotShareBlocks) {
  compute("base", {1, 2, 3, 4}).release();
  EXPECT_EQ(cache.num_cached_prefix_tokens("lora/a", std::vector<int32_t>{1, 2, 3, 4}), 0);
  compute("lora/a", {1, 2, 3, 4}).release();
  EXPECT_EQ(cache.stats().num_cached_blocks, 4);
  EXPECT_EQ(cache.drop_namespace("lora/a"), 2);
  EXPECT_EQ(cache.num_cached_prefix_tokens("base", std::vector<int32_t>{1, 2, 3, 4}), 4);
  EXPECT_EQ(cache.stats().num_free_blocks, 4);
}

TEST_F(KvCacheManagerTest, EvictsLeastRecentlyUsedLeavesFirst) {
  compute("base", {1, 1, 2, 2}).release();  // blocks 0 <- 1 (chain), released first
  compute("base", {3, 3}).release();        // block 2
  compute("base", {4, 4}).release();        // block 3
  EXPECT_EQ(cache.stats().num_cached_blocks, 4);
  // Touch [3,3]: now the chain is the least recently used.
  cache.lock_prefix("base", std::vector<int32_t>{3, 3}).release();

  KvLease lease = cache.lock_prefix("base", std::vector<int32_t>{});
  ASSERT_TRUE(cache.allocate(lease, 3));  // 2 free (4, 5) + 1 evicted: the chain's leaf, block 1
  EXPECT_EQ(lease.block_ids(), (Ids{1, 4, 5}));
  EXPECT_EQ(cache.num_cached_prefix_tokens("base", std::vector<int32_t>{1, 1, 2, 2}), 2);
  ASSERT_TRUE(cache.allocate(lease, 1));  // then the chain's root, block 0
  EXPECT_EQ(lease.block_ids().back(), 0);
  ASSERT_TRUE(cache.allocate(lease, 1));  // then [4,4] (block 3), older than the touched [3,3]
  EXPECT_EQ(lease.block_ids().back(), 3);
  EXPECT_EQ(cache.num_cached_prefix_tokens("base", std::vector<int32_t>{3, 3}), 2);
  EXPECT_EQ(cache.stats().num_evicted_blocks, 3);
}

TEST_F(KvCacheManagerTest, LockedNodesSurviveEviction) {
  KvLease held = compute("base", {1, 1, 2, 2});  // blocks 0, 1 in the tree and in use
  compute("base", {3, 3}).release();             // block 2 cached
  EXPECT_FALSE(cache.can_allocate(5));
  KvLease other = cache.lock_prefix("base", std::vector<int32_t>{});
  EXPECT_FALSE(cache.allocate(other, 5));  // no room: nothing changes
  EXPECT_EQ(other.num_blocks(), 0);
  EXPECT_EQ(cache.stats().num_cached_blocks, 1);
  ASSERT_TRUE(cache.allocate(other, 4));
  EXPECT_EQ(other.block_ids(), (Ids{2, 3, 4, 5}));
  EXPECT_EQ(cache.num_cached_prefix_tokens("base", std::vector<int32_t>{1, 1, 2, 2}), 4);
  EXPECT_FALSE(cache.can_allocate(1));
  held.release();  // now cached, so reclaimable
  EXPECT_TRUE(cache.can_allocate(2));
}

TEST_F(KvCacheManagerTest, DuplicateCommitAdoptsTheTreeBlock) {
  KvLease first = cache.lock_prefix("base", std::vector<int32_t>{});
  KvLease second = cache.lock_prefix("base", std::vector<int32_t>{});
  ASSERT_TRUE(cache.allocate(first, 2));   // 0, 1
  ASSERT_TRUE(cache.allocate(second, 2));  // 2, 3
  cache.commit(first, std::vector<int32_t>{5, 6, 7, 8}, 4);
  cache.commit(second, std::vector<int32_t>{5, 6, 7, 8}, 4);
  EXPECT_EQ(second.block_ids(), (Ids{0, 1}));
  EXPECT_EQ(cache.stats().num_free_blocks, 4);
  EXPECT_EQ(cache.integrity_error(), "");
  first.release();
  EXPECT_EQ(cache.stats().num_in_use_blocks, 2);
  second.release();
  EXPECT_EQ(cache.stats().num_cached_blocks, 2);
}

TEST_F(KvCacheManagerTest, MovedLeaseReleasesOnce) {
  KvLease lease = compute("base", {1, 2, 3});
  KvLease moved = std::move(lease);
  EXPECT_FALSE(lease.active());
  EXPECT_EQ(moved.num_blocks(), 2);
  { KvLease sink = std::move(moved); }
  EXPECT_EQ(cache.stats().num_in_use_blocks, 0);
  EXPECT_EQ(cache.evict_all_cached(), 1);
  EXPECT_EQ(cache.stats().num_free_blocks, 6);
}

}  // namespace
}  // namespace loom
