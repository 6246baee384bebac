#include "oracles/block_allocator.h"

#include <algorithm>
#include <functional>

#include "util/error.h"

namespace loom {

BlockAllocator::BlockAllocator(int32_t num_blocks)
    : num_total_blocks_(num_blocks), allocated_(static_cast<size_t>(num_blocks), false) {
  free_blocks_.reserve(static_cast<size_t>(num_blocks));
  for (int32_t id = num_blocks - 1; id >= 0; --id) free_blocks_.push_back(id);
}

std::optional<std::vector<int32_t>> BlockAllocator::allocate(int32_t count) {
  if (!can_allocate(count)) return std::nullopt;
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(count));
  for (int32_t i = 0; i < count; ++i) {
    ids.push_back(free_blocks_.back());
    free_blocks_.pop_back();
    allocated_[static_cast<size_t>(ids.back())] = true;
  }
  return ids;
}

void BlockAllocator::free(const std::vector<int32_t>& block_ids) {
  for (int32_t id : block_ids) {
    LOOM_CHECK(id >= 0 && id < num_total_blocks_ && allocated_[static_cast<size_t>(id)]);
    allocated_[static_cast<size_t>(id)] = false;
    free_blocks_.push_back(id);
  }
  // Keep lowest-first order so allocation is deterministic.
  std::sort(free_blocks_.begin(), free_blocks_.end(), std::greater<int32_t>());
}

}  // namespace loom
