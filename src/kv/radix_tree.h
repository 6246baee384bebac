// A radix tree of KV blocks keyed by (namespace, tokens), one block per edge.
//
// A node below a root stands for one full block: the block_size tokens on its
// edge, whose K/V live in `block_id`, computed with every ancestor's tokens
// before them. A path root -> n1 -> n2 therefore caches tokens [0, 2*block_size).
// A node's children are keyed by (namespace, block tokens), so a child may be
// of another namespace than its parent: that is how an activated (aLoRA)
// request's branch hangs under its last base block (kv/kv_key.h).
//
//   root("base") ── [t0..t15]#4 ── [t16..t31]#7 ── [t32..t47]#2
//                 │              ├─ [u16..u31]#9                 (#k: block id)
//                 │              └─ alora/X@37: [t32..t47]#5 ── alora/X@37: ...#6
//   root("lora/A") ── [t0..t15]#3
//
// The first block of a chain hangs under the root of its own namespace
// (KvKey::namespace_of_block(0)); block i > 0 under the node of block i - 1,
// looked up under namespace_of_block(i).
//
// Edges are exactly one block long (prefix reuse is at block granularity, so
// there is nothing to gain from longer edges and splitting never happens).
// Every node records its tier (device / host / disk) and state (ready / loading
// / offloading). Without a host pool (set_host_pool) only device + ready nodes
// exist. With one, the host-tier states of kv/host_tier_planner.h are
// kept here (radix_tree_host.cc); match() returns device-tier nodes only. A
// node is "device-resident" when it holds a device block (block_id >= 0):
// device-tier nodes and loading nodes. A second instance over its own
// BlockPool serves as ForkKV's residual tree (docs/design.md §1).
//
// Reference counts live in the BlockPool. Invariant (kept by KvCacheManager):
// a referenced node's ancestors are referenced too, because a request holds
// its whole block table from position 0 (and a transfer pins its whole path).
// Hence every unreferenced device block can be reclaimed by evicting
// "device leaves" (nodes with no device-resident child): LRU first, or under
// KvEvictionPolicy::kWorkflow dynamic suffixes first, then by agents'
// steps-to-execution (kv/eviction_priority.h; the agent marks live in
// radix_tree_agents.cc).
//
// Events: with an event sink (set_event_sink) the tree reports each node's
// tiers as they change (kv/kv_event_sink.h; radix_tree_events.cc): every
// method below that changes a node's tier or completes a copy tells the sink
// what the node gained or lost. Without a sink this costs one branch.
//
// Thread: engine thread only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kv/block_pool.h"
#include "kv/eviction_priority.h"
#include "kv/host_block_pool.h"
#include "kv/kv_block_hash.h"
#include "kv/kv_cache_id.h"
#include "kv/kv_event_sink.h"
#include "kv/kv_key.h"

namespace loom {

using KvTokenId = int32_t;

enum class KvTier : uint8_t { kDevice, kHost, kDisk };
enum class KvNodeState : uint8_t { kReady, kLoading, kOffloading };

// A child's key: (namespace, block tokens). Lookups compare a RadixChildView
// against it without copying (transparent comparator).
using RadixChildKey = std::pair<std::string, std::vector<KvTokenId>>;
struct RadixChildView {
  std::string_view kv_namespace;
  std::span<const KvTokenId> tokens;
};
struct RadixChildKeyLess {
  using is_transparent = void;
  static int compare(std::string_view ns_a, std::span<const KvTokenId> a, std::string_view ns_b,
                     std::span<const KvTokenId> b) {
    if (const int c = ns_a.compare(ns_b); c != 0) return c;
    if (std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end())) return -1;
    return std::lexicographical_compare(b.begin(), b.end(), a.begin(), a.end()) ? 1 : 0;
  }
  bool operator()(const RadixChildKey& a, const RadixChildKey& b) const {
    return compare(a.first, a.second, b.first, b.second) < 0;
  }
  bool operator()(const RadixChildKey& a, const RadixChildView& b) const {
    return compare(a.first, a.second, b.kv_namespace, b.tokens) < 0;
  }
  bool operator()(const RadixChildView& a, const RadixChildKey& b) const {
    return compare(a.kv_namespace, a.tokens, b.first, b.second) < 0;
  }
};

