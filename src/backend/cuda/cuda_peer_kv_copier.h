// PeerKvCopier (backend/peer_kv_copier.h) over CUDA IPC: pools exported with
// cudaIpcGetMemHandle, a peer's mapped once with cudaIpcOpenMemHandle (lazy
// peer access: the peer's GPU may be this one or another of the host that
// NVLink / PCIe reaches), copies on a non-blocking stream of its own behind
// each layer's fence event, tickets as events.
//
// A mapping stays open until the copier goes: a decode engine that
// reallocates its pools exports new handles, which map anew (the old mapping
// is then dead weight, not a hazard: nothing copies through it any more).
//
// Thread: any; a mutex guards the stream, the events and the mappings.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "backend/peer_kv_copier.h"

namespace loom::cuda {

class CudaPeerKvCopier final : public PeerKvCopier {
 public:
  // Throws Error when the device or its stream cannot be had.
  explicit CudaPeerKvCopier(int device);
  ~CudaPeerKvCopier() override;
  CudaPeerKvCopier(const CudaPeerKvCopier&) = delete;
  CudaPeerKvCopier& operator=(const CudaPeerKvCopier&) = delete;

  std::string device_name() const override { return name_; }
  bool accepts(const KvPoolMemory& pool) const override;
  std::vector<std::byte> export_allocation(const KvPoolMemory& pool) override;
  std::byte* import(std::span<const std::byte> handle) override;
  void after(const KvLayerFence& fence) override;
  void copy(std::byte* destination, const std::byte* source, int64_t bytes) override;
  Ticket record() override;
  void wait(Ticket ticket) override;
  void release(Ticket ticket) override;

 private:
  cudaEvent_t event_of(Ticket ticket);

  const int device_;
  std::string name_;
  std::mutex mutex_;
  cudaStream_t stream_ = nullptr;
  std::map<std::string, void*> mappings_;  // handle bytes -> base here
  std::map<Ticket, cudaEvent_t> tickets_;
  std::vector<cudaEvent_t> spare_events_;
  Ticket next_ticket_ = 1;
};

}  // namespace loom::cuda
