// The host tier of one KvCacheManager (KVFlow's / HiCache's host memory;
// docs/design.md §2): its host block pool, the backups (offloads) and loads it
// plans, and their transfers until they finish. Bookkeeping only: the engine
// copies the blocks. Owned by the manager (KvCacheManager::enable_host_tier),
// which reaches it as host_tier(); it acts on the manager's DeviceBlocks.
//
// A tree node keeps its K/V on the device (block_id), in a host block
// (host_block_id), or both:
//
//   node         tier    state        device block  host block    lock_prefix  device-evictable
//   device       device  ready        yes           -             matches      yes: node removed
//   backed up    device  ready        yes           yes (valid)   matches      yes: becomes "host"
//   offloading   device  offloading   yes           yes (filling) matches      no (pinned)
//   host         host    ready        -             yes (valid)   stops here   -
//   loading      host    loading      yes (filling) yes (valid)   stops here   no (in use)
//
// Invariants: a node's device-resident ancestors are all device-resident
// (device eviction takes nodes with no device-resident child; loads go top
// down), so a path is [device ...][loading ...][host ...]. A device node with no
// valid backup that is evicted is removed with every host node below it.
//
// Backups are written through: the manager's commit() asks plan_offload for
// each node it newly inserts (not for blocks another request committed first)
// and gets one when a host block can be had: a free one, else by dropping the
// first host leaf ("host" node with no children, same policy as the device)
// whose eviction key is smaller than the new node's, so under kWorkflow a
// dynamic block never pushes out a fixed prefix's backup. All the nodes one
// call backs up go into one transfer. A full host pool means no backup: the
// block is recomputed if it is evicted (degrades to recompute, never fails).
// A node the lease recomputed that the tree holds only on the host takes the
// lease's block (its backup stays); one that is still loading stops the
// commit there (the lease keeps the rest private until it is ready).
//
// Device eviction (allocation, start_load, evict_all_cached) takes
// unreferenced ready device nodes with no device-resident child (host
// children do not hold a node back): one with a valid backup becomes a host
// node (its marks and steps stay); one without is removed with every host
// node below it.
//
// Until finished, a transfer pins the device blocks of its whole path (root
// -> its last node: the blocks being copied and their ancestors) by holding
// references, as a lease does: they count as in use, are never evicted,
// reused or dropped, and its host blocks are held by its nodes. A lease
// released while its blocks are offloading leaves them pinned until the
// offload finishes; then they are cached. A failed offload leaves the node
// without backup; a failed load removes the loading nodes and every host
// node below them (those host copies are suspect), so requests recompute them.
//
// Thread: engine thread only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kv/device_blocks.h"
#include "kv/host_block_pool.h"
#include "kv/host_swap_space.h"
#include "kv/kv_cache_stats.h"
#include "kv/kv_transfer.h"

namespace loom {

class HostTierPlanner {
 public:
  // Precondition: num_host_blocks > 0. Gives the tree its host pool.
  HostTierPlanner(DeviceBlocks& device, KvTransferIds& transfer_ids, int32_t num_host_blocks);
  HostTierPlanner(const HostTierPlanner&) = delete;
  HostTierPlanner& operator=(const HostTierPlanner&) = delete;

  int32_t num_host_blocks() const { return pool_.num_total_blocks(); }
  // The host blocks; the disk tier reads into them (disk_tier_planner.h).
  HostBlockPool& pool() { return pool_; }
  // Swap preemption's copies (host_swap_space.h), over the same pool; its
  // transfers go out with this tier's (take_transfers, num_transfers_in_flight).
  HostSwapSpace& swap_space() { return swap_; }
  const HostSwapSpace& swap_space() const { return swap_; }

