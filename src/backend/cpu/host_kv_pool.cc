#include "backend/cpu/host_kv_pool.h"

#include <cstring>
#include <new>

#include "util/error.h"

namespace loom::cpu {

void HostKvPool::allocate(int32_t num_blocks, int32_t num_device_blocks, int32_t num_arrays, int64_t floats_per_block,
                          const char* what) {
  if (num_device_blocks <= 0) fail(ErrorKind::kInvalidArgument, "cpu backend: {} before its device pool was allocated", what);
  if (num_blocks < 0 || num_arrays <= 0 || floats_per_block <= 0)
    fail(ErrorKind::kInvalidArgument, "cpu backend: {} of {} blocks of {} x {} floats", what, num_blocks, num_arrays,
         floats_per_block);
  arena_.reset();
  num_blocks_ = 0;
  what_ = what;
  num_arrays_ = num_arrays;
  floats_per_block_ = floats_per_block;
  if (num_blocks == 0) return;
  const int64_t num_floats = static_cast<int64_t>(num_blocks) * num_arrays * floats_per_block;
  // Not zeroed: a host block is always written (offloaded or read from disk)
  // before it is read, and untouched pages of a large pool then cost no memory.
  constexpr size_t kAlignment = 4096;
  const size_t bytes = (static_cast<size_t>(num_floats) * sizeof(float) + kAlignment - 1) / kAlignment * kAlignment;
  arena_.reset(static_cast<float*>(std::aligned_alloc(kAlignment, bytes)));
  if (arena_ == nullptr) {
    throw Error(ErrorKind::kCapacity,
                fmt::format("cpu backend: cannot allocate a {} of {} bytes ({} blocks)", what, num_floats * 4,
                            num_blocks),
                "lower --host-kv-memory");
  }
  num_blocks_ = num_blocks;
}

void HostKvPool::check_copyable(int64_t device_floats_per_block, size_t num_ids) const {
  if (num_blocks_ == 0) fail(ErrorKind::kInvalidArgument, "cpu backend: copy of {} blocks with no {} allocated", num_ids, what_);
  if (floats_per_block_ != device_floats_per_block)
    fail(ErrorKind::kInvalidArgument,
         "cpu backend: {} has blocks of {} floats per array, the device pool {}; reallocate it", what_,
         floats_per_block_, device_floats_per_block);
}

void HostKvPool::copy(KvCopyDirection direction, std::span<float* const> device_arrays, int32_t num_device_blocks,
                      std::span<const int32_t> device_block_ids, std::span<const int32_t> host_block_ids) const {
  if (device_block_ids.size() != host_block_ids.size())
    fail(ErrorKind::kInvalidArgument, "cpu backend: {} copy of {} device blocks to {} host blocks", what_,
         device_block_ids.size(), host_block_ids.size());
  if (device_arrays.size() != static_cast<size_t>(num_arrays_))
    fail(ErrorKind::kInternal, "cpu backend: {} copy over {} arrays, allocated for {}", what_, device_arrays.size(),
         num_arrays_);
  for (size_t i = 0; i < device_block_ids.size(); ++i) {
    if (device_block_ids[i] < 0 || device_block_ids[i] >= num_device_blocks)
      fail(ErrorKind::kInvalidArgument, "cpu backend: {} copy: device block {} outside a pool of {} blocks", what_,
           device_block_ids[i], num_device_blocks);
    if (host_block_ids[i] < 0 || host_block_ids[i] >= num_blocks_)
      fail(ErrorKind::kInvalidArgument, "cpu backend: {} copy: host block {} outside a pool of {} blocks", what_,
           host_block_ids[i], num_blocks_);
  }
  const size_t block_bytes = static_cast<size_t>(floats_per_block_) * sizeof(float);
  for (size_t i = 0; i < device_block_ids.size(); ++i) {
    float* host = host_block(host_block_ids[i]);
    const int64_t device_offset = static_cast<int64_t>(device_block_ids[i]) * floats_per_block_;
    for (int32_t array = 0; array < num_arrays_; ++array) {
      float* device = device_arrays[array] + device_offset;
      float* host_part = host + array * floats_per_block_;
      if (direction == KvCopyDirection::kDeviceToHost)
        std::memcpy(host_part, device, block_bytes);
      else
        std::memcpy(device, host_part, block_bytes);
    }
  }
}

std::span<std::byte> HostKvPool::block_bytes(int32_t block) const {
  if (block < 0 || block >= num_blocks_)
    fail(ErrorKind::kInvalidArgument, "{}: host block {} out of range [0, {})", what_, block, num_blocks_);
  return {reinterpret_cast<std::byte*>(host_block(block)), static_cast<size_t>(floats_per_host_block()) * sizeof(float)};
}

}  // namespace loom::cpu
