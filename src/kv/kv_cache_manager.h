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
// Thread: engine thread only. The manager must outlive its leases.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "kv/block_pool.h"
#include "kv/host_block_pool.h"
#include "kv/kv_cache_id.h"
#include "kv/kv_disk_tier.h"
#include "kv/kv_event_sink.h"
#include "kv/kv_key.h"
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

struct KvCacheStats {
  int32_t num_total_blocks = 0, num_free_blocks = 0, num_cached_blocks = 0, num_in_use_blocks = 0;
  int64_t num_evicted_blocks = 0;  // since start: device blocks evicted (moved to the host or dropped)
  // Host tier (0 without one). Counters are since start, in blocks.
  int32_t num_host_total_blocks = 0, num_host_used_blocks = 0;  // used: valid backups + offloads in flight
  int64_t num_offloaded_blocks = 0;        // device -> host copies finished
  int64_t num_loaded_blocks = 0;           // host -> device copies finished (prefetches included)
  int64_t num_prefetched_blocks = 0;       // of those, started by prefetch_agent
  int64_t num_prefetch_hit_blocks = 0;     // prefetched blocks first locked by lock_prefix when ready ("in time")
  int64_t num_prefetch_late_blocks = 0;    // prefetched blocks a prefix_status found still loading ("late")
  int64_t num_failed_transfers = 0;
  int32_t num_host_only_blocks = 0;        // nodes whose K/V is only on the host now
  // Disk tier (0 without one). Counters are since start, in blocks.
  int64_t num_disk_read_blocks = 0;        // disk -> host reads finished and joined to the tree
  int64_t num_disk_read_failed_blocks = 0; // blocks of failed disk reads
  int64_t num_disk_write_planned_blocks = 0;  // offloaded blocks named for a disk write
  int32_t num_disk_reading_blocks = 0;     // disk reads in flight now
  // Device blocks in the tree (cached, in use by a lease that committed them,
  // or loading) per namespace; host-only nodes are not counted. Private
  // (uncommitted) blocks are counted under their lease's namespace for the
  // block index they hold.
  std::map<std::string, int32_t> num_blocks_by_namespace;
};

class KvCacheManager {
 public:
  KvCacheManager(int32_t num_blocks, int32_t block_size);
  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  int32_t block_size() const { return tree_.block_size(); }
  int32_t num_total_blocks() const { return pool_.num_total_blocks(); }

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

  // Whether `num_blocks` more blocks can be had (free + cached).
  bool can_allocate(int32_t num_blocks) const { return num_blocks <= num_available_blocks(); }
  // Free + cached blocks: what allocate() could hand out now.
  int32_t num_available_blocks() const;
  // Read-only views for planning (kv/kv_capacity_ledger.h). References on a
  // block: leases holding it, plus one per transfer pinning it.
  int32_t block_ref_count(int32_t block_id) const;
  // The cached prefix of `tokens` on every tier, root first: [device ...]
  // [loading ...][host ...] (see "Host tier" below); its leading device-tier
  // nodes are the blocks lock_prefix would lock. Changes nothing.
  std::vector<const RadixNode*> prefix_path(const KvKey& kv_key, std::span<const KvTokenId> tokens) const;
  // Appends `num_blocks` blocks to the lease, evicting cached leaves if needed
  // (LRU, or as the workflow policy below says). Returns false, changing
  // nothing, when can_allocate is false.
  bool allocate(KvLease& lease, int32_t num_blocks);

  // Puts the lease's full blocks of computed tokens into the tree:
  // blocks [num_committed_blocks, num_computed_tokens / block_size).
  // tokens[0, num_computed_tokens) are the tokens whose K/V the blocks hold.
  // A block whose tokens another request already committed is swapped for the
  // tree's block (the duplicate is freed), so block_ids() may change.
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
  using EvictionPolicy = KvEvictionPolicy;  // kLru, kWorkflow
  void set_eviction_policy(EvictionPolicy policy);
  EvictionPolicy eviction_policy() const;
  // Declares (or moves) agent `agent_key`'s fixed prefix: the full blocks of
  // tokens[0, num_fixed_tokens) under kv_key, as far as they are in the tree now
  // (on any tier; blocks committed later are covered by calling it again).
  // `agent_key` is unique per (workflow, agent), e.g. "wf-1/planner". Cheap;
  // engine thread. With a host tier, the marked device blocks that have no
  // backup yet get one planned as commit() does (now that they are fixed they
  // may displace a host leaf of lower priority).
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
  std::vector<int32_t> eviction_order() const;

