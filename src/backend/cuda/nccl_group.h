// The production DeviceCommunicator: NCCL, one communicator per GPU of this
// process, made together (docs/tensor-parallel.md: one process, a thread per
// GPU). all_reduce_sum is ncclAllReduce in place on the rank's stream, so it
// is captured into the rank's CUDA graphs like any kernel; sums of up to
// peer_all_reduce_bytes go to a PeerAllReduce instead (one kernel over NVLink
// peer access: 5.8 us a call at 16 KiB where NCCL takes 6.7, half NCCL's time
// at 2 MiB; bench/README.md) when the GPUs reach each other's memory.
//
// Failure: abort() (TensorParallelGroup::abort, called when a rank fails)
// aborts every communicator, which ends the collectives in flight (a rank
// waiting on its stream for a peer that never comes returns) and makes every
// later all_reduce_sum throw Error(kInternal) starting with
// AbortableBarrier::kAbortedPrefix. A group of NCCL communicators is not
// rebuilt in place: once aborted it stays ended, and the server must restart.
//
// Ownership: NcclGroup owns the communicators (aborted on destruction) and
// must outlive the ranks that use them (TensorParallelGroup::owner).
// Threads: each rank's communicator on that rank's thread; abort() on any.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <span>
#include <vector>

#include "backend/cuda/device_communicator.h"
#include "backend/cuda/peer_all_reduce.h"
#include "backend/tensor_parallel_backend.h"

namespace loom::cuda {

class NcclGroup {
 public:
  static constexpr int64_t kDefaultPeerAllReduceBytes = 4 << 20;

  // One rank per entry of `devices` (distinct CUDA devices, rank r on
  // devices[r]). Throws Error(kUnavailable) when NCCL cannot be loaded, a
  // device is missing or listed twice, or NCCL cannot make the communicators.
  // peer_all_reduce_bytes: the largest sum the peer kernel takes (0: NCCL for all).
  explicit NcclGroup(std::span<const int> devices, int64_t peer_all_reduce_bytes = kDefaultPeerAllReduceBytes);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int32_t size() const { return static_cast<int32_t>(ranks_.size()); }
  std::vector<DeviceCommunicator*> communicators() const;
  void abort(int32_t failed_rank);
  bool aborted() const { return failed_rank_.load() >= 0; }
  // Whether small sums take the peer kernel (peer_all_reduce_bytes > 0 and the GPUs reach each other).
  bool peer_all_reduce() const { return peer_ != nullptr; }

 private:
  class Rank;
  friend class Rank;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::unique_ptr<PeerAllReduce> peer_;
  std::atomic<int32_t> failed_rank_{-1};
  // Shared by calls into a communicator, exclusive while abort() frees them.
  std::shared_mutex calls_;
};

// The hooks TensorParallelBackend needs over `group` (which it keeps alive).
TensorParallelGroup nccl_tensor_parallel_group(std::shared_ptr<NcclGroup> group);

}  // namespace loom::cuda
