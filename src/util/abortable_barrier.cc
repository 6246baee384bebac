#include "util/abortable_barrier.h"

#include "util/error.h"

namespace loom {

AbortableBarrier::AbortableBarrier(int32_t size) : size_(size) { LOOM_CHECK(size >= 1); }

void AbortableBarrier::arrive_and_wait() {
  std::unique_lock lock(mutex_);
  auto fail_if_aborted = [&] {
    if (failed_rank_ >= 0)
      fail(ErrorKind::kInternal, "{} rank {} failed, so the step ended on every rank", kAbortedPrefix, failed_rank_);
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

void AbortableBarrier::abort(int32_t failed_rank) {
  std::lock_guard lock(mutex_);
  if (failed_rank_ < 0) failed_rank_ = failed_rank;
  arrived_.notify_all();
}

void AbortableBarrier::reset() {
  std::lock_guard lock(mutex_);
  failed_rank_ = -1;
  num_arrived_ = 0;
}

}  // namespace loom