  // ---- Host tier (KVFlow's / HiCache's host memory; docs/design.md §2) ----
  //
  // With enable_host_tier(), a tree node keeps its K/V on the device (block_id),
  // in a host block (host_block_id), or both:
  //
  //   node         tier    state        device block  host block   lock_prefix  device-evictable
  //   device       device  ready        yes           -            matches      yes: node removed
  //   backed up    device  ready        yes           yes (valid)  matches      yes: becomes "host"
  //   offloading   device  offloading   yes           yes (filling) matches     no (pinned)
  //   host         host    ready        -             yes (valid)  stops here   -
  //   loading      host    loading      yes (filling) yes (valid)  stops here   no (in use)
  //
  // Invariants: a node's device-resident ancestors are all device-resident
  // (device eviction takes nodes with no device-resident child; loads go top
  // down), so a path is [device ...][loading ...][host ...]. A device node with no
  // valid backup that is evicted is removed with every host node below it.
  //
  // Backups are written through: commit() plans an offload (device -> host copy)
  // for each node it newly inserts (not for blocks another request committed
  // first) when a host block can be had: a free one, else by dropping the
  // first host leaf ("host" node with no children, same policy as the device)
  // whose eviction key is smaller than the new node's, so under kWorkflow a
  // dynamic block never pushes out a fixed prefix's backup. All the nodes one
  // commit() backs up go into one transfer. A full host pool means no backup:
  // the block is recomputed if it is evicted (degrades to recompute, never
  // fails). A node the lease recomputed that the tree holds only on the host
  // takes the lease's block (its backup stays); one that is still loading
  // stops the commit there (the lease keeps the rest private until it is ready).
  //
  // Device eviction (allocate(), start_load, evict_all_cached) takes
  // unreferenced ready device nodes with no device-resident child (host
  // children do not hold a node back): one with a valid backup becomes a host
  // node (its marks and steps stay); one without is removed with every host
  // node below it.
  //
  // Transfers are planned here and executed by someone else (the engine's
  // kv_transfer_worker, through Backend::copy_kv_blocks):
  //   take_transfers()           the jobs planned since the last call, in order;
  //   finish_transfer(id, ok)    applies one when its copy has finished.
  // Until finished, a transfer pins the device blocks of its whole path (root
  // -> its last node: the blocks being copied and their ancestors) by holding
  // references, as a lease does: they count as in use, are never evicted,
  // reused or dropped, and its host blocks are held by its nodes. A lease
  // released while its blocks are offloading leaves them pinned until the
  // offload finishes; then they are cached. A failed offload leaves the node
  // without backup; a failed load removes the loading nodes and every host
  // node below them (those host copies are suspect), so requests recompute them.
  //
  // Metrics (stats()): offloaded / loaded / prefetched blocks, prefetched blocks
  // later found ready by lock_prefix ("in time") or still loading by
  // prefix_status ("late"), failed transfers, host blocks in use.
  //
  // enable_host_tier(n > 0) at most once (nodes committed before it simply
  // have no backup); n == 0 keeps the manager without a host tier.
  void enable_host_tier(int32_t num_host_blocks);
  bool has_host_tier() const;
  int32_t num_host_blocks() const;

  struct PrefixStatus {
    int32_t num_device_tokens = 0;   // what lock_prefix would lock now
    int32_t num_loading_tokens = 0;  // next: blocks being loaded (the request should wait),
                                     // including blocks being read from disk after the tree's part
    int32_t num_host_tokens = 0;     // then: blocks only on the host (start_load can fetch them)
    int32_t num_disk_tokens = 0;     // then: blocks only on disk (start_disk_read can fetch them)
  };
  // Where the cached prefix of tokens (whole blocks) lives. Changes nothing
  // except the "late prefetch" metric (a prefetched block found still loading).
  PrefixStatus prefix_status(const KvKey& kv_key, std::span<const KvTokenId> tokens);

