#include "util/worker_pool.h"

#include <iterator>
#include <stdexcept>
#include <utility>

namespace loom {

WorkerPool::WorkerPool(size_t num_threads) {
  if (num_threads == 0) throw std::invalid_argument("WorkerPool needs at least one thread");
  threads_.reserve(num_threads);
  try {
    for (size_t i = 0; i < num_threads; ++i) threads_.emplace_back([this] { work(); });
  } catch (...) {
    stop();  // the threads already started
    throw;
  }
}

WorkerPool::~WorkerPool() { stop(); }

void WorkerPool::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

WorkerPool::Job WorkerPool::start(size_t n, std::function<void(size_t)> fn) {
  auto state = std::make_shared<JobState>();
  state->fn = std::move(fn);
  state->remaining = n;
  if (n == 0) return Job(std::move(state));
  // Entries are made before any is queued, so a failure queues nothing.
  std::deque<std::pair<std::shared_ptr<JobState>, size_t>> entries;
  for (size_t i = 0; i < n; ++i) entries.emplace_back(state, i);
  {
    std::lock_guard lock(mutex_);
    std::move(entries.begin(), entries.end(), std::back_inserter(queue_));
  }
  if (n == 1) ready_.notify_one();
  else ready_.notify_all();
  return Job(std::move(state));
}

void WorkerPool::work() {
  for (;;) {
    std::pair<std::shared_ptr<JobState>, size_t> task;
    {
      std::unique_lock lock(mutex_);
      ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left that a Job waits for
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    JobState& state = *task.first;
    std::exception_ptr error;
    try {
      state.fn(task.second);
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard lock(state.mutex);
    if (error && !state.error) state.error = error;
    if (--state.remaining == 0) state.done.notify_all();
  }
}

WorkerPool::Job& WorkerPool::Job::operator=(Job&& other) noexcept {
  if (this != &other) {
    wait_quietly();
    state_ = std::move(other.state_);
  }
  return *this;
}

WorkerPool::Job::~Job() { wait_quietly(); }

void WorkerPool::Job::wait() {
  if (!state_) return;
  std::unique_lock lock(state_->mutex);
  state_->done.wait(lock, [this] { return state_->remaining == 0; });
  if (state_->error) std::rethrow_exception(std::exchange(state_->error, nullptr));
}

void WorkerPool::Job::wait_quietly() noexcept {
  if (!state_) return;
  std::unique_lock lock(state_->mutex);
  state_->done.wait(lock, [this] { return state_->remaining == 0; });
}

}  // namespace loom
