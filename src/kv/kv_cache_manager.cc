#include "kv/kv_cache_manager.h"

#include <fmt/format.h>

#include <algorithm>

#include "util/error.h"

namespace loom {

std::string kv_namespace_for_adapter(const std::string& adapter_name) {
  return adapter_name.empty() ? std::string(kBaseKvNamespace) : isolated_kv_namespace(adapter_name);
}

KvLease& KvLease::operator=(KvLease&& other) noexcept {
  if (this != &other) {
    release();
    manager_ = other.manager_;
    kv_key_ = std::move(other.kv_key_);
    block_ids_ = std::move(other.block_ids_);
    num_committed_blocks_ = other.num_committed_blocks_;
    num_found_tokens_ = other.num_found_tokens_;
    marks_used_ = other.marks_used_;
    other.manager_ = nullptr;
    other.block_ids_.clear();
    other.num_committed_blocks_ = 0;
    other.num_found_tokens_ = 0;
  }
  return *this;
}

void KvLease::release() {
  if (manager_ != nullptr) manager_->release(*this);
  manager_ = nullptr;
  block_ids_.clear();
  num_committed_blocks_ = 0;
}

KvCacheManager::KvCacheManager(int32_t num_blocks, int32_t block_size) : device_(num_blocks, block_size) {}

KvCacheManager::~KvCacheManager() = default;

int32_t KvCacheManager::num_cached_prefix_tokens(const KvKey& kv_key, std::span<const KvTokenId> tokens) const {
  return static_cast<int32_t>(device_.tree.match(kv_key, tokens).size()) * block_size();
}

KvLease KvCacheManager::lock_prefix(const KvKey& kv_key, std::span<const KvTokenId> tokens) {
  return reference_prefix(kv_key, tokens, true);
}

KvLease KvCacheManager::hold_prefix(const KvKey& kv_key, std::span<const KvTokenId> tokens) {
  return reference_prefix(kv_key, tokens, false);
}

void KvCacheManager::count_prefetch_hits(const std::vector<RadixNode*>& nodes) {
  for (RadixNode* node : nodes) {
    if (!node->loaded_by_prefetch) continue;  // a prefetched block, ready when first used: in time
    node->loaded_by_prefetch = false;
    ++num_prefetch_hit_blocks_;
  }
}

KvLease KvCacheManager::reference_prefix(const KvKey& kv_key, std::span<const KvTokenId> tokens, bool mark_used) {
  KvLease lease;
  lease.manager_ = this;
  lease.kv_key_ = kv_key;
  lease.marks_used_ = mark_used;
  const std::vector<RadixNode*> nodes = device_.tree.match(kv_key, tokens);
  for (RadixNode* node : nodes) lease.block_ids_.push_back(node->block_id);
  device_.pin(lease.block_ids_);
  if (mark_used) count_prefetch_hits(nodes);
  lease.num_committed_blocks_ = lease.num_blocks();
  lease.num_found_tokens_ = lease.num_blocks() * block_size();
  if (mark_used) device_.tree.touch(lease.block_ids_, device_.tick());
  return lease;
}

void KvCacheManager::touch_prefix(const KvKey& kv_key, std::span<const KvTokenId> tokens) {
  const std::vector<RadixNode*> nodes = device_.tree.match(kv_key, tokens);
  count_prefetch_hits(nodes);
  std::vector<int32_t> block_ids;
  for (const RadixNode* node : nodes) block_ids.push_back(node->block_id);
  device_.tick();  // the clock moves as a lease taken and released would move it (twice)
  device_.tree.touch(block_ids, device_.tick());
}

bool KvCacheManager::is_reserved(int32_t block_id) const {
  const RadixNode* node = device_.tree.node_of_block(block_id);
  return node != nullptr && node->reserved;
}

int32_t KvCacheManager::num_reserved_cached_blocks() const {
  int32_t count = 0;
  for (const RadixNode* node : device_.tree.reserved_nodes())
    if (node->block_id >= 0 && device_.pool.ref_count(node->block_id) == 0) ++count;
  return count;
}

PrefixLocation KvCacheManager::prefix_location(const KvKey& kv_key, std::span<const KvTokenId> tokens,
                                               PrefixLookup lookup) const {
  PrefixLocation location;
  location.block_size = block_size();
  const std::vector<RadixNode*> path = device_.tree.match_any_tier(kv_key, tokens);
  for (const RadixNode* node : path) {  // [device ...][loading ...][host ...]
    if (node->tier == KvTier::kDevice) location.device_block_ids.push_back(node->block_id);
    else if (node->state == KvNodeState::kLoading) ++location.num_loading_blocks;
    else location.host_block_ids.push_back(node->host_block_id);
  }
  if (disk_ && lookup == PrefixLookup::kTreeAndDisk) disk_->locate_past(kv_key, tokens, path, location);
  return location;
}

bool KvCacheManager::allocate(KvLease& lease, int32_t num_blocks) {
  LOOM_CHECK(lease.manager_ == this && num_blocks >= 0);
  if (!can_allocate(num_blocks)) return false;
  while (device_.pool.num_free_blocks() < num_blocks) {
    const bool evicted = device_.evict_one();
    LOOM_CHECK(evicted);  // every cached block is reclaimable (see radix_tree.h)
  }
  auto ids = device_.pool.take_free(num_blocks);
  LOOM_CHECK(ids.has_value());
  lease.block_ids_.insert(lease.block_ids_.end(), ids->begin(), ids->end());
  count_private_blocks(lease, lease.num_blocks() - num_blocks, lease.num_blocks(), +1);
  return true;
}

void KvCacheManager::count_private_blocks(const KvLease& lease, int32_t begin, int32_t end, int32_t delta) {
  for (int32_t i = begin; i < end; ++i) {
    auto it = num_private_blocks_by_namespace_.try_emplace(lease.kv_key_.namespace_of_block(i), 0).first;
    it->second += delta;
    LOOM_CHECK(it->second >= 0);
    if (it->second == 0) num_private_blocks_by_namespace_.erase(it);
  }
}

void KvCacheManager::commit(KvLease& lease, std::span<const KvTokenId> tokens, int32_t num_computed_tokens) {
  LOOM_CHECK(lease.manager_ == this);
  LOOM_CHECK(num_computed_tokens >= 0 && num_computed_tokens <= static_cast<int32_t>(tokens.size()));
  RadixTree& tree = device_.tree;
  BlockPool& pool = device_.pool;
  const int32_t num_full = std::min(num_computed_tokens / block_size(), lease.num_blocks());
  const int32_t first = lease.num_committed_blocks_;
  if (num_full <= first) return;
  const size_t block = static_cast<size_t>(block_size());
  RadixNode* parent = first == 0 ? nullptr : tree.node_of_block(lease.block_ids_[static_cast<size_t>(first - 1)]);
  const int64_t now = device_.tick();
  std::optional<size_t> first_new;  // index of the first node inserted here (all after it are new too)
  int32_t num_committed = first;
  for (int32_t i = first; i < num_full; ++i) {
    std::span<const KvTokenId> block_tokens = tokens.subspan(static_cast<size_t>(i) * block, block);
    int32_t& block_id = lease.block_ids_[static_cast<size_t>(i)];
    const std::string& kv_namespace = lease.kv_key_.namespace_of_block(i);
    RadixNode* node = tree.find_child(kv_namespace, parent, block_tokens);
    if (node == nullptr) {
      node = tree.insert(kv_namespace, parent, block_tokens, block_id);
      if (!first_new) first_new = static_cast<size_t>(i);
    } else if (node->state == KvNodeState::kLoading) {
      break;  // its device block is still filling: this and later blocks stay private for now
    } else if (node->tier == KvTier::kHost) {
      tree.adopt_device_block(node, block_id);  // recomputed what the host holds; the backup stays valid
    } else if (node->block_id != block_id) {
      // Computed twice (two requests prefilled the same tokens at once): keep the tree's copy.
      pool.add_ref(node->block_id);
      tree.on_ref_changed(node->block_id);
      if (pool.release_ref(block_id) == 0) pool.put_free(block_id);
      block_id = node->block_id;
    }
    node->last_access = now;
    tree.on_ref_changed(node->block_id);
    parent = node;
    num_committed = i + 1;
  }
  count_private_blocks(lease, first, num_committed, -1);
  lease.num_committed_blocks_ = num_committed;
  if (host_ && first_new) {
    std::vector<RadixNode*> path;
    for (int32_t i = 0; i < num_committed; ++i) path.push_back(tree.node_of_block(lease.block_ids_[static_cast<size_t>(i)]));
    host_->plan_offload(path, *first_new);
  }
}

void KvCacheManager::release(KvLease& lease) {
  RadixTree& tree = device_.tree;
  const int64_t now = lease.marks_used_ ? device_.tick() : 0;
  count_private_blocks(lease, lease.num_committed_blocks_, lease.num_blocks(), -1);
  // Tail first, so that a parent is never unreferenced while its child is referenced.
  for (auto it = lease.block_ids_.rbegin(); it != lease.block_ids_.rend(); ++it) {
    const int32_t id = *it;
    const bool in_tree = tree.node_of_block(id) != nullptr;
    if (device_.pool.release_ref(id) == 0 && !in_tree) device_.pool.put_free(id);
    if (in_tree) {
      if (lease.marks_used_) tree.node_of_block(id)->last_access = now;
      tree.on_ref_changed(id);
    }
  }
}

int32_t KvCacheManager::drop_namespace(const std::string& kv_namespace) {
  return drop_namespaces([&](const std::string& ns) { return ns == kv_namespace; });
}

int32_t KvCacheManager::drop_namespaces(const std::function<bool(const std::string&)>& matches) {
  LOOM_CHECK(num_transfers_in_flight() == 0);  // the engine drains transfers first
  std::vector<int32_t> freed = device_.tree.remove_namespaces(matches);
  for (int32_t id : freed) device_.pool.put_free(id);
  return static_cast<int32_t>(freed.size());
}

void KvCacheManager::set_agent_fixed_prefix(const std::string& agent_key, const KvKey& kv_key,
                                            std::span<const KvTokenId> tokens, int32_t num_fixed_tokens) {
  const size_t num_tokens = std::min(tokens.size(), static_cast<size_t>(std::max(num_fixed_tokens, 0)));
  const std::vector<RadixNode*> path = device_.tree.match_any_tier(kv_key, tokens.first(num_tokens));
  device_.tree.set_agent_prefix_end(agent_key, path.empty() ? nullptr : path.back());
  if (host_) host_->plan_offload(path, 0);
  if (disk_) disk_->set_agent_prefix(agent_key, kv_key, tokens.first(num_tokens));
}

void KvCacheManager::set_agent_steps(const std::map<std::string, int32_t>& steps_by_agent_key) {
  for (const auto& [agent_key, steps] : steps_by_agent_key) device_.tree.set_agent_steps(agent_key, std::max(steps, 0));
}

void KvCacheManager::forget_agents(const std::function<bool(const std::string&)>& matches) {
  device_.tree.forget_agents(matches);
  if (disk_) disk_->forget_agents(matches);
}

void KvCacheManager::enable_host_tier(int32_t num_host_blocks) {
  LOOM_CHECK(num_host_blocks >= 0 && host_ == nullptr);
  if (num_host_blocks == 0) return;
  host_ = std::make_unique<HostTierPlanner>(device_, transfer_ids_, num_host_blocks);
}

void KvCacheManager::enable_block_hashes(KvBlockNaming naming) {
  LOOM_CHECK(!has_block_hashes() && naming.namespace_salt);
  naming_ = std::move(naming);
  device_.tree.set_block_hasher(
      [this](const KvBlockHash& parent, const std::string& kv_namespace, std::span<const KvTokenId> tokens) {
        return chain_block_hash(parent.is_zero() ? naming_.cache_salt : parent, naming_.namespace_salt(kv_namespace),
                                tokens);
      });
}

void KvCacheManager::enable_disk_tier(KvDiskTierConfig config) {
  LOOM_CHECK(host_ != nullptr && has_block_hashes() && disk_ == nullptr && config.directory != nullptr &&
             device_.tree.num_nodes() == 0);
  disk_ = std::make_unique<DiskTierPlanner>(device_, host_->pool(), transfer_ids_, config);
  host_->write_through_to_disk();
}

int32_t KvCacheManager::prefetch_agent(const std::string& agent_key, int32_t max_blocks) {
  if (!host_) return 0;
  const int32_t num_loading = host_->prefetch_agent(agent_key, max_blocks);
  // What follows the tree's part on disk comes to the host now, to the device at a later prefetch.
  if (!disk_) return num_loading;
  return num_loading + disk_->prefetch_agent(agent_key, max_blocks - num_loading);
}

void KvCacheManager::count_late_prefetch(const KvKey& kv_key, std::span<const KvTokenId> tokens) {
  if (host_) host_->count_late_prefetch(kv_key, tokens);
}

std::vector<KvTransfer> KvCacheManager::take_transfers() {
  std::vector<KvTransfer> transfers;
  if (host_) host_->take_transfers(transfers);
  if (disk_) disk_->take_transfers(transfers);
  std::sort(transfers.begin(), transfers.end(), [](const KvTransfer& a, const KvTransfer& b) { return a.id < b.id; });
  return transfers;
}

void KvCacheManager::finish_transfer(int64_t transfer_id, bool succeeded) {
  if (disk_ && disk_->owns(transfer_id)) {
    disk_->finish_transfer(transfer_id, succeeded);
    return;
  }
  LOOM_CHECK(host_ != nullptr);
  if (host_->swap_space().owns(transfer_id)) {  // no write-through: a swap's blocks are private
    host_->swap_space().finish_transfer(transfer_id, succeeded);
    return;
  }
  const KvTransfer transfer = host_->finish_transfer(transfer_id, succeeded);
  if (disk_ && succeeded && transfer.kind == KvTransfer::Kind::kOffload) disk_->announce_written_through(transfer);
}

int32_t KvCacheManager::num_transfers_in_flight() const {
  return (host_ ? host_->num_transfers_in_flight() : 0) + (disk_ ? disk_->num_transfers_in_flight() : 0);
}

int32_t KvCacheManager::evict_all_cached() {
  int32_t count = 0;
  while (device_.evict_one()) ++count;
  return count;
}

KvCacheStats KvCacheManager::stats() const {
  const RadixTree& tree = device_.tree;
  KvCacheStats stats;
  stats.num_total_blocks = device_.pool.num_total_blocks();
  stats.num_free_blocks = device_.pool.num_free_blocks();
  stats.num_cached_blocks = tree.num_cached_blocks();
  stats.num_in_use_blocks = stats.num_total_blocks - stats.num_free_blocks - stats.num_cached_blocks;
  stats.num_evicted_blocks = device_.num_evicted_blocks;
  stats.num_blocks_by_namespace = tree.num_device_nodes_by_namespace();
  for (const auto& [kv_namespace, count] : num_private_blocks_by_namespace_)
    stats.num_blocks_by_namespace[kv_namespace] += count;
  stats.num_prefetch_hit_blocks = num_prefetch_hit_blocks_;
  if (host_) host_->add_stats(stats);
  if (disk_) disk_->add_stats(stats);
  return stats;
}

std::string KvCacheManager::integrity_error() const {
  const BlockPool& pool = device_.pool;
  const RadixTree& tree = device_.tree;
  int32_t num_in_use = 0, num_cached = 0, num_free = 0;
  for (int32_t id = 0; id < pool.num_total_blocks(); ++id) {
    const bool in_tree = tree.node_of_block(id) != nullptr;
    const int32_t refs = pool.ref_count(id);
    if (pool.is_free(id)) {
      if (refs != 0 || in_tree) return fmt::format("free block {} is referenced or cached", id);
      ++num_free;
    } else if (refs > 0) {
      ++num_in_use;
    } else if (in_tree) {
      ++num_cached;
    } else {
      return fmt::format("block {} is leaked: not free, not referenced, not cached", id);
    }
  }
  if (num_free + num_cached + num_in_use != pool.num_total_blocks())
    return fmt::format("free {} + cached {} + in use {} != total {}", num_free, num_cached, num_in_use,
                       pool.num_total_blocks());
  int32_t num_private = host_ ? host_->swap_space().num_device_blocks_held_by_copies_only() : 0;
  for (const auto& [kv_namespace, count] : num_private_blocks_by_namespace_) num_private += count;
  if (num_private + tree.num_device_nodes() != num_in_use + num_cached)
    return fmt::format("{} private + {} tree blocks != {} in use + {} cached", num_private, tree.num_device_nodes(),
                       num_in_use, num_cached);
  if (num_cached != tree.num_cached_blocks())
    return fmt::format("{} cached blocks counted, tree records {}", num_cached, tree.num_cached_blocks());
  if (std::string error = tree.integrity_error(); !error.empty()) return error;
  if (disk_)
    if (std::string error = disk_->integrity_error(); !error.empty()) return error;
  if (!host_) {
    bool any_in_transfer_state = false;
    tree.for_each_node([&](const RadixNode& node) { any_in_transfer_state |= node.state != KvNodeState::kReady; });
    return any_in_transfer_state ? "a node is loading or offloading without a host tier" : "";
  }
  return host_->integrity_error(disk_ ? disk_->held_host_blocks() : std::vector<int32_t>{});
}

}  // namespace loom
