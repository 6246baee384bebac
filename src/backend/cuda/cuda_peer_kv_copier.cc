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

// Puts the calling thread's current device back when it goes: the plane calls in from an engine's (or a
// tensor-parallel rank's) thread in the middle of its forward, whose launches need their own device current.
class KeepDevice {
 public:
  KeepDevice() { cudaGetDevice(&device_); }
  ~KeepDevice() { cudaSetDevice(device_); }
  KeepDevice(const KeepDevice&) = delete;
  KeepDevice& operator=(const KeepDevice&) = delete;

 private:
  int device_ = 0;
};

}  // namespace

CudaPeerKvCopier::CudaPeerKvCopier(std::vector<int> devices)
    : devices_(std::move(devices)), spare_events_(devices_.size()) {
  if (devices_.empty()) fail(ErrorKind::kInvalidArgument, "cuda-ipc: a copier with no device");
  KeepDevice keep;
  for (int device : devices_) {
    LOOM_CUDA_CHECK(cudaSetDevice(device));
    cudaDeviceProp properties{};
    LOOM_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
    name_ += (name_.empty() ? "" : ",") + uuid_text(properties.uuid);
    cudaStream_t stream = nullptr;
    LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    streams_.push_back(stream);
  }
}

CudaPeerKvCopier::~CudaPeerKvCopier() {
  KeepDevice keep;
  for (size_t r = 0; r < devices_.size(); ++r) {
    cudaSetDevice(devices_[r]);
    cudaStreamSynchronize(streams_[r]);
  }
  for (auto& [ticket, events] : tickets_)
    for (cudaEvent_t event : events) cudaEventDestroy(event);
  for (auto& events : spare_events_)
    for (cudaEvent_t event : events) cudaEventDestroy(event);
  for (auto& [key, base] : mappings_) {
    cudaSetDevice(devices_[static_cast<size_t>(key.first)]);
    cudaIpcCloseMemHandle(base);
  }
  for (cudaStream_t stream : streams_) cudaStreamDestroy(stream);
}

bool CudaPeerKvCopier::accepts(const KvPoolMemory& pool) const {
  if (pool.kind != KvPoolMemory::Kind::kCuda || pool.num_ranks != static_cast<int32_t>(devices_.size()) ||
      pool.allocations.size() != devices_.size())
    return false;
  const std::vector<int32_t> devices = pool.devices.empty() ? std::vector<int32_t>{pool.device} : pool.devices;
  for (size_t r = 0; r < devices_.size(); ++r)
    if (r >= devices.size() || devices[r] != devices_[r] || pool.allocations[r] == nullptr) return false;
  return true;
}

std::vector<std::byte> CudaPeerKvCopier::export_allocation(const KvPoolMemory& pool, int32_t rank) {
  if (!accepts(pool) || rank < 0 || rank >= static_cast<int32_t>(devices_.size()))
    fail(ErrorKind::kInvalidArgument, "cuda-ipc: the pool is not this copier's devices' allocations");
  std::lock_guard lock(mutex_);
  KeepDevice keep;
  LOOM_CUDA_CHECK(cudaSetDevice(devices_[static_cast<size_t>(rank)]));
  cudaIpcMemHandle_t handle{};
  LOOM_CUDA_CHECK(cudaIpcGetMemHandle(&handle, pool.allocations[static_cast<size_t>(rank)]));
  std::vector<std::byte> bytes(sizeof(handle));
  std::memcpy(bytes.data(), &handle, sizeof(handle));
  return bytes;
}

