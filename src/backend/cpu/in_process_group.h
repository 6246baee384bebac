// The collectives of a tensor-parallel group whose ranks are threads of one
// process (the CPU backend's ranks, tensor_parallel_cpu_backend.h): shared
// memory and a barrier, no copies beyond the sum itself.
//
// all_reduce_sum: every rank of the group calls it with its own buffer of the
// same length; on return every buffer holds the elementwise sum, added in rank
// order (0 + 1 + ... + N-1), so all ranks hold the same bits. Each rank sums
// its own segment of the buffers and writes it into all of them (reduce-scatter
// and all-gather in one pass); two barriers per call.
//
// Failure: a rank that fails calls abort(); every rank waiting in a collective,
// or entering one later, then throws Error(kInternal) naming the failed rank
// instead of waiting for ever. reset() (no rank inside a collective) rearms it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

namespace loom::cpu {

class InProcessGroup {
 public:
  explicit InProcessGroup(int32_t size);

  // The message of the error a rank waiting on an aborted group throws begins so.
  static constexpr const char* kAbortedPrefix = "tensor-parallel group:";

  int32_t size() const { return size_; }
  // Rank `rank` (0 <= rank < size) of the collective; see above.
  void all_reduce_sum(int32_t rank, float* data, int64_t count);

  void abort(int32_t failed_rank);
  void reset();

 private:
  // Waits until every rank arrived; throws when the group is (or gets) aborted.
  void arrive_and_wait();

  const int32_t size_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  int32_t num_arrived_ = 0;
  uint64_t generation_ = 0;
  int32_t failed_rank_ = -1;  // >= 0: aborted
  std::vector<float*> buffers_;
  std::vector<int64_t> counts_;
};

}  // namespace loom::cpu
