// Executes the KV cache group's host- and disk-tier transfers (kv_cache_manager.h
// "Host tier", "Disk tier") off the engine thread: a loader thread for host ->
// device loads, an offloader thread for device -> host backups (and their
// write-through to disk), a reader thread for disk -> host reads, each behind
// a bounded queue, so a slow copy never blocks a step, loads never queue
// behind backups, and a slow disk never holds up a host load.
//
//   engine thread:  group.take_transfers() -> submit() ... take_finished() -> group.finish_transfer()
//   loader:         pops a load,      copy(transfer), pushes (member, id, ok)
//   offloader:      pops an offload,  copy(transfer), pushes (member, id, ok)
//   disk reader:    pops a disk read, copy(transfer), pushes (member, id, ok)
//
// Every transfer names the KvCacheGroup member that planned it (MemberTransfer):
// `copy` reads it to pick the pool (KvPoolKind::kMain or kResidual), and it
// comes back in Finished, since transfer ids are only unique per member. The
// members share the two threads and their queues (a direction's copies run one
// at a time whatever their pool).
//
// `copy` runs on the worker threads and must follow Backend::copy_kv_blocks's
// threading rules (one call per direction at a time, which the one thread per
// direction gives). An exception from it marks the transfer failed (the
// manager then falls back to recompute); it is logged, never rethrown.
//
// Thread: submit / take_finished / wait_idle / the destructor on the engine
// thread only. The destructor waits for queued transfers (they hold blocks the
// backend may be about to free) and joins both threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "kv/kv_cache_group.h"

namespace loom {

class KvTransferWorker {
 public:
  using Transfer = KvCacheGroup::MemberTransfer;
  using CopyFunction = std::function<void(const Transfer&)>;
  struct Finished {
    KvCacheId cache = KvCacheId::kMain;
    int64_t transfer_id = 0;
    bool succeeded = false;
  };

  // max_queued_per_direction > 0: transfers waiting (not yet copying) per direction.
  KvTransferWorker(CopyFunction copy, int32_t max_queued_per_direction);
  ~KvTransferWorker();
  KvTransferWorker(const KvTransferWorker&) = delete;
  KvTransferWorker& operator=(const KvTransferWorker&) = delete;

  // Queues a transfer for its direction's thread. Returns false, queuing
  // nothing, when that queue is full: the caller finishes it as failed.
  bool submit(Transfer transfer);
  // Transfers whose copy ended since the last call, in the order they ended.
  std::vector<Finished> take_finished();
  // Blocks until every submitted transfer has ended (they stay in
  // take_finished()). For reallocating pools and for tests.
  void wait_idle();
  // Blocks until a transfer has ended that take_finished() has not returned yet, or none is
  // submitted and unfinished.
  void wait_for_finished();
  // Submitted and not yet taken by take_finished().
  int32_t num_pending() const;

 private:
  // One direction: its queue and the thread that drains it.
  struct Lane {
    const char* name = "";
    std::deque<Transfer> queue;  // waiting, not yet copying
    std::condition_variable has_work;
    std::thread thread;
  };
  Lane& lane_of(KvCacheManager::Transfer::Kind kind) {
    switch (kind) {
      case KvCacheManager::Transfer::Kind::kLoad: return loads_;
      case KvCacheManager::Transfer::Kind::kDiskRead: return disk_reads_;
      case KvCacheManager::Transfer::Kind::kOffload: break;
    }
    return offloads_;
  }
  void run(Lane& lane);

  const CopyFunction copy_;
  const int32_t max_queued_per_direction_;

  mutable std::mutex mutex_;  // guards everything below except the threads
  std::condition_variable copy_ended_;
  std::vector<Finished> finished_;  // ended, not yet taken
  int32_t num_unfinished_ = 0;      // submitted, copy not ended
  bool stopping_ = false;
  Lane loads_;
  Lane offloads_;
  Lane disk_reads_;
};

}  // namespace loom
