// The scheduler's record of one request (private to src/scheduler: scheduler.cc
// and scheduler_swap.cc). Owned by the Scheduler (requests_); its leases are
// the request's blocks while it runs, or while it swaps in (policy 4, swap).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "scheduler/scheduler.h"

namespace loom {

// A request preempted by swap (policy 4, PreemptionMode::kSwap): it waits with
// num_computed_tokens kept. Its committed blocks stay in each member's tree;
// its private blocks with data are in that member's HostSwapSpace.
struct SwappedKv {
  PerKvCache<int64_t> swap_ids;        // HostSwapSpace::SwapId per member it uses
  KvBlockCounts num_committed_blocks;  // its leases' tree blocks at swap-out, locked again at swap-in
  bool is_swapping_in = false;         // it holds leases again and waits for its swap-in copies
};

struct Scheduler::RequestState {
  SchedulerRequestId id = 0;
  std::vector<int32_t> tokens;
  std::string adapter;
  RequestKvKeys kv;
  int32_t priority = 0;
  int64_t arrival = 0;
  int32_t num_computed_tokens = 0;
  bool was_admitted = false;
  bool running = false;
  // Set by the disk walk (policy 7) in walk number disk_walk_id:
  int64_t disk_walk_id = 0;
  bool is_reserved = false;          // within the host budget: its prefix is reserved
  bool waits_for_disk_read = false;  // its next block is on disk and earlier requests hold the host budget
  RequestLeases leases;
  std::optional<SwappedKv> swapped;  // set while swapped out or swapping in (waiting)

  bool is_forked() const { return kv.uses(KvCacheId::kResidual); }
  // At least one token must be computed to get logits, so the last token never comes from the cache.
  std::span<const int32_t> lookup_tokens() const { return std::span<const int32_t>(tokens).first(tokens.size() - 1); }
  // Entries already holding data, which the backend must not write: a forked
  // partial hit may find more in one member than it computes from.
  int32_t num_present_tokens(KvCacheId id) const {
    return kv.uses(id) ? std::max(leases[id].num_found_tokens(), num_computed_tokens) : 0;
  }
  // The private blocks of member `id`'s lease that hold data, [first, second) in
  // its block_ids(): past the committed ones, up to the last present token.
  std::pair<int32_t, int32_t> private_data_blocks(KvCacheId id, int32_t block_size) const {
    const KvLease& lease = leases[id];
    const int32_t begin = lease.num_committed_blocks();
    const int32_t end = std::min(lease.num_blocks(), (num_present_tokens(id) + block_size - 1) / block_size);
    return {begin, std::max(begin, end)};
  }
};

}  // namespace loom
