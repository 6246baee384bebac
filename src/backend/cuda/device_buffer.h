// Owning handles for device memory (cudaMalloc) and pinned host memory
// (cudaHostAlloc). Move-only; freeing happens in the destructor. Thread: as the
// owning object (the backend's engine thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

namespace loom::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t num_bytes) { allocate(num_bytes); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(num_bytes_, other.num_bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Frees, then allocates `num_bytes` (uninitialised). Throws Error(kCapacity) on OOM.
  void allocate(size_t num_bytes);
  // Grows to at least `num_bytes` (contents lost when it grows). Never shrinks.
  void reserve(size_t num_bytes) {
    if (num_bytes > num_bytes_) allocate(num_bytes + num_bytes / 4);
  }
  void release();

  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  size_t size() const { return num_bytes_; }

 private:
  void* data_ = nullptr;
  size_t num_bytes_ = 0;
};

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { release(); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // Grows to at least `num_bytes`; contents are lost when it grows. The caller
  // must make sure no copy from/to the old buffer is still in flight.
  void reserve(size_t num_bytes);
  void release();
  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  size_t size() const { return num_bytes_; }

 private:
  void* data_ = nullptr;
  size_t num_bytes_ = 0;
};

}  // namespace loom::cuda
