// Swap preemption's host copies (vLLM v0's swap space; scheduler.h policy 4,
// --preemption-mode swap): the private blocks of a preempted request's lease
// (past its committed, tree-held blocks: the partial last block, and full
// ones a loading node kept out of the tree) copied to host blocks that the
// swap holds for the request until it is swapped back in. Its committed
// blocks are not here: they stay in the radix tree (cached, backed up by the
// host tier's write-through, moved to the host when evicted).
//
// Owned by the HostTierPlanner (host_tier_planner.h), whose host pool and
// transfer ids it shares, so its copies are ordinary KvTransfers (kOffload
// device -> host, kLoad host -> device, no block_hashes) that the engine runs
// with the tier's other copies and hands back through finish_transfer.
//
// Life of a swap (SwapId, per manager):
//
//   swap_out(blocks)  kSwappingOut  its copy pins each device block (one reference)
//   copy finished     kOnHost       device blocks unpinned (freed once no lease holds them)
//   swap_in(blocks)   kSwappingIn   the caller's lease holds the new blocks; the copy pins them too
//   copy finished     kOnDevice     host blocks freed; drop() forgets the swap
//   a failed copy     kLost         host blocks freed; the caller recomputes
//
// A swap of zero blocks (nothing private) is kOnHost at once and kOnDevice at
// swap_in, with no copy. drop() may come at any point: the host blocks are
// freed now, or when the copy in flight finishes.
//
// Host blocks: free ones first, then host leaves of the tree are evicted for
// it (any key: a preempted request's progress goes before a cached backup).
// Never a device node's backup, so a swap does not undo the write-through of
// the request's own committed blocks. Invariant: every host block is free xor
// held by one tree node, one disk read or one swap (integrity_error).
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
#include "kv/kv_transfer.h"

namespace loom {

class HostSwapSpace {
 public:
  using SwapId = int64_t;  // > 0
  enum class State : uint8_t { kSwappingOut, kOnHost, kSwappingIn, kOnDevice, kLost };

  // `device`, `transfer_ids` and `pool` must outlive it (the planner's).
  HostSwapSpace(DeviceBlocks& device, KvTransferIds& transfer_ids, HostBlockPool& pool);
  HostSwapSpace(const HostSwapSpace&) = delete;
  HostSwapSpace& operator=(const HostSwapSpace&) = delete;

  // Starts copying `device_block_ids` (private: in no tree node, referenced by
  // the caller's lease, which may then be released) to host blocks. nullopt,
  // changing nothing, when the host pool cannot give that many (free + host leaves).
  std::optional<SwapId> swap_out(std::span<const int32_t> device_block_ids);
  // Starts copying the swap back into `device_block_ids` (private, referenced by
  // the caller's lease; as many as it holds). Precondition: state(id) == kOnHost.
  void swap_in(SwapId id, std::span<const int32_t> device_block_ids);
  // Precondition: a swap not dropped.
  State state(SwapId id) const;
  int32_t num_blocks(SwapId id) const;
  // Forgets the swap (any state).
  void drop(SwapId id);

  void take_transfers(std::vector<KvTransfer>& out);
  bool owns(int64_t transfer_id) const { return by_transfer_.count(transfer_id) != 0; }
  // Precondition: owns(transfer_id).
  void finish_transfer(int64_t transfer_id, bool succeeded);
  int32_t num_transfers_in_flight() const { return static_cast<int32_t>(by_transfer_.size()); }

  int32_t num_swaps() const { return static_cast<int32_t>(swaps_.size()); }
  // Host blocks the swaps hold now.
  std::vector<int32_t> held_host_blocks() const;
  // Device blocks that only a copy of a swap references now (private blocks
  // whose lease is gone: they are freed when the copy finishes).
  int32_t num_device_blocks_held_by_copies_only() const;
  int64_t num_swapped_out_blocks() const { return num_swapped_out_blocks_; }  // copies finished, since start
  int64_t num_swapped_in_blocks() const { return num_swapped_in_blocks_; }
  int64_t num_failed_transfers() const { return num_failed_transfers_; }

 private:
  struct Swap {
    State state = State::kOnHost;
    std::vector<int32_t> host_block_ids;
    std::vector<int32_t> pinned_device_block_ids;  // during a copy
    int64_t transfer_id = 0;                       // 0: no copy in flight
    bool taken = false;                            // its copy went out through take_transfers
    bool dropped = false;
  };
  void start_copy(Swap& swap, KvTransfer::Kind kind, std::span<const int32_t> device_block_ids);
  void free_host_blocks(Swap& swap);

  DeviceBlocks& device_;
  KvTransferIds& transfer_ids_;
  HostBlockPool& pool_;
  SwapId next_id_ = 1;
  std::map<SwapId, Swap> swaps_;
  std::map<int64_t, SwapId> by_transfer_;  // copies in flight, in planning order
  int64_t num_swapped_out_blocks_ = 0, num_swapped_in_blocks_ = 0, num_failed_transfers_ = 0;
};

}  // namespace loom
