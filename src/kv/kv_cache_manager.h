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
//   lease = lock_prefix(ns, tokens, max)   // reuse cached blocks; they are now in use
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
// rCache blocks), with namespaces "resid/NAME"; the two evict independently.
//
// Thread: engine thread only. The manager must outlive its leases.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "kv/block_pool.h"
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
  int32_t num_cached_tokens() const { return num_cached_tokens_; }
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
  int32_t num_cached_tokens_ = 0;
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
  // Blocks in the tree (cached or in use by a lease that committed them) per
  // namespace; private (uncommitted) blocks are counted under their lease's
  // namespace for the block index they hold.
  std::map<std::string, int32_t> num_blocks_by_namespace;
};

class KvCacheManager {
 public:
  KvCacheManager(int32_t num_blocks, int32_t block_size);
  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  int32_t block_size() const { return tree_.block_size(); }
  int32_t num_total_blocks() const { return pool_.num_total_blocks(); }

  // Number of tokens of tokens[0, max_tokens) whose blocks are cached (a
  // multiple of block_size). Changes nothing.
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

  // Whether `num_blocks` more blocks can be had (free + cached).
  bool can_allocate(int32_t num_blocks) const;
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

  // Drops every cached block of a namespace (e.g. an unloaded adapter's).
  // Precondition: no lease of that namespace holds blocks. Returns blocks freed.
  int32_t drop_namespace(const std::string& kv_namespace);
  // Drops every cached block whose namespace `matches` (with its descendants,
  // e.g. all "alora/NAME@S" branches under base nodes). Same precondition.
  int32_t drop_namespaces(const std::function<bool(const std::string&)>& matches);
  // ---- Workflow-aware eviction (KVFlow, issue 5; DESIGN §2) ----
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
  // (blocks committed later are covered by calling it again). `agent_key` is
  // unique per (workflow, agent), e.g. "wf-1/planner". Cheap; engine thread.
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

  // ---- Host tier (KVFlow's / HiCache's host memory; issue 5, DESIGN §2) ----
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
  // for each newly inserted node when a host block can be had (free, or by
  // dropping a host-tier leaf in eviction order: "host" nodes with no children,
  // same policy as the device). A full host pool means no backup: the block is
  // recomputed if it is evicted (degrades to recompute, never fails).
  //
  // Transfers are planned here and executed by someone else (the engine's
  // kv_transfer_worker, through Backend::copy_kv_blocks):
  //   take_transfers()           the jobs planned since the last call, in order;
  //   finish_transfer(id, ok)    applies one when its copy has finished.
  // Until finished, a transfer's device and host blocks are pinned: never
  // evicted, reused or dropped (drop_namespaces() defers removing nodes in
  // flight; they go when their transfer finishes). A failed offload leaves the
  // node without backup; a failed load drops the host copies it was reading (they
  // are suspect), so the request recomputes them.
  //
  // Metrics (stats()): offloaded / loaded / prefetched blocks, prefetched blocks
  // later found ready by lock_prefix ("in time") or still loading by
  // prefix_status ("late"), failed transfers, host blocks in use.
  void enable_host_tier(int32_t num_host_blocks);
  bool has_host_tier() const;
  int32_t num_host_blocks() const;

  struct PrefixStatus {
    int32_t num_device_tokens = 0;   // what lock_prefix would lock now
    int32_t num_loading_tokens = 0;  // next: blocks being loaded (the request should wait)
    int32_t num_host_tokens = 0;     // then: blocks only on the host (start_load can fetch them)
  };
  // Where the cached prefix of tokens (whole blocks) lives. Changes nothing
  // except the "late prefetch" metric (a prefetched block found still loading).
  PrefixStatus prefix_status(const KvKey& kv_key, std::span<const KvTokenId> tokens);

  enum class LoadReason : uint8_t { kDemand, kPrefetch };
  // Starts loading the host-only blocks of tokens' cached prefix that follow its
  // device part (at most max_blocks, the first ones): allocates device blocks
  // (evicting as allocate() does; kPrefetch evicts only blocks that come before
  // the loaded path's own priority in eviction order, so a prefetch never pushes
  // out something the policy values more), marks them loading and plans one
  // transfer. Pins the device ancestors until it finishes. Returns the number
  // of blocks now loading: 0 when nothing waits on the host, when a loading
  // block is in the way, or when no device block can be had ("no room").
  int32_t start_load(const KvKey& kv_key, std::span<const KvTokenId> tokens, int32_t max_blocks,
                     LoadReason reason = LoadReason::kDemand);
  // Prefetch: start_load over the marked fixed prefix of `agent_key`
  // (set_agent_fixed_prefix; the mark stays on nodes moved to the host) with
  // kPrefetch. Returns the number of blocks now loading (0: unknown agent,
  // nothing on the host, or no room).
  int32_t prefetch_agent(const std::string& agent_key, int32_t max_blocks);

  struct Transfer {
    enum class Kind : uint8_t { kOffload, kLoad };
    int64_t id = 0;
    Kind kind = Kind::kOffload;
    LoadReason reason = LoadReason::kDemand;   // loads only
    std::vector<int32_t> device_block_ids;     // copy device_block_ids[i] <-> host_block_ids[i]
    std::vector<int32_t> host_block_ids;
  };
  std::vector<Transfer> take_transfers();
  // Applies a finished transfer (succeeded: the copy completed). Precondition:
  // an id from take_transfers() not finished yet.
  void finish_transfer(int64_t transfer_id, bool succeeded);
  // Transfers planned and not finished (taken or not).
  int32_t num_transfers_in_flight() const;

  // Evicts every cached block (tests; "after the blocks were evicted").
  int32_t evict_all_cached();

  KvCacheStats stats() const;
  // "" when free + cached + in use == total and the tree is consistent.
  std::string integrity_error() const;

  const RadixTree& tree() const { return tree_; }

 private:
  friend class KvLease;
  void release(KvLease& lease);
  // Private (uncommitted) blocks of leases [begin, end) leave or join the per-namespace count.
  void count_private_blocks(const KvLease& lease, int32_t begin, int32_t end, int32_t delta);

  BlockPool pool_;
  RadixTree tree_;
  int64_t clock_ = 0;
  int64_t num_evicted_blocks_ = 0;
  std::map<std::string, int32_t> num_private_blocks_by_namespace_;
};

}  // namespace loom
