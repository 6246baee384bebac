// The KV caches one engine keeps, as one group: the main cache (K/V, or
// ForkKV's shared bCache) and, when forked adapters are served, the residual
// cache (their rCache). Each member is a KvCacheManager over its own block
// pool; a request holds one lease per member it uses (RequestLeases).
//
// As vLLM's KVCacheBlocks[group][block], one type stands for several caches:
// the scheduler and the engine say "how many blocks does this request need",
// "allocate", "commit", "drop this adapter's namespaces" once, and the group
// applies it to every member the request (or the engine) uses. A further cache
// (a cross-layer cache, a disk-backed pool) is a new KvCacheId, not new
// branches in the callers.
//
//   member     KvCacheId   a request's key there                              present
//   main       kMain       RequestKvKeys::key                                 always
//   residual   kResidual   RequestKvKeys::residual_namespace ("resid/NAME")   when num_residual_blocks > 0
//
// The members evict independently (ForkKV's decoupled LRU): a forked request's
// two prefix hits may differ in length (RequestLeases::num_found_tokens).
//
// Host tier: each member may have its own (kv/host_tier_planner.h; the
// engine gives one to every member when it has a host budget, engine/kv_pools.h).
// Each member plans its own backups, loads and prefetches; transfer ids are
// per member, so a transfer travels with its KvCacheId (MemberTransfer) and
// comes back to the member that planned it. A member without a host tier has
// no host or loading nodes, so the calls below simply find nothing there.
//
// Thread: engine thread only. The group must outlive every RequestLeases.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kv/kv_cache_id.h"
#include "kv/kv_cache_manager.h"

namespace loom {

// One value per member, indexed by KvCacheId.
template <typename T>
struct PerKvCache {
  std::array<T, kNumKvCaches> values{};
  T& operator[](KvCacheId id) { return values[static_cast<size_t>(id)]; }
  const T& operator[](KvCacheId id) const { return values[static_cast<size_t>(id)]; }
  bool operator==(const PerKvCache&) const = default;
};

inline bool any_member(const PerKvCache<bool>& flags) {
  return std::find(flags.values.begin(), flags.values.end(), true) != flags.values.end();
}

// Blocks per member (what a step needs, or frees).
using KvBlockCounts = PerKvCache<int32_t>;

// How one request's blocks are keyed in each member it uses (built by the
// engine from the adapter's KV sharing mode, engine/request_kv.h).
struct RequestKvKeys {
  KvKey key;                       // main member (for forked: the shared bCache, "fork")
  std::string residual_namespace;  // residual member, forked only ("resid/NAME"); "" = not used

  bool uses(KvCacheId id) const { return id == KvCacheId::kMain || !residual_namespace.empty(); }
  // The key in member `id`. Precondition: uses(id).
  KvKey key_in(KvCacheId id) const;
};

// A request's leases, one per member it uses. Move-only; releases every
// lease when destroyed.
class RequestLeases {
 public:
  KvLease& operator[](KvCacheId id) { return leases_[id]; }
  const KvLease& operator[](KvCacheId id) const { return leases_[id]; }
  // Tokens found cached in every member it holds at lock_prefix: the prefix
  // the request need not compute (min over members; 0 when it holds none).
  int32_t num_found_tokens() const;
  void release();

 private:
  PerKvCache<KvLease> leases_;
};

class KvCacheGroup {
 public:
  // num_residual_blocks == 0: no residual member.
  KvCacheGroup(int32_t num_main_blocks, int32_t num_residual_blocks, int32_t block_size);
  KvCacheGroup(const KvCacheGroup&) = delete;
  KvCacheGroup& operator=(const KvCacheGroup&) = delete;

  int32_t block_size() const { return block_size_; }
  bool has(KvCacheId id) const { return members_[id] != nullptr; }
  // Precondition: has(id).
  KvCacheManager& operator[](KvCacheId id);
  const KvCacheManager& operator[](KvCacheId id) const;
  KvCacheManager& main() { return (*this)[KvCacheId::kMain]; }
  const KvCacheManager& main() const { return (*this)[KvCacheId::kMain]; }
  // The residual member, or nullptr without one.
  KvCacheManager* residual() { return members_[KvCacheId::kResidual].get(); }
  // Calls fn(id, manager) for every present member, main first.
  void for_each(const std::function<void(KvCacheId, KvCacheManager&)>& fn);
  void for_each(const std::function<void(KvCacheId, const KvCacheManager&)>& fn) const;
  // Whether a request keyed by `keys` can be served (its members exist).
  bool can_hold(const RequestKvKeys& keys) const;

