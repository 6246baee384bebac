// KV cache manager: block pool, radix tree, leases, LRU eviction, integrity.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

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
  EXPECT_EQ(lease.num_found_tokens(), 4);
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


// Activated (aLoRA) keys: blocks before the invocation start's block are base
// blocks, shared both ways with base requests; later ones branch off.
class ActivatedKvTest : public ::testing::Test {
 protected:
  // 16 blocks of 16 tokens.
  KvCacheManager cache{16, 16};

  void TearDown() override { EXPECT_EQ(cache.integrity_error(), ""); }

  static std::vector<int32_t> prompt(int32_t length, int32_t seed) {
    std::vector<int32_t> tokens(static_cast<size_t>(length));
    std::iota(tokens.begin(), tokens.end(), seed * 1000);
    return tokens;
  }
  // Locks the cached prefix, allocates the rest, commits everything; returns the lease.
  KvLease compute(const KvKey& key, const std::vector<int32_t>& tokens) {
    KvLease lease = cache.lock_prefix(key, tokens);
    const int32_t needed = (static_cast<int32_t>(tokens.size()) + 15) / 16 - lease.num_blocks();
    EXPECT_TRUE(cache.allocate(lease, needed));
    cache.commit(lease, tokens, static_cast<int32_t>(tokens.size()));
    return lease;
  }
  std::map<std::string, int32_t> by_namespace() const { return cache.stats().num_blocks_by_namespace; }
};

TEST_F(ActivatedKvTest, ActivatedRequestReusesBaseBlocksBeforeItsStart) {
  const std::vector<int32_t> tokens = prompt(64, 1);
  compute(KvKey::single("base"), tokens).release();  // base blocks 0, 1, 2, 3

  const KvKey key = activated_kv_key("x", 37, 16);  // branches at block 2
  EXPECT_EQ(cache.num_cached_prefix_tokens(key, tokens), 32);
  KvLease lease = cache.lock_prefix(key, tokens);
  EXPECT_EQ(lease.num_found_tokens(), 32);
  EXPECT_EQ(lease.block_ids(), (Ids{0, 1}));
  EXPECT_EQ(lease.kv_key(), key);
  ASSERT_TRUE(cache.allocate(lease, 2));
  EXPECT_EQ(lease.block_ids(), (Ids{0, 1, 4, 5}));
  // Private blocks count under the namespace of their block index.
  EXPECT_EQ(by_namespace(), (std::map<std::string, int32_t>{{"alora/x@37", 2}, {"base", 4}}));
  cache.commit(lease, tokens, 64);
  EXPECT_EQ(by_namespace(), (std::map<std::string, int32_t>{{"alora/x@37", 2}, {"base", 4}}));
  lease.release();

  // The branch hangs under base block 1: found again by the same key, never by base.
  EXPECT_EQ(cache.num_cached_prefix_tokens(key, tokens), 64);
  EXPECT_EQ(cache.lock_prefix(key, tokens).block_ids(), (Ids{0, 1, 4, 5}));
  EXPECT_EQ(cache.lock_prefix("base", tokens).block_ids(), (Ids{0, 1, 2, 3}));
  EXPECT_EQ(cache.tree().node_of_block(4)->parent, cache.tree().node_of_block(1));
  EXPECT_EQ(cache.stats().num_cached_blocks, 6);
}

TEST_F(ActivatedKvTest, BaseRequestReusesTheActivatedRequestsPreInvocationBlocks) {
  const std::vector<int32_t> tokens = prompt(64, 2);
  const KvKey key = activated_kv_key("x", 37, 16);
  KvLease activated = compute(key, tokens);  // blocks 0, 1 (base) 2, 3 (branch)
  EXPECT_EQ(activated.block_ids(), (Ids{0, 1, 2, 3}));
  EXPECT_EQ(by_namespace(), (std::map<std::string, int32_t>{{"alora/x@37", 2}, {"base", 2}}));

  // While the activated request still runs, and after it finished.
  KvLease base = cache.lock_prefix("base", tokens);
  EXPECT_EQ(base.num_found_tokens(), 32);
  EXPECT_EQ(base.block_ids(), (Ids{0, 1}));
  ASSERT_TRUE(cache.allocate(base, 2));
  EXPECT_EQ(base.block_ids(), (Ids{0, 1, 4, 5}));
  cache.commit(base, tokens, 64);
  activated.release();
  base.release();
  EXPECT_EQ(cache.num_cached_prefix_tokens(KvKey::single("base"), tokens), 64);
  EXPECT_EQ(cache.num_cached_prefix_tokens(key, tokens), 64);
  EXPECT_EQ(cache.stats().num_cached_blocks, 6);
}

