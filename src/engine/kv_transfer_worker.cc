#include "engine/kv_transfer_worker.h"

#include <exception>

#include <spdlog/spdlog.h>

#include "util/error.h"

namespace loom {

KvTransferWorker::KvTransferWorker(CopyFunction copy, int32_t max_queued_per_direction)
    : copy_(std::move(copy)), max_queued_per_direction_(max_queued_per_direction) {
  if (!copy_) fail(ErrorKind::kInvalidArgument, "kv transfer worker: no copy function given");
  if (max_queued_per_direction_ <= 0)
    fail(ErrorKind::kInvalidArgument, "kv transfer worker: max_queued_per_direction is {}", max_queued_per_direction_);
  loads_.name = "load";
  offloads_.name = "offload";
  disk_reads_.name = "disk read";
  // Started last: run() reads the members above.
  loads_.thread = std::thread([this] { run(loads_); });
  offloads_.thread = std::thread([this] { run(offloads_); });
  disk_reads_.thread = std::thread([this] { run(disk_reads_); });
}

KvTransferWorker::~KvTransferWorker() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  loads_.has_work.notify_all();
  offloads_.has_work.notify_all();
  disk_reads_.has_work.notify_all();
  // Each thread empties its queue before it returns (see run()).
  loads_.thread.join();
  offloads_.thread.join();
  disk_reads_.thread.join();
}

bool KvTransferWorker::submit(Transfer transfer) {
  Lane& lane = lane_of(transfer.transfer.kind);
  {
    std::lock_guard lock(mutex_);
    if (static_cast<int32_t>(lane.queue.size()) >= max_queued_per_direction_) return false;
    lane.queue.push_back(std::move(transfer));
    ++num_unfinished_;
  }
  lane.has_work.notify_one();
  return true;
}

std::vector<KvTransferWorker::Finished> KvTransferWorker::take_finished() {
  std::lock_guard lock(mutex_);
  std::vector<Finished> taken;
  taken.swap(finished_);
  return taken;
}

void KvTransferWorker::wait_idle() {
  std::unique_lock lock(mutex_);
  copy_ended_.wait(lock, [this] { return num_unfinished_ == 0; });
}

void KvTransferWorker::wait_for_finished() {
  std::unique_lock lock(mutex_);
  copy_ended_.wait(lock, [this] { return !finished_.empty() || num_unfinished_ == 0; });
}

int32_t KvTransferWorker::num_pending() const {
  std::lock_guard lock(mutex_);
  return num_unfinished_ + static_cast<int32_t>(finished_.size());
}

void KvTransferWorker::run(Lane& lane) {
  std::unique_lock lock(mutex_);
  while (true) {
    lane.has_work.wait(lock, [&] { return stopping_ || !lane.queue.empty(); });
    if (lane.queue.empty()) return;  // stopping, and nothing left to copy
    Transfer transfer = std::move(lane.queue.front());
    lane.queue.pop_front();
    lock.unlock();
    bool succeeded = true;
    try {
      copy_(transfer);
    } catch (const std::exception& error) {
      succeeded = false;
      spdlog::warn("kv transfer {} of the {} cache ({} of {} blocks) failed: {}", transfer.transfer.id,
                   kv_cache_name(transfer.cache), lane.name, transfer.transfer.host_block_ids.size(), error.what());
    } catch (...) {
      succeeded = false;
      spdlog::warn("kv transfer {} of the {} cache ({} of {} blocks) failed with an unknown exception",
                   transfer.transfer.id, kv_cache_name(transfer.cache), lane.name,
                   transfer.transfer.host_block_ids.size());
    }
    lock.lock();
    finished_.push_back({transfer.cache, transfer.transfer.id, succeeded});
    --num_unfinished_;
    copy_ended_.notify_all();
  }
}

}  // namespace loom
