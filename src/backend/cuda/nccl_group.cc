#include "backend/cuda/nccl_group.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include <spdlog/spdlog.h>

#include "nccl/nccl_library.h"
#include "util/abortable_barrier.h"
#include "util/error.h"

namespace loom::cuda {

namespace {

[[noreturn]] void unavailable(const std::string& what) {
  throw Error(ErrorKind::kUnavailable, "tensor parallelism over NCCL: " + what);
}

// Waits while `comm` is in progress (non-blocking communicators, nccl_library.h).
// Returns its final state; ncclInProgress only when `stop` became true.
ncclResult_t settle(const NcclLibrary& nccl, ncclComm_t comm, const std::atomic<int32_t>& failed_rank) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t polled = nccl.comm_get_async_error(comm, &state);
    if (polled != ncclSuccess) return polled;
    if (state != ncclInProgress || failed_rank.load() >= 0) return state;
    std::this_thread::sleep_for(std::chrono::microseconds(10));
  }
}

}  // namespace

class NcclGroup::Rank final : public DeviceCommunicator {
 public:
  Rank(NcclGroup& group, int32_t rank, int device) : group_(group), rank_(rank), device_(device) {}

  void all_reduce_sum(float* data, int64_t count, cudaStream_t stream) override {
    const NcclLibrary& nccl = nccl_library();
    std::shared_lock lock(group_.calls_);
    if (group_.aborted()) ended();
    if (group_.peer_ != nullptr && group_.peer_->takes(count)) {
      group_.peer_->all_reduce_sum(rank_, data, count, stream);
      return;
    }
    ncclResult_t result =
        nccl.all_reduce(data, data, static_cast<size_t>(count), ncclFloat, ncclSum, comm, stream);
    if (result == ncclInProgress) result = settle(nccl, comm, group_.failed_rank_);
    if (group_.aborted()) ended();
    if (result != ncclSuccess)
      throw Error(ErrorKind::kInternal, fmt::format("tensor parallelism: rank {}'s ncclAllReduce of {} floats: {}",
                                                    rank_, count, nccl.error_string(result)));
  }
  void all_gather(const float* send, float* receive, int64_t count, cudaStream_t stream) override {
    const NcclLibrary& nccl = nccl_library();
    std::shared_lock lock(group_.calls_);
    if (group_.aborted()) ended();
    ncclResult_t result = nccl.all_gather(send, receive, static_cast<size_t>(count), ncclFloat, comm, stream);
    if (result == ncclInProgress) result = settle(nccl, comm, group_.failed_rank_);
    if (group_.aborted()) ended();
    if (result != ncclSuccess)
      throw Error(ErrorKind::kInternal, fmt::format("tensor parallelism: rank {}'s ncclAllGather of {} floats: {}",
                                                    rank_, count, nccl.error_string(result)));
  }
  bool capturable() const override { return true; }

  ncclComm_t comm = nullptr;

 private:
  [[noreturn]] void ended() const {
    fail(ErrorKind::kInternal, "{} rank {} failed; the NCCL communicators ended with it (restart the server)",
         AbortableBarrier::kAbortedPrefix, group_.failed_rank_.load());
  }

  NcclGroup& group_;
  const int32_t rank_;
  const int device_;
  friend class NcclGroup;
};

