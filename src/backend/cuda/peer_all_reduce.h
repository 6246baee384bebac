// A one-shot all-reduce over peer access (NVLink) for the small sums of a
// tensor-parallel step: decode steps and short chunks, two per layer
// (docs/tensor-parallel.md). On two H200s in a graph: 5.8 us a call at 16 KiB
// against NCCL's 6.7, half NCCL's time at 2 MiB. One kernel per call: each rank
// copies its data into its own staging slot, signals every peer, waits for every
// peer's signal, then adds every rank's slot in rank order into its data.
//
// Ranks are GPUs of this process (one process, a thread per GPU), so a kernel
// reads a peer's staging memory directly (cudaDeviceEnablePeerAccess). Two ranks
// may share one device (the tests on one GPU).
//
// Invariants: every rank calls all_reduce_sum with the same count, in the same
// order, as for any collective. Each block copies, signals and sums only its own
// stretch of the data, cut the same way on every rank; every call runs the same
// blocks. Calls alternate between two staging slots: a rank's kernel of call k-1
// ended only after every peer block signalled call k-1, which a peer does only
// once its kernel of call k-2 ended (a stream runs its kernels in order); so when
// a rank writes its slot for call k, no peer still reads it from call k-2, and
// one signal per call is enough. Every rank gets the same bits (sums in rank
// order). The kernel is an ordinary kernel: captured into CUDA graphs as is.
//
// Failure: abort() sets a host-mapped flag that ends every kernel waiting for a
// peer (its data is left as it was); the group has ended, and its owner
// (NcclGroup) refuses every later call.
// Ownership: the staging, signal and counter memory on every rank's device, and
// the mapped flag. Threads: all_reduce_sum for rank r on r's thread; abort() on any.
#pragma once

#include <cstdint>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include <cuda_runtime_api.h>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/peer_all_reduce_kernel.h"

namespace loom::cuda {

class PeerAllReduce {
 public:
  static constexpr int kMaxRanks = detail::kPeerAllReduceMaxRanks;
  static constexpr int kBlocks = detail::kPeerAllReduceBlocks;  // every call's grid

  // Null when some rank's device cannot reach another's memory (no peer access), or
  // when there are fewer than 2 or more than kMaxRanks ranks. max_bytes: the largest
  // sum it takes (two staging slots of it on every device).
  static std::unique_ptr<PeerAllReduce> create(std::span<const int> devices, int64_t max_bytes);
  ~PeerAllReduce();
  PeerAllReduce(const PeerAllReduce&) = delete;
  PeerAllReduce& operator=(const PeerAllReduce&) = delete;

  // Whether all_reduce_sum takes a sum of `count` floats (at most max_bytes). By count alone, so every
  // rank of a call decides alike (a rank on NCCL and another on this kernel would wait for each other).
  bool takes(int64_t count) const { return count <= max_count_; }
  // data[0, count) (rank `rank`'s device memory, 16-byte aligned, as cudaMalloc's) becomes every rank's
  // sum, after the work already on `stream` and before the work enqueued on it next. Throws
  // Error(kInternal) for unaligned data or a count it does not take (the group then aborts, which ends
  // the peers' kernels waiting for this rank).
  void all_reduce_sum(int32_t rank, float* data, int64_t count, cudaStream_t stream);
  void abort();

 private:
  struct RankMemory {
    int device = 0;
    DeviceBuffer staging;   // 2 slots of max_count_ floats
    DeviceBuffer signals;   // [kBlocks][kMaxRanks] uint32: peer r's last call number, per block
    DeviceBuffer counters;  // [kBlocks] uint32: this rank's last call number, per block
  };
  PeerAllReduce(std::span<const int> devices, int64_t max_count);

  std::vector<RankMemory> ranks_;
  const int64_t max_count_;
  int* abort_host_ = nullptr;  // pinned, mapped into every device
  int* abort_device_ = nullptr;
};

}  // namespace loom::cuda
