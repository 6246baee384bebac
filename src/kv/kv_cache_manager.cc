#include "kv/kv_cache_manager.h"

#include <fmt/format.h>

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

KvCacheManager::KvCacheManager(int32_t num_blocks, int32_t block_size)
    : pool_(num_blocks), tree_(pool_, block_size) {}

int32_t KvCacheManager::num_cached_prefix_tokens(const KvKey& kv_key, std::span<const KvTokenId> tokens) const {
  return static_cast<int32_t>(tree_.match(kv_key, tokens).size()) * block_size();
}

KvLease KvCacheManager::lock_prefix(const KvKey& kv_key, std::span<const KvTokenId> tokens) {
  return reference_prefix(kv_key, tokens, true);
}

KvLease KvCacheManager::hold_prefix(const KvKey& kv_key, std::span<const KvTokenId> tokens) {
  return reference_prefix(kv_key, tokens, false);
}

KvLease KvCacheManager::reference_prefix(const KvKey& kv_key, std::span<const KvTokenId> tokens, bool mark_used) {
  KvLease lease;
  lease.manager_ = this;
  lease.kv_key_ = kv_key;
  lease.marks_used_ = mark_used;
  for (RadixNode* node : tree_.match(kv_key, tokens)) {
    pool_.add_ref(node->block_id);
    tree_.on_ref_changed(node->block_id);
    lease.block_ids_.push_back(node->block_id);
    if (mark_used && node->loaded_by_prefetch) {  // a prefetched block, ready when first used: in time
      node->loaded_by_prefetch = false;
      ++num_prefetch_hit_blocks_;
    }
  }
  lease.num_committed_blocks_ = lease.num_blocks();
  lease.num_found_tokens_ = lease.num_blocks() * block_size();
  if (mark_used) tree_.touch(lease.block_ids_, ++clock_);
  return lease;
}

int32_t KvCacheManager::num_available_blocks() const { return pool_.num_free_blocks() + tree_.num_cached_blocks(); }

int32_t KvCacheManager::block_ref_count(int32_t block_id) const { return pool_.ref_count(block_id); }

std::vector<const RadixNode*> KvCacheManager::prefix_path(const KvKey& kv_key, std::span<const KvTokenId> tokens) const {
  const std::vector<RadixNode*> path = tree_.match_any_tier(kv_key, tokens);
  return {path.begin(), path.end()};
}

bool KvCacheManager::allocate(KvLease& lease, int32_t num_blocks) {
  LOOM_CHECK(lease.manager_ == this && num_blocks >= 0);
  if (!can_allocate(num_blocks)) return false;
  while (pool_.num_free_blocks() < num_blocks) {
    const bool evicted = evict_one_device_block();
    LOOM_CHECK(evicted);  // every cached block is reclaimable (see radix_tree.h)
  }
  auto ids = pool_.take_free(num_blocks);
  LOOM_CHECK(ids.has_value());
  lease.block_ids_.insert(lease.block_ids_.end(), ids->begin(), ids->end());
  count_private_blocks(lease, lease.num_blocks() - num_blocks, lease.num_blocks(), +1);
  return true;
}