struct RadixNode {
  RadixNode* parent = nullptr;            // nullptr for a namespace root
  std::string kv_namespace;               // a root's: its namespace; else this block's
  std::vector<KvTokenId> tokens;          // block_size tokens; empty for a root
  int32_t block_id = -1;                  // -1 for a root, and for a host-tier node that is not loading
  int32_t host_block_id = -1;             // host tier: its backup (or the one being written); -1: none
  KvTier tier = KvTier::kDevice;          // kHost: K/V only in host_block_id (kv/host_tier_planner.h)
  KvNodeState state = KvNodeState::kReady;
  // A prefetch is loading or loaded it, and neither lock_prefix used it nor
  // count_late_prefetch found it still loading yet (metrics: "in time" / "late").
  bool loaded_by_prefetch = false;
  int64_t last_access = 0;                // logical clock of the last use
  int64_t node_id = 0;                    // creation order, breaks LRU ties
  // Content identity (kv/kv_block_hash.h) when the tree has a block hasher
  // (the disk tier's name for this block); zero otherwise.
  KvBlockHash content_hash;
  std::map<RadixChildKey, std::unique_ptr<RadixNode>, RadixChildKeyLess> children;

  // Smallest steps-to-execution of the agents whose fixed prefix passes
  // through this node; kDynamicNodeSteps when none does (eviction_priority.h).
  int32_t fixed_steps = kDynamicNodeSteps;
  // Agents whose marked fixed prefix ends at this node (usually 0 or 1).
  std::vector<std::string> prefix_end_of_agents;

  bool is_root() const { return parent == nullptr; }
  // Set while the node sits in the device-evictable set (under this key).
  std::optional<EvictionKey> evictable_key;
  // Set while the node sits in the host-evictable set (a host leaf).
  std::optional<EvictionKey> host_evictable_key;
  // Set while its backup may be dropped (device tier, ready, backed up, not reserved).
  std::optional<EvictionKey> backup_droppable_key;
  bool counted_unreferenced = false;
  // Held for a waiting request (RadixTree::set_reserved): a host-tier node is
  // then never host-evicted; a device one is device-evicted after every other.
  bool reserved = false;
  int32_t num_device_children = 0;  // children holding a device block (block_id >= 0)
  // What the event sink was last told this node holds (radix_tree_events.cc).
  bool announced_on_device = false;
  bool announced_on_host = false;
};

class RadixTree {
 public:
  // `pool` must outlive the tree; it supplies the ref counts.
  RadixTree(BlockPool& pool, int32_t block_size);
  ~RadixTree();

  int32_t block_size() const { return block_size_; }

  // Names every node inserted from now on: node->content_hash =
  // hasher(parent's content_hash (zero under a root), namespace, tokens).
  // Set before the first insert (checked).
  using BlockHasher =
      std::function<KvBlockHash(const KvBlockHash& parent, const std::string& kv_namespace, std::span<const KvTokenId>)>;
  void set_block_hasher(BlockHasher hasher);
  bool has_block_hasher() const { return static_cast<bool>(hasher_); }
  // The content hash a child of `parent` (nullptr or a root: the chain's
  // start) would get. Precondition: has_block_hasher().
  KvBlockHash child_hash(const RadixNode* parent, const std::string& kv_namespace,
                         std::span<const KvTokenId> block_tokens) const;
  // The same under a block of hash `parent` (zero: the chain's start), which
  // need not be in the tree (the disk tier looks past it).
  KvBlockHash child_hash(const KvBlockHash& parent, const std::string& kv_namespace,
                         std::span<const KvTokenId> block_tokens) const;

