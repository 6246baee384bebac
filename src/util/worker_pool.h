// A fixed set of worker threads for host work that runs every engine step
// beside or after the device's forward (structured-output masks, host
// sampling): starting threads per step (std::async) costs tens of µs each,
// a noticeable part of a decode step at 64 streams.
//
// start(n, fn) queues fn(0) .. fn(n - 1) and returns at once (or throws,
// having queued nothing); the Job's wait() blocks until all have run and
// rethrows the first exception one threw. Calls of one job may run on any
// worker, in any order, concurrently. A Job must be waited for before what fn
// refers to goes away (its destructor waits). Any thread but the pool's own
// workers may start and wait for jobs (a worker waiting on a job could wait on
// itself); the pool must outlive its jobs.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace loom {

class WorkerPool {
  struct JobState;

 public:
  explicit WorkerPool(size_t num_threads);  // num_threads >= 1
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  class Job {
   public:
    Job() = default;
    Job(Job&&) = default;
    Job& operator=(Job&& other) noexcept;
    ~Job();
    // Blocks until every call ran; rethrows the first exception (once).
    void wait();

   private:
    friend class WorkerPool;
    explicit Job(std::shared_ptr<JobState> state) : state_(std::move(state)) {}
    void wait_quietly() noexcept;
    std::shared_ptr<JobState> state_;
  };

  Job start(size_t n, std::function<void(size_t)> fn);
  size_t num_threads() const { return threads_.size(); }

 private:
  struct JobState {
    std::function<void(size_t)> fn;
    size_t remaining = 0;
    std::exception_ptr error;
    std::mutex mutex;
    std::condition_variable done;
  };
  void work();
  void stop();  // lets the workers drain the queue and joins them

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::pair<std::shared_ptr<JobState>, size_t>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace loom