bool KvCacheManager::evict_one_device_block() {
  std::optional<int32_t> evicted = tree_.evict_one();
  if (!evicted) return false;
  pool_.put_free(*evicted);
  ++num_evicted_blocks_;
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
  const int32_t num_full = std::min(num_computed_tokens / block_size(), lease.num_blocks());
  const int32_t first = lease.num_committed_blocks_;
  if (num_full <= first) return;
  const size_t block = static_cast<size_t>(block_size());
  RadixNode* parent = first == 0 ? nullptr : tree_.node_of_block(lease.block_ids_[static_cast<size_t>(first - 1)]);
  const int64_t now = ++clock_;
  std::optional<size_t> first_new;  // index of the first node inserted here (all after it are new too)
  int32_t num_committed = first;
  for (int32_t i = first; i < num_full; ++i) {
    std::span<const KvTokenId> block_tokens = tokens.subspan(static_cast<size_t>(i) * block, block);
    int32_t& block_id = lease.block_ids_[static_cast<size_t>(i)];
    const std::string& kv_namespace = lease.kv_key_.namespace_of_block(i);
    RadixNode* node = tree_.find_child(kv_namespace, parent, block_tokens);
    if (node == nullptr) {
      node = tree_.insert(kv_namespace, parent, block_tokens, block_id);
      if (!first_new) first_new = static_cast<size_t>(i);
    } else if (node->state == KvNodeState::kLoading) {
      break;  // its device block is still filling: this and later blocks stay private for now
    } else if (node->tier == KvTier::kHost) {
      tree_.adopt_device_block(node, block_id);  // recomputed what the host holds; the backup stays valid
    } else if (node->block_id != block_id) {
      // Computed twice (two requests prefilled the same tokens at once): keep the tree's copy.
      pool_.add_ref(node->block_id);
      tree_.on_ref_changed(node->block_id);
      if (pool_.release_ref(block_id) == 0) pool_.put_free(block_id);
      block_id = node->block_id;
    }
    node->last_access = now;
    tree_.on_ref_changed(node->block_id);
    parent = node;
    num_committed = i + 1;
  }
  count_private_blocks(lease, first, num_committed, -1);
  lease.num_committed_blocks_ = num_committed;
  if (host_pool_ && first_new) {
    std::vector<RadixNode*> path;
    for (int32_t i = 0; i < num_committed; ++i) path.push_back(tree_.node_of_block(lease.block_ids_[static_cast<size_t>(i)]));
    plan_offload(path, *first_new);
  }
}

void KvCacheManager::release(KvLease& lease) {
  const int64_t now = lease.marks_used_ ? ++clock_ : 0;
  count_private_blocks(lease, lease.num_committed_blocks_, lease.num_blocks(), -1);
  // Tail first, so that a parent is never unreferenced while its child is referenced.
  for (auto it = lease.block_ids_.rbegin(); it != lease.block_ids_.rend(); ++it) {
    const int32_t id = *it;
    const bool in_tree = tree_.node_of_block(id) != nullptr;
    if (pool_.release_ref(id) == 0 && !in_tree) pool_.put_free(id);
    if (in_tree) {
      if (lease.marks_used_) tree_.node_of_block(id)->last_access = now;
      tree_.on_ref_changed(id);
    }
  }
}

int32_t KvCacheManager::drop_namespace(const std::string& kv_namespace) {
  return drop_namespaces([&](const std::string& ns) { return ns == kv_namespace; });
}

int32_t KvCacheManager::drop_namespaces(const std::function<bool(const std::string&)>& matches) {
  LOOM_CHECK(transfers_in_flight_.empty());  // the engine drains transfers first
  std::vector<int32_t> freed = tree_.remove_namespaces(matches);
  for (int32_t id : freed) pool_.put_free(id);
  return static_cast<int32_t>(freed.size());
}

void KvCacheManager::set_eviction_policy(EvictionPolicy policy) { tree_.set_eviction_policy(policy); }

KvCacheManager::EvictionPolicy KvCacheManager::eviction_policy() const { return tree_.eviction_policy(); }

void KvCacheManager::set_agent_fixed_prefix(const std::string& agent_key, const KvKey& kv_key,
                                            std::span<const KvTokenId> tokens, int32_t num_fixed_tokens) {
  const size_t num_tokens = std::min(tokens.size(), static_cast<size_t>(std::max(num_fixed_tokens, 0)));
  const std::vector<RadixNode*> path = tree_.match_any_tier(kv_key, tokens.first(num_tokens));
  tree_.set_agent_prefix_end(agent_key, path.empty() ? nullptr : path.back());
  if (host_pool_) plan_offload(path, 0);
  // The disk tier may hold blocks of it that are in no tree tier: prefetch_agent reads them by hash.
  if (has_disk_tier()) agent_prefixes_[agent_key] = {kv_key, std::vector<KvTokenId>(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(num_tokens))};
}