  // The longest chain of device-tier nodes (ready or offloading) matching
  // tokens block by block, block i under kv_key.namespace_of_block(i) (only
  // whole blocks of `tokens` are looked at). Does not touch LRU times.
  std::vector<RadixNode*> match(const KvKey& kv_key, std::span<const KvTokenId> tokens) const;
  // The same chain through nodes of every tier and state: [device ...]
  // [loading ...][host ...].
  std::vector<RadixNode*> match_any_tier(const KvKey& kv_key, std::span<const KvTokenId> tokens) const;

  // The child of `parent` (nullptr: the root of `kv_namespace`) keyed by
  // (kv_namespace, block_tokens), or nullptr.
  RadixNode* find_child(const std::string& kv_namespace, RadixNode* parent,
                        std::span<const KvTokenId> block_tokens) const;
  // Adds a leaf of `kv_namespace` for one block under `parent` (nullptr: the
  // root of `kv_namespace`, created if needed).
  // Precondition: no such child yet; block_id is referenced and in no tree.
  RadixNode* insert(const std::string& kv_namespace, RadixNode* parent, std::span<const KvTokenId> block_tokens,
                    int32_t block_id);

  RadixNode* node_of_block(int32_t block_id) const;
  // Re-evaluates a tree block after its ref count changed (no-op for other blocks).
  void on_ref_changed(int32_t block_id);
  // Sets last_access = now on the node of each block that is in the tree.
  void touch(std::span<const int32_t> block_ids, int64_t now);

  // Unreferenced device blocks of the tree: "cached" and reclaimable.
  int32_t num_cached_blocks() const { return num_unreferenced_; }
  int32_t num_nodes() const { return num_nodes_; }
  // Nodes per namespace (no zero entries), of every tier.
  const std::map<std::string, int32_t>& num_nodes_by_namespace() const { return num_nodes_by_namespace_; }
  // Device-resident nodes (block_id >= 0), in all and per namespace (no zero entries).
  int32_t num_device_nodes() const { return num_device_nodes_; }
  const std::map<std::string, int32_t>& num_device_nodes_by_namespace() const {
    return num_device_nodes_by_namespace_;
  }

  // Evicts the first device-evictable node in eviction order (kLru: least
  // recently used, ties: oldest node; kWorkflow: see eviction_priority.h):
  // unreferenced, device tier, ready, no device-resident child. Returns its
  // block id, now in no tree (its ref count is 0; the caller frees it). With a
  // valid backup the node stays, as a host node; without one it is removed
  // with the host nodes below it (their host blocks go back to the host pool).
  // nullopt when nothing is evictable.
  std::optional<int32_t> evict_one();
  // The key of the node evict_one() would take now; nullopt when none.
  std::optional<EvictionKey> first_evictable_key() const;
  // eviction_key(policy, ...) of a node now.
  EvictionKey eviction_key_of(const RadixNode* node) const;

