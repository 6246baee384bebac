// KV cache manager host tier (KVFlow / HiCache): write-through
// offloads at commit, eviction to the host, demand loads and prefetches,
// failed transfers, a full host pool, and the KVFlow cyclic workflow with a
// host tier. Transfers are finished by hand (the engine's worker would copy).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "kv_test_tokens.h"

namespace loom {
namespace {

constexpr int32_t kBlock = test::kKvTestBlock;
using Ids = std::vector<int32_t>;
using Tokens = test::KvTestTokens;
using test::block_tokens;
using test::concat;
using Kind = KvCacheManager::Transfer::Kind;
using Reason = KvCacheManager::LoadReason;
using Policy = KvCacheManager::EvictionPolicy;
using Status = PrefixLocation;

// {device, loading, host} tokens.
std::vector<int32_t> as_vector(const Status& status) {
  return {status.num_device_tokens(), status.num_loading_tokens(), status.num_host_tokens()};
}

class HostTierCache {
 public:
  HostTierCache(int32_t num_blocks, int32_t num_host_blocks, Policy policy = Policy::kLru) : kv(num_blocks, kBlock) {
    kv.set_eviction_policy(policy);
    if (num_host_blocks > 0) kv.enable_host_tier(num_host_blocks);
  }

  // Locks the cached prefix, allocates the rest, commits it all.
  KvLease compute(const Tokens& tokens) {
    KvLease lease = kv.lock_prefix(key, tokens);
    EXPECT_TRUE(kv.allocate(lease, static_cast<int32_t>(tokens.size()) / kBlock - lease.num_blocks()));
    kv.commit(lease, tokens, static_cast<int32_t>(tokens.size()));
    EXPECT_EQ(kv.integrity_error(), "");
    return lease;
  }
  // compute + release + every transfer finished.
  void run(const Tokens& tokens) {
    compute(tokens).release();
    finish_all(true);
  }
  std::vector<KvCacheManager::Transfer> take() {
    auto transfers = kv.take_transfers();
    EXPECT_EQ(kv.integrity_error(), "");
    return transfers;
  }
  void finish_all(bool succeeded) {
    for (const auto& transfer : kv.take_transfers()) {
      kv.finish_transfer(transfer.id, succeeded);
      EXPECT_EQ(kv.integrity_error(), "");
    }
    EXPECT_EQ(kv.num_transfers_in_flight(), 0);
  }
  Status status(const Tokens& tokens) { return kv.prefix_location(key, tokens); }
  // The host tier's start_load (0 without one).
  int32_t start_load(const Tokens& tokens, int32_t max_blocks, Reason reason = Reason::kDemand) {
    return kv.host_tier() != nullptr ? kv.host_tier()->start_load(key, tokens, max_blocks, reason) : 0;
  }
  std::vector<RadixNode*> path(const Tokens& tokens) const { return kv.tree().match_any_tier(key, tokens); }
  Ids device_ids(const Tokens& tokens) const {
    Ids ids;
    for (const RadixNode* node : path(tokens)) ids.push_back(node->block_id);
    return ids;
  }
  Ids host_ids(const Tokens& tokens) const {
    Ids ids;
    for (const RadixNode* node : path(tokens)) ids.push_back(node->host_block_id);
    return ids;
  }
  std::vector<KvTier> tiers(const Tokens& tokens) const {
    std::vector<KvTier> out;
    for (const RadixNode* node : path(tokens)) out.push_back(node->tier);
    return out;
  }
  void mark(const std::string& agent, const Tokens& fixed) {
    kv.set_agent_fixed_prefix(agent, key, fixed, static_cast<int32_t>(fixed.size()));
    EXPECT_EQ(kv.integrity_error(), "");
  }

