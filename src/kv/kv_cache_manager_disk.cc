// KvCacheManager: block names (content hashes) and events, and the disk tier
// (kv_cache_manager.h "Disk tier"): lookups past the tree by hash, disk ->
// host reads and where their blocks go when they finish. Bookkeeping only: the engine reads the files.
#include <algorithm>
#include <limits>

#include "kv/kv_cache_manager.h"
#include "util/error.h"

namespace loom {

void KvCacheManager::announce_written_through(const Transfer& transfer) {
  if (!tree_.has_event_sink() || !disk_.directory->is_persistent()) return;
  for (size_t i = 0; i < transfer.block_hashes.size() && i < transfer.device_block_ids.size(); ++i) {
    const KvBlockHash& hash = transfer.block_hashes[i];
    if (hash.is_zero() || announced_on_disk_.count(hash) != 0 || !disk_.directory->contains(hash)) continue;
    announced_on_disk_.insert(hash);
    tree_.announce_on_disk(tree_.node_of_block(transfer.device_block_ids[i]));
  }
}

void KvCacheManager::disk_blocks_removed(std::span<const KvBlockHash> hashes) {
  for (const KvBlockHash& hash : hashes)
    if (announced_on_disk_.erase(hash) != 0) tree_.announce_disk_removal(hash);
}

void KvCacheManager::enable_block_hashes(KvBlockNaming naming) {
  LOOM_CHECK(!has_block_hashes() && naming.namespace_salt);
  naming_ = std::move(naming);
  tree_.set_block_hasher([this](const KvBlockHash& parent, const std::string& kv_namespace,
                                std::span<const KvTokenId> tokens) { return chain_hash(parent, kv_namespace, tokens); });
}

void KvCacheManager::set_event_sink(KvEventSink* sink, KvCacheId cache) { tree_.set_event_sink(sink, cache); }

void KvCacheManager::enable_disk_tier(KvDiskTierConfig config) {
  LOOM_CHECK(host_pool_ != nullptr && has_block_hashes() && disk_.directory == nullptr && config.directory != nullptr &&
             tree_.num_nodes() == 0);
  disk_ = config;
}

KvBlockHash KvCacheManager::chain_hash(const KvBlockHash& parent, const std::string& kv_namespace,
                                       std::span<const KvTokenId> tokens) const {
  return chain_block_hash(parent.is_zero() ? naming_.cache_salt : parent, naming_.namespace_salt(kv_namespace), tokens);
}

std::vector<std::pair<KvBlockHash, bool>> KvCacheManager::blocks_after_path(const KvKey& kv_key,
                                                                            std::span<const KvTokenId> tokens,
                                                                            const std::vector<RadixNode*>& path,
                                                                            int32_t max_blocks) const {
  std::vector<std::pair<KvBlockHash, bool>> blocks;
  if (!has_disk_tier()) return blocks;
  const int32_t num_full = static_cast<int32_t>(tokens.size()) / block_size();
  KvBlockHash parent = path.empty() ? KvBlockHash{} : path.back()->content_hash;
  for (auto i = static_cast<int32_t>(path.size()); i < num_full && static_cast<int32_t>(blocks.size()) < max_blocks;
       ++i) {
    const KvBlockHash hash = chain_hash(parent, kv_key.namespace_of_block(i),
                                        tokens.subspan(static_cast<size_t>(i) * block_size(), block_size()));
    const bool reading = reading_.count(hash) != 0;
    if (!reading && (unreadable_.count(hash) != 0 || !disk_.directory->contains(hash))) break;
    blocks.emplace_back(hash, reading);
    parent = hash;
  }
  return blocks;
}

bool KvCacheManager::disk_read_pending(const KvKey& kv_key, std::span<const KvTokenId> tokens) const {
  if (!has_disk_tier() || reading_.empty()) return false;
  const std::vector<RadixNode*> path = tree_.match_any_tier(kv_key, tokens);
  if (static_cast<int32_t>(tokens.size()) / block_size() <= static_cast<int32_t>(path.size())) return false;
  const auto i = static_cast<int32_t>(path.size());
  const KvBlockHash hash = chain_hash(path.empty() ? KvBlockHash{} : path.back()->content_hash,
                                      kv_key.namespace_of_block(i),
                                      tokens.subspan(static_cast<size_t>(i) * block_size(), block_size()));
  return reading_.count(hash) != 0;
}

bool KvCacheManager::next_block_on_disk(const KvKey& kv_key, std::span<const KvTokenId> tokens) const {
  if (!has_disk_tier()) return false;
  return !blocks_after_path(kv_key, tokens, tree_.match_any_tier(kv_key, tokens), 1).empty();
}

void KvCacheManager::clear_reservations() { tree_.clear_reserved(); }

KvCacheManager::PrefixReservation KvCacheManager::reserve_prefix(const KvKey& kv_key, std::span<const KvTokenId> tokens,
                                                                 int32_t max_host_blocks) {
  PrefixReservation reservation;
  const std::vector<RadixNode*> path = tree_.match_any_tier(kv_key, tokens);
  for (RadixNode* node : path) {
    if (node->tier == KvTier::kDevice) {
      tree_.set_reserved(node, true);
      if (node->host_block_id >= 0) ++reservation.num_host_blocks;  // its backup holds a host block too
    } else if (reservation.num_host_blocks < max_host_blocks) {
      tree_.set_reserved(node, true);
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

int32_t KvCacheManager::num_reserved_cached_blocks() const {
  int32_t count = 0;
  for (const RadixNode* node : tree_.reserved_nodes())
    if (node->block_id >= 0 && pool_.ref_count(node->block_id) == 0) ++count;
  return count;
}

int32_t KvCacheManager::start_disk_read(const KvKey& kv_key, std::span<const KvTokenId> tokens, int32_t max_blocks,
                                        LoadReason reason) {
  if (!has_disk_tier() || max_blocks <= 0) return 0;
  const std::vector<RadixNode*> path = tree_.match_any_tier(kv_key, tokens);
  const std::vector<std::pair<KvBlockHash, bool>> blocks = blocks_after_path(kv_key, tokens, path, max_blocks);
  if (blocks.empty() || blocks.front().second) return 0;  // nothing on disk, or a read in the way
  // The read's blocks rank as a new node would: newest under LRU; under
  // kWorkflow a dynamic block (demand) or the prefetched agent's steps.
  const int64_t now = clock_ + 1;
  const int32_t steps = path.empty() ? kDynamicNodeSteps : path.back()->fixed_steps;
  const EvictionKey for_key = reason == LoadReason::kPrefetch
                                  ? eviction_key(tree_.eviction_policy(), steps, std::numeric_limits<int64_t>::min(),
                                                 std::numeric_limits<int64_t>::min())
                                  : eviction_key(tree_.eviction_policy(), kDynamicNodeSteps, now,
                                                 std::numeric_limits<int64_t>::max());
  const RadixNode* last = path.empty() ? nullptr : path.back();
  Transfer transfer;
  transfer.kind = Transfer::Kind::kDiskRead;
  transfer.reason = reason;
  for (const auto& [hash, reading] : blocks) {
    if (reading) break;
    std::optional<int32_t> host_block = host_pool_->take_one();
    if (!host_block) {
      const std::optional<EvictionKey> victim = tree_.first_host_evictable_key();
      // Never the path's own last node: the blocks read hang under it.
      if (victim && *victim < for_key && !(last != nullptr && last->host_evictable_key == victim)) {
        tree_.evict_host_leaf();
      } else {
        // A device node's backup (the node stays on the device): else a host
        // tier no larger than the device fills with backups and reads stop.
        const std::optional<EvictionKey> backup = tree_.first_backup_droppable_key();
        if (!backup || !(*backup < for_key)) break;
        tree_.drop_first_backup();
      }
      host_block = host_pool_->take_one();
    }
    transfer.host_block_ids.push_back(*host_block);
    transfer.block_hashes.push_back(hash);
  }
  if (transfer.host_block_ids.empty()) return 0;
  const auto num_blocks = static_cast<int32_t>(transfer.host_block_ids.size());
  const auto first_block = static_cast<int32_t>(path.size());
  const int64_t id = add_transfer(transfer, {});
  TransferInFlight& in_flight = transfers_in_flight_.at(id);
  in_flight.kv_key = kv_key;
  in_flight.first_block = first_block;
  in_flight.tokens.assign(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(first_block + num_blocks) * block_size());
  for (const KvBlockHash& hash : in_flight.transfer.block_hashes) reading_.emplace(hash, id);
  return num_blocks;
}

void KvCacheManager::finish_disk_read(const TransferInFlight& in_flight, bool succeeded) {
  const Transfer& transfer = in_flight.transfer;
  for (const KvBlockHash& hash : transfer.block_hashes) reading_.erase(hash);
  const auto num_blocks = static_cast<int32_t>(transfer.host_block_ids.size());
  int32_t num_joined = 0;
  if (succeeded) {
    const std::span<const KvTokenId> tokens(in_flight.tokens);
    const std::vector<RadixNode*> path = tree_.match_any_tier(in_flight.kv_key, tokens);
    // The blocks hang under the node that ended the path when the read began
    // (first_block - 1), if the tree still ends there.
    if (static_cast<int32_t>(path.size()) == in_flight.first_block) {
      RadixNode* parent = path.empty() ? nullptr : path.back();
      const int64_t now = ++clock_;
      for (; num_joined < num_blocks; ++num_joined) {
        const int32_t block = in_flight.first_block + num_joined;
        const std::span<const KvTokenId> block_tokens =
            tokens.subspan(static_cast<size_t>(block) * block_size(), block_size());
        const std::string& kv_namespace = in_flight.kv_key.namespace_of_block(block);
        parent = tree_.insert_host(kv_namespace, parent, block_tokens,
                                   transfer.host_block_ids[static_cast<size_t>(num_joined)], now);
        if (transfer.reason == LoadReason::kDemand) tree_.set_reserved(parent, true);  // read for a waiting request
        LOOM_CHECK(parent->content_hash == transfer.block_hashes[static_cast<size_t>(num_joined)]);
      }
    }
    num_disk_read_blocks_ += num_joined;
  } else {
    ++num_failed_transfers_;
    num_disk_read_failed_blocks_ += num_blocks;
    // The store drops files that do not verify, but a file it keeps (or a read
    // refused for want of room in the queue) would be read again every step
    // while its request waits: these blocks count as not on disk from now on.
    if (unreadable_.size() > kMaxUnreadableBlocks) unreadable_.clear();
    unreadable_.insert(transfer.block_hashes.begin(), transfer.block_hashes.end());
  }
  for (int32_t i = num_joined; i < num_blocks; ++i) host_pool_->put_free(transfer.host_block_ids[static_cast<size_t>(i)]);
}

}  // namespace loom