  // ---- Host tier (radix_tree_host.cc; kv/host_tier_planner.h) ----
  // `host_pool` must outlive the tree; set before any node has a host block.
  void set_host_pool(HostBlockPool* host_pool);
  HostBlockPool* host_pool() const { return host_pool_; }
  // Nodes of the host tier (ready or loading).
  int32_t num_host_tier_nodes() const { return num_host_tier_nodes_; }
  // The key of the first host-evictable node (tier host, ready, no children),
  // and evicting it: the node is removed, its host block freed.
  std::optional<EvictionKey> first_host_evictable_key() const;
  bool evict_host_leaf();
  // Host-evictable nodes now (evicting one may make its parent one more).
  int32_t num_host_evictable_leaves() const { return static_cast<int32_t>(host_evictable_.size()); }
  // Device nodes whose backup could be dropped (tier device, ready, with a
  // host block, not reserved): the first one's key, and dropping its backup
  // (the node stays on the device without one; its host block is freed).
  std::optional<EvictionKey> first_backup_droppable_key() const;
  bool drop_first_backup();
  // State changes, each checked against the node's current state:
  // device ready without backup -> offloading into host_block_id.
  void begin_offload(RadixNode* node, int32_t host_block_id);
  // offloading -> ready; on failure the host block is freed (no backup).
  void end_offload(RadixNode* node, bool succeeded);
  // host ready -> loading into device_block_id (referenced, in no tree).
  void begin_load(RadixNode* node, int32_t device_block_id, bool by_prefetch);
  // loading -> device ready (the backup stays valid); last_access = now.
  void end_load(RadixNode* node, int64_t now);
  // Adds a host-tier ready leaf holding host_block_id (used, held by no node):
  // a block read back from the disk tier. Same preconditions on the key as
  // insert(); last_access = now.
  RadixNode* insert_host(const std::string& kv_namespace, RadixNode* parent, std::span<const KvTokenId> block_tokens,
                         int32_t host_block_id, int64_t now);
  // host ready -> device ready on device_block_id (referenced, in no tree),
  // which holds the same K/V (a request recomputed it); the backup stays.
  void adopt_device_block(RadixNode* node, int32_t device_block_id);
  // ---- Reservations (kv/disk_tier_planner.h "Reservations") ----
  // Marks `node` as held (or no longer held) for a waiting request; re-keys it.
  void set_reserved(RadixNode* node, bool reserved);
  // Unmarks every reserved node.
  void clear_reserved();
  // Reserved nodes now (a removed node leaves the set).
  const std::set<RadixNode*>& reserved_nodes() const { return reserved_nodes_; }
  // Removes `top` and everything below it; every device block there must be
  // unreferenced. Host blocks go back to the host pool; returns the device
  // block ids (the caller frees them).
  std::vector<int32_t> remove_subtree(RadixNode* top);
  // Visits every non-root node (parents before children). Checks and stats.
  void for_each_node(const std::function<void(const RadixNode&)>& visit) const;

  // ---- Workflow priorities (radix_tree_agents.cc) ----
  // kLru by default. Changing it re-keys the evictable set.
  void set_eviction_policy(KvEvictionPolicy policy);
  KvEvictionPolicy eviction_policy() const { return policy_; }
  // Marks `agent_key`'s fixed prefix as the path root -> `prefix_end`
  // (nullptr: none of it is in the tree), replacing an earlier mark. An agent
  // not seen before starts with kFarAgentSteps. When the end node is removed
  // (evicted or dropped), the mark moves to its parent, so the rest of the
  // prefix keeps the agent's value; at a root it becomes nullptr.
  void set_agent_prefix_end(const std::string& agent_key, RadixNode* prefix_end);
  // Sets an agent's steps (>= 0; kFarAgentSteps = far), declaring it if new.
  void set_agent_steps(const std::string& agent_key, int32_t steps);
  // Forgets matching agents; their nodes become dynamic unless another agent covers them.
  void forget_agents(const std::function<bool(const std::string&)>& matches);
  int32_t num_agents() const { return static_cast<int32_t>(agents_.size()); }
  // Where an agent's marked prefix ends now (nullptr: unknown agent or none).
  // The mark stays on a node that moved to the host tier.
  const RadixNode* agent_prefix_end(const std::string& agent_key) const;
  RadixNode* agent_prefix_end(const std::string& agent_key);
  // Every cached (unreferenced) block, in the order repeated evict_one() calls
  // would take them if nothing else changed: the evictable leaves by key, a
  // parent joining once its last child is gone. Tests and debugging; O(n log n).
  std::vector<int32_t> eviction_order() const;
  // Removes every node whose namespace `matches`, with all its descendants
  // (whatever their namespace), and the roots of matching namespaces. Returns
  // the removed device block ids; host blocks go back to the host pool.
  // Precondition: every removed node is unreferenced and ready (checked
  // before anything is removed).
  std::vector<int32_t> remove_namespaces(const std::function<bool(const std::string&)>& matches);
  std::vector<int32_t> remove_namespace(const std::string& kv_namespace) {
    return remove_namespaces([&](const std::string& ns) { return ns == kv_namespace; });
  }

