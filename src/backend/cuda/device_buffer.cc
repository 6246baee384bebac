#include "backend/cuda/device_buffer.h"

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_check.h"

namespace loom::cuda {

void DeviceBuffer::allocate(size_t num_bytes) {
  release();
  if (num_bytes == 0) return;
  LOOM_CUDA_CHECK(cudaMalloc(&data_, num_bytes));
  num_bytes_ = num_bytes;
}

void DeviceBuffer::release() {
  if (data_ != nullptr) cudaFree(data_);  // errors on free are not actionable
  data_ = nullptr;
  num_bytes_ = 0;
}

void PinnedBuffer::reserve(size_t num_bytes) {
  if (num_bytes <= num_bytes_) return;
  release();
  const size_t grown = num_bytes + num_bytes / 4;
  LOOM_CUDA_CHECK(cudaHostAlloc(&data_, grown, cudaHostAllocDefault));
  num_bytes_ = grown;
}

void PinnedBuffer::release() {
  if (data_ != nullptr) cudaFreeHost(data_);
  data_ = nullptr;
  num_bytes_ = 0;
}

}  // namespace loom::cuda
