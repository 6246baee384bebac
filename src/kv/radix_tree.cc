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
  std::vector<RadixNode*> path;
  RadixNode* node = root(kv_key.namespace_of_block(0));
  if (node == nullptr) return path;
  const size_t block = static_cast<size_t>(block_size_);
  for (size_t start = 0; start + block <= tokens.size(); start += block) {
    const int32_t block_index = static_cast<int32_t>(start / block);
    auto it = node->children.find(RadixChildView{kv_key.namespace_of_block(block_index), tokens.subspan(start, block)});
    if (it == node->children.end()) break;
    node = it->second.get();
    if (node->tier != KvTier::kDevice || node->state != KvNodeState::kReady) break;
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
  LOOM_CHECK(static_cast<int32_t>(block_tokens.size()) == block_size_);
  LOOM_CHECK(block_id >= 0 && block_id < pool_.num_total_blocks() && node_by_block_[static_cast<size_t>(block_id)] == nullptr);
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
  node->block_id = block_id;
  node->node_id = next_node_id_++;
  node->last_access = parent->last_access;
  RadixNode* raw = node.get();
  parent->children.emplace(std::move(key), std::move(node));
  node_by_block_[static_cast<size_t>(block_id)] = raw;
  ++num_nodes_;
  ++num_nodes_by_namespace_[kv_namespace];
  update(raw);
  if (!parent->is_root()) update(parent);  // no longer a leaf
  return raw;
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

// Keeps the unreferenced count and the evictable set in step with the node.
void RadixTree::update(RadixNode* node) {
  const bool unreferenced = pool_.ref_count(node->block_id) == 0;
  if (unreferenced != node->counted_unreferenced) {
    num_unreferenced_ += unreferenced ? 1 : -1;
    node->counted_unreferenced = unreferenced;
  }
  if (node->evictable_key) {
    evictable_.erase(*node->evictable_key);
    evictable_nodes_.erase(node->node_id);
    node->evictable_key.reset();
  }
  const bool evictable = unreferenced && node->children.empty() && node->state == KvNodeState::kReady &&
                         node->tier == KvTier::kDevice;
  if (evictable) {
    node->evictable_key = eviction_key(policy_, node->fixed_steps, node->last_access, node->node_id);
    evictable_.insert(*node->evictable_key);
    evictable_nodes_[node->node_id] = node;
  }
}

void RadixTree::detach(RadixNode* node) {
  LOOM_CHECK(!node->is_root() && node->children.empty());
  if (node->evictable_key) {
    evictable_.erase(*node->evictable_key);
    evictable_nodes_.erase(node->node_id);
  }
  if (node->counted_unreferenced) --num_unreferenced_;
  hand_marks_to_parent(node);
  node_by_block_[static_cast<size_t>(node->block_id)] = nullptr;
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
  detach(victim);
  return block_id;
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
  // Post-order over each subtree: leaves go first, so every detach() removes a leaf.
  std::vector<int32_t> removed;
  std::vector<RadixNode*> order;
  for (RadixNode* top : tops) {
    std::vector<std::pair<RadixNode*, bool>> walk{{top, false}};
    while (!walk.empty()) {
      auto [node, expanded] = walk.back();
      walk.pop_back();
      if (!expanded) {
        walk.push_back({node, true});
        for (auto& [key, child] : node->children) walk.push_back({child.get(), false});
      } else {
        LOOM_CHECK(pool_.ref_count(node->block_id) == 0);
        order.push_back(node);
      }
    }
  }
  for (RadixNode* node : order) {
    removed.push_back(node->block_id);
    detach(node);
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
  int32_t num_nodes = 0, num_unreferenced = 0, num_evictable = 0, num_marks = 0;
  std::map<std::string, int32_t> num_nodes_by_namespace;
  std::vector<const RadixNode*> stack;
  for (const auto& [name, top] : roots_) stack.push_back(top.get());
  while (!stack.empty()) {
    const RadixNode* node = stack.back();
    stack.pop_back();
    for (const auto& [key, child] : node->children) {
      if (child->parent != node || child->tokens != key.second || child->kv_namespace != key.first ||
          (node->is_root() && child->kv_namespace != node->kv_namespace))
        return fmt::format("node {} is linked wrongly", child->node_id);
      stack.push_back(child.get());
    }
    if (node->is_root()) continue;
    ++num_nodes;
    ++num_nodes_by_namespace[node->kv_namespace];
    const int32_t id = node->block_id;
    if (id < 0 || id >= pool_.num_total_blocks() || node_by_block_[static_cast<size_t>(id)] != node)
      return fmt::format("node {} has block {} that does not map back to it", node->node_id, id);
    if (pool_.is_free(id)) return fmt::format("block {} is both free and in the tree", id);
    if (static_cast<int32_t>(node->tokens.size()) != block_size_)
      return fmt::format("node {} holds {} tokens, not a block", node->node_id, node->tokens.size());
    const bool unreferenced = pool_.ref_count(id) == 0;
    if (unreferenced) ++num_unreferenced;
    if (!unreferenced && !node->parent->is_root() && pool_.ref_count(node->parent->block_id) == 0)
      return fmt::format("block {} is referenced but its parent block {} is not", id, node->parent->block_id);
    const bool evictable = unreferenced && node->children.empty();
    if (evictable != node->evictable_key.has_value())
      return fmt::format("node {} (block {}) has a stale evictable flag", node->node_id, id);
    if (evictable) ++num_evictable;
    if (std::string error = priority_error(node); !error.empty()) return error;
    num_marks += static_cast<int32_t>(node->prefix_end_of_agents.size());
  }
  const auto num_marked_agents =
      std::count_if(agents_.begin(), agents_.end(), [](const auto& entry) { return entry.second.prefix_end != nullptr; });
  if (num_marks != num_marked_agents)
    return fmt::format("{} agent marks on nodes, {} agents marked", num_marks, num_marked_agents);
  if (num_nodes != num_nodes_) return fmt::format("{} nodes counted, {} recorded", num_nodes, num_nodes_);
  if (num_nodes_by_namespace != num_nodes_by_namespace_) return "nodes per namespace are miscounted";
  if (num_unreferenced != num_unreferenced_)
    return fmt::format("{} unreferenced nodes counted, {} recorded", num_unreferenced, num_unreferenced_);
  if (num_evictable != static_cast<int32_t>(evictable_.size()) ||
      evictable_.size() != evictable_nodes_.size())
    return fmt::format("{} evictable nodes counted, {} recorded", num_evictable, evictable_.size());
  return {};
}

}  // namespace loom
