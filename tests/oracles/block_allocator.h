// A plain free-list allocator of KV block ids: a test oracle (tests/oracles) for the
// offline Generator and benchmarks; the serving engine uses kv/KvCacheManager.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace loom {

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_blocks);

  int32_t num_free_blocks() const { return static_cast<int32_t>(free_blocks_.size()); }
  int32_t num_total_blocks() const { return num_total_blocks_; }
  bool can_allocate(int32_t count) const { return count <= num_free_blocks(); }
  // Lowest ids first. Returns nullopt (allocating nothing) when there is no room.
  std::optional<std::vector<int32_t>> allocate(int32_t count);
  // Each id must be currently allocated (checked).
  void free(const std::vector<int32_t>& block_ids);

 private:
  int32_t num_total_blocks_;
  std::vector<int32_t> free_blocks_;  // kept sorted descending: back() is the lowest id
  std::vector<bool> allocated_;
};

}  // namespace loom
