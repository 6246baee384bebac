// The CPU backend's host tier of the KV cache (backend.h "Host tier"): one
// arena per pool kind, in ordinary memory, holding whole blocks copied out of
// (and back into) the device-side pools with memcpy.
//
// Layout. A device pool kind is num_arrays arrays (main: per layer K then V;
// residual: per layer the rCache), each num_device_blocks x floats_per_block
// floats. A host block keeps all of them together:
//
//   host block h:  [array 0: floats_per_block][array 1] ... [array num_arrays - 1]
//   device block d of array a:  device_arrays[a] + d * floats_per_block
//
// Threads: allocate() on the engine thread with no copy in flight; copy() on
// any thread, at most one per direction at a time, concurrently with forward()
// (it touches only the blocks it names and no backend scratch state).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>

#include "backend/backend.h"

namespace loom::cpu {

class HostKvPool {
 public:
  // Frees, then allocates num_blocks blocks of num_arrays x floats_per_block
  // floats (contents undefined); num_blocks 0 just frees. `what` names the pool
  // in errors. Throws Error(kInvalidArgument) on negative sizes or when the
  // device pool it mirrors has no blocks yet (num_device_blocks <= 0),
  // Error(kCapacity) when the memory cannot be had.
  void allocate(int32_t num_blocks, int32_t num_device_blocks, int32_t num_arrays, int64_t floats_per_block,
                const char* what);
  int32_t num_blocks() const { return num_blocks_; }
  int32_t num_arrays() const { return num_arrays_; }
  int64_t floats_per_block() const { return floats_per_block_; }

  // Throws Error(kInvalidArgument) when a copy of num_ids blocks cannot run:
  // nothing allocated, or blocks of another size than the device pool's
  // (device_floats_per_block: the device pool may have been reallocated since).
  void check_copyable(int64_t device_floats_per_block, size_t num_ids) const;

  // Host block `block`'s bytes. Throws Error(kInvalidArgument) on a bad id.
  std::span<std::byte> block_bytes(int32_t block) const;

  // Copies device block device_block_ids[i] of every array to host block
  // host_block_ids[i] (kDeviceToHost) or back. device_arrays: num_arrays()
  // pointers to arrays of num_device_blocks x floats_per_block() floats.
  // Validates every id (and the two spans' sizes) before copying anything:
  // Error(kInvalidArgument) naming the bad id and the pool's size.
  void copy(KvCopyDirection direction, std::span<float* const> device_arrays, int32_t num_device_blocks,
            std::span<const int32_t> device_block_ids, std::span<const int32_t> host_block_ids) const;

 private:
  float* host_block(int32_t block) const { return arena_.get() + static_cast<int64_t>(block) * floats_per_host_block(); }
  int64_t floats_per_host_block() const { return num_arrays_ * floats_per_block_; }

  const char* what_ = "host KV pool";
  struct FreeArena {
    void operator()(float* arena) const { std::free(arena); }
  };
  // 4096-aligned, so that the disk tier can read whole blocks into it with
  // O_DIRECT when the block size is a multiple of the page.
  std::unique_ptr<float, FreeArena> arena_;
  int32_t num_blocks_ = 0;
  int32_t num_arrays_ = 0;
  int64_t floats_per_block_ = 0;
};

}  // namespace loom::cpu
