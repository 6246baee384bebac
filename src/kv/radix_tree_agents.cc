// RadixTree: agents' fixed-prefix marks and the fixed_steps they give nodes
// (workflow-aware eviction, kv/eviction_priority.h).
#include <fmt/format.h>

#include <algorithm>
#include <queue>

#include "kv/radix_tree.h"
#include "util/error.h"

namespace loom {

void RadixTree::set_eviction_policy(KvEvictionPolicy policy) {
  if (policy == policy_) return;
  policy_ = policy;
  std::vector<RadixNode*> nodes;
  for (const auto& [node_id, node] : evictable_nodes_) nodes.push_back(node);
  for (const auto& [key, node] : host_evictable_) nodes.push_back(node);
  for (RadixNode* node : nodes) update(node);
}

int32_t RadixTree::derived_fixed_steps(const RadixNode* node) const {
  int32_t steps = kDynamicNodeSteps;
  for (const std::string& agent_key : node->prefix_end_of_agents)
    steps = combine_fixed_steps(steps, agents_.find(agent_key)->second.steps);
  for (const auto& [key, child] : node->children) steps = combine_fixed_steps(steps, child->fixed_steps);
  return steps;
}

void RadixTree::propagate_fixed_steps(RadixNode* node) {
  for (; node != nullptr && !node->is_root(); node = node->parent) {
    const int32_t steps = derived_fixed_steps(node);
    if (steps == node->fixed_steps) return;  // ancestors depend on nothing else that changed
    node->fixed_steps = steps;
    update(node);
  }
}

// The parent's value already includes the marks' steps (min over children), so
// moving them up changes no priority: evicting an agent's last block keeps the
// rest of its prefix as valuable as before.
void RadixTree::hand_marks_to_parent(RadixNode* node) {
  if (node->prefix_end_of_agents.empty()) return;
  RadixNode* parent = node->parent->is_root() ? nullptr : node->parent;
  for (std::string& agent_key : node->prefix_end_of_agents) {
    agents_.find(agent_key)->second.prefix_end = parent;
    if (parent != nullptr) parent->prefix_end_of_agents.push_back(std::move(agent_key));
  }
  node->prefix_end_of_agents.clear();
}

void RadixTree::set_agent_prefix_end(const std::string& agent_key, RadixNode* prefix_end) {
  LOOM_CHECK(prefix_end == nullptr ||
             (!prefix_end->is_root() && (prefix_end->block_id < 0 || node_of_block(prefix_end->block_id) == prefix_end)));
  auto it = agents_.try_emplace(agent_key).first;
  RadixNode* old_end = it->second.prefix_end;
  if (old_end == prefix_end) return;
  if (old_end != nullptr) {
    auto& marks = old_end->prefix_end_of_agents;
    marks.erase(std::find(marks.begin(), marks.end(), agent_key));
  }
  it->second.prefix_end = prefix_end;
  if (prefix_end != nullptr) prefix_end->prefix_end_of_agents.push_back(agent_key);
  propagate_fixed_steps(old_end);
  propagate_fixed_steps(prefix_end);
}

void RadixTree::set_agent_steps(const std::string& agent_key, int32_t steps) {
  LOOM_CHECK(steps >= 0);
  AgentMark& mark = agents_.try_emplace(agent_key).first->second;
  if (mark.steps == steps) return;
  mark.steps = steps;
  propagate_fixed_steps(mark.prefix_end);
}

void RadixTree::forget_agents(const std::function<bool(const std::string&)>& matches) {
  std::vector<RadixNode*> touched;
  for (auto it = agents_.begin(); it != agents_.end();) {
    if (!matches(it->first)) {
      ++it;
      continue;
    }
    if (RadixNode* end = it->second.prefix_end) {
      auto& marks = end->prefix_end_of_agents;
      marks.erase(std::find(marks.begin(), marks.end(), it->first));
      touched.push_back(end);
    }
    it = agents_.erase(it);
  }
  for (RadixNode* node : touched) propagate_fixed_steps(node);
}

const RadixNode* RadixTree::agent_prefix_end(const std::string& agent_key) const {
  const auto it = agents_.find(agent_key);
  return it == agents_.end() ? nullptr : it->second.prefix_end;
}

RadixNode* RadixTree::agent_prefix_end(const std::string& agent_key) {
  const auto it = agents_.find(agent_key);
  return it == agents_.end() ? nullptr : it->second.prefix_end;
}

std::vector<int32_t> RadixTree::eviction_order() const {
  // A parent's key does not change when its children go (its marks come up
  // with the same min), so this replays evict_one() without touching the tree.
  // A parent joins once its last device-resident child is gone (host children
  // do not hold it back).
  using Entry = std::pair<EvictionKey, const RadixNode*>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> queue;
  std::map<const RadixNode*, size_t> num_children_left;
  for (const auto& [node_id, node] : evictable_nodes_) queue.emplace(*node->evictable_key, node);
  std::vector<int32_t> order;
  while (!queue.empty()) {
    const RadixNode* node = queue.top().second;
    queue.pop();
    order.push_back(node->block_id);
    const RadixNode* parent = node->parent;
    if (parent->is_root() || pool_.ref_count(parent->block_id) != 0 || parent->state != KvNodeState::kReady ||
        parent->tier != KvTier::kDevice)
      continue;
    auto [it, inserted] = num_children_left.try_emplace(parent, parent->num_device_children);
    if (--it->second == 0) queue.emplace(eviction_key_of(parent), parent);
  }
  return order;
}

std::string RadixTree::priority_error(const RadixNode* node) const {
  if (node->fixed_steps != derived_fixed_steps(node))
    return fmt::format("node {} (block {}) has fixed_steps {}, its marks and children give {}", node->node_id,
                       node->block_id, node->fixed_steps, derived_fixed_steps(node));
  for (const std::string& agent_key : node->prefix_end_of_agents) {
    const auto it = agents_.find(agent_key);
    if (it == agents_.end() || it->second.prefix_end != node)
      return fmt::format("node {} marks agent \"{}\", which does not point back to it", node->node_id, agent_key);
  }
  if (node->evictable_key) {
    if (*node->evictable_key != eviction_key_of(node))
      return fmt::format("node {} (block {}) is evictable under a stale priority", node->node_id, node->block_id);
    const auto it = evictable_nodes_.find(node->node_id);
    if (evictable_.count(*node->evictable_key) == 0 || it == evictable_nodes_.end() || it->second != node)
      return fmt::format("node {} (block {}) is missing from the evictable set", node->node_id, node->block_id);
  }
  return {};
}

}  // namespace loom
