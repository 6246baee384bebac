#include "backend/cuda/cuda_peer_kv_copier.h"

#include <cstring>

#include <fmt/format.h>

#include "backend/cuda/cuda_check.h"
#include "util/error.h"

namespace loom::cuda {

namespace {

std::string uuid_text(const cudaUUID_t& uuid) {
  std::string text = "GPU-";
  for (int i = 0; i < 16; ++i) {
    text += fmt::format("{:02x}", static_cast<unsigned char>(uuid.bytes[i]));
    if (i == 3 || i == 5 || i == 7 || i == 9) text += '-';
  }
  return text;
}

}  // namespace

CudaPeerKvCopier::CudaPeerKvCopier(int device) : device_(device) {
  LOOM_CUDA_CHECK(cudaSetDevice(device_));
  cudaDeviceProp properties{};
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&properties, device_));
  name_ = uuid_text(properties.uuid);
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

CudaPeerKvCopier::~CudaPeerKvCopier() {
  cudaSetDevice(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (auto& [ticket, event] : tickets_) cudaEventDestroy(event);
  for (cudaEvent_t event : spare_events_) cudaEventDestroy(event);
  for (auto& [handle, base] : mappings_) cudaIpcCloseMemHandle(base);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

bool CudaPeerKvCopier::accepts(const KvPoolMemory& pool) const {
  return pool.kind == KvPoolMemory::Kind::kCuda && pool.device == device_ && pool.allocation != nullptr;
}

std::vector<std::byte> CudaPeerKvCopier::export_allocation(const KvPoolMemory& pool) {
  if (!accepts(pool))
    fail(ErrorKind::kInvalidArgument, "cuda-ipc: the pool is not device {}'s whole allocation", device_);
  std::lock_guard lock(mutex_);
  LOOM_CUDA_CHECK(cudaSetDevice(device_));
  cudaIpcMemHandle_t handle{};
  LOOM_CUDA_CHECK(cudaIpcGetMemHandle(&handle, pool.allocation));
  std::vector<std::byte> bytes(sizeof(handle));
  std::memcpy(bytes.data(), &handle, sizeof(handle));
  return bytes;
}

std::byte* CudaPeerKvCopier::import(std::span<const std::byte> handle) {
  if (handle.size() != sizeof(cudaIpcMemHandle_t))
    fail(ErrorKind::kInvalidArgument, "cuda-ipc: a handle of {} bytes, not {}", handle.size(),
         sizeof(cudaIpcMemHandle_t));
  std::lock_guard lock(mutex_);
  const std::string key(reinterpret_cast<const char*>(handle.data()), handle.size());
  if (auto it = mappings_.find(key); it != mappings_.end()) return static_cast<std::byte*>(it->second);
  LOOM_CUDA_CHECK(cudaSetDevice(device_));
  cudaIpcMemHandle_t ipc{};
  std::memcpy(&ipc, handle.data(), sizeof(ipc));
  void* base = nullptr;
  const cudaError_t status = cudaIpcOpenMemHandle(&base, ipc, cudaIpcMemLazyEnablePeerAccess);
  if (status != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    fail(ErrorKind::kUnsupported, "cuda-ipc: cannot map the peer's KV pool from device {}: {}", device_,
         cudaGetErrorString(status));
  }
  mappings_[key] = base;
  return static_cast<std::byte*>(base);
}

void CudaPeerKvCopier::after(const KvLayerFence& fence) {
  if (fence.event == nullptr) return;
  std::lock_guard lock(mutex_);
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(fence.event), 0));
}

void CudaPeerKvCopier::copy(std::byte* destination, const std::byte* source, int64_t bytes) {
  std::lock_guard lock(mutex_);
  LOOM_CUDA_CHECK(cudaSetDevice(device_));
  LOOM_CUDA_CHECK(cudaMemcpyAsync(destination, source, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream_));
}

PeerKvCopier::Ticket CudaPeerKvCopier::record() {
  std::lock_guard lock(mutex_);
  LOOM_CUDA_CHECK(cudaSetDevice(device_));
  cudaEvent_t event = nullptr;
  if (spare_events_.empty()) {
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  } else {
    event = spare_events_.back();
    spare_events_.pop_back();
  }
  LOOM_CUDA_CHECK(cudaEventRecord(event, stream_));
  const Ticket ticket = next_ticket_++;
  tickets_[ticket] = event;
  return ticket;
}

cudaEvent_t CudaPeerKvCopier::event_of(Ticket ticket) {
  std::lock_guard lock(mutex_);
  auto it = tickets_.find(ticket);
  return it == tickets_.end() ? nullptr : it->second;
}

void CudaPeerKvCopier::wait(Ticket ticket) {
  cudaEvent_t event = event_of(ticket);  // synchronised outside the lock: other threads enqueue meanwhile
  if (event != nullptr) LOOM_CUDA_CHECK(cudaEventSynchronize(event));
}

void CudaPeerKvCopier::release(Ticket ticket) {
  std::lock_guard lock(mutex_);
  auto it = tickets_.find(ticket);
  if (it == tickets_.end()) return;
  spare_events_.push_back(it->second);
  tickets_.erase(it);
}

}  // namespace loom::cuda
