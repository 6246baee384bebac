// The receiver's bookkeeping of one device-to-device transfer: which
// (layer, block) slices landed, in whatever order layers and pieces come,
// and whether the whole transfer is done, failed or past its deadline. Any
// receiving plane keeps one per transfer (the cuda-ipc plane marks a piece
// landed when the sender reports that its copies ran).
//
// Thread: not thread-safe; the plane guards it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "kvtransfer/device/device_kv_plane.h"

namespace loom {

class DeviceKvAssembly {
 public:
  using Clock = std::chrono::steady_clock;
  DeviceKvAssembly(int32_t num_layers, int32_t num_blocks, Clock::time_point deadline);

  // Marks layer `layer` of blocks [first_block, first_block + count) landed
  // (bytes: what the piece carried). A slice that lands twice counts once.
  // false, changing nothing, for a piece outside the transfer or after it
  // ended (failed).
  bool land(int32_t layer, int32_t first_block, int32_t count, int64_t bytes);
  // The sender's end: without `failure`, nothing; with it, the transfer fails.
  void fail(const std::string& failure);
  // kDone once every slice landed; kFailed once failed or, still incomplete,
  // at `now` past the deadline (that verdict sticks).
  DeviceKvProgress progress(Clock::time_point now);

  int32_t num_layers() const { return num_layers_; }
  int32_t num_blocks() const { return num_blocks_; }
  bool complete() const { return num_missing_ == 0; }

 private:
  const int32_t num_layers_, num_blocks_;
  const Clock::time_point deadline_;
  std::vector<uint8_t> landed_;               // [layer * num_blocks + block]
  std::vector<int32_t> missing_per_layer_;    // blocks still missing, per layer
  int64_t num_missing_ = 0;
  int64_t num_bytes_ = 0;
  std::string failure_;
};

}  // namespace loom
