#include "kv/host_tier_planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <set>

#include "util/error.h"

namespace loom {

HostTierPlanner::HostTierPlanner(DeviceBlocks& device, KvTransferIds& transfer_ids, int32_t num_host_blocks)
    : device_(device), transfer_ids_(transfer_ids), pool_(num_host_blocks), swap_(device, transfer_ids, pool_) {
  LOOM_CHECK(num_host_blocks > 0);
  device_.tree.set_host_pool(&pool_);
}

void HostTierPlanner::add_transfer(KvTransfer transfer, std::vector<int32_t> pinned_block_ids) {
  transfer.id = transfer_ids_.next();
  const int64_t id = transfer.id;
  in_flight_.emplace(id, InFlight{std::move(transfer), std::move(pinned_block_ids), false});
}

std::optional<int32_t> HostTierPlanner::take_host_block(const EvictionKey& for_key) {
  if (std::optional<int32_t> id = pool_.take_one()) return id;
  const std::optional<EvictionKey> victim = device_.tree.first_host_evictable_key();
  if (!victim || !(*victim < for_key)) return std::nullopt;
  device_.tree.evict_host_leaf();
  return pool_.take_one();
}

void HostTierPlanner::plan_offload(const std::vector<RadixNode*>& path, size_t first_candidate) {
  RadixTree& tree = device_.tree;
  // Only the device part of the path can be backed up (and pinned); host
  // leaves after it may be evicted below to make room.
  size_t num_device = 0;
  while (num_device < path.size() && path[num_device]->tier == KvTier::kDevice) ++num_device;
  KvTransfer transfer;
  transfer.kind = KvTransfer::Kind::kOffload;
  size_t num_pinned = 0;
  for (size_t i = first_candidate; i < num_device; ++i) {
    RadixNode* node = path[i];
    if (node->state != KvNodeState::kReady || node->host_block_id >= 0) continue;
    const std::optional<int32_t> host_block = take_host_block(tree.eviction_key_of(node));
    if (!host_block) continue;
    tree.begin_offload(node, *host_block);
    transfer.device_block_ids.push_back(node->block_id);
    transfer.host_block_ids.push_back(*host_block);
    if (writes_through_) {  // the writer skips blocks the store holds already (no file I/O on this thread)
      transfer.block_hashes.push_back(node->content_hash);
      ++num_disk_write_planned_blocks_;
    }
    num_pinned = i + 1;
  }
  if (transfer.device_block_ids.empty()) return;
  std::vector<int32_t> pinned;
  for (size_t i = 0; i < num_pinned; ++i) pinned.push_back(path[i]->block_id);
  device_.pin(pinned);
  add_transfer(std::move(transfer), std::move(pinned));
}

void HostTierPlanner::count_late_prefetch(const KvKey& kv_key, std::span<const KvTokenId> tokens) {
  for (RadixNode* node : device_.tree.match_any_tier(kv_key, tokens)) {
    if (node->tier == KvTier::kDevice || node->state != KvNodeState::kLoading || !node->loaded_by_prefetch) continue;
    node->loaded_by_prefetch = false;  // a request needs it before the prefetch is done
    ++num_prefetch_late_blocks_;
  }
}

int32_t HostTierPlanner::start_load(const KvKey& kv_key, std::span<const KvTokenId> tokens, int32_t max_blocks,
                                    KvLoadReason reason) {
  return load_path(device_.tree.match_any_tier(kv_key, tokens), max_blocks, reason);
}

int32_t HostTierPlanner::prefetch_agent(const std::string& agent_key, int32_t max_blocks) {
  std::vector<RadixNode*> path;
  for (RadixNode* node = device_.tree.agent_prefix_end(agent_key); node != nullptr && !node->is_root();
       node = node->parent)
    path.push_back(node);
  std::reverse(path.begin(), path.end());
  return load_path(path, max_blocks, KvLoadReason::kPrefetch);
}

int32_t HostTierPlanner::load_path(const std::vector<RadixNode*>& path, int32_t max_blocks, KvLoadReason reason) {
  if (max_blocks <= 0) return 0;
  RadixTree& tree = device_.tree;
  BlockPool& device_pool = device_.pool;
  size_t num_device = 0;
  while (num_device < path.size() && path[num_device]->tier == KvTier::kDevice) ++num_device;
  if (num_device == path.size() || path[num_device]->state == KvNodeState::kLoading) return 0;
  std::vector<RadixNode*> nodes;
  for (size_t i = num_device; i < path.size() && static_cast<int32_t>(nodes.size()) < max_blocks; ++i) {
    LOOM_CHECK(path[i]->tier == KvTier::kHost && path[i]->state == KvNodeState::kReady);
    nodes.push_back(path[i]);
  }
  // Pin the device ancestors first, so that no eviction below can take them
  // (the host nodes hang under them, or under a root).
  std::vector<int32_t> pinned;
  for (size_t i = 0; i < num_device; ++i) pinned.push_back(path[i]->block_id);
  device_.pin(pinned);
  const int32_t num_wanted = static_cast<int32_t>(nodes.size());
  if (reason == KvLoadReason::kDemand) {
    const int32_t num_blocks = std::min(num_wanted, device_.num_available_blocks());
    while (device_pool.num_free_blocks() < num_blocks) {
      const bool evicted = device_.evict_one();
      LOOM_CHECK(evicted);
    }
  } else {
    const int32_t steps = nodes.back()->fixed_steps;
    if (tree.eviction_policy() == KvEvictionPolicy::kWorkflow && steps != kDynamicNodeSteps) {
      // Only what eviction would take before this path's own last block.
      const EvictionKey threshold{1, -static_cast<int64_t>(steps), std::numeric_limits<int64_t>::min(),
                                  std::numeric_limits<int64_t>::min()};
      while (device_pool.num_free_blocks() < num_wanted) {
        const std::optional<EvictionKey> key = tree.first_evictable_key();
        if (!key || !(*key < threshold)) break;
        device_.evict_one();
      }
    }
  }
  const int32_t num_blocks = std::min(num_wanted, device_pool.num_free_blocks());
  if (num_blocks == 0) {
    device_.unpin(pinned);
    return 0;
  }
  const std::vector<int32_t> device_ids = device_pool.take_free(num_blocks).value();  // each referenced once: the pin
  KvTransfer transfer;
  transfer.kind = KvTransfer::Kind::kLoad;
  transfer.reason = reason;
  for (int32_t j = 0; j < num_blocks; ++j) {
    RadixNode* node = nodes[static_cast<size_t>(j)];
    const int32_t device_id = device_ids[static_cast<size_t>(j)];
    tree.begin_load(node, device_id, reason == KvLoadReason::kPrefetch);
    transfer.device_block_ids.push_back(device_id);
    transfer.host_block_ids.push_back(node->host_block_id);
    pinned.push_back(device_id);
  }
  add_transfer(std::move(transfer), std::move(pinned));
  return num_blocks;
}

void HostTierPlanner::take_transfers(std::vector<KvTransfer>& out) {
  for (auto& [id, in_flight] : in_flight_) {
    if (in_flight.taken) continue;
    in_flight.taken = true;
    out.push_back(in_flight.transfer);
  }
  swap_.take_transfers(out);
}

KvTransfer HostTierPlanner::finish_transfer(int64_t transfer_id, bool succeeded) {
  auto it = in_flight_.find(transfer_id);
  LOOM_CHECK(it != in_flight_.end());
  InFlight in_flight = std::move(it->second);
  in_flight_.erase(it);
  RadixTree& tree = device_.tree;
  const KvTransfer& transfer = in_flight.transfer;
  const auto num_blocks = static_cast<int64_t>(transfer.device_block_ids.size());
  if (!succeeded) ++num_failed_transfers_;
  if (transfer.kind == KvTransfer::Kind::kOffload) {
    for (int32_t id : transfer.device_block_ids) tree.end_offload(tree.node_of_block(id), succeeded);
    if (succeeded) num_offloaded_blocks_ += num_blocks;
    device_.unpin(in_flight.pinned_block_ids);
  } else if (succeeded) {
    const int64_t now = device_.tick();
    for (int32_t id : transfer.device_block_ids) tree.end_load(tree.node_of_block(id), now);
    num_loaded_blocks_ += num_blocks;
    if (transfer.reason == KvLoadReason::kPrefetch) num_prefetched_blocks_ += num_blocks;
    device_.unpin(in_flight.pinned_block_ids);
  } else {
    // The host copies it read are suspect: drop them with everything below.
    RadixNode* first = tree.node_of_block(transfer.device_block_ids.front());
    device_.unpin(in_flight.pinned_block_ids);
    for (int32_t id : tree.remove_subtree(first)) device_.pool.put_free(id);
  }
  return std::move(in_flight.transfer);
}

void HostTierPlanner::add_stats(KvCacheStats& stats) const {
  stats.num_host_total_blocks = pool_.num_total_blocks();
  stats.num_host_used_blocks = pool_.num_used_blocks();
  stats.num_host_only_blocks = device_.tree.num_host_tier_nodes();
  stats.num_offloaded_blocks = num_offloaded_blocks_;
  stats.num_loaded_blocks = num_loaded_blocks_;
  stats.num_prefetched_blocks = num_prefetched_blocks_;
  stats.num_prefetch_late_blocks = num_prefetch_late_blocks_;
  stats.num_failed_transfers += num_failed_transfers_;
  stats.num_disk_write_planned_blocks = num_disk_write_planned_blocks_;
  stats.num_swapped_out_blocks = swap_.num_swapped_out_blocks();
  stats.num_swapped_in_blocks = swap_.num_swapped_in_blocks();
  stats.num_host_swap_blocks = static_cast<int32_t>(swap_.held_host_blocks().size());
  stats.num_failed_transfers += swap_.num_failed_transfers();
}

std::string HostTierPlanner::integrity_error(std::span<const int32_t> read_blocks) const {
  const RadixTree& tree = device_.tree;
  int32_t num_in_transfer_states = 0;
  std::vector<int32_t> num_holders(static_cast<size_t>(pool_.num_total_blocks()), 0);
  tree.for_each_node([&](const RadixNode& node) {
    if (node.state != KvNodeState::kReady) ++num_in_transfer_states;
    if (pool_.contains(node.host_block_id)) ++num_holders[static_cast<size_t>(node.host_block_id)];
  });
  for (int32_t host_block : read_blocks) {
    if (!pool_.contains(host_block)) return fmt::format("a disk read holds host block {}", host_block);
    ++num_holders[static_cast<size_t>(host_block)];
  }
  for (int32_t host_block : swap_.held_host_blocks()) {
    if (!pool_.contains(host_block)) return fmt::format("a swap holds host block {}", host_block);
    ++num_holders[static_cast<size_t>(host_block)];
  }
  int32_t num_held = 0;
  for (int32_t id = 0; id < pool_.num_total_blocks(); ++id) {
    const int32_t holders = num_holders[static_cast<size_t>(id)];
    if (pool_.is_free(id) ? holders != 0 : holders != 1)
      return fmt::format("host block {} ({}) is held by {} nodes", id, pool_.is_free(id) ? "free" : "used", holders);
    num_held += holders;
  }
  if (num_held + pool_.num_free_blocks() != pool_.num_total_blocks())
    return fmt::format("{} host blocks held + {} free != {} total", num_held, pool_.num_free_blocks(),
                       pool_.num_total_blocks());
  std::set<const RadixNode*> in_transfers;
  for (const auto& [id, in_flight] : in_flight_) {
    const KvTransfer& transfer = in_flight.transfer;
    if (transfer.id != id || transfer.device_block_ids.empty() ||
        transfer.device_block_ids.size() != transfer.host_block_ids.size() ||
        (!transfer.block_hashes.empty() && transfer.block_hashes.size() != transfer.host_block_ids.size()))
      return fmt::format("transfer {} is malformed", id);
    for (int32_t pinned : in_flight.pinned_block_ids)
      if (tree.node_of_block(pinned) == nullptr || device_.pool.ref_count(pinned) == 0)
        return fmt::format("transfer {} pins block {}, which is not a referenced tree block", id, pinned);
    const KvNodeState expected =
        transfer.kind == KvTransfer::Kind::kOffload ? KvNodeState::kOffloading : KvNodeState::kLoading;
    for (size_t i = 0; i < transfer.device_block_ids.size(); ++i) {
      const RadixNode* node = tree.node_of_block(transfer.device_block_ids[i]);
      if (node == nullptr || node->state != expected || node->host_block_id != transfer.host_block_ids[i] ||
          !in_transfers.insert(node).second)
        return fmt::format("transfer {}: device block {} is not a node in its state", id,
                           transfer.device_block_ids[i]);
    }
  }
  if (static_cast<int32_t>(in_transfers.size()) != num_in_transfer_states)
    return fmt::format("{} nodes loading or offloading, {} in transfers in flight", num_in_transfer_states,
                       in_transfers.size());
  return {};
}

}  // namespace loom
