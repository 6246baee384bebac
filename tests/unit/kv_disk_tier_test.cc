// KV cache manager disk tier (kv/disk_tier_planner.h), through a fake
// directory: content hashes, write-through names on offloads, lookups past the
// tree by hash, disk -> host reads joining the tree, failed and orphaned reads,
// and the scheduler waiting on a read (policy 7). Transfers are finished by
// hand (the engine's worker and the disk store would do the I/O).
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "kv/kv_cache_group.h"
#include "kv/kv_cache_manager.h"
#include "kv_test_tokens.h"
#include "scheduler/scheduler.h"

namespace loom {
namespace {

constexpr int32_t kBlock = test::kKvTestBlock;
using Tokens = test::KvTestTokens;
using test::block_tokens;
using Kind = KvCacheManager::Transfer::Kind;
using Reason = KvCacheManager::LoadReason;
using Status = PrefixLocation;

class FakeDirectory : public KvBlockDirectory {
 public:
  bool contains(const KvBlockHash& hash) override { return blocks.count(hash) != 0; }
  std::set<KvBlockHash> blocks;
};

// Names blocks as `model`'s cache and puts the disk tier over `directory` (after the host tier).
void enable_disk(KvCacheManager& kv, FakeDirectory& directory, const std::string& model = "model-a") {
  kv.enable_block_hashes({hash_string(model), [](const std::string& ns) { return hash_string(ns); }});
  kv.enable_disk_tier({&directory});
}

// One process's cache: device blocks, host blocks, the disk tier over `directory`.
struct DiskCache {
  DiskCache(FakeDirectory& directory, int32_t num_blocks, int32_t num_host_blocks, const std::string& model = "model-a")
      : kv(num_blocks, kBlock) {
    kv.enable_host_tier(num_host_blocks);
    enable_disk(kv, directory, model);
  }
  // Computes and commits tokens; every offload "writes" its named blocks.
  void run(const Tokens& tokens, FakeDirectory& directory) {
    KvLease lease = kv.lock_prefix(key, tokens);
    ASSERT_TRUE(kv.allocate(lease, static_cast<int32_t>(tokens.size()) / kBlock - lease.num_blocks()));
    kv.commit(lease, tokens, static_cast<int32_t>(tokens.size()));
    lease.release();
    for (const auto& transfer : kv.take_transfers()) {
      ASSERT_EQ(transfer.kind, Kind::kOffload);
      ASSERT_EQ(transfer.block_hashes.size(), transfer.host_block_ids.size());
      for (const KvBlockHash& hash : transfer.block_hashes)
        if (!hash.is_zero()) directory.blocks.insert(hash);
      kv.finish_transfer(transfer.id, true);
    }
    ASSERT_EQ(kv.integrity_error(), "");
  }
  // Applies every transfer planned so far as `succeeded` (the I/O is not run).
  void finish_all(bool succeeded) {
    for (const auto& transfer : kv.take_transfers()) kv.finish_transfer(transfer.id, succeeded);
  }
  std::vector<int32_t> status(const Tokens& tokens) {
    const Status s = kv.prefix_location(key, tokens);
    return {s.num_device_tokens(), s.num_loading_tokens(), s.num_host_tokens(), s.num_disk_tokens()};
  }
  KvCacheManager kv;
  KvKey key = KvKey::single("base");
};

TEST(KvDiskTier, NodesCarryChainedContentHashes) {
  FakeDirectory directory;
  DiskCache a(directory, 8, 8), b(directory, 8, 8), other_model(directory, 8, 8, "model-b");
  const Tokens tokens = block_tokens(100, 3);
  a.run(tokens, directory);
  b.run(tokens, directory);
  other_model.run(tokens, directory);
  const auto path_a = a.kv.tree().match_any_tier(a.key, tokens);
  const auto path_b = b.kv.tree().match_any_tier(b.key, tokens);
  const auto path_other = other_model.kv.tree().match_any_tier(other_model.key, tokens);
  ASSERT_EQ(path_a.size(), 3u);
  std::set<KvBlockHash> distinct;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(path_a[i]->content_hash, path_b[i]->content_hash);        // same model, same tokens: same name
    EXPECT_NE(path_a[i]->content_hash, path_other[i]->content_hash);  // another model: another name
    distinct.insert(path_a[i]->content_hash);
  }
  EXPECT_EQ(distinct.size(), 3u);
  // The chain: block 1's name depends on block 0's tokens.
  Tokens changed = tokens;
  changed[0] += 1000;
  a.run(changed, directory);
  EXPECT_NE(a.kv.tree().match_any_tier(a.key, changed)[1]->content_hash, path_a[1]->content_hash);
  // An activated branch hashes the base chain before it and its own namespace.
  const KvKey branch = activated_kv_key("x", 2 * kBlock, kBlock);
  KvLease lease = a.kv.lock_prefix(branch, tokens);
  ASSERT_EQ(lease.num_blocks(), 2);
  ASSERT_TRUE(a.kv.allocate(lease, 1));
  a.kv.commit(lease, tokens, 3 * kBlock);
  const auto branch_path = a.kv.tree().match_any_tier(branch, tokens);
  ASSERT_EQ(branch_path.size(), 3u);
  EXPECT_EQ(branch_path[1], path_a[1]);
  EXPECT_EQ(branch_path[2]->content_hash,
            chain_block_hash(path_a[1]->content_hash, hash_string("alora/x@8"),
                             std::span<const KvTokenId>(tokens).subspan(8, 4)));
}

TEST(KvDiskTier, OffloadsNameEveryBlockTheyCopy) {
  FakeDirectory directory;
  DiskCache a(directory, 8, 8), b(directory, 8, 8);
  const Tokens tokens = block_tokens(0, 2);
  a.run(tokens, directory);
  EXPECT_EQ(directory.blocks.size(), 2u);
  EXPECT_EQ(a.kv.stats().num_disk_write_planned_blocks, 2);
  // b computes the same blocks: its backups name them too (the store skips what it holds).
  KvLease lease = b.kv.lock_prefix(b.key, tokens);
  ASSERT_TRUE(b.kv.allocate(lease, 2));
  b.kv.commit(lease, tokens, 8);
  const auto transfers = b.kv.take_transfers();
  ASSERT_EQ(transfers.size(), 1u);
  const auto path = a.kv.tree().match_any_tier(a.key, tokens);
  EXPECT_EQ(transfers[0].block_hashes, (std::vector<KvBlockHash>{path[0]->content_hash, path[1]->content_hash}));
}

TEST(KvDiskTier, ABlockOnDiskIsReadToTheHostThenLoaded) {
  FakeDirectory directory;
  DiskCache writer(directory, 8, 8);
  const Tokens tokens = block_tokens(0, 5);
  writer.run(tokens, directory);
  // A fresh process (a restart, or a second server) with the prompt's first two blocks computed.
  DiskCache reader(directory, 8, 8);
  reader.run(Tokens(tokens.begin(), tokens.begin() + 2 * kBlock), directory);
  EXPECT_EQ(reader.status(tokens), (std::vector<int32_t>{8, 0, 0, 12}));
  EXPECT_FALSE(reader.kv.disk_tier()->read_pending(reader.key, tokens));
  EXPECT_EQ(reader.kv.disk_tier()->start_read(reader.key, tokens, 2), 2);  // max_blocks caps it
  EXPECT_TRUE(reader.kv.disk_tier()->read_pending(reader.key, tokens));
  EXPECT_EQ(reader.status(tokens), (std::vector<int32_t>{8, 8, 0, 4}));
  EXPECT_EQ(reader.kv.disk_tier()->start_read(reader.key, tokens, 8), 0);  // a read is in the way
  EXPECT_EQ(reader.kv.integrity_error(), "");
  auto transfers = reader.kv.take_transfers();
  ASSERT_EQ(transfers.size(), 1u);
  EXPECT_EQ(transfers[0].kind, Kind::kDiskRead);
  EXPECT_TRUE(transfers[0].device_block_ids.empty());
  const auto writer_path = writer.kv.tree().match_any_tier(writer.key, tokens);
  EXPECT_EQ(transfers[0].block_hashes,
            (std::vector<KvBlockHash>{writer_path[2]->content_hash, writer_path[3]->content_hash}));
  EXPECT_EQ(reader.kv.stats().num_disk_reading_blocks, 2);
  reader.kv.finish_transfer(transfers[0].id, true);
  EXPECT_EQ(reader.kv.integrity_error(), "");
  EXPECT_EQ(reader.status(tokens), (std::vector<int32_t>{8, 0, 8, 4}));
  EXPECT_EQ(reader.kv.stats().num_disk_read_blocks, 2);
  // The rest, then host -> device as for any host block.
  EXPECT_EQ(reader.kv.disk_tier()->start_read(reader.key, tokens, 8), 1);
  reader.finish_all(true);
  EXPECT_EQ(reader.status(tokens), (std::vector<int32_t>{8, 0, 12, 0}));
  EXPECT_EQ(reader.kv.host_tier()->start_load(reader.key, tokens, 8), 3);
  reader.finish_all(true);
  EXPECT_EQ(reader.status(tokens), (std::vector<int32_t>{20, 0, 0, 0}));
  KvLease lease = reader.kv.lock_prefix(reader.key, tokens);
  EXPECT_EQ(lease.num_found_tokens(), 20);
  EXPECT_EQ(reader.kv.integrity_error(), "");
}

TEST(KvDiskTier, AFailedReadFreesItsHostBlocksAndJoinsNothing) {
  FakeDirectory directory;
  DiskCache writer(directory, 8, 8);
  const Tokens tokens = block_tokens(0, 3);
  writer.run(tokens, directory);
  DiskCache reader(directory, 8, 4);
  EXPECT_EQ(reader.kv.disk_tier()->start_read(reader.key, tokens, 8), 3);
  EXPECT_EQ(reader.kv.stats().num_host_used_blocks, 3);
  reader.finish_all(false);
  EXPECT_EQ(reader.kv.integrity_error(), "");
  EXPECT_EQ(reader.kv.stats().num_host_used_blocks, 0);
  EXPECT_EQ(reader.kv.stats().num_disk_read_failed_blocks, 3);
  EXPECT_EQ(reader.kv.tree().num_nodes(), 0);
  // Its blocks count as not on disk from now on (a file the store kept would fail again): the request
  // computes them instead of waiting on the same read every step.
  EXPECT_EQ(reader.status(tokens), (std::vector<int32_t>{0, 0, 0, 0}));
  EXPECT_EQ(reader.kv.disk_tier()->start_read(reader.key, tokens, 8), 0);
}

TEST(KvDiskTier, AReadWhoseParentIsGoneOrRecomputedJoinsNothing) {
  FakeDirectory directory;
  DiskCache writer(directory, 8, 8);
  const Tokens tokens = block_tokens(0, 3);
  writer.run(tokens, directory);
  DiskCache reader(directory, 4, 8);
  reader.run(Tokens(tokens.begin(), tokens.begin() + kBlock), directory);
  EXPECT_EQ(reader.kv.disk_tier()->start_read(reader.key, tokens, 8), 2);
  const auto reads = reader.kv.take_transfers();
  // Meanwhile a request recomputes the whole prompt.
  reader.run(tokens, directory);
  for (const auto& transfer : reads) reader.kv.finish_transfer(transfer.id, true);
  EXPECT_EQ(reader.kv.integrity_error(), "");
  EXPECT_EQ(reader.kv.stats().num_disk_read_blocks, 0);
  EXPECT_EQ(reader.kv.tree().num_nodes(), 3);
}

TEST(KvDiskTier, AReadTakesHostLeavesButNeverItsOwnParent) {
  FakeDirectory directory;
  DiskCache writer(directory, 8, 8);
  const Tokens tokens = block_tokens(0, 3);
  writer.run(tokens, directory);
  // Two host blocks: the prompt's first block (evicted to the host) and an older unrelated one.
  DiskCache reader(directory, 2, 2);
  reader.run(block_tokens(500, 1), directory);
  reader.run(Tokens(tokens.begin(), tokens.begin() + kBlock), directory);
  reader.kv.evict_all_cached();
  EXPECT_EQ(reader.status(tokens), (std::vector<int32_t>{0, 0, 4, 8}));
  // The unrelated host leaf goes; the prompt's own host block (the read's parent) stays.
  EXPECT_EQ(reader.kv.disk_tier()->start_read(reader.key, tokens, 8), 1);
  EXPECT_EQ(reader.kv.integrity_error(), "");
  reader.finish_all(true);
  EXPECT_EQ(reader.status(tokens), (std::vector<int32_t>{0, 0, 8, 4}));
  EXPECT_EQ(reader.status(block_tokens(500, 1)), (std::vector<int32_t>{0, 0, 0, 4}));  // its backup is on disk
}

TEST(KvDiskTier, APrefetchedAgentPrefixComesFromDiskThenToTheDevice) {
  FakeDirectory directory;
  DiskCache writer(directory, 8, 8);
  const Tokens prefix = block_tokens(0, 4);
  writer.run(prefix, directory);
  // A restart: the agent's prefix is declared (nothing of it in the tree) and only the disk holds it.
  DiskCache reader(directory, 8, 8);
  reader.kv.set_eviction_policy(KvEvictionPolicy::kWorkflow);
  reader.kv.set_agent_fixed_prefix("wf/planner", reader.key, prefix, 16);
  reader.kv.set_agent_steps({{"wf/planner", 1}});
  EXPECT_EQ(reader.kv.prefetch_agent("wf/planner", 3), 3);  // max_blocks caps the read
  auto transfers = reader.kv.take_transfers();
  ASSERT_EQ(transfers.size(), 1u);
  EXPECT_EQ(transfers[0].kind, Kind::kDiskRead);
  EXPECT_EQ(transfers[0].reason, Reason::kPrefetch);
  reader.kv.finish_transfer(transfers[0].id, true);
  EXPECT_EQ(reader.status(prefix), (std::vector<int32_t>{0, 0, 12, 4}));
  // The next prefetch loads the host part (the mark moves there once declared again) and reads the rest.
  reader.kv.set_agent_fixed_prefix("wf/planner", reader.key, prefix, 16);
  EXPECT_EQ(reader.kv.prefetch_agent("wf/planner", 8), 4);
  reader.finish_all(true);
  EXPECT_EQ(reader.status(prefix), (std::vector<int32_t>{12, 0, 4, 0}));
  EXPECT_EQ(reader.kv.stats().num_prefetched_blocks, 3);
  EXPECT_EQ(reader.kv.integrity_error(), "");
  reader.kv.forget_agents([](const std::string&) { return true; });
  EXPECT_EQ(reader.kv.prefetch_agent("wf/planner", 8), 0);
}

TEST(KvDiskTier, TheSchedulerWaitsOnADiskReadThenRunsOnTheLoadedPrefix) {
  FakeDirectory directory;
  DiskCache writer(directory, 8, 8);
  const Tokens prompt = block_tokens(0, 4);  // the last token is not looked up: 3 full blocks can hit
  writer.run(prompt, directory);
  KvCacheGroup group(16, 0, kBlock);
  group.enable_host_tier({{8, 0}});
  enable_disk(group.main(), directory);
  Scheduler scheduler(SchedulerConfig{}, group);
  scheduler.add(1, prompt, "", "base", 0);
  ScheduledBatch batch = scheduler.plan();
  EXPECT_EQ(batch.num_disk_read_blocks, 3);
  EXPECT_TRUE(batch.requests.empty());
  EXPECT_EQ(batch.waiting_on_load, (std::vector<SchedulerRequestId>{1}));
  for (const auto& transfer : group.take_transfers()) group.finish_transfer(transfer.cache, transfer.transfer.id, true);
  batch = scheduler.plan();  // the blocks are on the host now: a demand load
  EXPECT_EQ(batch.num_disk_read_blocks, 0);
  EXPECT_EQ(batch.waiting_on_load, (std::vector<SchedulerRequestId>{1}));
  for (const auto& transfer : group.take_transfers()) group.finish_transfer(transfer.cache, transfer.transfer.id, true);
  batch = scheduler.plan();
  ASSERT_EQ(batch.requests.size(), 1u);
  EXPECT_EQ(batch.requests[0].num_prefix_hit_tokens, 12);
  EXPECT_EQ(batch.requests[0].num_new_tokens, 4);
  EXPECT_EQ(group.integrity_error(), "");
}

TEST(KvDiskTier, BlocksReadForAWaitingRequestOutliveOtherRequestsBackups) {
  FakeDirectory directory;
  DiskCache writer(directory, 8, 8);
  const Tokens prompt = block_tokens(0, 2);
  writer.run(prompt, directory);
  DiskCache reader(directory, 8, 2);
  EXPECT_EQ(reader.kv.disk_tier()->start_read(reader.key, prompt, 8, Reason::kDemand), 2);
  reader.finish_all(true);
  EXPECT_EQ(reader.status(prompt), (std::vector<int32_t>{0, 0, 8, 0}));
  EXPECT_EQ(reader.kv.tree().reserved_nodes().size(), 2u);  // a demand read's blocks land reserved
  // Another request computes two blocks: its write-through finds no host block to take.
  reader.run(block_tokens(100, 2), directory);
  EXPECT_EQ(reader.status(prompt), (std::vector<int32_t>{0, 0, 8, 0}));
  EXPECT_EQ(reader.kv.stats().num_offloaded_blocks, 0);
  // Reserved again (as the scheduler does each step) and loaded: the device copies go last.
  reader.kv.disk_tier()->clear_reservations();
  const DiskTierPlanner::PrefixReservation reservation = reader.kv.disk_tier()->reserve_prefix(reader.key, prompt, 8);
  EXPECT_EQ(reservation.num_host_blocks, 2);
  EXPECT_EQ(reader.kv.host_tier()->start_load(reader.key, prompt, 8), 2);
  reader.finish_all(true);
  EXPECT_EQ(reader.kv.num_reserved_cached_blocks(), 2);
  KvLease other = reader.kv.lock_prefix(reader.key, block_tokens(200, 1));
  ASSERT_TRUE(reader.kv.allocate(other, 6));  // 8 blocks: the other two cached ones go first
  EXPECT_EQ(reader.status(prompt), (std::vector<int32_t>{8, 0, 0, 0}));
  // Once unreserved, a backup may take their host blocks again.
  other.release();
  reader.kv.disk_tier()->clear_reservations();
  EXPECT_EQ(reader.kv.integrity_error(), "");
  reader.kv.evict_all_cached();
  reader.run(block_tokens(300, 2), directory);
  EXPECT_EQ(reader.kv.stats().num_offloaded_blocks, 2);
  EXPECT_EQ(reader.kv.integrity_error(), "");
}

// Runs the engine's loop without a backend until no work is left (at most
// 100 steps); each request ends at its first sampled token. Every transfer
// lands before the step's commits, which plan write-through backups.
// Returns each request's prefix hit at admission.
std::map<SchedulerRequestId, int32_t> run_to_completion(Scheduler& scheduler, KvCacheGroup& group,
                                                        FakeDirectory& directory) {
  std::map<SchedulerRequestId, int32_t> hits;
  for (int32_t step = 0; step < 100 && scheduler.has_work(); ++step) {
    const ScheduledBatch batch = scheduler.plan();
    for (const auto& transfer : group.take_transfers()) {
      for (const KvBlockHash& hash : transfer.transfer.block_hashes)
        if (transfer.transfer.kind == Kind::kOffload && !hash.is_zero()) directory.blocks.insert(hash);
      group.finish_transfer(transfer.cache, transfer.transfer.id, true);
    }
    scheduler.complete_step(batch);
    for (const ScheduledRequest& entry : batch.requests) {
      if (entry.num_prefix_hit_tokens >= 0) hits[entry.id] = entry.num_prefix_hit_tokens;
      if (entry.samples_next_token) scheduler.finish(entry.id);
    }
    EXPECT_EQ(group.integrity_error(), "");
  }
  return hits;
}

// N waiting requests whose prompts are on disk, a host tier smaller than
// their sum and a device that holds about two of them at a time: every one is
// served from what was read, not recomputed (the blocks read for a request
// outlive the others' backups and loads until it is admitted).
TEST(KvDiskTier, ConcurrentRequestsOnDiskAreAllServedFromTheirReads) {
  FakeDirectory directory;
  DiskCache writer(directory, 64, 64);
  constexpr int32_t kRequests = 6, kPromptBlocks = 4;  // 3 full blocks looked up per request
  std::vector<Tokens> prompts;
  for (int32_t i = 0; i < kRequests; ++i) {
    prompts.push_back(block_tokens(1000 * (i + 1), kPromptBlocks));
    writer.run(Tokens(prompts.back().begin(), prompts.back().end() - kBlock), directory);
  }
  KvCacheGroup group(10, 0, kBlock);
  group.enable_host_tier({{8, 0}});
  enable_disk(group.main(), directory);
  Scheduler scheduler(SchedulerConfig{}, group);
  for (int32_t i = 0; i < kRequests; ++i) scheduler.add(i, prompts[static_cast<size_t>(i)], "", "base", 0);
  const std::map<SchedulerRequestId, int32_t> hits = run_to_completion(scheduler, group, directory);
  EXPECT_FALSE(scheduler.has_work());
  std::map<SchedulerRequestId, int32_t> all_hit;
  for (int32_t i = 0; i < kRequests; ++i) all_hit[i] = 3 * kBlock;
  EXPECT_EQ(hits, all_hit);
  EXPECT_EQ(group.stats()[KvCacheId::kMain].num_disk_read_blocks, kRequests * 3);  // each block read once
}

// Prompts larger than the host tier: the first in line reads what fits, is
// loaded and admitted with that part (it never waits for budget it holds
// itself), and the one behind it gets its turn; nobody waits forever.
TEST(KvDiskTier, PromptsLargerThanTheHostTierEndInPartialHitsNotAWaitForever) {
  FakeDirectory directory;
  DiskCache writer(directory, 64, 64);
  const Tokens first = block_tokens(0, 5), second = block_tokens(500, 5);  // 4 full blocks looked up each
  writer.run(Tokens(first.begin(), first.end() - kBlock), directory);
  writer.run(Tokens(second.begin(), second.end() - kBlock), directory);
  KvCacheGroup group(16, 0, kBlock);
  group.enable_host_tier({{2, 0}});
  enable_disk(group.main(), directory);
  Scheduler scheduler(SchedulerConfig{}, group);
  scheduler.add(1, first, "", "base", 0);
  scheduler.add(2, second, "", "base", 0);
  const std::map<SchedulerRequestId, int32_t> hits = run_to_completion(scheduler, group, directory);
  EXPECT_FALSE(scheduler.has_work());
  ASSERT_EQ(hits.size(), 2u);
  EXPECT_GE(hits.at(1), 2 * kBlock);
  EXPECT_LT(hits.at(1), 4 * kBlock);
  EXPECT_GE(hits.at(2), 2 * kBlock);
}

}  // namespace
}  // namespace loom
