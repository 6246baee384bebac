#include "kv/disk_tier_planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "util/error.h"

namespace loom {

DiskTierPlanner::DiskTierPlanner(DeviceBlocks& device, HostBlockPool& host_pool, KvTransferIds& transfer_ids,
                                 KvDiskTierConfig config)
    : device_(device), host_pool_(host_pool), transfer_ids_(transfer_ids), directory_(*config.directory) {
  LOOM_CHECK(device_.tree.has_block_hasher());
}

KvBlockHash DiskTierPlanner::hash_after(const KvBlockHash& parent, const KvKey& kv_key, int32_t block,
                                        std::span<const KvTokenId> tokens) const {
  const int32_t block_size = device_.tree.block_size();
  return device_.tree.child_hash(parent, kv_key.namespace_of_block(block),
                                 tokens.subspan(static_cast<size_t>(block) * block_size, block_size));
}

std::vector<std::pair<KvBlockHash, bool>> DiskTierPlanner::blocks_after_path(const KvKey& kv_key,
                                                                             std::span<const KvTokenId> tokens,
                                                                             const std::vector<RadixNode*>& path,
                                                                             int32_t max_blocks) const {
  std::vector<std::pair<KvBlockHash, bool>> blocks;
  const int32_t num_full = static_cast<int32_t>(tokens.size()) / device_.tree.block_size();
  KvBlockHash parent = path.empty() ? KvBlockHash{} : path.back()->content_hash;
  for (auto i = static_cast<int32_t>(path.size()); i < num_full && static_cast<int32_t>(blocks.size()) < max_blocks;
       ++i) {
    const KvBlockHash hash = hash_after(parent, kv_key, i, tokens);
    const bool reading = reading_.count(hash) != 0;
    if (!reading && (unreadable_.count(hash) != 0 || !directory_.contains(hash))) break;
    blocks.emplace_back(hash, reading);
    parent = hash;
  }
  return blocks;
}

void DiskTierPlanner::locate_past(const KvKey& kv_key, std::span<const KvTokenId> tokens,
                                  const std::vector<RadixNode*>& path, PrefixLocation& location) const {
  for (const auto& [hash, reading] : blocks_after_path(kv_key, tokens, path, std::numeric_limits<int32_t>::max()))
    ++(reading ? location.num_reading_blocks : location.num_disk_blocks);
}

bool DiskTierPlanner::read_pending(const KvKey& kv_key, std::span<const KvTokenId> tokens) const {
  if (reading_.empty()) return false;
  const std::vector<RadixNode*> path = device_.tree.match_any_tier(kv_key, tokens);
  const auto i = static_cast<int32_t>(path.size());
  if (static_cast<int32_t>(tokens.size()) / device_.tree.block_size() <= i) return false;
  return reading_.count(hash_after(path.empty() ? KvBlockHash{} : path.back()->content_hash, kv_key, i, tokens)) != 0;
}

bool DiskTierPlanner::next_block_on_disk(const KvKey& kv_key, std::span<const KvTokenId> tokens) const {
  return !blocks_after_path(kv_key, tokens, device_.tree.match_any_tier(kv_key, tokens), 1).empty();
}

DiskTierPlanner::PrefixReservation DiskTierPlanner::reserve_prefix(const KvKey& kv_key,
                                                                   std::span<const KvTokenId> tokens,
                                                                   int32_t max_host_blocks) {
  PrefixReservation reservation;
  RadixTree& tree = device_.tree;
  const std::vector<RadixNode*> path = tree.match_any_tier(kv_key, tokens);
  for (RadixNode* node : path) {
    if (node->tier == KvTier::kDevice) {
      tree.set_reserved(node, true);
      if (node->host_block_id >= 0) ++reservation.num_host_blocks;  // its backup holds a host block too
    } else if (reservation.num_host_blocks < max_host_blocks) {
      tree.set_reserved(node, true);
      ++reservation.num_host_blocks;
    } else {
      ++reservation.num_unreserved_host_blocks;
    }
  }
  for (const auto& [hash, reading] : blocks_after_path(kv_key, tokens, path, std::numeric_limits<int32_t>::max())) {
    if (!reading) break;
    ++reservation.num_reading_blocks;
  }
  return reservation;
}

int32_t DiskTierPlanner::start_read(const KvKey& kv_key, std::span<const KvTokenId> tokens, int32_t max_blocks,
                                    KvLoadReason reason) {
  if (max_blocks <= 0) return 0;
  RadixTree& tree = device_.tree;
  const std::vector<RadixNode*> path = tree.match_any_tier(kv_key, tokens);
  const std::vector<std::pair<KvBlockHash, bool>> blocks = blocks_after_path(kv_key, tokens, path, max_blocks);
  if (blocks.empty() || blocks.front().second) return 0;  // nothing on disk, or a read in the way
  // The read's blocks rank as a new node would: newest under LRU; under
  // kWorkflow a dynamic block (demand) or the prefetched agent's steps.
  const int64_t now = device_.clock + 1;
  const int32_t steps = path.empty() ? kDynamicNodeSteps : path.back()->fixed_steps;
  const EvictionKey for_key = reason == KvLoadReason::kPrefetch
                                  ? eviction_key(tree.eviction_policy(), steps, std::numeric_limits<int64_t>::min(),
                                                 std::numeric_limits<int64_t>::min())
                                  : eviction_key(tree.eviction_policy(), kDynamicNodeSteps, now,
                                                 std::numeric_limits<int64_t>::max());
  const RadixNode* last = path.empty() ? nullptr : path.back();
  KvTransfer transfer;
  transfer.kind = KvTransfer::Kind::kDiskRead;
  transfer.reason = reason;
  for (const auto& [hash, reading] : blocks) {
    if (reading) break;
    std::optional<int32_t> host_block = host_pool_.take_one();
    if (!host_block) {
      const std::optional<EvictionKey> victim = tree.first_host_evictable_key();
      // Never the path's own last node: the blocks read hang under it.
      if (victim && *victim < for_key && !(last != nullptr && last->host_evictable_key == victim)) {
        tree.evict_host_leaf();
      } else {
        // A device node's backup (the node stays on the device): else a host
        // tier no larger than the device fills with backups and reads stop.
        const std::optional<EvictionKey> backup = tree.first_backup_droppable_key();
        if (!backup || !(*backup < for_key)) break;
        tree.drop_first_backup();
      }
      host_block = host_pool_.take_one();
    }
    transfer.host_block_ids.push_back(*host_block);
    transfer.block_hashes.push_back(hash);
  }
  if (transfer.host_block_ids.empty()) return 0;
  const auto num_blocks = static_cast<int32_t>(transfer.host_block_ids.size());
  const auto first_block = static_cast<int32_t>(path.size());
  transfer.id = transfer_ids_.next();
  const int64_t id = transfer.id;
  Read read{std::move(transfer), false, kv_key, {}, first_block};
  read.tokens.assign(tokens.begin(),
                     tokens.begin() + static_cast<ptrdiff_t>(first_block + num_blocks) * tree.block_size());
  for (const KvBlockHash& hash : read.transfer.block_hashes) reading_.emplace(hash, id);
  reads_.emplace(id, std::move(read));
  return num_blocks;
}

void DiskTierPlanner::set_agent_prefix(const std::string& agent_key, const KvKey& kv_key,
                                       std::span<const KvTokenId> tokens) {
  agent_prefixes_[agent_key] = {kv_key, std::vector<KvTokenId>(tokens.begin(), tokens.end())};
}

void DiskTierPlanner::forget_agents(const std::function<bool(const std::string&)>& matches) {
  std::erase_if(agent_prefixes_, [&](const auto& entry) { return matches(entry.first); });
}

int32_t DiskTierPlanner::prefetch_agent(const std::string& agent_key, int32_t max_blocks) {
  auto it = agent_prefixes_.find(agent_key);
  if (it == agent_prefixes_.end()) return 0;
  return start_read(it->second.kv_key, it->second.tokens, max_blocks, KvLoadReason::kPrefetch);
}

void DiskTierPlanner::announce_written_through(const KvTransfer& offload) {
  RadixTree& tree = device_.tree;
  if (!tree.has_event_sink() || !directory_.is_persistent()) return;
  for (size_t i = 0; i < offload.block_hashes.size() && i < offload.device_block_ids.size(); ++i) {
    const KvBlockHash& hash = offload.block_hashes[i];
    if (hash.is_zero() || announced_on_disk_.count(hash) != 0 || !directory_.contains(hash)) continue;
    announced_on_disk_.insert(hash);
    tree.announce_on_disk(tree.node_of_block(offload.device_block_ids[i]));
  }
}

void DiskTierPlanner::blocks_removed(std::span<const KvBlockHash> hashes) {
  for (const KvBlockHash& hash : hashes)
    if (announced_on_disk_.erase(hash) != 0) device_.tree.announce_disk_removal(hash);
}

void DiskTierPlanner::take_transfers(std::vector<KvTransfer>& out) {
  for (auto& [id, read] : reads_) {
    if (read.taken) continue;
    read.taken = true;
    out.push_back(read.transfer);
  }
}

void DiskTierPlanner::finish_transfer(int64_t transfer_id, bool succeeded) {
  auto it = reads_.find(transfer_id);
  LOOM_CHECK(it != reads_.end());
  const Read read = std::move(it->second);
  reads_.erase(it);
  finish_read(read, succeeded);
}

void DiskTierPlanner::finish_read(const Read& read, bool succeeded) {
  RadixTree& tree = device_.tree;
  const KvTransfer& transfer = read.transfer;
  for (const KvBlockHash& hash : transfer.block_hashes) reading_.erase(hash);
  const auto num_blocks = static_cast<int32_t>(transfer.host_block_ids.size());
  int32_t num_joined = 0;
  if (succeeded) {
    const std::span<const KvTokenId> tokens(read.tokens);
    const std::vector<RadixNode*> path = tree.match_any_tier(read.kv_key, tokens);
    // The blocks hang under the node that ended the path when the read began
    // (first_block - 1), if the tree still ends there.
    if (static_cast<int32_t>(path.size()) == read.first_block) {
      RadixNode* parent = path.empty() ? nullptr : path.back();
      const int64_t now = device_.tick();
      const int32_t block_size = tree.block_size();
      for (; num_joined < num_blocks; ++num_joined) {
        const int32_t block = read.first_block + num_joined;
        const std::span<const KvTokenId> block_tokens =
            tokens.subspan(static_cast<size_t>(block) * block_size, block_size);
        parent = tree.insert_host(read.kv_key.namespace_of_block(block), parent, block_tokens,
                                  transfer.host_block_ids[static_cast<size_t>(num_joined)], now);
        if (transfer.reason == KvLoadReason::kDemand) tree.set_reserved(parent, true);  // read for a waiting request
        LOOM_CHECK(parent->content_hash == transfer.block_hashes[static_cast<size_t>(num_joined)]);
      }
    }
    num_read_blocks_ += num_joined;
  } else {
    ++num_failed_reads_;
    num_read_failed_blocks_ += num_blocks;
    // The store drops files that do not verify, but a file it keeps (or a read
    // refused for want of room in the queue) would be read again every step
    // while its request waits: these blocks count as not on disk from now on.
    if (unreadable_.size() > kMaxUnreadableBlocks) unreadable_.clear();
    unreadable_.insert(transfer.block_hashes.begin(), transfer.block_hashes.end());
  }
  for (int32_t i = num_joined; i < num_blocks; ++i) host_pool_.put_free(transfer.host_block_ids[static_cast<size_t>(i)]);
}

std::vector<int32_t> DiskTierPlanner::held_host_blocks() const {
  std::vector<int32_t> held;
  for (const auto& [id, read] : reads_)
    held.insert(held.end(), read.transfer.host_block_ids.begin(), read.transfer.host_block_ids.end());
  return held;
}

void DiskTierPlanner::add_stats(KvCacheStats& stats) const {
  stats.num_disk_read_blocks = num_read_blocks_;
  stats.num_disk_read_failed_blocks = num_read_failed_blocks_;
  stats.num_disk_reading_blocks = static_cast<int32_t>(reading_.size());
  stats.num_failed_transfers += num_failed_reads_;
}

std::string DiskTierPlanner::integrity_error() const {
  size_t num_reading = 0;
  for (const auto& [id, read] : reads_) {
    const KvTransfer& transfer = read.transfer;
    if (transfer.id != id || transfer.host_block_ids.empty() || !transfer.device_block_ids.empty() ||
        transfer.block_hashes.size() != transfer.host_block_ids.size())
      return fmt::format("disk read {} is malformed", id);
    num_reading += transfer.block_hashes.size();
  }
  if (num_reading != reading_.size())
    return fmt::format("{} blocks in disk reads, {} recorded as reading", num_reading, reading_.size());
  return {};
}

}  // namespace loom
