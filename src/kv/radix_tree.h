// A radix tree of KV blocks keyed by (namespace, tokens), one block per edge.
//
// Each namespace (e.g. "base", or one isolated adapter's namespace) has its own
// root. A node below a root stands for one full block: the block_size tokens on
// its edge, whose K/V live in `block_id`, computed with every ancestor's tokens
// before them. A path root -> n1 -> n2 therefore caches tokens [0, 2*block_size).
//
//   root("base") ── [t0..t15]#4 ── [t16..t31]#7 ── [t32..t47]#2
//                                └─ [u16..u31]#9          (#k: block id)
//
// Edges are exactly one block long (prefix reuse is at block granularity, so
// there is nothing to gain from longer edges and splitting never happens).
// Every node records its tier (device / host / disk) and state (ready / loading
// / offloading); today only device + ready nodes exist, and match() only returns
// those. A second instance over its own BlockPool can serve as ForkKV's
// residual tree (DESIGN §1).
//
// Reference counts live in the BlockPool. Invariant (kept by KvCacheManager):
// a referenced node's ancestors are referenced too, because a request holds
// its whole block table from position 0. Hence every unreferenced node can be
// reclaimed by evicting leaves (LRU first).
//
// Thread: engine thread only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kv/block_pool.h"

namespace loom {

using KvTokenId = int32_t;

enum class KvTier : uint8_t { kDevice, kHost, kDisk };
enum class KvNodeState : uint8_t { kReady, kLoading, kOffloading };

struct RadixNode {
  RadixNode* parent = nullptr;            // nullptr for a namespace root
  std::string kv_namespace;
  std::vector<KvTokenId> tokens;          // block_size tokens; empty for a root
  int32_t block_id = -1;                  // -1 for a root
  KvTier tier = KvTier::kDevice;
  KvNodeState state = KvNodeState::kReady;
  int64_t last_access = 0;                // logical clock of the last use
  int64_t node_id = 0;                    // creation order, breaks LRU ties
  std::map<std::vector<KvTokenId>, std::unique_ptr<RadixNode>> children;

  bool is_root() const { return parent == nullptr; }
  // Set while the node sits in the evictable set (under this key).
  std::optional<std::pair<int64_t, int64_t>> evictable_key;
  bool counted_unreferenced = false;
};

class RadixTree {
 public:
  // `pool` must outlive the tree; it supplies the ref counts.
  RadixTree(BlockPool& pool, int32_t block_size);
  ~RadixTree();

  int32_t block_size() const { return block_size_; }

  // The longest chain of ready device nodes matching tokens block by block
  // (only whole blocks of `tokens` are looked at). Does not touch LRU times.
  std::vector<RadixNode*> match(const std::string& kv_namespace, std::span<const KvTokenId> tokens) const;

  // The child of `parent` (nullptr: the namespace root) for one block of tokens, or nullptr.
  RadixNode* find_child(const std::string& kv_namespace, RadixNode* parent,
                        std::span<const KvTokenId> block_tokens) const;
  // Adds a leaf for one block under `parent` (nullptr: the namespace root).
  // Precondition: no such child yet; block_id is referenced and in no tree.
  RadixNode* insert(const std::string& kv_namespace, RadixNode* parent, std::span<const KvTokenId> block_tokens,
                    int32_t block_id);

  RadixNode* node_of_block(int32_t block_id) const;
  // Re-evaluates a tree block after its ref count changed (no-op for other blocks).
  void on_ref_changed(int32_t block_id);
  // Sets last_access = now on the node of each block that is in the tree.
  void touch(std::span<const int32_t> block_ids, int64_t now);

  // Unreferenced nodes: their blocks are "cached" and reclaimable.
  int32_t num_cached_blocks() const { return num_unreferenced_; }
  int32_t num_nodes() const { return num_nodes_; }

  // Removes the least recently used unreferenced leaf (ties: oldest node) and
  // returns its block id, now in no tree (its ref count is 0; the caller frees
  // it). nullopt when nothing is evictable.
  std::optional<int32_t> evict_one();
  // Removes every node of the namespace (all must be unreferenced) and
  // returns their block ids.
  std::vector<int32_t> remove_namespace(const std::string& kv_namespace);

  // "" when the tree is consistent, else what is wrong.
  std::string integrity_error() const;

 private:
  RadixNode* root(const std::string& kv_namespace) const;
  void update(RadixNode* node);
  void detach(RadixNode* node);  // removes a leaf; updates its parent

  BlockPool& pool_;
  int32_t block_size_;
  int64_t next_node_id_ = 1;
  int32_t num_unreferenced_ = 0;
  int32_t num_nodes_ = 0;
  std::map<std::string, std::unique_ptr<RadixNode>> roots_;
  std::vector<RadixNode*> node_by_block_;  // indexed by block id; nullptr: not in this tree
  std::set<std::pair<int64_t, int64_t>> evictable_;  // (last_access, node_id)
  std::map<int64_t, RadixNode*> evictable_nodes_;    // node_id -> node
};

}  // namespace loom
