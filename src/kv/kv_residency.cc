#include "kv/kv_residency.h"

namespace loom {

void KvResidency::block_stored(const KvStoredBlock& block) {
  if (block.medium != KvMedium::kDisk) {
    std::lock_guard lock(mutex_);
    media_[block.hash] |= bit(block.cache, block.medium);
  }
  if (next_ != nullptr) next_->block_stored(block);
}

void KvResidency::block_removed(KvCacheId cache, KvMedium medium, const KvBlockHash& hash) {
  if (medium != KvMedium::kDisk) {
    std::lock_guard lock(mutex_);
    if (auto it = media_.find(hash); it != media_.end()) {
      it->second &= static_cast<uint8_t>(~bit(cache, medium));
      if (it->second == 0) media_.erase(it);
    }
  }
  if (next_ != nullptr) next_->block_removed(cache, medium, hash);
}

void KvResidency::all_blocks_cleared() {
  {
    std::lock_guard lock(mutex_);
    media_.clear();
  }
  if (next_ != nullptr) next_->all_blocks_cleared();
}

bool KvResidency::holds(const KvBlockHash& hash) const {
  std::lock_guard lock(mutex_);
  return media_.count(hash) != 0;
}

int64_t KvResidency::num_blocks() const {
  std::lock_guard lock(mutex_);
  return static_cast<int64_t>(media_.size());
}

}  // namespace loom