NcclGroup::NcclGroup(std::span<const int> devices, int64_t peer_all_reduce_bytes) {
  const NcclLibrary& nccl = nccl_library();
  if (!nccl.loaded()) unavailable(nccl.failure);
  int num_devices = 0;
  if (cudaGetDeviceCount(&num_devices) != cudaSuccess) num_devices = 0;
  for (size_t r = 0; r < devices.size(); ++r) {
    if (devices[r] < 0 || devices[r] >= num_devices)
      unavailable(fmt::format("{} ranks need {} GPUs; CUDA device {} is not there ({} visible)", devices.size(),
                              devices.size(), devices[r], num_devices));
    if (std::count(devices.begin(), devices.end(), devices[r]) > 1)
      unavailable(fmt::format("CUDA device {} is listed for two ranks; NCCL needs one GPU per rank", devices[r]));
  }
  for (size_t r = 0; r < devices.size(); ++r)
    ranks_.push_back(std::make_unique<Rank>(*this, static_cast<int32_t>(r), devices[r]));

  ncclUniqueId id{};
  ncclResult_t result = nccl.get_unique_id(&id);
  if (result != ncclSuccess) unavailable(fmt::format("ncclGetUniqueId: {}", nccl.error_string(result)));
  int previous_device = 0;
  cudaGetDevice(&previous_device);
  // One thread makes every rank's communicator: inside a group, as NCCL asks.
  result = nccl.group_start();
  for (auto& rank : ranks_) {
    if (result != ncclSuccess) break;
    cudaSetDevice(rank->device_);
    result = nccl.comm_init_rank(&rank->comm, size(), id, rank->rank_);
    if (result == ncclInProgress) result = ncclSuccess;
  }
  const ncclResult_t ended = nccl.group_end();
  if (result == ncclSuccess && ended != ncclInProgress) result = ended;
  for (auto& rank : ranks_) {
    if (result != ncclSuccess || rank->comm == nullptr) break;
    result = settle(nccl, rank->comm, failed_rank_);
  }
  cudaSetDevice(previous_device);
  if (result != ncclSuccess) {
    for (auto& rank : ranks_)
      if (rank->comm != nullptr) nccl.comm_abort(rank->comm);
    unavailable(fmt::format("making {} communicators: {}", size(), nccl.error_string(result)));
  }
  try {
    if (peer_all_reduce_bytes > 0) peer_ = PeerAllReduce::create(devices, peer_all_reduce_bytes);
  } catch (const Error& error) {  // NCCL alone still serves
    spdlog::warn("tensor parallelism: no peer all-reduce ({}); every sum goes to NCCL", error.what());
  }
  int version = 0;
  nccl.get_version(&version);
  spdlog::info("tensor parallelism: NCCL {} communicators over {} GPUs{}", version, size(),
               peer_ ? fmt::format("; sums of up to {} KiB over peer access", peer_all_reduce_bytes >> 10) : "");
}

NcclGroup::~NcclGroup() {
  std::unique_lock lock(calls_);
  for (auto& rank : ranks_)
    if (rank->comm != nullptr) nccl_library().comm_abort(rank->comm);
}

std::vector<DeviceCommunicator*> NcclGroup::communicators() const {
  std::vector<DeviceCommunicator*> pointers;
  for (const auto& rank : ranks_) pointers.push_back(rank.get());
  return pointers;
}

void NcclGroup::abort(int32_t failed_rank) {
  int32_t expected = -1;
  if (!failed_rank_.compare_exchange_strong(expected, std::max(failed_rank, 0))) return;  // already ended
  if (peer_ != nullptr) peer_->abort();  // ends the peer kernels waiting for the failed rank
  // Calls in progress see the flag and leave; then no rank is inside NCCL.
  std::unique_lock lock(calls_);
  spdlog::error("tensor parallelism: rank {} failed; aborting the NCCL communicators", failed_rank);
  for (auto& rank : ranks_) {
    if (rank->comm == nullptr) continue;
    nccl_library().comm_abort(rank->comm);
    rank->comm = nullptr;
  }
}

TensorParallelGroup nccl_tensor_parallel_group(std::shared_ptr<NcclGroup> group) {
  NcclGroup* raw = group.get();
  return TensorParallelGroup{[raw](int32_t failed_rank) { raw->abort(failed_rank); },
                             [] {},  // an aborted group stays ended (nccl_group.h)
                             std::move(group), AbortableBarrier::kAbortedPrefix};
}

}  // namespace loom::cuda
