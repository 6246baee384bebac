// Host-tier block ids: the host-memory KV pool behind
// Backend::allocate_host_kv_cache, as bookkeeping only.
//
// A host block is either free or held by exactly one radix-tree node (its
// backup, or the copy being written by an offload). No reference counts: a
// node pins a host block by holding it, and transfers pin nodes (see
// kv/host_tier_planner.h). Free blocks are handed out lowest id first
// so that tests can name exact ids.
//
// Thread: engine thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <set>

#include "util/error.h"

namespace loom {

class HostBlockPool {
 public:
  explicit HostBlockPool(int32_t num_blocks) : num_total_blocks_(num_blocks) {
    LOOM_CHECK(num_blocks >= 0);
    for (int32_t id = 0; id < num_blocks; ++id) free_blocks_.insert(free_blocks_.end(), id);
  }

  int32_t num_total_blocks() const { return num_total_blocks_; }
  int32_t num_free_blocks() const { return static_cast<int32_t>(free_blocks_.size()); }
  int32_t num_used_blocks() const { return num_total_blocks_ - num_free_blocks(); }
  bool contains(int32_t block_id) const { return block_id >= 0 && block_id < num_total_blocks_; }
  bool is_free(int32_t block_id) const { return free_blocks_.count(block_id) != 0; }

  // The lowest free id, now used; nullopt when none is free.
  std::optional<int32_t> take_one() {
    if (free_blocks_.empty()) return std::nullopt;
    const int32_t id = *free_blocks_.begin();
    free_blocks_.erase(free_blocks_.begin());
    return id;
  }
  // Precondition: block_id is a used block of this pool.
  void put_free(int32_t block_id) {
    LOOM_CHECK(contains(block_id));
    const bool inserted = free_blocks_.insert(block_id).second;
    LOOM_CHECK(inserted);
  }

 private:
  int32_t num_total_blocks_;
  std::set<int32_t> free_blocks_;
};

}  // namespace loom
