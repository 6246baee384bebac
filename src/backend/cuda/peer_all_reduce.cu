#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/peer_all_reduce_kernel.h"

namespace loom::cuda::detail {
namespace {

constexpr int kThreads = 512;
constexpr int kAbortPollSpins = 256;  // a spin reads local memory; the mapped flag crosses PCIe

__device__ __forceinline__ void store_release(uint32_t* address, uint32_t value) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(address), "r"(value) : "memory");
}

__device__ __forceinline__ uint32_t load_acquire(const uint32_t* address) {
  uint32_t value;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}

// Block b owns the float4s [b * per_block, (b + 1) * per_block) and, the last block, the tail floats.
__global__ void __launch_bounds__(kThreads) peer_all_reduce_kernel(PeerAllReduceArgs args) {
  __shared__ uint32_t call_shared;
  __shared__ int aborted;
  const int block = blockIdx.x;
  if (threadIdx.x == 0) {
    call_shared = args.counters[block] + 1;
    aborted = 0;
  }
  __syncthreads();
  const uint32_t call = call_shared;
  const int64_t slot = static_cast<int64_t>(call & 1) * args.slot_floats;
  const int64_t vectors = args.count / 4;
  const int64_t per_block = (vectors + gridDim.x - 1) / gridDim.x;
  const int64_t begin = block * per_block;
  const int64_t end = min(vectors, begin + per_block);
  const bool tail = block == gridDim.x - 1;

  float* mine = args.staging[args.rank] + slot;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads)
    reinterpret_cast<float4*>(mine)[i] = reinterpret_cast<const float4*>(args.data)[i];
  if (tail)
    for (int64_t i = vectors * 4 + threadIdx.x; i < args.count; i += kThreads) mine[i] = args.data[i];
  __syncthreads();

  // Thread r signals peer r, then waits for peer r's signal of this call.
  if (threadIdx.x < args.size) {
    const int peer = threadIdx.x;
    __threadfence_system();
    store_release(args.signals[peer] + block * kPeerAllReduceMaxRanks + args.rank, call);
    const uint32_t* from_peer = args.signals[args.rank] + block * kPeerAllReduceMaxRanks + peer;
    for (int spins = 0; static_cast<int32_t>(load_acquire(from_peer) - call) < 0; ++spins) {
      if (spins == kAbortPollSpins) {
        spins = 0;
        if (*args.abort != 0) {
          aborted = 1;
          break;
        }
      }
    }
  }
  __syncthreads();
  if (aborted) return;  // the group has ended; its owner refuses every later call

  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    float4 sum = __ldcg(reinterpret_cast<const float4*>(args.staging[0] + slot) + i);
    for (int r = 1; r < args.size; ++r) {
      const float4 part = __ldcg(reinterpret_cast<const float4*>(args.staging[r] + slot) + i);
      sum.x += part.x;
      sum.y += part.y;
      sum.z += part.z;
      sum.w += part.w;
    }
    reinterpret_cast<float4*>(args.data)[i] = sum;
  }
  if (tail) {
    for (int64_t i = vectors * 4 + threadIdx.x; i < args.count; i += kThreads) {
      float sum = __ldcg(args.staging[0] + slot + i);
      for (int r = 1; r < args.size; ++r) sum += __ldcg(args.staging[r] + slot + i);
      args.data[i] = sum;
    }
  }
  if (threadIdx.x == 0) args.counters[block] = call;
}

}  // namespace

void launch_peer_all_reduce(const PeerAllReduceArgs& args, cudaStream_t stream) {
  if (args.count <= 0) return;
  // Always every block, whatever the count: the blocks' call numbers then move
  // together, so every block of a call uses the same slot (peer_all_reduce.h).
  peer_all_reduce_kernel<<<kPeerAllReduceBlocks, kThreads, 0, stream>>>(args);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::cuda::detail
