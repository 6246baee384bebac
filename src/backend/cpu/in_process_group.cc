#include "backend/cpu/in_process_group.h"

#include "util/error.h"

namespace loom::cpu {

InProcessGroup::InProcessGroup(int32_t size) : barrier_(size), buffers_(size), counts_(size) {}

void InProcessGroup::all_reduce_sum(int32_t rank, float* data, int64_t count) {
  const int32_t size = barrier_.size();
  LOOM_CHECK(rank >= 0 && rank < size);
  if (size == 1) return;
  {
    std::lock_guard lock(mutex_);
    buffers_[rank] = data;
    counts_[rank] = count;
  }
  barrier_.arrive_and_wait();
  for (int32_t other = 0; other < size; ++other)
    if (counts_[other] != count) {
      abort(rank);
      fail(ErrorKind::kInternal, "tensor-parallel all-reduce: rank {} gave {} values, rank {} {}", rank, count, other,
           counts_[other]);
    }
  const int64_t begin = count * rank / size, end = count * (rank + 1) / size;
  for (int64_t i = begin; i < end; ++i) {
    float sum = buffers_[0][i];
    for (int32_t other = 1; other < size; ++other) sum += buffers_[other][i];
    for (int32_t other = 0; other < size; ++other) buffers_[other][i] = sum;
  }
  barrier_.arrive_and_wait();  // no rank reads its buffer before every segment is written
}

}  // namespace loom::cpu
