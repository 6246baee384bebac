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
// Failure: abort() / reset() as util/abortable_barrier.h: a rank that fails
// ends every other rank's wait with an error.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "util/abortable_barrier.h"

namespace loom::cpu {

class InProcessGroup {
 public:
  static constexpr const char* kAbortedPrefix = AbortableBarrier::kAbortedPrefix;

  explicit InProcessGroup(int32_t size);

  int32_t size() const { return barrier_.size(); }
  // Rank `rank` (0 <= rank < size) of the collective; see above.
  void all_reduce_sum(int32_t rank, float* data, int64_t count);

  void abort(int32_t failed_rank) { barrier_.abort(failed_rank); }
  void reset() { barrier_.reset(); }

 private:
  AbortableBarrier barrier_;
  std::mutex mutex_;
  std::vector<float*> buffers_;
  std::vector<int64_t> counts_;
};

}  // namespace loom::cpu
