#include "kvtransfer/device/device_kv_assembly.h"

#include <algorithm>

#include "util/error.h"

namespace loom {

DeviceKvAssembly::DeviceKvAssembly(int32_t num_layers, int32_t num_blocks, Clock::time_point deadline)
    : num_layers_(num_layers), num_blocks_(num_blocks), deadline_(deadline),
      landed_(static_cast<size_t>(num_layers) * static_cast<size_t>(num_blocks), 0),
      missing_per_layer_(static_cast<size_t>(num_layers), num_blocks),
      num_missing_(static_cast<int64_t>(num_layers) * num_blocks) {
  LOOM_CHECK(num_layers > 0 && num_blocks >= 0);
}

bool DeviceKvAssembly::land(int32_t layer, int32_t first_block, int32_t count, int64_t bytes) {
  if (!failure_.empty()) return false;
  if (layer < 0 || layer >= num_layers_ || first_block < 0 || count < 0 || first_block + count > num_blocks_)
    return false;
  for (int32_t block = first_block; block < first_block + count; ++block) {
    uint8_t& slot = landed_[static_cast<size_t>(layer) * num_blocks_ + block];
    if (slot) continue;
    slot = 1;
    --missing_per_layer_[static_cast<size_t>(layer)];
    --num_missing_;
  }
  num_bytes_ += bytes;
  return true;
}

void DeviceKvAssembly::fail(const std::string& failure) {
  if (failure.empty() || !failure_.empty() || complete()) return;
  failure_ = failure;
}

DeviceKvProgress DeviceKvAssembly::progress(Clock::time_point now) {
  if (failure_.empty() && !complete() && now >= deadline_) failure_ = "deadline passed";
  DeviceKvProgress progress;
  progress.num_layers_landed =
      static_cast<int32_t>(std::count(missing_per_layer_.begin(), missing_per_layer_.end(), 0));
  progress.num_bytes_landed = num_bytes_;
  if (complete()) {
    progress.state = DeviceKvProgress::State::kDone;
  } else if (!failure_.empty()) {
    progress.state = DeviceKvProgress::State::kFailed;
    progress.failure = failure_;
  } else {
    progress.state = DeviceKvProgress::State::kPending;
  }
  return progress;
}

}  // namespace loom
