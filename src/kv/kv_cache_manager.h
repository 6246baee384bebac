// The KV cache manager: a BlockPool plus a RadixTree over it, and the leases
// through which running requests hold blocks.
//
// A request's block table is a KvLease. Its blocks split into three ranges:
//
//   block_ids: [0 .. num_committed_blocks) [.. private, full or partial ..]
//               in the radix tree (matched     written by this request only;
//               at lock_prefix or committed)   committed once full + computed
//
// Life of a request (all on the engine thread):
//   lease = lock_prefix(key, tokens)       // reuse cached blocks; they are now in use
//   if (can_allocate(n)) allocate(lease, n) // plan, then apply; "no room" is `false`
//   ... forward ...; commit(lease, tokens, num_computed)   // full blocks -> tree
//   lease.release() or ~KvLease           // committed blocks stay cached (LRU), others free
//
// While a lease holds a block, the block (and its tree node) cannot be evicted:
// leases are the RAII lock handles of the design. allocate() evicts cached
// leaves, least recently used first (or workflow-aware, see below), when free
// blocks run short.
//
// Namespaces and keys: see kv/kv_key.h. A lease remembers its KvKey, so
// commit() files each block under the namespace the key gives that block
// (an activated request's early blocks go to "base", later ones to its branch).
// kv_namespace_for_adapter("") == "base"; an isolated adapter NAME uses "lora/NAME".
//
// ForkKV's residual cache is a second KvCacheManager over its own pool (the
// rCache blocks), with namespaces "resid/NAME"; the two evict independently,
// each with its own host tier when the engine has one (kv_cache_group.h).
//
// The manager does the device work: match, lock, allocate, commit, evict, and
// the agents' marks that eviction reads. Beside it, owned by it, the tiers
// below the device plan their own transfers: the host tier
// (kv/host_tier_planner.h: backups, loads, prefetches) and the disk tier
// (kv/disk_tier_planner.h: reads, reservations, disk events). Both act on the
// manager's DeviceBlocks (kv/device_blocks.h). The manager joins them where a
// device operation involves them (commit plans backups, a finished offload
// announces what was written through) and where one answer spans the tiers:
// prefix_location, the transfers, stats and integrity_error.
//
// Thread: engine thread only. The manager must outlive its leases.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/device_blocks.h"
#include "kv/disk_tier_planner.h"
#include "kv/host_tier_planner.h"
#include "kv/kv_cache_id.h"
#include "kv/kv_cache_stats.h"
#include "kv/kv_disk_tier.h"
#include "kv/kv_event_sink.h"
#include "kv/kv_key.h"
#include "kv/kv_transfer.h"
#include "kv/prefix_location.h"
#include "kv/radix_tree.h"

namespace loom {

std::string kv_namespace_for_adapter(const std::string& adapter_name);

class KvCacheManager;

// Move-only; releases its blocks when destroyed.
class KvLease {
 public:
  KvLease() = default;
  KvLease(KvLease&& other) noexcept { *this = std::move(other); }
  KvLease& operator=(KvLease&& other) noexcept;
  KvLease(const KvLease&) = delete;
  KvLease& operator=(const KvLease&) = delete;
  ~KvLease() { release(); }

  const std::vector<int32_t>& block_ids() const { return block_ids_; }
  int32_t num_blocks() const { return static_cast<int32_t>(block_ids_.size()); }
  int32_t num_committed_blocks() const { return num_committed_blocks_; }
  // Tokens found in the cache when the lease was made (a multiple of block_size).
  int32_t num_found_tokens() const { return num_found_tokens_; }
  const KvKey& kv_key() const { return kv_key_; }
  const std::string& kv_namespace() const { return kv_key_.kv_namespace; }
  bool active() const { return manager_ != nullptr; }
  // Gives every block back: committed ones stay cached, the rest become free.
  void release();

 private:
  friend class KvCacheManager;
  KvCacheManager* manager_ = nullptr;
  KvKey kv_key_;
  std::vector<int32_t> block_ids_;
  int32_t num_committed_blocks_ = 0;
  int32_t num_found_tokens_ = 0;
  bool marks_used_ = true;  // false for hold_prefix's leases
};

class KvCacheManager {
 public:
  using Transfer = KvTransfer;
  using LoadReason = KvLoadReason;
  using EvictionPolicy = KvEvictionPolicy;  // kLru, kWorkflow

  KvCacheManager(int32_t num_blocks, int32_t block_size);
  ~KvCacheManager();
  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  int32_t block_size() const { return device_.tree.block_size(); }
  int32_t num_total_blocks() const { return device_.pool.num_total_blocks(); }

