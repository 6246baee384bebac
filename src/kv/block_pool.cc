#include "kv/block_pool.h"

#include "util/error.h"

namespace loom {

BlockPool::BlockPool(int32_t num_blocks) : ref_counts_(static_cast<size_t>(num_blocks), 0) {
  LOOM_CHECK(num_blocks >= 0);
  for (int32_t id = 0; id < num_blocks; ++id) free_blocks_.insert(free_blocks_.end(), id);
}

std::optional<std::vector<int32_t>> BlockPool::take_free(int32_t count) {
  LOOM_CHECK(count >= 0);
  if (count > num_free_blocks()) return std::nullopt;
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(count));
  for (int32_t i = 0; i < count; ++i) {
    const int32_t id = *free_blocks_.begin();
    free_blocks_.erase(free_blocks_.begin());
    ref_counts_[static_cast<size_t>(id)] = 1;
    ids.push_back(id);
  }
  return ids;
}

void BlockPool::add_ref(int32_t block_id) {
  LOOM_CHECK(block_id >= 0 && block_id < num_total_blocks() && !is_free(block_id));
  ++ref_counts_[static_cast<size_t>(block_id)];
}

int32_t BlockPool::release_ref(int32_t block_id) {
  LOOM_CHECK(block_id >= 0 && block_id < num_total_blocks() && ref_count(block_id) > 0);
  return --ref_counts_[static_cast<size_t>(block_id)];
}

void BlockPool::put_free(int32_t block_id) {
  LOOM_CHECK(ref_count(block_id) == 0);
  const bool inserted = free_blocks_.insert(block_id).second;
  LOOM_CHECK(inserted);
}

}  // namespace loom