std::byte* CudaPeerKvCopier::import(int32_t rank, std::span<const std::byte> handle) {
  if (handle.size() != sizeof(cudaIpcMemHandle_t) || rank < 0 || rank >= static_cast<int32_t>(devices_.size()))
    fail(ErrorKind::kInvalidArgument, "cuda-ipc: a handle of {} bytes for rank {}", handle.size(), rank);
  std::lock_guard lock(mutex_);
  const auto key = std::make_pair(rank, std::string(reinterpret_cast<const char*>(handle.data()), handle.size()));
  if (auto it = mappings_.find(key); it != mappings_.end()) return static_cast<std::byte*>(it->second);
  const int device = devices_[static_cast<size_t>(rank)];
  KeepDevice keep;
  LOOM_CUDA_CHECK(cudaSetDevice(device));
  cudaIpcMemHandle_t ipc{};
  std::memcpy(&ipc, handle.data(), sizeof(ipc));
  void* base = nullptr;
  const cudaError_t status = cudaIpcOpenMemHandle(&base, ipc, cudaIpcMemLazyEnablePeerAccess);
  if (status != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    fail(ErrorKind::kUnsupported, "cuda-ipc: cannot map the peer's KV pool from device {}: {}", device,
         cudaGetErrorString(status));
  }
  mappings_[key] = base;
  return static_cast<std::byte*>(base);
}

void CudaPeerKvCopier::after(const KvLayerFence& fence) {
  std::lock_guard lock(mutex_);
  if (fence.num_ranks == 0) {
    if (fence.event != nullptr) LOOM_CUDA_CHECK(cudaStreamWaitEvent(streams_[0], static_cast<cudaEvent_t>(fence.event), 0));
    return;
  }
  for (int32_t r = 0; r < fence.num_ranks && r < static_cast<int32_t>(streams_.size()); ++r)
    if (fence.rank_events[static_cast<size_t>(r)] != nullptr)
      LOOM_CUDA_CHECK(cudaStreamWaitEvent(streams_[static_cast<size_t>(r)],
                                          static_cast<cudaEvent_t>(fence.rank_events[static_cast<size_t>(r)]), 0));
}

void CudaPeerKvCopier::copy(int32_t rank, std::byte* destination, const std::byte* source, int64_t bytes) {
  std::lock_guard lock(mutex_);
  KeepDevice keep;
  LOOM_CUDA_CHECK(cudaSetDevice(devices_.at(static_cast<size_t>(rank))));
  LOOM_CUDA_CHECK(cudaMemcpyAsync(destination, source, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice,
                                  streams_[static_cast<size_t>(rank)]));
}

PeerKvCopier::Ticket CudaPeerKvCopier::record() {
  std::lock_guard lock(mutex_);
  KeepDevice keep;
  std::vector<cudaEvent_t> events;
  for (size_t r = 0; r < devices_.size(); ++r) {
    LOOM_CUDA_CHECK(cudaSetDevice(devices_[r]));
    cudaEvent_t event = nullptr;
    if (spare_events_[r].empty()) {
      LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    } else {
      event = spare_events_[r].back();
      spare_events_[r].pop_back();
    }
    LOOM_CUDA_CHECK(cudaEventRecord(event, streams_[r]));
    events.push_back(event);
  }
  const Ticket ticket = next_ticket_++;
  tickets_[ticket] = std::move(events);
  return ticket;
}

std::vector<cudaEvent_t> CudaPeerKvCopier::events_of(Ticket ticket) {
  std::lock_guard lock(mutex_);
  auto it = tickets_.find(ticket);
  return it == tickets_.end() ? std::vector<cudaEvent_t>{} : it->second;
}

void CudaPeerKvCopier::wait(Ticket ticket) {
  // Synchronised outside the lock: other threads enqueue meanwhile.
  for (cudaEvent_t event : events_of(ticket)) LOOM_CUDA_CHECK(cudaEventSynchronize(event));
}

void CudaPeerKvCopier::release(Ticket ticket) {
  std::lock_guard lock(mutex_);
  auto it = tickets_.find(ticket);
  if (it == tickets_.end()) return;
  for (size_t r = 0; r < it->second.size(); ++r) spare_events_[r].push_back(it->second[r]);
  tickets_.erase(it);
}

}  // namespace loom::cuda