  // ---- Device: match, lock, allocate, commit ----
  // Number of tokens of `tokens` whose blocks are cached (a multiple of
  // block_size). Changes nothing.
  int32_t num_cached_prefix_tokens(const KvKey& kv_key, std::span<const KvTokenId> tokens) const;
  int32_t num_cached_prefix_tokens(const std::string& kv_namespace, std::span<const KvTokenId> tokens) const {
    return num_cached_prefix_tokens(KvKey::single(kv_namespace), tokens);
  }
  // A lease over the cached blocks of the longest cached prefix of `tokens`
  // (whole blocks only; pass tokens.first(n) to cap it). Never fails; the
  // lease may be empty. Marks those blocks used now (LRU).
  // Block i is looked up (and later committed) under kv_key.namespace_of_block(i).
  KvLease lock_prefix(const KvKey& kv_key, std::span<const KvTokenId> tokens);
  KvLease lock_prefix(const std::string& kv_namespace, std::span<const KvTokenId> tokens) {
    return lock_prefix(KvKey::single(kv_namespace), tokens);
  }
  // lock_prefix that never marks the blocks used (no LRU time when made or
  // released, no prefetch metric): holds them so that nothing evicts them
  // while a planned step is applied (Scheduler::apply).
  KvLease hold_prefix(const KvKey& kv_key, std::span<const KvTokenId> tokens);
  // Marks the blocks lock_prefix would lock used now (LRU time, prefetch
  // metric), holding nothing: a request that found no room still used its prefix.
  void touch_prefix(const KvKey& kv_key, std::span<const KvTokenId> tokens);

  // Whether `num_blocks` more blocks can be had (free + cached).
  bool can_allocate(int32_t num_blocks) const { return num_blocks <= num_available_blocks(); }
  // Free + cached blocks: what allocate() could hand out now.
  int32_t num_available_blocks() const { return device_.num_available_blocks(); }
  // Read-only views for planning (kv/kv_capacity_ledger.h). References on a
  // block: leases holding it, plus one per transfer pinning it.
  int32_t block_ref_count(int32_t block_id) const { return device_.pool.ref_count(block_id); }
  bool is_reserved(int32_t block_id) const;
  // Device blocks that are cached (unreferenced) and reserved (disk_tier_planner.h
  // "Reservations"): the last ones eviction takes.
  int32_t num_reserved_cached_blocks() const;
  // Where the cached prefix of `tokens` lives (kv/prefix_location.h): on the
  // device, loading, on the host, and with kTreeAndDisk and a disk tier, being
  // read or on disk past the tree. Changes nothing.
  PrefixLocation prefix_location(const KvKey& kv_key, std::span<const KvTokenId> tokens,
                                 PrefixLookup lookup = PrefixLookup::kTreeAndDisk) const;
  // Appends `num_blocks` blocks to the lease, evicting cached leaves if needed
  // (LRU, or as the workflow policy below says). Returns false, changing
  // nothing, when can_allocate is false.
  bool allocate(KvLease& lease, int32_t num_blocks);

  // Puts the lease's full blocks of computed tokens into the tree:
  // blocks [num_committed_blocks, num_computed_tokens / block_size).
  // tokens[0, num_computed_tokens) are the tokens whose K/V the blocks hold.
  // A block whose tokens another request already committed is swapped for the
  // tree's block (the duplicate is freed), so block_ids() may change. With a
  // host tier, the nodes it newly inserts get backups (host_tier_planner.h).
  void commit(KvLease& lease, std::span<const KvTokenId> tokens, int32_t num_computed_tokens);

  // Drops every cached block of a namespace (e.g. an unloaded adapter's), and
  // its host-tier copies. Preconditions: no lease of that namespace holds
  // blocks, and num_transfers_in_flight() == 0 (the engine drains transfers
  // first; checked). Returns device blocks freed.
  int32_t drop_namespace(const std::string& kv_namespace);
  // Drops every cached block whose namespace `matches` (with its descendants,
  // e.g. all "alora/NAME@S" branches under base nodes). Same preconditions.
  int32_t drop_namespaces(const std::function<bool(const std::string&)>& matches);

  // ---- Workflow-aware eviction (KVFlow; docs/design.md §2) ----
  //
  // With EvictionPolicy::kWorkflow, allocate() evicts among unreferenced leaves:
  //   1. nodes on no agent's fixed prefix ("dynamic suffixes"), LRU first;
  //   2. then fixed-prefix nodes by steps-to-execution, largest first
  //      (kStepsFar first of all), LRU within equal steps.
  // A node's steps = min over the agents whose fixed prefix passes through it
  // (an agent's value sits on the last block of its fixed prefix and
  // propagates to ancestors as the min over children). kLru ignores all this.
  // Default kLru. Marks and steps are kept under both policies, so switching
  // takes effect at once (kv/eviction_priority.h has the exact keys).
  void set_eviction_policy(EvictionPolicy policy) { device_.tree.set_eviction_policy(policy); }
  EvictionPolicy eviction_policy() const { return device_.tree.eviction_policy(); }
  // Declares (or moves) agent `agent_key`'s fixed prefix: the full blocks of
  // tokens[0, num_fixed_tokens) under kv_key, as far as they are in the tree now
  // (on any tier; blocks committed later are covered by calling it again).
  // `agent_key` is unique per (workflow, agent), e.g. "wf-1/planner". Cheap;
  // engine thread. With a host tier, the marked device blocks that have no
  // backup yet get one planned as commit() does (now that they are fixed they
  // may displace a host leaf of lower priority); with a disk tier, the disk
  // tier remembers the prefix (its blocks past the tree may be on disk).
  void set_agent_fixed_prefix(const std::string& agent_key, const KvKey& kv_key,
                              std::span<const KvTokenId> tokens, int32_t num_fixed_tokens);
  // Sets the steps-to-execution of agents (absent agents keep their value;
  // INT32_MAX = far). Re-derives node priorities.
  void set_agent_steps(const std::map<std::string, int32_t>& steps_by_agent_key);
  // Forgets agents (their nodes become dynamic unless another agent covers them).
  void forget_agents(const std::function<bool(const std::string&)>& matches);
  // Every cached block in the order allocate() would take them if nothing
  // else changed (the evictable leaves by key, a parent once its children
  // are gone). Tests and debugging; O(n log n).
  std::vector<int32_t> eviction_order() const { return device_.tree.eviction_order(); }