  enum class LoadReason : uint8_t { kDemand, kPrefetch };
  // Starts loading the host-only blocks of tokens' cached prefix that follow its
  // device part (at most max_blocks, the first ones): allocates device blocks,
  // marks them loading and plans one transfer. Pins the device ancestors until
  // it finishes. kDemand evicts as allocate() does (never the path itself).
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
                     LoadReason reason = LoadReason::kDemand);
  // Prefetch: start_load over the marked fixed prefix of `agent_key`
  // (set_agent_fixed_prefix; the mark stays on nodes moved to the host) with
  // kPrefetch; with a disk tier, also start_disk_read(kPrefetch) of the blocks
  // of its declared prefix that follow the tree's part on disk (they reach the
  // host now and the device at a later prefetch). Returns the number of blocks
  // now loading or reading (0: unknown agent, nothing below the device, or no room).
  int32_t prefetch_agent(const std::string& agent_key, int32_t max_blocks);

  // ---- Block names and events ----
  //
  // enable_block_hashes() (before any block is committed; at most once) gives
  // every node from then on its content hash (RadixNode::content_hash,
  // kv_block_hash.h), chained from naming.cache_salt over namespace salts and
  // tokens. The disk tier files blocks by it; events name blocks by it.
  void enable_block_hashes(KvBlockNaming naming);
  bool has_block_hashes() const { return tree_.has_block_hasher(); }
  // Reports every block that enters or leaves this manager's device or host
  // tier to `sink` (kv_event_sink.h), as member `cache`, on the engine thread
  // at the state change. Precondition: has_block_hashes(), before any block
  // is committed (checked). nullptr: no events (the default; costs nothing).
  void set_event_sink(KvEventSink* sink, KvCacheId cache);

  // ---- Disk tier (below the host tier; docs/design.md §2, kv_disk_tier.h) ----
  //
  // With enable_disk_tier() (after enable_host_tier(n > 0) and
  // enable_block_hashes(), before any block is committed):
  // - Write-through: an offload (device -> host backup) also names, in
  //   Transfer::block_hashes, every block it copies; whoever runs it writes
  //   them to disk after the copy, skipping those the store holds already (so
  //   this thread never touches the file system for it). A failed write does
  //   not fail the offload; the block is just not on disk.
  // - Lookups: prefix_status continues past the tree's path by hash: blocks
  //   being read count as loading, then blocks the directory holds as disk.
  // - start_disk_read plans a kDiskRead transfer of the blocks that follow the
  //   tree's path on disk (none when the next block is being read already):
  //   host blocks taken as a backup takes them (a free one, else a host leaf
  //   whose eviction key is below the read's, never the path's own last node),
  //   else by dropping the backup of a device node whose key is below the
  //   read's (ready, not reserved; it stays on the device without one).
  //   Until it finishes they belong to the transfer, not to the tree (nothing
  //   in the tree is pinned or changes state). On success the blocks whose
  //   parent is still the path's end join the tree as host nodes (ready; a
  //   start_load brings them to the device), the others (their parent gone, or
  //   recomputed meanwhile) go back to the host pool; on failure all do, and
  //   those blocks count as not on disk from then on (lookups stop before
  //   them, so a request never waits on the same failing read twice).
  //   kPrefetch reads take only free host blocks or leaves of lower priority
  //   as prefetch loads do.
  void enable_disk_tier(KvDiskTierConfig config);
  bool has_disk_tier() const { return disk_.directory != nullptr; }
  // KV events (kv_event_sink.h, medium kDisk): an offload that finishes with a
  // disk tier announces its blocks the directory now holds; these blocks left
  // the directory (the store trimmed them), so those announced are removed.
  void disk_blocks_removed(std::span<const KvBlockHash> hashes);
  // Returns the blocks now being read (0: nothing on disk after the tree's
  // part, a read already in the way, or no host block to be had).
  int32_t start_disk_read(const KvKey& kv_key, std::span<const KvTokenId> tokens, int32_t max_blocks,
                          LoadReason reason = LoadReason::kDemand);
  // Whether the block after the tree's part of tokens' prefix is being read from disk. Changes nothing.
  bool disk_read_pending(const KvKey& kv_key, std::span<const KvTokenId> tokens) const;
  // Whether that block is being read or on disk (a read could fetch it). Changes nothing.
  bool next_block_on_disk(const KvKey& kv_key, std::span<const KvTokenId> tokens) const;

  // ---- Reservations (a waiting request's prefix; Scheduler policy 7) ----
  //
  // Blocks read from disk for a waiting request are worth something only if
  // they are still there when it is admitted. A reserved node is held for a
  // waiting request:
  //   host tier (ready or loading)  never host-evicted: a backup (commit's
  //                                 write-through) or another read takes other
  //                                 host blocks or none;
  //   device tier                   device-evicted after every unreserved node
  //                                 (kReservedEvictionBand), so still available:
  //                                 the capacity counts do not change, and a
  //                                 running request is never starved by one.
  // A demand read (start_disk_read, kDemand) reserves its blocks when they join
  // the tree. The scheduler re-derives the whole set before each step:
  // clear_reservations(), then reserve_prefix() for the waiting requests it
  // serves first. A node that is removed (its subtree dropped) stops being reserved.
  struct PrefixReservation {
    int32_t num_host_blocks = 0;     // host blocks the reserved nodes hold (host-tier nodes, device nodes' backups)
    int32_t num_reading_blocks = 0;  // blocks after the tree's part being read (they reserve when they join)
    int32_t num_unreserved_host_blocks = 0;  // host-tier nodes of the path left unreserved (over max_host_blocks)
  };
  void clear_reservations();
  // Reserves the device nodes of tokens' cached prefix and its host-tier
  // nodes, top down, while the host blocks they hold stay within
  // max_host_blocks (device nodes are always reserved; their backups count).
  PrefixReservation reserve_prefix(const KvKey& kv_key, std::span<const KvTokenId> tokens, int32_t max_host_blocks);
  // Device blocks that are cached (unreferenced) and reserved: the last ones eviction takes.
  int32_t num_reserved_cached_blocks() const;

  struct Transfer {
    enum class Kind : uint8_t { kOffload, kLoad, kDiskRead };
    int64_t id = 0;
    Kind kind = Kind::kOffload;
    LoadReason reason = LoadReason::kDemand;   // loads and disk reads
    std::vector<int32_t> device_block_ids;     // copy device_block_ids[i] <-> host_block_ids[i] (none for kDiskRead)
    std::vector<int32_t> host_block_ids;
    // kOffload with a disk tier: block_hashes[i] names host_block_ids[i] on
    // disk (zero: do not write it); kDiskRead: the blocks to read into
    // host_block_ids[i]. Empty otherwise.
    std::vector<KvBlockHash> block_hashes;
  };
  std::vector<Transfer> take_transfers();
  // Applies a finished transfer (succeeded: the copy completed). Precondition:
  // an id planned and not finished yet (checked; normally one from
  // take_transfers(); one not taken yet is dropped from the next take).
  void finish_transfer(int64_t transfer_id, bool succeeded);
  // Transfers planned and not finished (taken or not).
  int32_t num_transfers_in_flight() const;

  // Evicts every cached device block as eviction does (with a host tier, the
  // backed-up ones move to the host). Tests; "after the blocks were evicted".
  int32_t evict_all_cached();

  KvCacheStats stats() const;
  // "" when free + cached + in use == total, the tree is consistent and, with
  // a host tier, every host block is free xor held by one node and every
  // loading / offloading node belongs to a transfer in flight.
  std::string integrity_error() const;

  const RadixTree& tree() const { return tree_; }

 private:
  // After an offload with a disk tier: announces (kDisk) the blocks it wrote through that the directory holds.
  void announce_written_through(const Transfer& transfer);
  friend class KvLease;
  struct TransferInFlight {
    Transfer transfer;
    std::vector<int32_t> pinned_block_ids;  // root -> last node, each holding one reference
    bool taken = false;
    // kDiskRead: where its blocks go: kv_key's blocks [first_block, ...) of tokens.
    KvKey kv_key;
    std::vector<KvTokenId> tokens;  // tokens[0, (first_block + n) * block_size)
    int32_t first_block = 0;
  };

  void release(KvLease& lease);
  KvLease reference_prefix(const KvKey& kv_key, std::span<const KvTokenId> tokens, bool mark_used);
  // Private (uncommitted) blocks of leases [begin, end) leave or join the per-namespace count.
  void count_private_blocks(const KvLease& lease, int32_t begin, int32_t end, int32_t delta);
  // Evicts one device block into the free list; false when none is evictable.
  bool evict_one_device_block();
  // kv_cache_manager_host.cc:
  // Backs up path[first_candidate ...] nodes (device, ready, no backup) as far
  // as host blocks can be had; one transfer pinning path[0 .. last backed up].
  void plan_offload(const std::vector<RadixNode*>& path, size_t first_candidate);
  std::optional<int32_t> take_host_block(const EvictionKey& for_key);
  // start_load over a node path root -> ... (any tiers).
  int32_t load_path(const std::vector<RadixNode*>& path, int32_t max_blocks, LoadReason reason);
  void pin(std::span<const int32_t> block_ids);
  void unpin(std::span<const int32_t> block_ids);  // tail first
  int64_t add_transfer(Transfer transfer, std::vector<int32_t> pinned_block_ids);
  std::string host_integrity_error() const;
  // kv_cache_manager_disk.cc:
  // Hashes of the full blocks of tokens after `path` (the tree's part),
  // while each is being read or on disk: {hash, reading}.
  std::vector<std::pair<KvBlockHash, bool>> blocks_after_path(const KvKey& kv_key, std::span<const KvTokenId> tokens,
                                                              const std::vector<RadixNode*>& path,
                                                              int32_t max_blocks) const;
  void finish_disk_read(const TransferInFlight& in_flight, bool succeeded);
  // The content hash of a block under a node of hash `parent` (zero: the chain's start).
  KvBlockHash chain_hash(const KvBlockHash& parent, const std::string& kv_namespace,
                         std::span<const KvTokenId> tokens) const;

  BlockPool pool_;
  RadixTree tree_;
  int64_t clock_ = 0;
  int64_t num_evicted_blocks_ = 0;
  std::map<std::string, int32_t> num_private_blocks_by_namespace_;
  // Host tier (null without one).
  std::unique_ptr<HostBlockPool> host_pool_;
  std::map<int64_t, TransferInFlight> transfers_in_flight_;
  int64_t next_transfer_id_ = 1;
  int64_t num_offloaded_blocks_ = 0, num_loaded_blocks_ = 0, num_prefetched_blocks_ = 0;
  int64_t num_prefetch_hit_blocks_ = 0, num_prefetch_late_blocks_ = 0, num_failed_transfers_ = 0;
  KvBlockNaming naming_;  // enable_block_hashes
  // Disk tier (directory null without one).
  KvDiskTierConfig disk_;
  std::set<KvBlockHash> announced_on_disk_;  // blocks the sink was told are on disk (kDisk)
  std::map<KvBlockHash, int64_t> reading_;  // block -> the kDiskRead transfer reading it
  std::set<KvBlockHash> unreadable_;         // blocks of failed disk reads: never read again (bounded)
  static constexpr size_t kMaxUnreadableBlocks = 1 << 16;
  struct AgentPrefix {
    KvKey kv_key;
    std::vector<KvTokenId> tokens;  // the fixed prefix's tokens as last declared
  };
  std::map<std::string, AgentPrefix> agent_prefixes_;  // with a disk tier: prefetch_agent reads past the tree
  int64_t num_disk_read_blocks_ = 0, num_disk_read_failed_blocks_ = 0, num_disk_write_planned_blocks_ = 0;
};

}  // namespace loom