  // Backs up path[first_candidate ...] nodes (device, ready, no backup) as far
  // as host blocks can be had; one transfer pinning path[0 .. last backed up].
  void plan_offload(const std::vector<RadixNode*>& path, size_t first_candidate);
  // With a disk tier: every offload also names, in KvTransfer::block_hashes,
  // the blocks it copies; whoever runs it writes them to disk after the copy.
  void write_through_to_disk() { writes_through_ = true; }

  // Starts loading the host-only blocks of tokens' cached prefix that follow its
  // device part (at most max_blocks, the first ones): allocates device blocks,
  // marks them loading and plans one transfer. Pins the device ancestors until
  // it finishes. kDemand evicts as allocation does (never the path itself).
  // kPrefetch takes free blocks, and under kWorkflow evicts only nodes whose
  // eviction key is below {1, -steps, min, min}, steps = fixed_steps of the
  // last block to load (dynamic nodes, and fixed ones further from execution),
  // so a prefetch never pushes out something the policy values as much or
  // more; under kLru, or for a dynamic path, it takes free blocks only. Loads
  // as many of the blocks as it gets blocks for. Returns the number of blocks
  // now loading: 0, changing nothing, when nothing waits on the host, when a
  // loading block is in the way, or when no device block can be had ("no
  // room"). A finished load keeps the host copy (the node stays backed up).
  int32_t start_load(const KvKey& kv_key, std::span<const KvTokenId> tokens, int32_t max_blocks,
                     KvLoadReason reason = KvLoadReason::kDemand);
  // start_load(kPrefetch) over the marked fixed prefix of `agent_key` (the
  // mark stays on nodes moved to the host). 0: unknown agent, nothing on the
  // host, or no room.
  int32_t prefetch_agent(const std::string& agent_key, int32_t max_blocks);
  // Prefetched blocks of tokens' prefix that are still loading count as late
  // (the stats' num_prefetch_late_blocks), once each.
  void count_late_prefetch(const KvKey& kv_key, std::span<const KvTokenId> tokens);

  // The transfers planned since the last call (the swap space's too), appended to `out`.
  void take_transfers(std::vector<KvTransfer>& out);
  // Its own offloads and loads (not the swap space's: swap_space().owns).
  bool owns(int64_t transfer_id) const { return in_flight_.count(transfer_id) != 0; }
  // Applies a finished offload or load (precondition: owns(transfer_id)) and returns it.
  KvTransfer finish_transfer(int64_t transfer_id, bool succeeded);
  // Its own and the swap space's.
  int32_t num_transfers_in_flight() const {
    return static_cast<int32_t>(in_flight_.size()) + swap_.num_transfers_in_flight();
  }

  void add_stats(KvCacheStats& stats) const;
  // "" when every host block is free xor held by one node (or by one of
  // `read_blocks`, the host blocks disk reads hold, or by a swap) and every loading or
  // offloading node belongs to a transfer in flight.
  std::string integrity_error(std::span<const int32_t> read_blocks) const;

 private:
  struct InFlight {
    KvTransfer transfer;
    std::vector<int32_t> pinned_block_ids;  // root -> last node, each holding one reference
    bool taken = false;
  };

  std::optional<int32_t> take_host_block(const EvictionKey& for_key);
  // start_load over a node path root -> ... (any tiers).
  int32_t load_path(const std::vector<RadixNode*>& path, int32_t max_blocks, KvLoadReason reason);
  void add_transfer(KvTransfer transfer, std::vector<int32_t> pinned_block_ids);

  DeviceBlocks& device_;
  KvTransferIds& transfer_ids_;
  HostBlockPool pool_;
  HostSwapSpace swap_;  // over pool_
  bool writes_through_ = false;
  std::map<int64_t, InFlight> in_flight_;  // by id: the order they were planned
  int64_t num_offloaded_blocks_ = 0, num_loaded_blocks_ = 0, num_prefetched_blocks_ = 0;
  int64_t num_prefetch_late_blocks_ = 0, num_failed_transfers_ = 0, num_disk_write_planned_blocks_ = 0;
};

}  // namespace loom