  // ---- Events (radix_tree_events.cc; kv/kv_event_sink.h) ----
  // Reports every block entering or leaving a tier to `sink` (nullptr: none;
  // it must outlive the tree), as member `cache`. Precondition: a block hasher
  // (events name blocks by content hash) and no node yet (checked).
  void set_event_sink(KvEventSink* sink, KvCacheId cache);
  // Tells the sink (if any) that `node`'s block is stored on the disk tier, or
  // that block `hash` left it (disk blocks outlive nodes: the caller keeps
  // track of what was announced).
  void announce_on_disk(const RadixNode* node);
  bool has_event_sink() const { return sink_ != nullptr; }
  void announce_disk_removal(const KvBlockHash& hash);
  KvEventSink* event_sink() const { return sink_; }

  // "" when the tree is consistent, else what is wrong.
  std::string integrity_error() const;

 private:
  RadixNode* root(const std::string& kv_namespace) const;
  // The new child of `parent` (nullptr: kv_namespace's root, made if needed),
  // counted, not yet given a block.
  RadixNode* add_child(const std::string& kv_namespace, RadixNode* parent, std::span<const KvTokenId> block_tokens);
  void update(RadixNode* node);
  void leave_evictable_sets(RadixNode* node);
  // Gives `node` device block `block_id` (-1: none), keeping node_by_block_,
  // the device-node counts and the parent's num_device_children in step.
  void set_device_block(RadixNode* node, int32_t block_id);
  void detach(RadixNode* node);  // removes a leaf; frees its host block; updates its parent
  // "" when `node`'s tier, state and block ids fit together.
  std::string tier_error(const RadixNode* node) const;
  // fixed_steps of `node` from its marks and its children (not stored).
  int32_t derived_fixed_steps(const RadixNode* node) const;
  // Re-derives fixed_steps from `node` up to its root, as far as values change.
  void propagate_fixed_steps(RadixNode* node);
  // Moves the marks of `node` (about to be removed) to its parent.
  void hand_marks_to_parent(RadixNode* node);
  // "" when `node`'s priority, marks and evictable key are consistent.
  std::string priority_error(const RadixNode* node) const;
  // Tells the sink (if any) the tiers `node` entered or left since it was last announced.
  void announce(RadixNode* node);
  // `node` is being removed: the sink hears it left every tier it was announced on.
  void announce_removal(RadixNode* node);
  // "" when the sink was told what `node` holds now (or there is no sink).
  std::string event_error(const RadixNode* node) const;

  struct AgentMark {
    RadixNode* prefix_end = nullptr;
    int32_t steps = kFarAgentSteps;
  };

  BlockPool& pool_;
  int32_t block_size_;
  int64_t next_node_id_ = 1;
  int32_t num_unreferenced_ = 0;
  int32_t num_nodes_ = 0;
  int32_t num_device_nodes_ = 0;
  int32_t num_host_tier_nodes_ = 0;
  std::map<std::string, std::unique_ptr<RadixNode>, std::less<>> roots_;
  std::map<std::string, int32_t> num_nodes_by_namespace_;
  std::map<std::string, int32_t> num_device_nodes_by_namespace_;
  std::vector<RadixNode*> node_by_block_;  // indexed by block id; nullptr: not in this tree
  KvEvictionPolicy policy_ = KvEvictionPolicy::kLru;
  std::set<EvictionKey> evictable_;                // eviction_key(policy_, ...) of each evictable leaf
  std::map<int64_t, RadixNode*> evictable_nodes_;  // node_id -> node
  std::map<EvictionKey, RadixNode*> host_evictable_;  // host leaves by key
  std::map<EvictionKey, RadixNode*> backup_droppable_;  // backed-up device nodes by key
  HostBlockPool* host_pool_ = nullptr;
  std::set<RadixNode*> reserved_nodes_;
  std::map<std::string, AgentMark, std::less<>> agents_;
  BlockHasher hasher_;
  KvEventSink* sink_ = nullptr;
  KvCacheId sink_cache_ = KvCacheId::kMain;
};

}  // namespace loom
