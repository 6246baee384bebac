// RadixTree: host-tier node states (kv/host_tier_planner.h): host
// leaves and their eviction, the offload / load state changes, and subtree
// removal. The manager plans transfers and pins paths; the tree only keeps
// each node's tier, state, blocks and evictable sets consistent.
#include <fmt/format.h>

#include "kv/radix_tree.h"
#include "util/error.h"

namespace loom {

void RadixTree::set_host_pool(HostBlockPool* host_pool) {
  LOOM_CHECK(host_pool_ == nullptr && num_host_tier_nodes_ == 0);
  host_pool_ = host_pool;
}

std::optional<EvictionKey> RadixTree::first_host_evictable_key() const {
  if (host_evictable_.empty()) return std::nullopt;
  return host_evictable_.begin()->first;
}

bool RadixTree::evict_host_leaf() {
  if (host_evictable_.empty()) return false;
  detach(host_evictable_.begin()->second);
  return true;
}

std::optional<EvictionKey> RadixTree::first_backup_droppable_key() const {
  if (backup_droppable_.empty()) return std::nullopt;
  return backup_droppable_.begin()->first;
}

bool RadixTree::drop_first_backup() {
  if (backup_droppable_.empty()) return false;
  RadixNode* node = backup_droppable_.begin()->second;
  host_pool_->put_free(node->host_block_id);
  node->host_block_id = -1;
  update(node);
  announce(node);
  return true;
}

void RadixTree::begin_offload(RadixNode* node, int32_t host_block_id) {
  LOOM_CHECK(host_pool_ != nullptr && node->tier == KvTier::kDevice && node->state == KvNodeState::kReady &&
             node->host_block_id < 0 && host_pool_->contains(host_block_id) && !host_pool_->is_free(host_block_id));
  node->host_block_id = host_block_id;
  node->state = KvNodeState::kOffloading;
  update(node);
}

void RadixTree::end_offload(RadixNode* node, bool succeeded) {
  LOOM_CHECK(node->tier == KvTier::kDevice && node->state == KvNodeState::kOffloading);
  node->state = KvNodeState::kReady;
  if (!succeeded) {
    host_pool_->put_free(node->host_block_id);
    node->host_block_id = -1;
  }
  update(node);
  announce(node);
}

void RadixTree::begin_load(RadixNode* node, int32_t device_block_id, bool by_prefetch) {
  LOOM_CHECK(node->tier == KvTier::kHost && node->state == KvNodeState::kReady && node->block_id < 0 &&
             node->host_block_id >= 0);
  LOOM_CHECK(node->parent->is_root() || node->parent->block_id >= 0);  // loads go top down
  LOOM_CHECK(device_block_id >= 0 && pool_.ref_count(device_block_id) > 0);
  node->state = KvNodeState::kLoading;
  node->loaded_by_prefetch = by_prefetch;
  set_device_block(node, device_block_id);
}

void RadixTree::end_load(RadixNode* node, int64_t now) {
  LOOM_CHECK(node->tier == KvTier::kHost && node->state == KvNodeState::kLoading && node->block_id >= 0);
  node->tier = KvTier::kDevice;
  node->state = KvNodeState::kReady;
  --num_host_tier_nodes_;
  node->last_access = now;
  update(node);
  announce(node);
}

RadixNode* RadixTree::insert_host(const std::string& kv_namespace, RadixNode* parent,
                                  std::span<const KvTokenId> block_tokens, int32_t host_block_id, int64_t now) {
  LOOM_CHECK(host_pool_ != nullptr && host_pool_->contains(host_block_id) && !host_pool_->is_free(host_block_id));
  RadixNode* node = add_child(kv_namespace, parent, block_tokens);
  node->tier = KvTier::kHost;
  node->host_block_id = host_block_id;
  node->last_access = now;
  ++num_host_tier_nodes_;
  update(node);
  if (!node->parent->is_root()) update(node->parent);  // no longer a leaf
  announce(node);
  return node;
}

void RadixTree::adopt_device_block(RadixNode* node, int32_t device_block_id) {
  LOOM_CHECK(node->tier == KvTier::kHost && node->state == KvNodeState::kReady && node->block_id < 0);
  LOOM_CHECK(node->parent->is_root() || node->parent->tier == KvTier::kDevice);
  LOOM_CHECK(device_block_id >= 0 && pool_.ref_count(device_block_id) > 0);
  node->tier = KvTier::kDevice;
  --num_host_tier_nodes_;
  set_device_block(node, device_block_id);
  announce(node);
}

void RadixTree::set_reserved(RadixNode* node, bool reserved) {
  LOOM_CHECK(!node->is_root());
  if (node->reserved == reserved) return;
  node->reserved = reserved;
  if (reserved) reserved_nodes_.insert(node);
  else reserved_nodes_.erase(node);
  update(node);
}

void RadixTree::clear_reserved() {
  const std::set<RadixNode*> nodes = std::move(reserved_nodes_);
  reserved_nodes_.clear();
  for (RadixNode* node : nodes) {
    node->reserved = false;
    update(node);
  }
}

std::vector<int32_t> RadixTree::remove_subtree(RadixNode* top) {
  LOOM_CHECK(!top->is_root());
  // Post-order: leaves go first, so every detach() removes a leaf.
  std::vector<RadixNode*> order;
  std::vector<std::pair<RadixNode*, bool>> walk{{top, false}};
  while (!walk.empty()) {
    auto [node, expanded] = walk.back();
    walk.pop_back();
    if (!expanded) {
      walk.push_back({node, true});
      for (auto& [key, child] : node->children) walk.push_back({child.get(), false});
    } else {
      LOOM_CHECK(node->block_id < 0 || pool_.ref_count(node->block_id) == 0);
      order.push_back(node);
    }
  }
  std::vector<int32_t> removed;
  for (RadixNode* node : order) {
    if (node->block_id >= 0) removed.push_back(node->block_id);
    detach(node);
  }
  return removed;
}

void RadixTree::for_each_node(const std::function<void(const RadixNode&)>& visit) const {
  std::vector<const RadixNode*> stack;
  for (const auto& [name, top] : roots_) stack.push_back(top.get());
  while (!stack.empty()) {
    const RadixNode* node = stack.back();
    stack.pop_back();
    if (!node->is_root()) visit(*node);
    for (const auto& [key, child] : node->children) stack.push_back(child.get());
  }
}

// The table of kv/host_tier_planner.h, and the path order
// [device ...][loading ...][host ...].
std::string RadixTree::tier_error(const RadixNode* node) const {
  const bool has_host_block = node->host_block_id >= 0;
  if (has_host_block && (host_pool_ == nullptr || !host_pool_->contains(node->host_block_id) ||
                         host_pool_->is_free(node->host_block_id)))
    return fmt::format("node {} holds host block {}, which is free or not in the host pool", node->node_id,
                       node->host_block_id);
  const RadixNode* parent = node->parent;
  const char* wrong = nullptr;
  if (node->tier == KvTier::kDevice) {
    if (node->block_id < 0) wrong = "a device node without a device block";
    else if (node->state == KvNodeState::kLoading) wrong = "a loading device node";
    else if (node->state == KvNodeState::kOffloading && !has_host_block) wrong = "an offload without a host block";
    else if (!parent->is_root() && parent->tier != KvTier::kDevice) wrong = "a device node under a host node";
  } else if (node->tier == KvTier::kHost) {
    if (!has_host_block) wrong = "a host node without a host block";
    else if (node->state == KvNodeState::kOffloading) wrong = "an offloading host node";
    else if ((node->state == KvNodeState::kLoading) != (node->block_id >= 0))
      wrong = "a host node whose device block does not match its loading state";
    else if (node->state == KvNodeState::kLoading && !parent->is_root() && parent->block_id < 0)
      wrong = "a loading node under a host node";
  } else {
    wrong = "a disk node";
  }
  if (wrong == nullptr) return {};
  return fmt::format("node {} (block {}, host block {}) is {}", node->node_id, node->block_id, node->host_block_id,
                     wrong);
}

}  // namespace loom
