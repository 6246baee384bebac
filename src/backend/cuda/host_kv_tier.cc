#include "backend/cuda/host_kv_tier.h"

#include <fmt/format.h>

#include "backend/cuda/cuda_check.h"
#include "util/error.h"

namespace loom::cuda {

HostKvTier::~HostKvTier() {
  for (cudaStream_t& stream : streams_) {
    if (stream == nullptr) continue;
    cudaStreamSynchronize(stream);  // errors here are not actionable
    cudaStreamDestroy(stream);
    stream = nullptr;
  }
  release();
}

void HostKvTier::release() {
  if (host_ != nullptr && owned_) cudaFreeHost(host_);
  host_ = nullptr;
  owned_ = false;
  num_blocks_ = 0;
}

void HostKvTier::attach(void* host, int32_t num_blocks, int32_t num_arrays, size_t bytes_per_block,
                        size_t host_block_stride) {
  if (num_blocks < 0 || num_arrays <= 0 || bytes_per_block == 0 ||
      host_block_stride < static_cast<size_t>(num_arrays) * bytes_per_block || (host == nullptr && num_blocks > 0))
    fail(ErrorKind::kInvalidArgument, "cuda backend: host KV view of {} blocks of {} x {} bytes, {} apart", num_blocks,
         num_arrays, bytes_per_block, host_block_stride);
  release();
  host_ = host;
  num_blocks_ = num_blocks;
  num_arrays_ = num_arrays;
  bytes_per_block_ = bytes_per_block;
  host_block_stride_ = host_block_stride;
}

void HostKvTier::allocate(int32_t num_blocks, int32_t num_arrays, size_t bytes_per_block) {
  if (num_blocks < 0 || num_arrays <= 0 || bytes_per_block == 0)
    fail(ErrorKind::kInvalidArgument, "cuda backend: host KV pool of {} blocks of {} x {} bytes", num_blocks,
         num_arrays, bytes_per_block);
  release();
  num_arrays_ = num_arrays;
  bytes_per_block_ = bytes_per_block;
  host_block_stride_ = static_cast<size_t>(num_arrays) * bytes_per_block;
  if (num_blocks == 0) return;
  const size_t bytes = static_cast<size_t>(num_blocks) * static_cast<size_t>(num_arrays) * bytes_per_block;
  LOOM_CUDA_CHECK(cudaSetDevice(device_));
  const cudaError_t status = cudaHostAlloc(&host_, bytes, cudaHostAllocPortable);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear it, so a later launch check does not report it
    host_ = nullptr;
    throw Error(ErrorKind::kCapacity,
                fmt::format("cuda backend: cannot pin {} bytes of host memory for a host KV pool of {} blocks: {}",
                            bytes, num_blocks, cudaGetErrorString(status)),
                "lower --host-kv-memory");
  }
  owned_ = true;
  num_blocks_ = num_blocks;
}

cudaStream_t HostKvTier::stream_for(KvCopyDirection direction) {
  cudaStream_t& stream = streams_[static_cast<int>(direction)];
  // Non-blocking: never orders against the legacy default stream (nor the engine's work).
  if (stream == nullptr) LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return stream;
}

void HostKvTier::copy(KvCopyDirection direction, const DevicePool& device, std::span<const int32_t> device_block_ids,
                      std::span<const int32_t> host_block_ids) {
  enqueue_copy(direction, device, device_block_ids, host_block_ids);
  if (!device_block_ids.empty()) finish(direction);
}

void HostKvTier::finish(KvCopyDirection direction) {
  LOOM_CUDA_CHECK(cudaSetDevice(device_));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_for(direction)));
}

void HostKvTier::enqueue_copy(KvCopyDirection direction, const DevicePool& device,
                              std::span<const int32_t> device_block_ids, std::span<const int32_t> host_block_ids) {
  if (device_block_ids.size() != host_block_ids.size())
    fail(ErrorKind::kInvalidArgument, "cuda backend: host KV copy of {} device blocks to {} host blocks",
         device_block_ids.size(), host_block_ids.size());
  if (num_blocks_ == 0)
    fail(ErrorKind::kInvalidArgument, "cuda backend: copy of {} blocks with no host KV pool allocated",
         device_block_ids.size());
  for (size_t i = 0; i < device_block_ids.size(); ++i) {
    if (device_block_ids[i] < 0 || device_block_ids[i] >= device.num_blocks)
      fail(ErrorKind::kInvalidArgument, "cuda backend: host KV copy: device block {} outside a pool of {} blocks",
           device_block_ids[i], device.num_blocks);
    if (host_block_ids[i] < 0 || host_block_ids[i] >= num_blocks_)
      fail(ErrorKind::kInvalidArgument, "cuda backend: host KV copy: host block {} outside a pool of {} blocks",
           host_block_ids[i], num_blocks_);
  }
  if (device_block_ids.empty()) return;
  // The copying thread (a transfer worker) has no current device of its own.
  LOOM_CUDA_CHECK(cudaSetDevice(device_));
  const cudaStream_t stream = stream_for(direction);
  for (size_t i = 0; i < device_block_ids.size(); ++i) {
    char* host = static_cast<char*>(host_) + static_cast<size_t>(host_block_ids[i]) * host_block_stride_;
    char* block = static_cast<char*>(device.data) + static_cast<size_t>(device_block_ids[i]) * bytes_per_block_;
    // One row per array: width bytes_per_block, device pitch the array stride.
    if (direction == KvCopyDirection::kDeviceToHost)
      LOOM_CUDA_CHECK(cudaMemcpy2DAsync(host, bytes_per_block_, block, device.array_stride_bytes, bytes_per_block_,
                                        num_arrays_, cudaMemcpyDeviceToHost, stream));
    else
      LOOM_CUDA_CHECK(cudaMemcpy2DAsync(block, device.array_stride_bytes, host, bytes_per_block_, bytes_per_block_,
                                        num_arrays_, cudaMemcpyHostToDevice, stream));
  }
}

std::span<std::byte> HostKvTier::block_bytes(int32_t block) const {
  if (block < 0 || block >= num_blocks_)
    fail(ErrorKind::kInvalidArgument, "cuda backend: host block {} out of range [0, {})", block, num_blocks_);
  return {static_cast<std::byte*>(host_) + static_cast<size_t>(block) * host_block_stride_,
          static_cast<size_t>(num_arrays_) * bytes_per_block_};
}

}  // namespace loom::cuda
