// The disk tier of one KvCacheManager (below the host tier; docs/design.md §2,
// kv_disk_tier.h): lookups past the tree by content hash, the disk -> host
// reads it plans and their transfers until they finish, the reservations of
// waiting requests' prefixes, and the KV events of blocks on disk.
// Bookkeeping only: the engine reads and writes the files. Owned by the
// manager (KvCacheManager::enable_disk_tier, after its host tier and block
// hashes, before any block is committed), which reaches it as disk_tier().
//
// - Write-through: an offload (device -> host backup) also names, in
//   KvTransfer::block_hashes, every block it copies (host_tier_planner.h);
//   whoever runs it writes them to disk after the copy, skipping those the
//   store holds already (so this thread never touches the file system for
//   it). A failed write does not fail the offload; the block is just not on disk.
// - Lookups continue past the tree's path by hash: blocks being read, then
//   blocks the directory holds (KvCacheManager::prefix_location).
// - start_read plans a kDiskRead transfer of the blocks that follow the tree's
//   path on disk (none when the next block is being read already): host
//   blocks taken as a backup takes them (a free one, else a host leaf whose
//   eviction key is below the read's, never the path's own last node), else
//   by dropping the backup of a device node whose key is below the read's
//   (ready, not reserved; it stays on the device without one). Until it
//   finishes they belong to the transfer, not to the tree (nothing in the
//   tree is pinned or changes state). On success the blocks whose parent is
//   still the path's end join the tree as host nodes (ready; a load brings
//   them to the device), the others (their parent gone, or recomputed
//   meanwhile) go back to the host pool; on failure all do, and those blocks
//   count as not on disk from then on (lookups stop before them, so a request
//   never waits on the same failing read twice). kPrefetch reads take only
//   free host blocks or leaves of lower priority as prefetch loads do.
//
// Reservations (a waiting request's prefix; Scheduler policy 7). Blocks read
// from disk for a waiting request are worth something only if they are still
// there when it is admitted. A reserved node is held for a waiting request:
//   host tier (ready or loading)  never host-evicted: a backup (commit's
//                                 write-through) or another read takes other
//                                 host blocks or none;
//   device tier                   device-evicted after every unreserved node
//                                 (kReservedEvictionBand), so still available:
//                                 the capacity counts do not change, and a
//                                 running request is never starved by one.
// A demand read (kDemand) reserves its blocks when they join the tree. The
// scheduler re-derives the whole set before each step: clear_reservations(),
// then reserve_prefix() for the waiting requests it serves first. A node that
// is removed (its subtree dropped) stops being reserved.
//
// Thread: engine thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kv/device_blocks.h"
#include "kv/host_block_pool.h"
#include "kv/kv_cache_stats.h"
#include "kv/kv_disk_tier.h"
#include "kv/kv_transfer.h"
#include "kv/prefix_location.h"

namespace loom {

class DiskTierPlanner {
 public:
  // `host_pool`: the host tier's blocks, which reads fill. Precondition: the
  // tree names its blocks (RadixTree::has_block_hasher) and config.directory is set.
  DiskTierPlanner(DeviceBlocks& device, HostBlockPool& host_pool, KvTransferIds& transfer_ids,
                  KvDiskTierConfig config);
  DiskTierPlanner(const DiskTierPlanner&) = delete;
  DiskTierPlanner& operator=(const DiskTierPlanner&) = delete;

  // ---- Lookups (change nothing) ----
  // Adds the blocks after `path` (the tree's part of tokens' prefix) that are
  // being read or on disk to `location`.
  void locate_past(const KvKey& kv_key, std::span<const KvTokenId> tokens, const std::vector<RadixNode*>& path,
                   PrefixLocation& location) const;
  // Whether the block after the tree's part of tokens' prefix is being read from disk.
  bool read_pending(const KvKey& kv_key, std::span<const KvTokenId> tokens) const;
  // Whether that block is being read or on disk (a read could fetch it).
  bool next_block_on_disk(const KvKey& kv_key, std::span<const KvTokenId> tokens) const;