  // ---- A request's blocks (each applies to the members `keys` uses) ----
  // Leases over the cached prefix of `tokens` in each member (kv_cache_manager.h
  // lock_prefix), at most max_blocks[id] blocks of it in member id when given.
  RequestLeases lock_prefix(const RequestKvKeys& keys, std::span<const KvTokenId> tokens,
                            std::optional<KvBlockCounts> max_blocks = std::nullopt);
  // Marks the cached prefix of `tokens` used now (KvCacheManager::touch_prefix), holding nothing.
  void touch_prefix(const RequestKvKeys& keys, std::span<const KvTokenId> tokens);
  // The same through KvCacheManager::hold_prefix (never marks blocks used).
  RequestLeases hold_prefix(const RequestKvKeys& keys, std::span<const KvTokenId> tokens,
                            std::optional<KvBlockCounts> max_blocks = std::nullopt);
  // Blocks each member must add so that the leases cover num_tokens tokens.
  KvBlockCounts num_blocks_needed(const RequestKvKeys& keys, const RequestLeases& leases, int32_t num_tokens) const;
  // Whether every member can provide its count.
  bool can_allocate(const KvBlockCounts& counts) const;
  // Members that cannot provide their count (all false: can_allocate).
  PerKvCache<bool> short_members(const KvBlockCounts& counts) const;
  // Adds the blocks (counts[id] > 0 only for members the leases hold). Returns
  // false, changing nothing, when !can_allocate(counts).
  bool allocate(RequestLeases& leases, const KvBlockCounts& counts);
  // Commits the full computed blocks of every held lease (kv_cache_manager.h commit).
  void commit(RequestLeases& leases, std::span<const KvTokenId> tokens, int32_t num_computed_tokens);

  // ---- The engine's operations on every member ----
  void set_eviction_policy(KvEvictionPolicy policy);
  void set_agent_steps(const std::map<std::string, int32_t>& steps_by_agent_key);
  void forget_agents(const std::function<bool(const std::string&)>& matches);
  // Declares agent_key's fixed prefix in every member `keys` uses.
  void set_agent_fixed_prefix(const std::string& agent_key, const RequestKvKeys& keys,
                              std::span<const KvTokenId> tokens, int32_t num_fixed_tokens);
  // Drops the matching namespaces in every member; returns device blocks freed.
  int32_t drop_namespaces(const std::function<bool(const std::string&)>& matches);
  // Evicts every cached block of every member (tests).
  int32_t evict_all_cached();
  // Every member reports its blocks to `sink` (KvCacheManager::set_event_sink;
  // each member must have block hashes; before any block is committed).
  void set_event_sink(KvEventSink* sink);
  // ---- Host tier, on every member that has one ----
  // Gives each present member num_host_blocks[id] host blocks (0: none); at
  // most once per member (KvCacheManager::enable_host_tier).
  void enable_host_tier(const KvBlockCounts& num_host_blocks);
  bool has_host_tier(KvCacheId id) const { return has(id) && members_[id]->host_tier() != nullptr; }
  bool has_any_host_tier() const;
  // Where the cached prefix of `tokens` lives in each member `keys` uses
  // (KvCacheManager::prefix_location). Changes nothing.
  PerKvCache<PrefixLocation> prefix_location(const RequestKvKeys& keys, std::span<const KvTokenId> tokens,
                                             PrefixLookup lookup = PrefixLookup::kTreeAndDisk) const;
  // A request waits on a load: prefetched blocks of its prefix still loading
  // count as late, in each member `keys` uses (KvCacheManager::count_late_prefetch).
  void count_late_prefetch(const RequestKvKeys& keys, std::span<const KvTokenId> tokens);
  // HostTierPlanner::start_load in each member `keys` uses with max_blocks[id] > 0;
  // returns the blocks now loading in each.
  KvBlockCounts start_load(const RequestKvKeys& keys, std::span<const KvTokenId> tokens,
                           const KvBlockCounts& max_blocks, KvCacheManager::LoadReason reason);
  // ---- Disk tier (kv/disk_tier_planner.h; the engine enables it on each member) ----
  bool has_any_disk_tier() const;
  // DiskTierPlanner::start_read in each member `keys` uses that has a disk tier; the blocks now reading in each.
  KvBlockCounts start_disk_read(const RequestKvKeys& keys, std::span<const KvTokenId> tokens, int32_t max_blocks,
                                KvCacheManager::LoadReason reason);
  // Whether any member `keys` uses is reading the block after its tree's part from disk.
  bool disk_read_pending(const RequestKvKeys& keys, std::span<const KvTokenId> tokens) const;
  // Whether, in any member `keys` uses, the block after its tree's part is being read or on disk.
  bool next_block_on_disk(const RequestKvKeys& keys, std::span<const KvTokenId> tokens) const;
  // Every disk tier's clear_reservations() (disk_tier_planner.h "Reservations").
  void clear_reservations();
  // DiskTierPlanner::blocks_removed on every member's disk tier.
  void disk_blocks_removed(std::span<const KvBlockHash> hashes);
  // A transfer planned by a member, named by it.
  struct MemberTransfer {
    KvCacheId cache = KvCacheId::kMain;
    KvCacheManager::Transfer transfer;
  };
  // Every member's take_transfers(), main's first.
  std::vector<MemberTransfer> take_transfers();
  // Precondition: as KvCacheManager::finish_transfer, in member `cache`.
  void finish_transfer(KvCacheId cache, int64_t transfer_id, bool succeeded);
  // Summed over the members.
  int32_t num_transfers_in_flight() const;

  // Per member ({} for an absent one).
  PerKvCache<KvCacheStats> stats() const;
  // "" when every member is consistent; else each member's problem, named.
  std::string integrity_error() const;

 private:
  RequestLeases reference_prefix(const RequestKvKeys& keys, std::span<const KvTokenId> tokens,
                                 const std::optional<KvBlockCounts>& max_blocks, bool mark_used);

  int32_t block_size_;
  PerKvCache<std::unique_ptr<KvCacheManager>> members_;
};

}  // namespace loom
