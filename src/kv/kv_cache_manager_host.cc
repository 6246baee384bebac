// KvCacheManager: the host tier (kv_cache_manager.h "Host tier"): backups
// planned at commit, loads and prefetches, transfers and their pins, host
// integrity. Bookkeeping only: the engine copies the blocks.
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <set>

#include "kv/kv_cache_manager.h"
#include "util/error.h"

namespace loom {

void KvCacheManager::enable_host_tier(int32_t num_host_blocks) {
  LOOM_CHECK(num_host_blocks >= 0 && host_pool_ == nullptr);
  if (num_host_blocks == 0) return;
  host_pool_ = std::make_unique<HostBlockPool>(num_host_blocks);
  tree_.set_host_pool(host_pool_.get());
}

bool KvCacheManager::has_host_tier() const { return host_pool_ != nullptr; }

int32_t KvCacheManager::num_host_blocks() const { return host_pool_ ? host_pool_->num_total_blocks() : 0; }

void KvCacheManager::pin(std::span<const int32_t> block_ids) {
  for (int32_t id : block_ids) {
    pool_.add_ref(id);
    tree_.on_ref_changed(id);
  }
}

void KvCacheManager::unpin(std::span<const int32_t> block_ids) {
  for (auto it = block_ids.rbegin(); it != block_ids.rend(); ++it) {
    LOOM_CHECK(tree_.node_of_block(*it) != nullptr);  // pinned blocks stay in the tree
    pool_.release_ref(*it);
    tree_.on_ref_changed(*it);
  }
}

int64_t KvCacheManager::add_transfer(Transfer transfer, std::vector<int32_t> pinned_block_ids) {
  transfer.id = next_transfer_id_++;
  const int64_t id = transfer.id;
  transfers_in_flight_.emplace(id, TransferInFlight{std::move(transfer), std::move(pinned_block_ids), false, {}, {}, 0});
  return id;
}

std::optional<int32_t> KvCacheManager::take_host_block(const EvictionKey& for_key) {
  if (std::optional<int32_t> id = host_pool_->take_one()) return id;
  const std::optional<EvictionKey> victim = tree_.first_host_evictable_key();
  if (!victim || !(*victim < for_key)) return std::nullopt;
  tree_.evict_host_leaf();
  return host_pool_->take_one();
}

void KvCacheManager::plan_offload(const std::vector<RadixNode*>& path, size_t first_candidate) {
  // Only the device part of the path can be backed up (and pinned); host
  // leaves after it may be evicted below to make room.
  size_t num_device = 0;
  while (num_device < path.size() && path[num_device]->tier == KvTier::kDevice) ++num_device;
  Transfer transfer;
  transfer.kind = Transfer::Kind::kOffload;
  size_t num_pinned = 0;
  for (size_t i = first_candidate; i < num_device; ++i) {
    RadixNode* node = path[i];
    if (node->state != KvNodeState::kReady || node->host_block_id >= 0) continue;
    const std::optional<int32_t> host_block = take_host_block(tree_.eviction_key_of(node));
    if (!host_block) continue;
    tree_.begin_offload(node, *host_block);
    transfer.device_block_ids.push_back(node->block_id);
    transfer.host_block_ids.push_back(*host_block);
    if (has_disk_tier()) {  // the writer skips blocks the store holds already (no file I/O on this thread)
      transfer.block_hashes.push_back(node->content_hash);
      ++num_disk_write_planned_blocks_;
    }
    num_pinned = i + 1;
  }
  if (transfer.device_block_ids.empty()) return;
  std::vector<int32_t> pinned;
  for (size_t i = 0; i < num_pinned; ++i) pinned.push_back(path[i]->block_id);
  pin(pinned);
  add_transfer(std::move(transfer), std::move(pinned));
}

KvCacheManager::PrefixStatus KvCacheManager::prefix_status(const KvKey& kv_key, std::span<const KvTokenId> tokens) {
  PrefixStatus status;
  const std::vector<RadixNode*> path = tree_.match_any_tier(kv_key, tokens);
  for (const auto& [hash, reading] : blocks_after_path(kv_key, tokens, path, std::numeric_limits<int32_t>::max()))
    (reading ? status.num_loading_tokens : status.num_disk_tokens) += block_size();
  for (RadixNode* node : path) {  // [device ...][loading ...][host ...]
    if (node->tier == KvTier::kDevice) {
      status.num_device_tokens += block_size();
    } else if (node->state == KvNodeState::kLoading) {
      status.num_loading_tokens += block_size();
      if (node->loaded_by_prefetch) {  // a request needs it before the prefetch is done
        node->loaded_by_prefetch = false;
        ++num_prefetch_late_blocks_;
      }
    } else {
      status.num_host_tokens += block_size();
    }
  }
  return status;
}

int32_t KvCacheManager::start_load(const KvKey& kv_key, std::span<const KvTokenId> tokens, int32_t max_blocks,
                                   LoadReason reason) {
  if (!host_pool_) return 0;
  return load_path(tree_.match_any_tier(kv_key, tokens), max_blocks, reason);
}

int32_t KvCacheManager::prefetch_agent(const std::string& agent_key, int32_t max_blocks) {
  if (!host_pool_) return 0;
  std::vector<RadixNode*> path;
  for (RadixNode* node = tree_.agent_prefix_end(agent_key); node != nullptr && !node->is_root(); node = node->parent)
    path.push_back(node);
  std::reverse(path.begin(), path.end());
  const int32_t num_loading = load_path(path, max_blocks, LoadReason::kPrefetch);
  // What follows the tree's part on disk comes to the host now, to the device at a later prefetch.
  auto it = agent_prefixes_.find(agent_key);
  if (it == agent_prefixes_.end()) return num_loading;
  return num_loading + start_disk_read(it->second.kv_key, it->second.tokens, max_blocks - num_loading,
                                       LoadReason::kPrefetch);
}

int32_t KvCacheManager::load_path(const std::vector<RadixNode*>& path, int32_t max_blocks, LoadReason reason) {
  if (max_blocks <= 0) return 0;
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
  pin(pinned);
  const int32_t num_wanted = static_cast<int32_t>(nodes.size());
  if (reason == LoadReason::kDemand) {
    const int32_t num_blocks = std::min(num_wanted, pool_.num_free_blocks() + tree_.num_cached_blocks());
    while (pool_.num_free_blocks() < num_blocks) {
      const bool evicted = evict_one_device_block();
      LOOM_CHECK(evicted);
    }
  } else {
    const int32_t steps = nodes.back()->fixed_steps;
    if (tree_.eviction_policy() == KvEvictionPolicy::kWorkflow && steps != kDynamicNodeSteps) {
      // Only what eviction would take before this path's own last block.
      const EvictionKey threshold{1, -static_cast<int64_t>(steps), std::numeric_limits<int64_t>::min(),
                                  std::numeric_limits<int64_t>::min()};
      while (pool_.num_free_blocks() < num_wanted) {
        const std::optional<EvictionKey> key = tree_.first_evictable_key();
        if (!key || !(*key < threshold)) break;
        evict_one_device_block();
      }
    }
  }
  const int32_t num_blocks = std::min(num_wanted, pool_.num_free_blocks());
  if (num_blocks == 0) {
    unpin(pinned);
    return 0;
  }
  const std::vector<int32_t> device_ids = pool_.take_free(num_blocks).value();  // each referenced once: the pin
  Transfer transfer;
  transfer.kind = Transfer::Kind::kLoad;
  transfer.reason = reason;
  for (int32_t j = 0; j < num_blocks; ++j) {
    RadixNode* node = nodes[static_cast<size_t>(j)];
    const int32_t device_id = device_ids[static_cast<size_t>(j)];
    tree_.begin_load(node, device_id, reason == LoadReason::kPrefetch);
    transfer.device_block_ids.push_back(device_id);
    transfer.host_block_ids.push_back(node->host_block_id);
    pinned.push_back(device_id);
  }
  add_transfer(std::move(transfer), std::move(pinned));
  return num_blocks;
}

std::vector<KvCacheManager::Transfer> KvCacheManager::take_transfers() {
  std::vector<Transfer> transfers;
  for (auto& [id, in_flight] : transfers_in_flight_) {  // by id: the order they were planned
    if (in_flight.taken) continue;
    in_flight.taken = true;
    transfers.push_back(in_flight.transfer);
  }
  return transfers;
}

void KvCacheManager::finish_transfer(int64_t transfer_id, bool succeeded) {
  auto it = transfers_in_flight_.find(transfer_id);
  LOOM_CHECK(it != transfers_in_flight_.end());
  const TransferInFlight in_flight = std::move(it->second);
  transfers_in_flight_.erase(it);
  const Transfer& transfer = in_flight.transfer;
  if (transfer.kind == Transfer::Kind::kDiskRead) {
    finish_disk_read(in_flight, succeeded);
    return;
  }
  const auto num_blocks = static_cast<int64_t>(transfer.device_block_ids.size());
  if (!succeeded) ++num_failed_transfers_;
  if (transfer.kind == Transfer::Kind::kOffload) {
    for (int32_t id : transfer.device_block_ids) tree_.end_offload(tree_.node_of_block(id), succeeded);
    if (succeeded && has_disk_tier()) announce_written_through(transfer);
    if (succeeded) num_offloaded_blocks_ += num_blocks;
    unpin(in_flight.pinned_block_ids);
  } else if (succeeded) {
    const int64_t now = ++clock_;
    for (int32_t id : transfer.device_block_ids) tree_.end_load(tree_.node_of_block(id), now);
    num_loaded_blocks_ += num_blocks;
    if (transfer.reason == LoadReason::kPrefetch) num_prefetched_blocks_ += num_blocks;
    unpin(in_flight.pinned_block_ids);
  } else {
    // The host copies it read are suspect: drop them with everything below.
    RadixNode* first = tree_.node_of_block(transfer.device_block_ids.front());
    unpin(in_flight.pinned_block_ids);
    for (int32_t id : tree_.remove_subtree(first)) pool_.put_free(id);
  }
}

int32_t KvCacheManager::num_transfers_in_flight() const { return static_cast<int32_t>(transfers_in_flight_.size()); }

std::string KvCacheManager::host_integrity_error() const {
  int32_t num_in_transfer_states = 0;
  std::vector<int32_t> num_holders(static_cast<size_t>(num_host_blocks()), 0);
  tree_.for_each_node([&](const RadixNode& node) {
    if (node.state != KvNodeState::kReady) ++num_in_transfer_states;
    if (host_pool_ && host_pool_->contains(node.host_block_id)) ++num_holders[static_cast<size_t>(node.host_block_id)];
  });
  size_t num_reading = 0;
  for (const auto& [id, in_flight] : transfers_in_flight_) {
    if (in_flight.transfer.kind != Transfer::Kind::kDiskRead) continue;
    num_reading += in_flight.transfer.block_hashes.size();
    for (int32_t host_block : in_flight.transfer.host_block_ids) {
      if (!host_pool_ || !host_pool_->contains(host_block)) return fmt::format("disk read {} holds host block {}", id, host_block);
      ++num_holders[static_cast<size_t>(host_block)];
    }
  }
  if (num_reading != reading_.size())
    return fmt::format("{} blocks in disk reads, {} recorded as reading", num_reading, reading_.size());
  if (host_pool_) {
    int32_t num_held = 0;
    for (int32_t id = 0; id < host_pool_->num_total_blocks(); ++id) {
      const int32_t holders = num_holders[static_cast<size_t>(id)];
      if (host_pool_->is_free(id) ? holders != 0 : holders != 1)
        return fmt::format("host block {} ({}) is held by {} nodes", id, host_pool_->is_free(id) ? "free" : "used",
                           holders);
      num_held += holders;
    }
    if (num_held + host_pool_->num_free_blocks() != host_pool_->num_total_blocks())
      return fmt::format("{} host blocks held + {} free != {} total", num_held, host_pool_->num_free_blocks(),
                         host_pool_->num_total_blocks());
  }
  std::set<const RadixNode*> in_transfers;
  for (const auto& [id, in_flight] : transfers_in_flight_) {
    const Transfer& transfer = in_flight.transfer;
    if (transfer.kind == Transfer::Kind::kDiskRead) {
      if (transfer.id != id || transfer.host_block_ids.empty() || !transfer.device_block_ids.empty() ||
          transfer.block_hashes.size() != transfer.host_block_ids.size() || !in_flight.pinned_block_ids.empty())
        return fmt::format("disk read {} is malformed", id);
      continue;
    }
    if (transfer.id != id || transfer.device_block_ids.empty() ||
        transfer.device_block_ids.size() != transfer.host_block_ids.size() ||
        (!transfer.block_hashes.empty() && transfer.block_hashes.size() != transfer.host_block_ids.size()))
      return fmt::format("transfer {} is malformed", id);
    for (int32_t pinned : in_flight.pinned_block_ids)
      if (tree_.node_of_block(pinned) == nullptr || pool_.ref_count(pinned) == 0)
        return fmt::format("transfer {} pins block {}, which is not a referenced tree block", id, pinned);
    const KvNodeState expected =
        transfer.kind == Transfer::Kind::kOffload ? KvNodeState::kOffloading : KvNodeState::kLoading;
    for (size_t i = 0; i < transfer.device_block_ids.size(); ++i) {
      const RadixNode* node = tree_.node_of_block(transfer.device_block_ids[i]);
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
