// PeerKvCopier (backend/peer_kv_copier.h) over CUDA IPC: pools exported with
// cudaIpcGetMemHandle, a peer's mapped once with cudaIpcOpenMemHandle (lazy
// peer access: the peer's GPU may be this one or another of the host that
// NVLink / PCIe reaches), copies on a non-blocking stream per rank behind each
// layer's fence event(s), tickets as one event per rank.
//
// A mapping stays open until the copier goes: a decode engine that
// reallocates its pools exports new handles, which map anew (the old mapping
// is then dead weight, not a hazard: nothing copies through it any more).
//
// Thread: any; a mutex guards the streams, the events and the mappings.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "backend/peer_kv_copier.h"

namespace loom::cuda {

class CudaPeerKvCopier final : public PeerKvCopier {
 public:
  // devices[r]: tensor-parallel rank r's GPU (one entry alone). Throws Error
  // when a device or its stream cannot be had.
  explicit CudaPeerKvCopier(std::vector<int> devices);
  ~CudaPeerKvCopier() override;
  CudaPeerKvCopier(const CudaPeerKvCopier&) = delete;
  CudaPeerKvCopier& operator=(const CudaPeerKvCopier&) = delete;

  std::string device_name() const override { return name_; }
  bool accepts(const KvPoolMemory& pool) const override;
  std::vector<std::byte> export_allocation(const KvPoolMemory& pool, int32_t rank) override;
  std::byte* import(int32_t rank, std::span<const std::byte> handle) override;
  void after(const KvLayerFence& fence) override;
  void copy(int32_t rank, std::byte* destination, const std::byte* source, int64_t bytes) override;
  Ticket record() override;
  void wait(Ticket ticket) override;
  void release(Ticket ticket) override;

 private:
  std::vector<cudaEvent_t> events_of(Ticket ticket);

  const std::vector<int> devices_;
  std::string name_;
  std::mutex mutex_;
  std::vector<cudaStream_t> streams_;                       // [rank]
  std::map<std::pair<int32_t, std::string>, void*> mappings_;  // (rank, handle bytes) -> base here
  std::map<Ticket, std::vector<cudaEvent_t>> tickets_;      // an event per rank
  std::vector<std::vector<cudaEvent_t>> spare_events_;      // [rank]
  Ticket next_ticket_ = 1;
};

}  // namespace loom::cuda
