// The CUDA backend's host tier of the KV cache (backend.h "Host tier"): pinned
// host blocks mirroring device KV blocks, copied on a dedicated non-blocking
// stream per direction.
//
// Layout. The device pool is num_arrays arrays (per layer K then V), each
// num_device_blocks blocks of bytes_per_block contiguous bytes (a block's slots,
// head-major inside, plan_types.h), array a starting at a * array_stride_bytes.
// A host block keeps a block's arrays together:
//
//   host block h:  [array 0: bytes_per_block][array 1] ... [array num_arrays - 1]
//
// so one cudaMemcpy2DAsync (rows = arrays, pitches = array stride / block
// bytes) moves one block of every layer.
//
// A view (attach()) uses host memory it does not own, with host blocks
// host_block_stride bytes apart: a tensor-parallel group keeps one pinned arena
// whose host block is every rank's part one after the other, and rank r's view
// starts at part r (tensor_parallel_cuda_backend.cc).
//
// Threads: allocate() / attach() / the destructor on the engine thread with no
// copy in flight; copy() on any thread, at most one per direction at a time,
// beside the engine's forward(). Each direction's stream is created by its
// first copy, on the copying thread (after cudaSetDevice).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include <cuda_runtime_api.h>

#include "backend/backend.h"

namespace loom::cuda {

class HostKvTier {
 public:
  explicit HostKvTier(int device) : device_(device) {}
  ~HostKvTier();
  HostKvTier(const HostKvTier&) = delete;
  HostKvTier& operator=(const HostKvTier&) = delete;

  // Frees, then pins num_blocks x num_arrays x bytes_per_block bytes (0 blocks:
  // just frees). Throws Error(kCapacity) when cudaHostAlloc fails.
  void allocate(int32_t num_blocks, int32_t num_arrays, size_t bytes_per_block);
  // Frees what it owned, then views num_blocks host blocks of `host` (pinned,
  // portable, not owned: must outlive the view or the next allocate/attach),
  // block b's arrays at host + b * host_block_stride.
  void attach(void* host, int32_t num_blocks, int32_t num_arrays, size_t bytes_per_block, size_t host_block_stride);
  int32_t num_blocks() const { return num_blocks_; }
  size_t bytes_per_block() const { return bytes_per_block_; }

  // Host block `block`'s bytes (pinned). Throws Error(kInvalidArgument) on a bad id.
  std::span<std::byte> block_bytes(int32_t block) const;

  struct DevicePool {
    void* data = nullptr;           // array 0, block 0
    int32_t num_blocks = 0;
    size_t array_stride_bytes = 0;  // from one array to the next
  };
  // Copies device block device_block_ids[i] (all arrays) to host block
  // host_block_ids[i] or back, and returns once the data has landed. All ids
  // are validated first: Error(kInvalidArgument) naming the id and the pool
  // size, nothing copied. CUDA failures: Error (cuda_check.h).
  void copy(KvCopyDirection direction, const DevicePool& device, std::span<const int32_t> device_block_ids,
            std::span<const int32_t> host_block_ids);
  // copy() in two halves, for copies on several devices at once: enqueue (ids
  // validated first, as copy()), then finish(direction) waits for it.
  void enqueue_copy(KvCopyDirection direction, const DevicePool& device, std::span<const int32_t> device_block_ids,
                    std::span<const int32_t> host_block_ids);
  void finish(KvCopyDirection direction);

 private:
  cudaStream_t stream_for(KvCopyDirection direction);
  void release();

  const int device_;
  void* host_ = nullptr;  // pinned
  bool owned_ = false;    // allocate()d here (else attach()ed)
  int32_t num_blocks_ = 0;
  int32_t num_arrays_ = 0;
  size_t bytes_per_block_ = 0;
  size_t host_block_stride_ = 0;
  cudaStream_t streams_[2] = {nullptr, nullptr};  // [KvCopyDirection]
};

}  // namespace loom::cuda