void KvCacheManager::set_agent_steps(const std::map<std::string, int32_t>& steps_by_agent_key) {
  for (const auto& [agent_key, steps] : steps_by_agent_key) tree_.set_agent_steps(agent_key, std::max(steps, 0));
}

void KvCacheManager::forget_agents(const std::function<bool(const std::string&)>& matches) {
  tree_.forget_agents(matches);
  std::erase_if(agent_prefixes_, [&](const auto& entry) { return matches(entry.first); });
}

std::vector<int32_t> KvCacheManager::eviction_order() const { return tree_.eviction_order(); }

int32_t KvCacheManager::evict_all_cached() {
  int32_t count = 0;
  while (evict_one_device_block()) ++count;
  return count;
}

KvCacheStats KvCacheManager::stats() const {
  KvCacheStats stats;
  stats.num_total_blocks = pool_.num_total_blocks();
  stats.num_free_blocks = pool_.num_free_blocks();
  stats.num_cached_blocks = tree_.num_cached_blocks();
  stats.num_in_use_blocks = stats.num_total_blocks - stats.num_free_blocks - stats.num_cached_blocks;
  stats.num_evicted_blocks = num_evicted_blocks_;
  stats.num_blocks_by_namespace = tree_.num_device_nodes_by_namespace();
  for (const auto& [kv_namespace, count] : num_private_blocks_by_namespace_)
    stats.num_blocks_by_namespace[kv_namespace] += count;
  if (host_pool_) {
    stats.num_host_total_blocks = host_pool_->num_total_blocks();
    stats.num_host_used_blocks = host_pool_->num_used_blocks();
    stats.num_host_only_blocks = tree_.num_host_tier_nodes();
  }
  stats.num_offloaded_blocks = num_offloaded_blocks_;
  stats.num_loaded_blocks = num_loaded_blocks_;
  stats.num_prefetched_blocks = num_prefetched_blocks_;
  stats.num_prefetch_hit_blocks = num_prefetch_hit_blocks_;
  stats.num_prefetch_late_blocks = num_prefetch_late_blocks_;
  stats.num_failed_transfers = num_failed_transfers_;
  stats.num_disk_read_blocks = num_disk_read_blocks_;
  stats.num_disk_read_failed_blocks = num_disk_read_failed_blocks_;
  stats.num_disk_write_planned_blocks = num_disk_write_planned_blocks_;
  stats.num_disk_reading_blocks = static_cast<int32_t>(reading_.size());
  return stats;
}

std::string KvCacheManager::integrity_error() const {
  int32_t num_in_use = 0, num_cached = 0, num_free = 0;
  for (int32_t id = 0; id < pool_.num_total_blocks(); ++id) {
    const bool in_tree = tree_.node_of_block(id) != nullptr;
    const int32_t refs = pool_.ref_count(id);
    if (pool_.is_free(id)) {
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
  if (num_free + num_cached + num_in_use != pool_.num_total_blocks())
    return fmt::format("free {} + cached {} + in use {} != total {}", num_free, num_cached, num_in_use,
                       pool_.num_total_blocks());
  int32_t num_private = 0;
  for (const auto& [kv_namespace, count] : num_private_blocks_by_namespace_) num_private += count;
  if (num_private + tree_.num_device_nodes() != num_in_use + num_cached)
    return fmt::format("{} private + {} tree blocks != {} in use + {} cached", num_private, tree_.num_device_nodes(),
                       num_in_use, num_cached);
  if (num_cached != tree_.num_cached_blocks())
    return fmt::format("{} cached blocks counted, tree records {}", num_cached, tree_.num_cached_blocks());
  if (std::string error = tree_.integrity_error(); !error.empty()) return error;
  return host_integrity_error();
}

}  // namespace loom
