#include "kv/host_swap_space.h"

#include "util/error.h"

namespace loom {

HostSwapSpace::HostSwapSpace(DeviceBlocks& device, KvTransferIds& transfer_ids, HostBlockPool& pool)
    : device_(device), transfer_ids_(transfer_ids), pool_(pool) {}

std::optional<HostSwapSpace::SwapId> HostSwapSpace::swap_out(std::span<const int32_t> device_block_ids) {
  const auto num_blocks = static_cast<int32_t>(device_block_ids.size());
  if (pool_.num_free_blocks() + device_.tree.num_host_evictable_leaves() < num_blocks) return std::nullopt;
  Swap swap;
  for (int32_t i = 0; i < num_blocks; ++i) {
    std::optional<int32_t> host_block = pool_.take_one();
    if (!host_block) {
      const bool evicted = device_.tree.evict_host_leaf();
      LOOM_CHECK(evicted);
      host_block = pool_.take_one();
    }
    LOOM_CHECK(host_block.has_value());
    swap.host_block_ids.push_back(*host_block);
  }
  const SwapId id = next_id_++;
  Swap& stored = swaps_.emplace(id, std::move(swap)).first->second;
  if (num_blocks > 0) start_copy(stored, KvTransfer::Kind::kOffload, device_block_ids);
  stored.state = num_blocks > 0 ? State::kSwappingOut : State::kOnHost;
  if (num_blocks > 0) by_transfer_.emplace(stored.transfer_id, id);
  return id;
}

void HostSwapSpace::swap_in(SwapId id, std::span<const int32_t> device_block_ids) {
  Swap& swap = swaps_.at(id);
  LOOM_CHECK(swap.state == State::kOnHost && device_block_ids.size() == swap.host_block_ids.size());
  if (device_block_ids.empty()) {
    swap.state = State::kOnDevice;
    return;
  }
  start_copy(swap, KvTransfer::Kind::kLoad, device_block_ids);
  swap.state = State::kSwappingIn;
  by_transfer_.emplace(swap.transfer_id, id);
}

void HostSwapSpace::start_copy(Swap& swap, KvTransfer::Kind kind, std::span<const int32_t> device_block_ids) {
  for (int32_t block : device_block_ids) {
    LOOM_CHECK(device_.tree.node_of_block(block) == nullptr && device_.pool.ref_count(block) > 0);
    device_.pool.add_ref(block);
  }
  swap.pinned_device_block_ids.assign(device_block_ids.begin(), device_block_ids.end());
  swap.transfer_id = transfer_ids_.next();
  swap.taken = false;
}

HostSwapSpace::State HostSwapSpace::state(SwapId id) const { return swaps_.at(id).state; }

int32_t HostSwapSpace::num_blocks(SwapId id) const {
  return static_cast<int32_t>(swaps_.at(id).host_block_ids.size());
}

void HostSwapSpace::free_host_blocks(Swap& swap) {
  for (int32_t block : swap.host_block_ids) pool_.put_free(block);
  swap.host_block_ids.clear();
}

void HostSwapSpace::drop(SwapId id) {
  auto it = swaps_.find(id);
  LOOM_CHECK(it != swaps_.end() && !it->second.dropped);
  if (it->second.transfer_id != 0) {  // the copy still uses the host blocks: freed when it finishes
    it->second.dropped = true;
    return;
  }
  free_host_blocks(it->second);
  swaps_.erase(it);
}

void HostSwapSpace::take_transfers(std::vector<KvTransfer>& out) {
  for (const auto& [transfer_id, id] : by_transfer_) {
    Swap& swap = swaps_.at(id);
    if (swap.taken) continue;
    swap.taken = true;
    KvTransfer transfer;
    transfer.id = transfer_id;
    transfer.kind = swap.state == State::kSwappingOut ? KvTransfer::Kind::kOffload : KvTransfer::Kind::kLoad;
    transfer.device_block_ids = swap.pinned_device_block_ids;
    transfer.host_block_ids = swap.host_block_ids;
    out.push_back(std::move(transfer));
  }
}

void HostSwapSpace::finish_transfer(int64_t transfer_id, bool succeeded) {
  auto by = by_transfer_.find(transfer_id);
  LOOM_CHECK(by != by_transfer_.end());
  const SwapId id = by->second;
  by_transfer_.erase(by);
  Swap& swap = swaps_.at(id);
  // Unpin: a swapped-out block whose lease is gone is free now.
  for (int32_t block : swap.pinned_device_block_ids)
    if (device_.pool.release_ref(block) == 0) device_.pool.put_free(block);
  const auto num_blocks = static_cast<int64_t>(swap.pinned_device_block_ids.size());
  swap.pinned_device_block_ids.clear();
  swap.transfer_id = 0;
  if (!succeeded) {
    ++num_failed_transfers_;
    swap.state = State::kLost;
    free_host_blocks(swap);
  } else if (swap.state == State::kSwappingOut) {
    num_swapped_out_blocks_ += num_blocks;
    swap.state = State::kOnHost;
  } else {
    num_swapped_in_blocks_ += num_blocks;
    swap.state = State::kOnDevice;
    free_host_blocks(swap);
  }
  if (swap.dropped) {
    free_host_blocks(swap);
    swaps_.erase(id);
  }
}

int32_t HostSwapSpace::num_device_blocks_held_by_copies_only() const {
  int32_t count = 0;
  for (const auto& [id, swap] : swaps_)
    for (int32_t block : swap.pinned_device_block_ids) count += device_.pool.ref_count(block) == 1 ? 1 : 0;
  return count;
}

std::vector<int32_t> HostSwapSpace::held_host_blocks() const {
  std::vector<int32_t> blocks;
  for (const auto& [id, swap] : swaps_) blocks.insert(blocks.end(), swap.host_block_ids.begin(), swap.host_block_ids.end());
  return blocks;
}

}  // namespace loom
