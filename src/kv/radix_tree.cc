#include "kv/radix_tree.h"

#include <fmt/format.h>

#include "util/error.h"

namespace loom {

RadixTree::RadixTree(BlockPool& pool, int32_t block_size)
    : pool_(pool), block_size_(block_size), node_by_block_(static_cast<size_t>(pool.num_total_blocks()), nullptr) {
  LOOM_CHECK(block_size > 0);
}

RadixTree::~RadixTree() = default;

RadixNode* RadixTree::root(const std::string& kv_namespace) const {
  auto it = roots_.find(kv_namespace);
  return it == roots_.end() ? nullptr : it->second.get();
}

std::vector<RadixNode*> RadixTree::match(const KvKey& kv_key, std::span<const KvTokenId> tokens) const {
  std::vector<RadixNode*> path = match_any_tier(kv_key, tokens);
  // Offloading nodes match (their K/V is final); the path stops at the first host or loading node.
  const auto first_off_device =
      std::find_if(path.begin(), path.end(), [](const RadixNode* node) { return node->tier != KvTier::kDevice; });
  path.erase(first_off_device, path.end());
  return path;
}

std::vector<RadixNode*> RadixTree::match_any_tier(const KvKey& kv_key, std::span<const KvTokenId> tokens) const {
  std::vector<RadixNode*> path;
  RadixNode* node = root(kv_key.namespace_of_block(0));
  if (node == nullptr) return path;
  const size_t block = static_cast<size_t>(block_size_);
  for (size_t start = 0; start + block <= tokens.size(); start += block) {
    const int32_t block_index = static_cast<int32_t>(start / block);
    auto it = node->children.find(RadixChildView{kv_key.namespace_of_block(block_index), tokens.subspan(start, block)});
    if (it == node->children.end()) break;
    node = it->second.get();
    path.push_back(node);
  }
  return path;
}

RadixNode* RadixTree::find_child(const std::string& kv_namespace, RadixNode* parent,
                                 std::span<const KvTokenId> block_tokens) const {
  if (parent == nullptr) parent = root(kv_namespace);
  if (parent == nullptr) return nullptr;
  auto it = parent->children.find(RadixChildView{kv_namespace, block_tokens});
  return it == parent->children.end() ? nullptr : it->second.get();
}

RadixNode* RadixTree::insert(const std::string& kv_namespace, RadixNode* parent,
                             std::span<const KvTokenId> block_tokens, int32_t block_id) {
  LOOM_CHECK(block_id >= 0 && block_id < pool_.num_total_blocks() && node_by_block_[static_cast<size_t>(block_id)] == nullptr);
  RadixNode* raw = add_child(kv_namespace, parent, block_tokens);
  set_device_block(raw, block_id);
  if (!raw->parent->is_root()) update(raw->parent);  // no longer a leaf
  announce(raw);
  return raw;
}

RadixNode* RadixTree::add_child(const std::string& kv_namespace, RadixNode* parent,
                                std::span<const KvTokenId> block_tokens) {
  LOOM_CHECK(static_cast<int32_t>(block_tokens.size()) == block_size_);
  if (parent == nullptr) {
    auto& slot = roots_[kv_namespace];
    if (!slot) {
      slot = std::make_unique<RadixNode>();
      slot->kv_namespace = kv_namespace;
    }
    parent = slot.get();
  }
  // A root's children are of its namespace; below that, a branch may change it.
  LOOM_CHECK(!parent->is_root() || parent->kv_namespace == kv_namespace);
  RadixChildKey key{kv_namespace, std::vector<KvTokenId>(block_tokens.begin(), block_tokens.end())};
  LOOM_CHECK(parent->children.count(key) == 0);
  auto node = std::make_unique<RadixNode>();
  node->parent = parent;
  node->kv_namespace = kv_namespace;
  node->tokens = key.second;
  node->node_id = next_node_id_++;
  node->last_access = parent->last_access;
  if (hasher_) node->content_hash = child_hash(parent, kv_namespace, block_tokens);
  RadixNode* raw = node.get();
  parent->children.emplace(std::move(key), std::move(node));
  ++num_nodes_;
  ++num_nodes_by_namespace_[kv_namespace];
  return raw;
}

void RadixTree::set_block_hasher(BlockHasher hasher) {
  LOOM_CHECK(num_nodes_ == 0 && !hasher_);
  hasher_ = std::move(hasher);
}

KvBlockHash RadixTree::child_hash(const RadixNode* parent, const std::string& kv_namespace,
                                  std::span<const KvTokenId> block_tokens) const {
  LOOM_CHECK(hasher_);
  return hasher_(parent == nullptr || parent->is_root() ? KvBlockHash{} : parent->content_hash, kv_namespace,
                 block_tokens);
}

KvBlockHash RadixTree::child_hash(const KvBlockHash& parent, const std::string& kv_namespace,
                                  std::span<const KvTokenId> block_tokens) const {
  LOOM_CHECK(hasher_);
  return hasher_(parent, kv_namespace, block_tokens);
}

RadixNode* RadixTree::node_of_block(int32_t block_id) const {
  if (block_id < 0 || block_id >= static_cast<int32_t>(node_by_block_.size())) return nullptr;
  return node_by_block_[static_cast<size_t>(block_id)];
}

void RadixTree::on_ref_changed(int32_t block_id) {
  if (RadixNode* node = node_of_block(block_id)) update(node);
}

void RadixTree::touch(std::span<const int32_t> block_ids, int64_t now) {
  for (int32_t id : block_ids) {
    if (RadixNode* node = node_of_block(id)) {
      node->last_access = now;
      update(node);
    }
  }
}

// Keeps the unreferenced count and the evictable sets in step with the node.
void RadixTree::update(RadixNode* node) {
  const bool unreferenced = node->block_id >= 0 && pool_.ref_count(node->block_id) == 0;
  if (unreferenced != node->counted_unreferenced) {
    num_unreferenced_ += unreferenced ? 1 : -1;
    node->counted_unreferenced = unreferenced;
  }
  leave_evictable_sets(node);
  const bool ready = node->state == KvNodeState::kReady;
  if (unreferenced && ready && node->tier == KvTier::kDevice && node->num_device_children == 0) {
    node->evictable_key = eviction_key_of(node);
    evictable_.insert(*node->evictable_key);
    evictable_nodes_[node->node_id] = node;
  } else if (ready && node->tier == KvTier::kHost && node->children.empty() && !node->reserved) {
    node->host_evictable_key = eviction_key_of(node);
    host_evictable_.emplace(*node->host_evictable_key, node);
  }
  if (ready && node->tier == KvTier::kDevice && node->host_block_id >= 0 && !node->reserved) {
    node->backup_droppable_key = eviction_key_of(node);
    backup_droppable_.emplace(*node->backup_droppable_key, node);
  }
}

void RadixTree::leave_evictable_sets(RadixNode* node) {
  if (node->evictable_key) {
    evictable_.erase(*node->evictable_key);
    evictable_nodes_.erase(node->node_id);
    node->evictable_key.reset();
  }
  if (node->host_evictable_key) {
    host_evictable_.erase(*node->host_evictable_key);
    node->host_evictable_key.reset();
  }
  if (node->backup_droppable_key) {
    backup_droppable_.erase(*node->backup_droppable_key);
    node->backup_droppable_key.reset();
  }
}

EvictionKey RadixTree::eviction_key_of(const RadixNode* node) const {
  EvictionKey key = eviction_key(policy_, node->fixed_steps, node->last_access, node->node_id);
  if (node->reserved) key[0] = kReservedEvictionBand;  // after every unreserved node, under both policies
  return key;
}

void RadixTree::set_device_block(RadixNode* node, int32_t block_id) {
  const bool was_resident = node->block_id >= 0;
  if (was_resident) node_by_block_[static_cast<size_t>(node->block_id)] = nullptr;
  if (block_id >= 0) {
    LOOM_CHECK(block_id < pool_.num_total_blocks() && node_by_block_[static_cast<size_t>(block_id)] == nullptr);
    node_by_block_[static_cast<size_t>(block_id)] = node;
  }
  node->block_id = block_id;
  const bool resident = block_id >= 0;
  if (resident != was_resident) {
    num_device_nodes_ += resident ? 1 : -1;
    auto it = num_device_nodes_by_namespace_.try_emplace(node->kv_namespace, 0).first;
    it->second += resident ? 1 : -1;
    if (it->second == 0) num_device_nodes_by_namespace_.erase(it);
    node->parent->num_device_children += resident ? 1 : -1;
    if (!node->parent->is_root()) update(node->parent);
  }
  update(node);
}

void RadixTree::detach(RadixNode* node) {
  LOOM_CHECK(!node->is_root() && node->children.empty());
  announce_removal(node);
  if (node->block_id >= 0) set_device_block(node, -1);
  leave_evictable_sets(node);
  if (node->reserved) reserved_nodes_.erase(node);
  if (node->tier == KvTier::kHost) --num_host_tier_nodes_;
  if (node->host_block_id >= 0) host_pool_->put_free(node->host_block_id);
  hand_marks_to_parent(node);
  --num_nodes_;
  if (auto it = num_nodes_by_namespace_.find(node->kv_namespace); --it->second == 0) num_nodes_by_namespace_.erase(it);
  RadixNode* parent = node->parent;
  parent->children.erase(parent->children.find(RadixChildView{node->kv_namespace, node->tokens}));  // destroys node
  if (!parent->is_root()) {
    propagate_fixed_steps(parent);
    update(parent);
  }
}

std::optional<int32_t> RadixTree::evict_one() {
  if (evictable_.empty()) return std::nullopt;
  RadixNode* victim = evictable_nodes_.at((*evictable_.begin())[3]);
  const int32_t block_id = victim->block_id;
  if (victim->host_block_id >= 0) {  // ready, so the backup is valid: keep the node on the host
    victim->tier = KvTier::kHost;
    victim->loaded_by_prefetch = false;  // evicted before any use: neither in time nor late
    ++num_host_tier_nodes_;
    set_device_block(victim, -1);
    announce(victim);
  } else {
    const std::vector<int32_t> removed = remove_subtree(victim);  // below it: host nodes only
    LOOM_CHECK(removed.size() == 1 && removed[0] == block_id);
  }
  return block_id;
}

std::optional<EvictionKey> RadixTree::first_evictable_key() const {
  if (evictable_.empty()) return std::nullopt;
  return *evictable_.begin();
}

std::vector<int32_t> RadixTree::remove_namespaces(const std::function<bool(const std::string&)>& matches) {
  // The tops of the subtrees to remove: matching nodes whose parent is kept (or a root).
  std::vector<RadixNode*> tops;
  std::vector<RadixNode*> stack;
  for (const auto& [name, top] : roots_) stack.push_back(top.get());
  while (!stack.empty()) {
    RadixNode* node = stack.back();
    stack.pop_back();
    for (auto& [key, child] : node->children) {
      if (matches(child->kv_namespace))
        tops.push_back(child.get());
      else
        stack.push_back(child.get());
    }
  }
  // Check everything before removing anything.
  for (RadixNode* top : tops) {
    stack.assign(1, top);
    while (!stack.empty()) {
      RadixNode* node = stack.back();
      stack.pop_back();
      LOOM_CHECK(node->state == KvNodeState::kReady && (node->block_id < 0 || pool_.ref_count(node->block_id) == 0));
      for (auto& [key, child] : node->children) stack.push_back(child.get());
    }
  }
  std::vector<int32_t> removed;
  for (RadixNode* top : tops) {
    std::vector<int32_t> ids = remove_subtree(top);
    removed.insert(removed.end(), ids.begin(), ids.end());
  }
  for (auto it = roots_.begin(); it != roots_.end();) {
    if (matches(it->first)) {
      LOOM_CHECK(it->second->children.empty());
      it = roots_.erase(it);
    } else {
      ++it;
    }
  }
  return removed;
}

std::string RadixTree::integrity_error() const {
  size_t num_reserved = 0, num_backup_droppable = 0;
  int32_t num_nodes = 0, num_device_nodes = 0, num_host_tier = 0, num_unreferenced = 0, num_evictable = 0,
          num_host_evictable = 0, num_marks = 0;
  std::map<std::string, int32_t> num_nodes_by_namespace, num_device_nodes_by_namespace;
  std::vector<const RadixNode*> stack;
  for (const auto& [name, top] : roots_) stack.push_back(top.get());
  while (!stack.empty()) {
    const RadixNode* node = stack.back();
    stack.pop_back();
    int32_t num_device_children = 0;
    for (const auto& [key, child] : node->children) {
      if (child->parent != node || child->tokens != key.second || child->kv_namespace != key.first ||
          (node->is_root() && child->kv_namespace != node->kv_namespace))
        return fmt::format("node {} is linked wrongly", child->node_id);
      if (child->block_id >= 0) ++num_device_children;
      stack.push_back(child.get());
    }
    if (num_device_children != node->num_device_children)
      return fmt::format("node {} has {} device-resident children, records {}", node->node_id, num_device_children,
                         node->num_device_children);
    if (node->is_root()) continue;
    ++num_nodes;
    ++num_nodes_by_namespace[node->kv_namespace];
    if (static_cast<int32_t>(node->tokens.size()) != block_size_)
      return fmt::format("node {} holds {} tokens, not a block", node->node_id, node->tokens.size());
    if (std::string error = tier_error(node); !error.empty()) return error;
    if (std::string error = event_error(node); !error.empty()) return error;
    if (node->tier == KvTier::kHost) ++num_host_tier;
    const int32_t id = node->block_id;
    const bool unreferenced = id >= 0 && pool_.ref_count(id) == 0;
    if (id >= 0) {
      ++num_device_nodes;
      ++num_device_nodes_by_namespace[node->kv_namespace];
      if (id >= pool_.num_total_blocks() || node_by_block_[static_cast<size_t>(id)] != node)
        return fmt::format("node {} has block {} that does not map back to it", node->node_id, id);
      if (pool_.is_free(id)) return fmt::format("block {} is both free and in the tree", id);
      if (unreferenced) ++num_unreferenced;
      if (!unreferenced && !node->parent->is_root() && pool_.ref_count(node->parent->block_id) == 0)
        return fmt::format("block {} is referenced but its parent block {} is not", id, node->parent->block_id);
    }
    const bool ready = node->state == KvNodeState::kReady;
    const bool evictable = unreferenced && ready && node->tier == KvTier::kDevice && node->num_device_children == 0;
    if (evictable != node->evictable_key.has_value())
      return fmt::format("node {} (block {}) has a stale evictable flag", node->node_id, id);
    if (evictable) ++num_evictable;
    const bool host_evictable = ready && node->tier == KvTier::kHost && node->children.empty() && !node->reserved;
    if (node->reserved != (reserved_nodes_.count(const_cast<RadixNode*>(node)) != 0))
      return fmt::format("node {} has a stale reserved flag", node->node_id);
    if (node->reserved) ++num_reserved;
    const bool backup_droppable =
        ready && node->tier == KvTier::kDevice && node->host_block_id >= 0 && !node->reserved;
    if (backup_droppable != node->backup_droppable_key.has_value() ||
        (backup_droppable && *node->backup_droppable_key != eviction_key_of(node)))
      return fmt::format("node {} (host block {}) has a stale backup flag", node->node_id, node->host_block_id);
    if (backup_droppable) ++num_backup_droppable;
    if (host_evictable != node->host_evictable_key.has_value())
      return fmt::format("node {} (host block {}) has a stale host-evictable flag", node->node_id, node->host_block_id);
    if (host_evictable) {
      ++num_host_evictable;
      const auto it = host_evictable_.find(*node->host_evictable_key);
      if (*node->host_evictable_key != eviction_key_of(node) || it == host_evictable_.end() || it->second != node)
        return fmt::format("node {} (host block {}) is host-evictable under a stale key", node->node_id,
                           node->host_block_id);
    }
    if (std::string error = priority_error(node); !error.empty()) return error;
    num_marks += static_cast<int32_t>(node->prefix_end_of_agents.size());
  }
  const auto num_marked_agents =
      std::count_if(agents_.begin(), agents_.end(), [](const auto& entry) { return entry.second.prefix_end != nullptr; });
  if (num_marks != num_marked_agents)
    return fmt::format("{} agent marks on nodes, {} agents marked", num_marks, num_marked_agents);
  if (num_nodes != num_nodes_) return fmt::format("{} nodes counted, {} recorded", num_nodes, num_nodes_);
  if (num_device_nodes != num_device_nodes_)
    return fmt::format("{} device-resident nodes counted, {} recorded", num_device_nodes, num_device_nodes_);
  if (num_host_tier != num_host_tier_nodes_)
    return fmt::format("{} host-tier nodes counted, {} recorded", num_host_tier, num_host_tier_nodes_);
  if (num_nodes_by_namespace != num_nodes_by_namespace_) return "nodes per namespace are miscounted";
  if (num_device_nodes_by_namespace != num_device_nodes_by_namespace_)
    return "device-resident nodes per namespace are miscounted";
  if (num_unreferenced != num_unreferenced_)
    return fmt::format("{} unreferenced nodes counted, {} recorded", num_unreferenced, num_unreferenced_);
  if (num_evictable != static_cast<int32_t>(evictable_.size()) ||
      evictable_.size() != evictable_nodes_.size())
    return fmt::format("{} evictable nodes counted, {} recorded", num_evictable, evictable_.size());
  if (num_backup_droppable != backup_droppable_.size())
    return fmt::format("{} droppable backups, {} recorded", num_backup_droppable, backup_droppable_.size());
  if (num_reserved != reserved_nodes_.size())
    return fmt::format("{} reserved nodes, {} recorded", num_reserved, reserved_nodes_.size());
  if (num_host_evictable != static_cast<int32_t>(host_evictable_.size()))
    return fmt::format("{} host-evictable nodes counted, {} recorded", num_host_evictable, host_evictable_.size());
  return {};
}

}  // namespace loom