  // ---- Reads ----
  // Returns the blocks now being read (0: nothing on disk after the tree's
  // part, a read already in the way, or no host block to be had).
  int32_t start_read(const KvKey& kv_key, std::span<const KvTokenId> tokens, int32_t max_blocks,
                     KvLoadReason reason = KvLoadReason::kDemand);
  // An agent's fixed prefix as last declared (KvCacheManager::set_agent_fixed_prefix):
  // the disk may hold blocks of it that are in no tree tier.
  void set_agent_prefix(const std::string& agent_key, const KvKey& kv_key, std::span<const KvTokenId> tokens);
  void forget_agents(const std::function<bool(const std::string&)>& matches);
  // start_read(kPrefetch) of the blocks of the agent's declared prefix that
  // follow the tree's part on disk (they reach the host now and the device at a
  // later prefetch). 0 for an unknown agent.
  int32_t prefetch_agent(const std::string& agent_key, int32_t max_blocks);

  // ---- Reservations ----
  struct PrefixReservation {
    int32_t num_host_blocks = 0;     // host blocks the reserved nodes hold (host-tier nodes, device nodes' backups)
    int32_t num_reading_blocks = 0;  // blocks after the tree's part being read (they reserve when they join)
    int32_t num_unreserved_host_blocks = 0;  // host-tier nodes of the path left unreserved (over max_host_blocks)
  };
  void clear_reservations() { device_.tree.clear_reserved(); }
  // Reserves the device nodes of tokens' cached prefix and its host-tier
  // nodes, top down, while the host blocks they hold stay within
  // max_host_blocks (device nodes are always reserved; their backups count).
  PrefixReservation reserve_prefix(const KvKey& kv_key, std::span<const KvTokenId> tokens, int32_t max_host_blocks);

  // ---- Events (kv_event_sink.h, medium kDisk) ----
  // After an offload: announces the blocks it wrote through that the directory holds.
  void announce_written_through(const KvTransfer& offload);
  // These blocks left the directory (the store trimmed them): those announced are removed.
  void blocks_removed(std::span<const KvBlockHash> hashes);

  // ---- Transfers (kDiskRead) ----
  void take_transfers(std::vector<KvTransfer>& out);
  bool owns(int64_t transfer_id) const { return reads_.count(transfer_id) != 0; }
  // Applies a finished read. Precondition: owns(transfer_id).
  void finish_transfer(int64_t transfer_id, bool succeeded);
  int32_t num_transfers_in_flight() const { return static_cast<int32_t>(reads_.size()); }
  // The host blocks reads in flight hold (the host tier's integrity counts them).
  std::vector<int32_t> held_host_blocks() const;

  void add_stats(KvCacheStats& stats) const;
  // "" when every read in flight is well formed and the blocks recorded as being read are theirs.
  std::string integrity_error() const;

 private:
  struct Read {
    KvTransfer transfer;
    bool taken = false;
    // Where its blocks go: kv_key's blocks [first_block, ...) of tokens.
    KvKey kv_key;
    std::vector<KvTokenId> tokens;  // tokens[0, (first_block + n) * block_size)
    int32_t first_block = 0;
  };
  struct AgentPrefix {
    KvKey kv_key;
    std::vector<KvTokenId> tokens;
  };

  // Hashes of the full blocks of tokens after `path` (the tree's part),
  // while each is being read or on disk: {hash, reading}.
  std::vector<std::pair<KvBlockHash, bool>> blocks_after_path(const KvKey& kv_key, std::span<const KvTokenId> tokens,
                                                              const std::vector<RadixNode*>& path,
                                                              int32_t max_blocks) const;
  KvBlockHash hash_after(const KvBlockHash& parent, const KvKey& kv_key, int32_t block,
                         std::span<const KvTokenId> tokens) const;
  void finish_read(const Read& read, bool succeeded);

  DeviceBlocks& device_;
  HostBlockPool& host_pool_;
  KvTransferIds& transfer_ids_;
  KvBlockDirectory& directory_;
  std::map<int64_t, Read> reads_;            // in flight, by id
  std::map<KvBlockHash, int64_t> reading_;   // block -> the read reading it
  std::set<KvBlockHash> unreadable_;         // blocks of failed reads: never read again (bounded)
  static constexpr size_t kMaxUnreadableBlocks = 1 << 16;
  std::set<KvBlockHash> announced_on_disk_;  // blocks the sink was told are on disk (kDisk)
  std::map<std::string, AgentPrefix> agent_prefixes_;
  int64_t num_read_blocks_ = 0, num_read_failed_blocks_ = 0, num_failed_reads_ = 0;
};

}  // namespace loom
