// The kernel behind PeerAllReduce (peer_all_reduce.h), for peer_all_reduce.cu
// (C++17: no std::span here). Every pointer is device memory reachable from the
// launching device; `abort` is host-mapped.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace loom::cuda::detail {

inline constexpr int kPeerAllReduceMaxRanks = 8;
inline constexpr int kPeerAllReduceBlocks = 32;

struct PeerAllReduceArgs {
  float* staging[kPeerAllReduceMaxRanks];     // every rank's two slots
  uint32_t* signals[kPeerAllReduceMaxRanks];  // every rank's [blocks][ranks] signals
  uint32_t* counters;                         // this rank's, per block
  float* data;
  int64_t count;
  int64_t slot_floats;
  int32_t rank;
  int32_t size;
  const volatile int* abort;
};
void launch_peer_all_reduce(const PeerAllReduceArgs& args, cudaStream_t stream);

}  // namespace loom::cuda::detail
