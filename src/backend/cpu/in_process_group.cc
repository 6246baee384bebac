#include "backend/cpu/in_process_group.h"

#include "util/error.h"

namespace loom::cpu {

InProcessGroup::InProcessGroup(int32_t size) : size_(size), buffers_(size), counts_(size) { LOOM_CHECK(size >= 1); }

void InProcessGroup::arrive_and_wait() {
  std::unique_lock lock(mutex_);
  auto fail_if_aborted = [&] {
    if (failed_rank_ >= 0)
      fail(ErrorKind::kInternal, "tensor-parallel group: rank {} failed, so the step ended on every rank",
           failed_rank_);
  };
  fail_if_aborted();
  const uint64_t generation = generation_;
  if (++num_arrived_ == size_) {
    num_arrived_ = 0;
    ++generation_;
    arrived_.notify_all();
    return;
  }
  arrived_.wait(lock, [&] { return generation_ != generation || failed_rank_ >= 0; });
  if (generation_ == generation) fail_if_aborted();
}

void InProcessGroup::all_reduce_sum(int32_t rank, float* data, int64_t count) {
  LOOM_CHECK(rank >= 0 && rank < size_);
  if (size_ == 1) return;
  {
    std::lock_guard lock(mutex_);
    buffers_[rank] = data;
    counts_[rank] = count;
  }
  arrive_and_wait();
  for (int32_t other = 0; other < size_; ++other)
    if (counts_[other] != count) {
      abort(rank);
      fail(ErrorKind::kInternal, "tensor-parallel all-reduce: rank {} gave {} values, rank {} {}", rank, count, other,
           counts_[other]);
    }
  const int64_t begin = count * rank / size_, end = count * (rank + 1) / size_;
  for (int64_t i = begin; i < end; ++i) {
    float sum = buffers_[0][i];
    for (int32_t other = 1; other < size_; ++other) sum += buffers_[other][i];
    for (int32_t other = 0; other < size_; ++other) buffers_[other][i] = sum;
  }
  arrive_and_wait();  // no rank reads its buffer before every segment is written
}

void InProcessGroup::abort(int32_t failed_rank) {
  std::lock_guard lock(mutex_);
  if (failed_rank_ < 0) failed_rank_ = failed_rank;
  arrived_.notify_all();
}

void InProcessGroup::reset() {
  std::lock_guard lock(mutex_);
  failed_rank_ = -1;
  num_arrived_ = 0;
}

}  // namespace loom::cpu