  // ---- The tiers below the device ----
  // enable_host_tier(n > 0) at most once (nodes committed before it simply
  // have no backup); n == 0 keeps the manager without a host tier.
  void enable_host_tier(int32_t num_host_blocks);
  // nullptr without a host tier.
  HostTierPlanner* host_tier() { return host_.get(); }
  const HostTierPlanner* host_tier() const { return host_.get(); }
  // After enable_host_tier(n > 0) and enable_block_hashes(), before any block
  // is committed (checked).
  void enable_disk_tier(KvDiskTierConfig config);
  // nullptr without a disk tier.
  DiskTierPlanner* disk_tier() { return disk_.get(); }
  const DiskTierPlanner* disk_tier() const { return disk_.get(); }
  // Prefetch: the host tier's prefetch_agent and, with a disk tier, the disk
  // tier's, with what max_blocks leaves. Returns the blocks now loading or
  // reading (0: unknown agent, nothing below the device, or no room).
  int32_t prefetch_agent(const std::string& agent_key, int32_t max_blocks);
  // Prefetched blocks of tokens' prefix found still loading count as late
  // (HostTierPlanner::count_late_prefetch; nothing without a host tier).
  void count_late_prefetch(const KvKey& kv_key, std::span<const KvTokenId> tokens);
  // The tiers' transfers planned since the last call, in the order planned.
  std::vector<Transfer> take_transfers();
  // Applies a finished transfer (succeeded: the copy completed) in the tier
  // that planned it. Precondition: an id planned and not finished yet
  // (checked; normally one from take_transfers(); one not taken yet is
  // dropped from the next take).
  void finish_transfer(int64_t transfer_id, bool succeeded);
  // Transfers planned and not finished (taken or not).
  int32_t num_transfers_in_flight() const;

  // ---- Block names and events ----
  //
  // enable_block_hashes() (before any block is committed; at most once) gives
  // every node from then on its content hash (RadixNode::content_hash,
  // kv_block_hash.h), chained from naming.cache_salt over namespace salts and
  // tokens. The disk tier files blocks by it; events name blocks by it.
  void enable_block_hashes(KvBlockNaming naming);
  bool has_block_hashes() const { return device_.tree.has_block_hasher(); }
  // Reports every block that enters or leaves this manager's device or host
  // tier to `sink` (kv_event_sink.h), as member `cache`, on the engine thread
  // at the state change. Precondition: has_block_hashes(), before any block
  // is committed (checked). nullptr: no events (the default; costs nothing).
  void set_event_sink(KvEventSink* sink, KvCacheId cache) { device_.tree.set_event_sink(sink, cache); }

  // Evicts every cached device block as eviction does (with a host tier, the
  // backed-up ones move to the host). Tests; "after the blocks were evicted".
  int32_t evict_all_cached();

  KvCacheStats stats() const;
  // "" when free + cached + in use == total, the tree is consistent and, with
  // a host tier, every host block is free xor held by one node or disk read and
  // every loading / offloading node belongs to a transfer in flight.
  std::string integrity_error() const;

  const RadixTree& tree() const { return device_.tree; }

 private:
  friend class KvLease;
  void release(KvLease& lease);
  KvLease reference_prefix(const KvKey& kv_key, std::span<const KvTokenId> tokens, bool mark_used);
  // Private (uncommitted) blocks of leases [begin, end) leave or join the per-namespace count.
  void count_private_blocks(const KvLease& lease, int32_t begin, int32_t end, int32_t delta);
  // Prefetched blocks first locked ready count as in time.
  void count_prefetch_hits(const std::vector<RadixNode*>& nodes);

  DeviceBlocks device_;
  std::map<std::string, int32_t> num_private_blocks_by_namespace_;
  int64_t num_prefetch_hit_blocks_ = 0;
  KvBlockNaming naming_;  // enable_block_hashes
  KvTransferIds transfer_ids_;
  // Declared after device_: destroyed first, as the tree holds the host pool.
  std::unique_ptr<HostTierPlanner> host_;
  std::unique_ptr<DiskTierPlanner> disk_;
};

}  // namespace loom
