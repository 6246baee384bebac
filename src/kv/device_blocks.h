// The device tier of one KvCacheManager: its block pool, the radix tree over
// it (which also records where each node's host copy is) and the LRU clock.
// The manager owns it; its tier planners (host_tier_planner.h,
// disk_tier_planner.h) act on it through a reference, so that a load can pin
// and evict device blocks and a disk read can join the tree, without the
// manager exposing those steps to anyone else.
//
// Invariant (radix_tree.h): a referenced node's ancestors are referenced, so
// pin() takes a path root first and unpin() releases it tail first.
//
// Thread: engine thread only.
#pragma once

#include <cstdint>
#include <span>

#include "kv/block_pool.h"
#include "kv/radix_tree.h"
#include "util/error.h"

namespace loom {

struct DeviceBlocks {
  DeviceBlocks(int32_t num_blocks, int32_t block_size) : pool(num_blocks), tree(pool, block_size) {}
  DeviceBlocks(const DeviceBlocks&) = delete;
  DeviceBlocks& operator=(const DeviceBlocks&) = delete;

  // The next LRU time.
  int64_t tick() { return ++clock; }
  // Free + cached blocks: what an allocation could have now.
  int32_t num_available_blocks() const { return pool.num_free_blocks() + tree.num_cached_blocks(); }
  // Evicts one cached block into the free list (a backed-up node moves to the
  // host); false when none is evictable.
  bool evict_one() {
    const std::optional<int32_t> evicted = tree.evict_one();
    if (!evicted) return false;
    pool.put_free(*evicted);
    ++num_evicted_blocks;
    return true;
  }
  // One reference on each block (root first), as a lease holds them.
  void pin(std::span<const int32_t> block_ids) {
    for (int32_t id : block_ids) {
      pool.add_ref(id);
      tree.on_ref_changed(id);
    }
  }
  // Drops the references pin() took (tail first); the blocks stay in the tree.
  void unpin(std::span<const int32_t> block_ids) {
    for (auto it = block_ids.rbegin(); it != block_ids.rend(); ++it) {
      LOOM_CHECK(tree.node_of_block(*it) != nullptr);
      pool.release_ref(*it);
      tree.on_ref_changed(*it);
    }
  }

  BlockPool pool;
  RadixTree tree;  // over `pool`
  int64_t clock = 0;
  int64_t num_evicted_blocks = 0;  // since start: moved to the host or dropped
};

}  // namespace loom
