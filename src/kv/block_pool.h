// Reference-counted KV block ids over the backend's KV pool.
//
// A block id names block_size KV slots in every layer of the backend (see
// backend/backend.h). The pool only does bookkeeping on the host:
//
//   free      ref_count == 0, not in any tree      -> can be handed out
//   cached    ref_count == 0, held by a radix tree -> reusable, evictable
//   in use    ref_count  > 0 (held by >= 1 running request's KvLease)
//
//   free + cached + in use == total   (KvCacheManager::integrity_error checks it)
//
// Free blocks are handed out lowest id first so that tests can name exact ids.
// Thread: engine thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <vector>

namespace loom {

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);

  int32_t num_total_blocks() const { return static_cast<int32_t>(ref_counts_.size()); }
  int32_t num_free_blocks() const { return static_cast<int32_t>(free_blocks_.size()); }
  bool is_free(int32_t block_id) const { return free_blocks_.count(block_id) != 0; }
  int32_t ref_count(int32_t block_id) const { return ref_counts_[static_cast<size_t>(block_id)]; }

  // Takes `count` free blocks (lowest ids first), each with ref_count 1.
  // Returns nullopt, taking nothing, when fewer than `count` are free.
  std::optional<std::vector<int32_t>> take_free(int32_t count);
  void add_ref(int32_t block_id);
  // Returns the new ref count; the caller decides whether a block at 0 goes back
  // to the free list (put_free) or stays cached in a tree.
  int32_t release_ref(int32_t block_id);
  // Precondition: ref_count == 0 and not already free.
  void put_free(int32_t block_id);

 private:
  std::vector<int32_t> ref_counts_;
  std::set<int32_t> free_blocks_;
};

}  // namespace loom