  KvCacheManager kv;
  KvKey key = KvKey::single(kBaseKvNamespace);
};

constexpr KvTier kDev = KvTier::kDevice;
constexpr KvTier kHost = KvTier::kHost;

TEST(KvHostTierTest, OffloadEvictLoadRoundTrip) {
  HostTierCache cache(4, 8);
  const Tokens a = block_tokens(1000, 3), b = block_tokens(2000, 4);
  KvLease lease = cache.compute(a);
  EXPECT_EQ(lease.block_ids(), (Ids{0, 1, 2}));
  auto transfers = cache.take();
  ASSERT_EQ(transfers.size(), 1u);
  EXPECT_EQ(transfers[0].kind, Kind::kOffload);
  EXPECT_EQ(transfers[0].device_block_ids, (Ids{0, 1, 2}));
  EXPECT_EQ(transfers[0].host_block_ids, (Ids{0, 1, 2}));
  EXPECT_TRUE(cache.take().empty());  // taken once
  for (const RadixNode* node : cache.path(a)) EXPECT_EQ(node->state, KvNodeState::kOffloading);
  // Offloading blocks are final: they match.
  EXPECT_EQ(cache.kv.num_cached_prefix_tokens(cache.key, a), 12);
  EXPECT_EQ(cache.kv.stats().num_host_used_blocks, 3);
  cache.kv.finish_transfer(transfers[0].id, true);
  lease.release();
  EXPECT_EQ(cache.kv.integrity_error(), "");
  EXPECT_EQ(cache.host_ids(a), (Ids{0, 1, 2}));
  KvCacheStats stats = cache.kv.stats();
  EXPECT_EQ(stats.num_offloaded_blocks, 3);
  EXPECT_EQ(stats.num_cached_blocks, 3);
  EXPECT_EQ(stats.num_host_total_blocks, 8);
  EXPECT_EQ(stats.num_host_used_blocks, 3);
  EXPECT_EQ(stats.num_host_only_blocks, 0);

  // b needs the whole pool: a's blocks are evicted (leaf first) and stay on the host.
  lease = cache.compute(b);
  EXPECT_EQ(lease.block_ids(), (Ids{0, 1, 2, 3}));
  EXPECT_EQ(cache.tiers(a), (std::vector<KvTier>{kHost, kHost, kHost}));
  EXPECT_EQ(cache.device_ids(a), (Ids{-1, -1, -1}));
  EXPECT_EQ(as_vector(cache.status(a)), (std::vector<int32_t>{0, 0, 12}));
  EXPECT_EQ(cache.kv.lock_prefix(cache.key, a).num_blocks(), 0);
  stats = cache.kv.stats();
  EXPECT_EQ(stats.num_evicted_blocks, 3);
  EXPECT_EQ(stats.num_host_only_blocks, 3);
  transfers = cache.take();
  ASSERT_EQ(transfers.size(), 1u);
  EXPECT_EQ(transfers[0].host_block_ids, (Ids{3, 4, 5, 6}));
  cache.kv.finish_transfer(transfers[0].id, true);
  lease.release();
  EXPECT_EQ(cache.kv.integrity_error(), "");

  // Demand load: b's blocks 3, 2, 1 go to the host (b's leaf first), a loads into 1, 2, 3.
  EXPECT_EQ(cache.start_load(a, 3, Reason::kDemand), 3);
  EXPECT_EQ(cache.kv.integrity_error(), "");
  EXPECT_EQ(cache.tiers(b), (std::vector<KvTier>{kDev, kHost, kHost, kHost}));
  EXPECT_EQ(as_vector(cache.status(a)), (std::vector<int32_t>{0, 12, 0}));
  EXPECT_EQ(cache.start_load(a, 3, Reason::kDemand), 0);  // already loading
  EXPECT_EQ(cache.kv.lock_prefix(cache.key, a).num_blocks(), 0);
  EXPECT_EQ(cache.kv.stats().num_in_use_blocks, 3);  // the loading blocks are pinned
  transfers = cache.take();
  ASSERT_EQ(transfers.size(), 1u);
  EXPECT_EQ(transfers[0].kind, Kind::kLoad);
  EXPECT_EQ(transfers[0].reason, Reason::kDemand);
  EXPECT_EQ(transfers[0].device_block_ids, (Ids{1, 2, 3}));
  EXPECT_EQ(transfers[0].host_block_ids, (Ids{0, 1, 2}));
  cache.kv.finish_transfer(transfers[0].id, true);
  EXPECT_EQ(cache.kv.integrity_error(), "");
  lease = cache.kv.lock_prefix(cache.key, a);
  EXPECT_EQ(lease.block_ids(), (Ids{1, 2, 3}));
  EXPECT_EQ(lease.num_found_tokens(), 12);
  EXPECT_EQ(cache.host_ids(a), (Ids{0, 1, 2}));  // the host copy stays: evicting again needs no copy
  stats = cache.kv.stats();
  EXPECT_EQ(stats.num_loaded_blocks, 3);
  EXPECT_EQ(stats.num_prefetched_blocks, 0);
  EXPECT_EQ(stats.num_host_only_blocks, 3);
  EXPECT_EQ(stats.num_host_used_blocks, 7);
  EXPECT_EQ(stats.num_blocks_by_namespace, (std::map<std::string, int32_t>{{"base", 4}}));
  lease.release();
  EXPECT_EQ(cache.kv.evict_all_cached(), 4);
  EXPECT_EQ(cache.kv.stats().num_host_only_blocks, 7);
  EXPECT_TRUE(cache.take().empty());
  EXPECT_EQ(cache.kv.integrity_error(), "");
}

TEST(KvHostTierTest, LeaseReleasedWhileOffloadingAndRequestCancelledWhileLoading) {
  HostTierCache cache(4, 8);
  const Tokens a = block_tokens(1000, 3), c = block_tokens(3000, 2);
  cache.compute(a).release();  // released before its offload finished
  KvCacheStats stats = cache.kv.stats();
  EXPECT_EQ(stats.num_in_use_blocks, 3);  // pinned by the offload
  EXPECT_EQ(stats.num_cached_blocks, 0);
  EXPECT_FALSE(cache.kv.can_allocate(2));
  EXPECT_EQ(cache.kv.integrity_error(), "");
  cache.finish_all(true);
  stats = cache.kv.stats();
  EXPECT_EQ(stats.num_in_use_blocks, 0);
  EXPECT_EQ(stats.num_cached_blocks, 3);

  // c (2 blocks) pushes a's last block to the host.
  cache.run(c);
  EXPECT_EQ(cache.tiers(a), (std::vector<KvTier>{kDev, kDev, kHost}));
  EXPECT_EQ(cache.device_ids(c), (Ids{2, 3}));
  // A request for a: it holds its device part, and a load starts for the rest
  // (c's leaf, block 3, goes to the host to make room).
  KvLease lease = cache.kv.lock_prefix(cache.key, a);
  EXPECT_EQ(lease.block_ids(), (Ids{0, 1}));
  EXPECT_EQ(as_vector(cache.status(a)), (std::vector<int32_t>{8, 0, 4}));
  EXPECT_EQ(cache.start_load(a, 1), 1);
  EXPECT_EQ(cache.device_ids(a), (Ids{0, 1, 3}));
  EXPECT_EQ(cache.tiers(c), (std::vector<KvTier>{kDev, kHost}));
  // Cancelled while loading: the path stays pinned by the load.
  lease.release();
  stats = cache.kv.stats();
  EXPECT_EQ(stats.num_in_use_blocks, 3);
  EXPECT_EQ(stats.num_cached_blocks, 1);
  EXPECT_EQ(cache.kv.integrity_error(), "");
  cache.finish_all(true);
  stats = cache.kv.stats();
  EXPECT_EQ(stats.num_in_use_blocks, 0);
  EXPECT_EQ(stats.num_cached_blocks, 4);
  EXPECT_EQ(stats.num_free_blocks, 0);
  EXPECT_EQ(stats.num_host_used_blocks, 5);
  EXPECT_EQ(as_vector(cache.status(a)), (std::vector<int32_t>{12, 0, 0}));
}

TEST(KvHostTierTest, FailedOffloadLeavesNoBackupAndFailedLoadDropsTheHostCopies) {
  HostTierCache cache(5, 8);
  const Tokens a = block_tokens(1000, 3), d = block_tokens(4000, 4);
  // Failed offload: no backup; eviction then removes the nodes.
  const Tokens x = block_tokens(500, 2);
  cache.compute(x).release();
  cache.finish_all(false);
  EXPECT_EQ(cache.host_ids(x), (Ids{-1, -1}));
  KvCacheStats stats = cache.kv.stats();
  EXPECT_EQ(stats.num_failed_transfers, 1);
  EXPECT_EQ(stats.num_offloaded_blocks, 0);
  EXPECT_EQ(stats.num_host_used_blocks, 0);
  EXPECT_EQ(cache.kv.evict_all_cached(), 2);
  EXPECT_EQ(cache.kv.tree().num_nodes(), 0);
  EXPECT_EQ(cache.kv.stats().num_host_only_blocks, 0);

  // a backed up; d pushes a's two last blocks to the host.
  cache.run(a);
  cache.run(d);
  EXPECT_EQ(cache.tiers(a), (std::vector<KvTier>{kDev, kHost, kHost}));
  EXPECT_EQ(cache.host_ids(a), (Ids{0, 1, 2}));
  EXPECT_EQ(cache.device_ids(d), (Ids{1, 2, 3, 4}));
  EXPECT_EQ(as_vector(cache.status(a)), (std::vector<int32_t>{4, 0, 8}));
  // The load evicts d's leaves (4, then 3), never a's pinned first block (older).
  EXPECT_EQ(cache.start_load(a, 8), 2);
  auto transfers = cache.take();
  ASSERT_EQ(transfers.size(), 1u);
  EXPECT_EQ(transfers[0].device_block_ids, (Ids{3, 4}));
  EXPECT_EQ(transfers[0].host_block_ids, (Ids{1, 2}));
  EXPECT_EQ(cache.tiers(d), (std::vector<KvTier>{kDev, kDev, kHost, kHost}));
  cache.kv.finish_transfer(transfers[0].id, false);
  EXPECT_EQ(cache.kv.integrity_error(), "");
  // The suspect host copies are gone: only the device block is left to reuse.
  EXPECT_EQ(as_vector(cache.status(a)), (std::vector<int32_t>{4, 0, 0}));
  EXPECT_EQ(cache.kv.lock_prefix(cache.key, a).num_found_tokens(), 4);
  stats = cache.kv.stats();
  EXPECT_EQ(stats.num_failed_transfers, 2);
  EXPECT_EQ(stats.num_loaded_blocks, 0);
  EXPECT_EQ(stats.num_free_blocks, 2);
  EXPECT_EQ(stats.num_host_used_blocks, 5);  // a's first block, d's four
  EXPECT_EQ(stats.num_host_only_blocks, 2);
}

TEST(KvHostTierTest, EvictingANodeWithoutBackupRemovesItsHostSubtree) {
  HostTierCache cache(4, 4);
  const Tokens e = block_tokens(100, 2);
  KvLease lease = cache.kv.lock_prefix(cache.key, e);
  ASSERT_TRUE(cache.kv.allocate(lease, 2));
  cache.kv.commit(lease, e, kBlock);  // block 0 only
  cache.finish_all(false);            // ... whose backup fails
  cache.kv.commit(lease, e, 2 * kBlock);
  cache.finish_all(true);  // block 1 is backed up
  lease.release();
  EXPECT_EQ(cache.host_ids(e), (Ids{-1, 0}));  // the failed backup gave its host block back
  // Block 1 moves to the host; block 0 has no backup: removed with it.
  EXPECT_EQ(cache.kv.evict_all_cached(), 2);
  EXPECT_EQ(cache.kv.tree().num_nodes(), 0);
  EXPECT_EQ(cache.kv.stats().num_host_used_blocks, 0);
  EXPECT_EQ(as_vector(cache.status(e)), (std::vector<int32_t>{0, 0, 0}));  // recompute
  EXPECT_EQ(cache.kv.integrity_error(), "");
}

TEST(KvHostTierTest, FullHostPoolKeepsFixedBackupsAndDegradesToRecompute) {
  HostTierCache cache(8, 3, Policy::kWorkflow);
  cache.kv.set_agent_steps({{"w/a", 1}});
  const Tokens a = block_tokens(1000, 2);
  cache.run(a);
  cache.mark("w/a", a);
  const Tokens z = block_tokens(2000, 1);
  cache.run(z);  // the last free host block
  EXPECT_EQ(cache.host_ids(z), (Ids{2}));
  EXPECT_EQ(cache.kv.stats().num_host_used_blocks, 3);
  // w: a's prefix plus a dynamic block. The host is full and holds no host
  // leaf: no backup, no transfer.
  const Tokens w = concat(a, block_tokens(3000, 1));
  cache.compute(w).release();
  EXPECT_TRUE(cache.take().empty());
  EXPECT_EQ(cache.host_ids(w), (Ids{0, 1, -1}));
  // Dynamic first: z moves to the host, w's block is dropped, then a's prefix.
  EXPECT_EQ(cache.kv.evict_all_cached(), 4);
  EXPECT_EQ(cache.tiers(w), (std::vector<KvTier>{kHost, kHost}));
  EXPECT_EQ(cache.tiers(z), (std::vector<KvTier>{kHost}));
  EXPECT_EQ(cache.kv.stats().num_host_only_blocks, 3);
  // A lookup of w finds a's host copies, and recomputes the dropped block.
  EXPECT_EQ(as_vector(cache.status(w)), (std::vector<int32_t>{0, 0, 8}));
  // A new dynamic block may push out z's backup (dynamic, older) ...
  const Tokens v = block_tokens(5000, 1);
  cache.run(v);
  EXPECT_EQ(cache.host_ids(v), (Ids{2}));
  EXPECT_TRUE(cache.path(z).empty());
  // ... but never a fixed prefix's: the only host leaf left is a's last block.
  const Tokens v2 = block_tokens(6000, 1);
  cache.compute(v2).release();
  EXPECT_TRUE(cache.take().empty());
  EXPECT_EQ(cache.host_ids(v2), (Ids{-1}));
  EXPECT_EQ(cache.tiers(a), (std::vector<KvTier>{kHost, kHost}));
  // A fixed block of a nearer agent may: marking b (steps 0) backs up its
  // block in place of a's last block (steps 1, the first host leaf).
  cache.kv.set_agent_steps({{"w/b", 0}});
  cache.mark("w/b", v2);
  auto transfers = cache.take();
  ASSERT_EQ(transfers.size(), 1u);
  EXPECT_EQ(transfers[0].host_block_ids, (Ids{1}));
  EXPECT_EQ(cache.tiers(a), (std::vector<KvTier>{kHost}));
  cache.kv.finish_transfer(transfers[0].id, true);
  EXPECT_EQ(cache.kv.integrity_error(), "");
  // a's mark moved up to its first block, still on the host.
  EXPECT_EQ(cache.kv.tree().agent_prefix_end("w/a"), cache.path(a)[0]);
}

// Agents a (steps 1), c (2), e (5) and b (3). Device: 4 blocks.
TEST(KvHostTierTest, PrefetchNeverEvictsANearerAgent) {
  HostTierCache cache(4, 16, Policy::kWorkflow);
  cache.kv.set_agent_steps({{"w/a", 1}, {"w/b", 3}, {"w/c", 2}, {"w/e", 5}});
  const Tokens a = block_tokens(1000, 2), b = block_tokens(2000, 2), c = block_tokens(3000, 2),
               e = block_tokens(5000, 2);
  cache.run(c);
  cache.mark("w/c", c);
  cache.run(e);
  cache.mark("w/e", e);
  EXPECT_EQ(cache.kv.evict_all_cached(), 4);
  cache.run(a);
  cache.mark("w/a", a);
  cache.run(b);
  cache.mark("w/b", b);
  EXPECT_EQ(cache.device_ids(a), (Ids{0, 1}));
  EXPECT_EQ(cache.device_ids(b), (Ids{2, 3}));
  EXPECT_EQ(cache.kv.prefetch_agent("w/unknown", 8), 0);
  // c (2) may take b's blocks (3, further) but not a's (1).
  EXPECT_EQ(cache.kv.prefetch_agent("w/c", 8), 2);
  EXPECT_EQ(cache.kv.integrity_error(), "");
  EXPECT_EQ(cache.tiers(b), (std::vector<KvTier>{kHost, kHost}));
  EXPECT_EQ(cache.device_ids(c), (Ids{2, 3}));
  auto transfers = cache.take();
  ASSERT_EQ(transfers.size(), 1u);
  EXPECT_EQ(transfers[0].reason, Reason::kPrefetch);
  EXPECT_EQ(transfers[0].host_block_ids, cache.host_ids(c));
  // A request for c arrives before the prefetch is done: late.
  EXPECT_EQ(as_vector(cache.status(c)), (std::vector<int32_t>{0, 8, 0}));
  cache.kv.count_late_prefetch(cache.key, c);
  EXPECT_EQ(as_vector(cache.status(c)), (std::vector<int32_t>{0, 8, 0}));
  cache.kv.count_late_prefetch(cache.key, c);
  EXPECT_EQ(cache.kv.stats().num_prefetch_late_blocks, 2);  // once per block
  cache.kv.finish_transfer(transfers[0].id, true);
  EXPECT_EQ(cache.kv.stats().num_prefetched_blocks, 2);
  EXPECT_EQ(cache.kv.lock_prefix(cache.key, c).num_blocks(), 2);
  EXPECT_EQ(cache.kv.stats().num_prefetch_hit_blocks, 0);  // it was late
  // e (5) may take nothing: a (1) and c (2) are nearer. Nor may b (3).
  EXPECT_EQ(cache.kv.prefetch_agent("w/e", 8), 0);
  EXPECT_EQ(cache.kv.prefetch_agent("w/b", 8), 0);
  // Equal steps are not enough either.
  cache.kv.set_agent_steps({{"w/e", 2}});
  EXPECT_EQ(cache.kv.prefetch_agent("w/e", 8), 0);
  EXPECT_TRUE(cache.take().empty());
  EXPECT_EQ(cache.device_ids(a), (Ids{0, 1}));
  EXPECT_EQ(cache.device_ids(c), (Ids{2, 3}));
  // a nearer agent (steps 0) may take c's (2), in eviction order: c's leaf first.
  cache.kv.set_agent_steps({{"w/b", 0}});
  EXPECT_EQ(cache.kv.prefetch_agent("w/b", 1), 1);
  EXPECT_EQ(cache.tiers(c), (std::vector<KvTier>{kDev, kHost}));
  EXPECT_EQ(cache.device_ids(b), (Ids{3, -1}));
  cache.finish_all(true);
  // In time: locked after it finished.
  EXPECT_EQ(cache.kv.lock_prefix(cache.key, b).num_blocks(), 1);
  EXPECT_EQ(cache.kv.stats().num_prefetch_hit_blocks, 1);
  EXPECT_EQ(cache.kv.lock_prefix(cache.key, b).num_blocks(), 1);
  EXPECT_EQ(cache.kv.stats().num_prefetch_hit_blocks, 1);  // counted once
  // Under kLru a prefetch only takes free blocks; a demand load evicts.
  cache.kv.set_eviction_policy(Policy::kLru);
  EXPECT_EQ(cache.kv.prefetch_agent("w/e", 8), 0);
  EXPECT_EQ(cache.start_load(e, 8, Reason::kDemand), 2);
  cache.finish_all(true);
  EXPECT_EQ(as_vector(cache.status(e)), (std::vector<int32_t>{8, 0, 0}));
  EXPECT_EQ(cache.kv.integrity_error(), "");
}

TEST(KvHostTierTest, RecomputedHostBlockIsAdoptedAndALoadingBlockStopsACommit) {
  HostTierCache cache(4, 8);
  const Tokens a = block_tokens(1000, 2);
  cache.run(a);
  EXPECT_EQ(cache.kv.evict_all_cached(), 2);
  // Admitted without loading (e.g. no room then): it recomputes a; commit takes its blocks.
  KvLease lease = cache.compute(a);
  EXPECT_EQ(lease.block_ids(), (Ids{0, 1}));
  EXPECT_EQ(cache.tiers(a), (std::vector<KvTier>{kDev, kDev}));
  EXPECT_EQ(cache.host_ids(a), (Ids{0, 1}));
  EXPECT_TRUE(cache.take().empty());  // already backed up
  lease.release();
  EXPECT_EQ(cache.kv.evict_all_cached(), 2);
  // One request loads a; another recomputes it meanwhile and cannot commit over the load.
  EXPECT_EQ(cache.start_load(a, 8), 2);
  KvLease other = cache.kv.lock_prefix(cache.key, a);
  ASSERT_TRUE(cache.kv.allocate(other, 2));
  cache.kv.commit(other, a, 2 * kBlock);
  EXPECT_EQ(other.num_committed_blocks(), 0);
  EXPECT_EQ(cache.kv.integrity_error(), "");
  cache.finish_all(true);
  cache.kv.commit(other, a, 2 * kBlock);  // now a dedup hit: the tree's blocks replace its own
  EXPECT_EQ(other.num_committed_blocks(), 2);
  EXPECT_EQ(other.block_ids(), (Ids{0, 1}));
  other.release();
  EXPECT_EQ(cache.kv.stats().num_free_blocks, 2);
  EXPECT_EQ(cache.kv.integrity_error(), "");
}

// ---- KVFlow Fig. 1 with a host tier: planner -> executor -> expresser -> reviewer ----

struct Arrival {
  std::string agent;
  std::vector<int32_t> status;  // {device, loading, host} tokens of its prefix when its request arrives
  bool operator==(const Arrival&) const = default;
};
void PrintTo(const Arrival& arrival, std::ostream* os) {
  *os << "{" << arrival.agent << " " << arrival.status[0] << "/" << arrival.status[1] << "/" << arrival.status[2]
      << "}";
}

// Each agent: a 3-block fixed prefix and a 1-block dynamic suffix per turn;
// the device pool (12 blocks) holds three agents' prefixes with suffixes, the
// host pool everything. Steps follow the cycle (running agent 0, next 1, ...).
// Before each request, with `prefetch`, the two next agents' prefixes are
// prefetched (as the engine does); a request whose prefix is on the host
// loads it on demand. Every transfer finishes at once.
std::vector<Arrival> run_cycle_with_host_tier(Policy policy, bool prefetch, KvCacheStats* final_stats) {
  const std::vector<std::string> agents{"planner", "executor", "expresser", "reviewer"};
  const std::vector<int32_t> order{2, 3, 0, 1, 2, 3, 0, 1};  // expresser, reviewer, planner, executor, ...
  auto fixed_of = [](int32_t agent) { return block_tokens(1000 * (agent + 1), 3); };
  HostTierCache cache(12, 32, policy);
  std::vector<Arrival> arrivals;
  for (int32_t turn = 0; turn < static_cast<int32_t>(order.size()); ++turn) {
    const int32_t running = order[static_cast<size_t>(turn)];
    std::map<std::string, int32_t> steps;
    auto steps_of = [&](int32_t agent) { return (agent - running + 4) % 4; };
    for (int32_t agent = 0; agent < 4; ++agent) steps["wf/" + agents[static_cast<size_t>(agent)]] = steps_of(agent);
    cache.kv.set_agent_steps(steps);
    if (prefetch) {
      for (int32_t distance = 1; distance <= 2; ++distance) {
        const int32_t target = (running + distance) % 4;
        std::map<int32_t, int32_t> nearer_device_tokens;
        for (int32_t agent = 0; agent < 4; ++agent)
          if (steps_of(agent) < distance) nearer_device_tokens[agent] = cache.status(fixed_of(agent)).num_device_tokens();
        cache.kv.prefetch_agent("wf/" + agents[static_cast<size_t>(target)], 12);
        EXPECT_EQ(cache.kv.integrity_error(), "");
        for (const auto& [agent, num_tokens] : nearer_device_tokens)
          EXPECT_EQ(cache.status(fixed_of(agent)).num_device_tokens(), num_tokens)
              << "prefetching " << agents[static_cast<size_t>(target)] << " evicted the nearer "
              << agents[static_cast<size_t>(agent)];
        cache.finish_all(true);
      }
    }
    const Tokens fixed = fixed_of(running);
    const Tokens tokens = concat(fixed, block_tokens(100000 + 100 * turn, 1));
    const Status status = cache.status(tokens);
    if (status.num_host_tokens() > 0) {
      EXPECT_GT(cache.start_load(tokens, status.num_host_tokens() / kBlock), 0);
      cache.finish_all(true);
    }
    cache.run(tokens);
    cache.mark("wf/" + agents[static_cast<size_t>(running)], fixed);
    cache.finish_all(true);
    if (turn >= 3) arrivals.push_back({agents[static_cast<size_t>(running)], as_vector(status)});
  }
  *final_stats = cache.kv.stats();
  return arrivals;
}

TEST(KvHostTierTest, Fig1CycleLruSendsTheNextAgentToTheHost) {
  // Under LRU each agent's prefix went to the host one step before its turn
  // (the executor's first turn pushed the expresser's out): every turn loads.
  KvCacheStats stats;
  EXPECT_EQ(run_cycle_with_host_tier(Policy::kLru, false, &stats),
            (std::vector<Arrival>{{"executor", {0, 0, 0}},
                                  {"expresser", {0, 0, 12}},
                                  {"reviewer", {0, 0, 12}},
                                  {"planner", {0, 0, 12}},
                                  {"executor", {0, 0, 12}}}));
  EXPECT_EQ(stats.num_loaded_blocks, 12);
  EXPECT_EQ(stats.num_prefetched_blocks, 0);
}

TEST(KvHostTierTest, Fig1CycleWorkflowPolicyWithPrefetchFindsEveryPrefixOnTheDevice) {
  // Without prefetch, the planner's last block (furthest when the executor
  // first ran) is on the host at its turn; prefetching it one step ahead
  // brings it back in time.
  KvCacheStats stats;
  EXPECT_EQ(run_cycle_with_host_tier(Policy::kWorkflow, false, &stats),
            (std::vector<Arrival>{{"executor", {0, 0, 0}},
                                  {"expresser", {12, 0, 0}},
                                  {"reviewer", {12, 0, 0}},
                                  {"planner", {8, 0, 4}},
                                  {"executor", {12, 0, 0}}}));
  EXPECT_EQ(stats.num_loaded_blocks, 1);
  EXPECT_EQ(run_cycle_with_host_tier(Policy::kWorkflow, true, &stats),
            (std::vector<Arrival>{{"executor", {0, 0, 0}},
                                  {"expresser", {12, 0, 0}},
                                  {"reviewer", {12, 0, 0}},
                                  {"planner", {12, 0, 0}},
                                  {"executor", {12, 0, 0}}}));
  // From the expresser's turn on, each turn's dynamic block pushes the last
  // block of the agent two steps away to the host, and its prefetch brings it
  // back: 4 blocks, all loads. The two prefetched during turns 4 and 5 were
  // used in time; those of turns 6 and 7 are for turns after the run.
  EXPECT_EQ(stats.num_loaded_blocks, 4);
  EXPECT_EQ(stats.num_prefetched_blocks, 4);
  EXPECT_EQ(stats.num_prefetch_hit_blocks, 2);
  EXPECT_EQ(stats.num_prefetch_late_blocks, 0);
}

TEST(KvHostTierTest, WithoutAHostTierNothingIsPlanned) {
  HostTierCache cache(4, 0);
  EXPECT_EQ(cache.kv.host_tier(), nullptr);
  EXPECT_EQ(cache.kv.stats().num_host_total_blocks, 0);
  const Tokens a = block_tokens(1000, 3);
  cache.compute(a).release();
  EXPECT_TRUE(cache.kv.take_transfers().empty());
  cache.run(block_tokens(2000, 2));  // evicts a's last block: removed
  EXPECT_EQ(cache.path(a).size(), 2u);
  EXPECT_EQ(as_vector(cache.status(a)), (std::vector<int32_t>{8, 0, 0}));
  EXPECT_EQ(cache.start_load(a, 8), 0);
  cache.mark("w/a", a);
  EXPECT_EQ(cache.kv.prefetch_agent("w/a", 8), 0);
  EXPECT_TRUE(cache.kv.take_transfers().empty());
  const KvCacheStats stats = cache.kv.stats();
  EXPECT_EQ(stats.num_host_total_blocks, 0);
  EXPECT_EQ(stats.num_host_used_blocks, 0);
  EXPECT_EQ(stats.num_host_only_blocks, 0);
  EXPECT_EQ(stats.num_offloaded_blocks + stats.num_loaded_blocks + stats.num_failed_transfers, 0);
  EXPECT_EQ(stats.num_evicted_blocks, 1);
  EXPECT_EQ(cache.kv.integrity_error(), "");
}

}  // namespace
}  // namespace loom
