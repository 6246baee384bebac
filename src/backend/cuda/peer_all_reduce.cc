#include "backend/cuda/peer_all_reduce.h"

#include <spdlog/spdlog.h>

#include "backend/cuda/cuda_check.h"
#include "util/error.h"

namespace loom::cuda {

namespace {

// Whether `device` may read and write `peer`'s memory, enabling it if so.
bool enable_peer_access(int device, int peer) {
  if (device == peer) return true;
  int can = 0;
  if (cudaDeviceCanAccessPeer(&can, device, peer) != cudaSuccess || can == 0) return false;
  LOOM_CUDA_CHECK(cudaSetDevice(device));
  const cudaError_t enabled = cudaDeviceEnablePeerAccess(peer, 0);
  if (enabled == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();  // NCCL (or an earlier group) enabled it: fine
    return true;
  }
  return enabled == cudaSuccess;
}

}  // namespace

std::unique_ptr<PeerAllReduce> PeerAllReduce::create(std::span<const int> devices, int64_t max_bytes) {
  const auto size = static_cast<int>(devices.size());
  if (size < 2 || size > kMaxRanks || max_bytes < static_cast<int64_t>(sizeof(float))) return nullptr;
  int previous = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&previous));
  bool reachable = true;
  for (int a = 0; a < size && reachable; ++a)
    for (int b = 0; b < size && reachable; ++b) reachable = enable_peer_access(devices[a], devices[b]);
  LOOM_CUDA_CHECK(cudaSetDevice(previous));
  if (!reachable) {
    spdlog::info("tensor parallelism: the GPUs cannot all reach each other's memory; every all-reduce goes to NCCL");
    return nullptr;
  }
  return std::unique_ptr<PeerAllReduce>(new PeerAllReduce(devices, max_bytes / static_cast<int64_t>(sizeof(float))));
}

PeerAllReduce::PeerAllReduce(std::span<const int> devices, int64_t max_count) : max_count_((max_count + 3) / 4 * 4) {
  int previous = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&previous));
  LOOM_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&abort_host_), sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
  *abort_host_ = 0;
  LOOM_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&abort_device_), abort_host_, 0));
  ranks_.resize(devices.size());
  for (size_t r = 0; r < devices.size(); ++r) {
    RankMemory& rank = ranks_[r];
    rank.device = devices[r];
    LOOM_CUDA_CHECK(cudaSetDevice(rank.device));
    rank.staging.allocate(2 * static_cast<size_t>(max_count_) * sizeof(float));
    rank.signals.allocate(static_cast<size_t>(kBlocks) * kMaxRanks * sizeof(uint32_t));
    rank.counters.allocate(static_cast<size_t>(kBlocks) * sizeof(uint32_t));
    LOOM_CUDA_CHECK(cudaMemset(rank.signals.data(), 0, rank.signals.size()));
    LOOM_CUDA_CHECK(cudaMemset(rank.counters.data(), 0, rank.counters.size()));
  }
  for (const RankMemory& rank : ranks_) {
    LOOM_CUDA_CHECK(cudaSetDevice(rank.device));
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  }
  LOOM_CUDA_CHECK(cudaSetDevice(previous));
}

PeerAllReduce::~PeerAllReduce() {
  if (abort_host_ != nullptr) cudaFreeHost(abort_host_);
}

void PeerAllReduce::all_reduce_sum(int32_t rank, float* data, int64_t count, cudaStream_t stream) {
  LOOM_CHECK(rank >= 0 && rank < static_cast<int32_t>(ranks_.size()) && takes(count) &&
             reinterpret_cast<uintptr_t>(data) % 16 == 0);
  detail::PeerAllReduceArgs args{};
  for (size_t r = 0; r < ranks_.size(); ++r) {
    args.staging[r] = ranks_[r].staging.as<float>();
    args.signals[r] = ranks_[r].signals.as<uint32_t>();
  }
  args.counters = ranks_[rank].counters.as<uint32_t>();
  args.data = data;
  args.count = count;
  args.slot_floats = max_count_;
  args.rank = rank;
  args.size = static_cast<int32_t>(ranks_.size());
  args.abort = abort_device_;
  detail::launch_peer_all_reduce(args, stream);
}

void PeerAllReduce::abort() { *const_cast<volatile int*>(abort_host_) = 1; }

}  // namespace loom::cuda
