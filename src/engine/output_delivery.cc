#include "engine/output_delivery.h"

namespace loom {

OutputDelivery::OutputDelivery() : thread_([this] { run(); }) {}

OutputDelivery::~OutputDelivery() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
  for (auto& [channel, output] : gathered_) channel->push(std::move(output));
}

void OutputDelivery::add(std::shared_ptr<RequestChannel> channel, RequestOutput output) {
  gathered_.emplace_back(std::move(channel), std::move(output));
}

void OutputDelivery::send() {
  if (gathered_.empty()) return;
  if (synchronous_) {
    for (auto& [channel, output] : gathered_) channel->push(std::move(output));
    gathered_.clear();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (queue_.empty()) {
      queue_.push_back(std::move(gathered_));
    } else {  // the thread is behind: one batch longer rather than one more batch (same order)
      Batch& last = queue_.back();
      last.insert(last.end(), std::make_move_iterator(gathered_.begin()), std::make_move_iterator(gathered_.end()));
    }
  }
  gathered_.clear();
  work_cv_.notify_one();
}

void OutputDelivery::finish_async() {
  flush();
  synchronous_ = true;
}

void OutputDelivery::flush() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !pushing_; });
}

void OutputDelivery::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return !queue_.empty() || stopping_; });
    if (queue_.empty()) return;  // stopping, and everything pushed
    Batch batch = std::move(queue_.front());
    queue_.pop_front();
    pushing_ = true;
    lock.unlock();
    for (auto& [channel, output] : batch) channel->push(std::move(output));
    batch.clear();  // the channels' last references may go here, outside the lock
    lock.lock();
    pushing_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

}  // namespace loom