TEST_F(ActivatedKvTest, StartInsideABlockKeepsTheFullBlocksBeforeIt) {
  const std::vector<int32_t> tokens = prompt(80, 3);
  compute(KvKey::single("base"), tokens).release();  // blocks 0..4
  // Inside block 2: blocks 0, 1 reused; block-aligned at 48: blocks 0, 1, 2.
  EXPECT_EQ(cache.num_cached_prefix_tokens(activated_kv_key("x", 37, 16), tokens), 32);
  EXPECT_EQ(cache.num_cached_prefix_tokens(activated_kv_key("x", 48, 16), tokens), 48);
  EXPECT_EQ(cache.num_cached_prefix_tokens(activated_kv_key("x", 47, 16), tokens), 32);
  EXPECT_EQ(cache.num_cached_prefix_tokens(activated_kv_key("x", 5, 16), tokens), 0);
  // A prefix capped before the start sees base blocks only.
  EXPECT_EQ(cache.num_cached_prefix_tokens(activated_kv_key("x", 48, 16), std::span(tokens).first(47)), 32);
  EXPECT_EQ(compute(activated_kv_key("x", 48, 16), tokens).block_ids(), (Ids{0, 1, 2, 5, 6}));
}

TEST_F(ActivatedKvTest, StartsInOneBlockShareItOnlyAtTheSameOffset) {
  const std::vector<int32_t> tokens = prompt(48, 4);
  const KvKey at37 = activated_kv_key("x", 37, 16), at33 = activated_kv_key("x", 33, 16);
  EXPECT_EQ(compute(at37, tokens).block_ids(), (Ids{0, 1, 2}));
  EXPECT_EQ(compute(at33, tokens).block_ids(), (Ids{0, 1, 3}));  // its own block 2
  EXPECT_EQ(compute(at37, tokens).block_ids(), (Ids{0, 1, 2}));  // the same start shares it
  // Another adapter at the same start does not either.
  EXPECT_EQ(compute(activated_kv_key("y", 37, 16), tokens).block_ids(), (Ids{0, 1, 4}));
  EXPECT_EQ(by_namespace(),
            (std::map<std::string, int32_t>{{"alora/x@33", 1}, {"alora/x@37", 1}, {"alora/y@37", 1}, {"base", 2}}));
}

TEST_F(ActivatedKvTest, DropNamespacesRemovesBranchesAndKeepsBaseNodes) {
  const std::vector<int32_t> tokens = prompt(64, 5);
  compute(activated_kv_key("x", 37, 16), tokens).release();      // base 0, 1; alora/x@37 2, 3
  compute(activated_kv_key("x", 5, 16), tokens).release();       // alora/x@5 4..7 at its own root
  compute(activated_kv_key("y", 37, 16), tokens).release();      // alora/y@37 8, 9
  compute(KvKey::single(isolated_kv_namespace("x")), tokens).release();  // lora/x 10..13
  EXPECT_EQ(cache.stats().num_free_blocks, 2);

  auto belongs_to_x = [](const std::string& ns) { return kv_namespace_belongs_to_adapter(ns, "x"); };
  EXPECT_EQ(cache.drop_namespaces(belongs_to_x), 10);
  EXPECT_EQ(by_namespace(), (std::map<std::string, int32_t>{{"alora/y@37", 2}, {"base", 2}}));
  EXPECT_EQ(cache.stats().num_free_blocks, 12);
  EXPECT_EQ(cache.num_cached_prefix_tokens(KvKey::single("base"), tokens), 32);
  EXPECT_EQ(cache.num_cached_prefix_tokens(activated_kv_key("x", 37, 16), tokens), 32);
  EXPECT_EQ(cache.num_cached_prefix_tokens(activated_kv_key("y", 37, 16), tokens), 64);
  // Dropping base takes the branches hanging under it.
  EXPECT_EQ(cache.drop_namespace("base"), 4);
  EXPECT_EQ(cache.stats().num_free_blocks, 16);
  EXPECT_TRUE(by_namespace().empty());
}

TEST_F(ActivatedKvTest, EvictionTakesBranchLeavesBeforeTheBaseBlocksTheyHangFrom) {
  const std::vector<int32_t> tokens = prompt(64, 6);
  compute(activated_kv_key("x", 37, 16), tokens).release();  // 0, 1 base; 2, 3 branch
  KvLease filler = cache.lock_prefix("base", std::vector<int32_t>{});
  ASSERT_TRUE(cache.allocate(filler, 13));  // 4..15 free, then the branch leaf 3 is evicted
  EXPECT_EQ(filler.block_ids().front(), 3);
  ASSERT_TRUE(cache.allocate(filler, 1));
  EXPECT_EQ(filler.block_ids().back(), 2);
  EXPECT_EQ(cache.num_cached_prefix_tokens(KvKey::single("base"), tokens), 32);
}

}  // namespace
}  // namespace loom
