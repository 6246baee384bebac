// A barrier for the N threads of a group that one of them can break: when a
// thread fails it calls abort(), and every thread waiting (or arriving later)
// throws Error(kInternal) whose message begins with kAbortedPrefix and names
// the failed rank, instead of waiting for ever. reset() rearms it, with no
// thread inside. Used by the tensor-parallel groups whose ranks are threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace loom {

class AbortableBarrier {
 public:
  static constexpr const char* kAbortedPrefix = "tensor-parallel group:";

  explicit AbortableBarrier(int32_t size);
  int32_t size() const { return size_; }
  // Blocks until all `size` threads arrived (or throws, see above).
  void arrive_and_wait();
  void abort(int32_t failed_rank);
  void reset();

 private:
  const int32_t size_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  int32_t num_arrived_ = 0;
  uint64_t generation_ = 0;
  int32_t failed_rank_ = -1;  // >= 0: aborted
};

}  // namespace loom
