// A what-if count of a KvCacheGroup's blocks, for planning a step without
// touching the group (Scheduler::schedule is a pure function of it).
//
// The group hands out free + cached ("available") blocks; a block is cached
// when it sits in a tree with no reference. The ledger replays, on counts
// only, what a sequence of the group's calls would do to that number:
//
//   call (applied later, in the same order)     ledger
//   lock_prefix: references the prefix blocks   add_refs(path blocks): each at 0 refs stops being available
//   a transfer's pin of a path                  add_refs
//   allocate(n)                                 take(n)
//   KvLease::release / preemption               drop_refs(lease blocks): each reaching 0 refs becomes
//                                               available (a private block is freed, a committed one cached);
//                                               give_back(n) for blocks take() gave it in this plan
//   start_load (demand) of host nodes            add_refs(the device part: its pin), take(the blocks it
//                                               gets), mark_loading(each host block it loads)
//
// Reserved blocks (disk_tier_planner.h "Reservations": cached device blocks
// held for waiting requests) are available like any cached block, but
// eviction takes them last; the ledger follows how many of the available
// blocks are reserved, so that a planned load can leave them alone.
//
// References are the group's (KvCacheManager::block_ref_count) plus the
// ledger's deltas, so blocks shared by several leases are counted exactly.
// Because every unreferenced tree block can be evicted (radix_tree.h), these
// counts decide can_allocate exactly as the group would after the same calls.
//
// Thread: engine thread; the group must not change while a ledger is in use.
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <span>
#include <unordered_map>

#include "kv/kv_cache_group.h"

namespace loom {

class KvCapacityLedger {
 public:
  explicit KvCapacityLedger(const KvCacheGroup& kv_caches);

  int32_t num_available_blocks(KvCacheId id) const { return num_available_[id]; }
  // Available blocks eviction would take before any reserved one (free + unreserved cached).
  int32_t num_unreserved_available_blocks(KvCacheId id) const {
    // Below zero after add_refs on reserved blocks that earlier take()s already counted as evicted.
    return num_available_[id] - std::max(0, num_reserved_available_[id]);
  }
  // Members that could not hand out their count now. A member whose count
  // went below zero (add_refs on blocks that earlier take()s already had to
  // evict) is short whatever is asked of it.
  PerKvCache<bool> short_members(const KvBlockCounts& counts) const;
  bool can_allocate(const KvBlockCounts& counts) const;

  // Precondition for take: can_allocate(counts).
  void take(const KvBlockCounts& counts);
  void give_back(const KvBlockCounts& counts);
  void add_refs(KvCacheId id, std::span<const int32_t> block_ids);
  void drop_refs(KvCacheId id, std::span<const int32_t> block_ids);

  // A host block of member `id` that a planned load would bring to the device:
  // it counts as loading (host block ids name host nodes one to one).
  void mark_loading(KvCacheId id, int32_t host_block_id) { loading_host_blocks_[id].insert(host_block_id); }
  // Whether the first block after the device part of `location` (member `id`'s)
  // is loading, or a planned load of this ledger would load it.
  bool is_loading(KvCacheId id, const PrefixLocation& location) const;

 private:
  int32_t ref_count(KvCacheId id, int32_t block_id) const;
  bool is_reserved(KvCacheId id, int32_t block_id) const;

  const KvCacheGroup& kv_caches_;
  PerKvCache<int32_t> num_available_;
  PerKvCache<int32_t> num_reserved_available_;  // of num_available_: reserved cached blocks
  PerKvCache<std::unordered_map<int32_t, int32_t>> ref_deltas_;
  PerKvCache<std::set<int32_t>> loading_host_blocks_;
};

}  // namespace loom
