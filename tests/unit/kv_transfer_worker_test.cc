// KvTransferWorker: per-direction ordering, loads never wait behind offloads,
// bounded queues, failed copies, wait_idle, wait_for_finished and shutdown with queued work, and
// transfers of both KvCacheGroup members (same ids) kept apart.
#include "engine/kv_transfer_worker.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "util/error.h"

namespace loom {
namespace {

using Kind = KvCacheManager::Transfer::Kind;
using Transfer = KvTransferWorker::Transfer;
using Finished = KvTransferWorker::Finished;

Transfer make_transfer(int64_t id, Kind kind, KvCacheId cache = KvCacheId::kMain) {
  Transfer planned;
  planned.cache = cache;
  planned.transfer.id = id;
  planned.transfer.kind = kind;
  planned.transfer.device_block_ids = {static_cast<int32_t>(id)};
  planned.transfer.host_block_ids = {static_cast<int32_t>(id)};
  return planned;
}

// A gate the copy function can block on until the test opens it.
class Gate {
 public:
  void wait() {
    std::unique_lock lock(mutex_);
    ++num_waiting_;
    changed_.notify_all();
    changed_.wait(lock, [this] { return open_; });
  }
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  // Blocks until `count` copies wait at the gate.
  void wait_for_waiters(int count) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return num_waiting_ >= count; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int num_waiting_ = 0;
  bool open_ = false;
};

std::vector<int64_t> ids_of(const std::vector<Finished>& finished) {
  std::vector<int64_t> ids;
  for (const Finished& f : finished) ids.push_back(f.transfer_id);
  return ids;
}

std::vector<int64_t> ids_of_kind(const std::vector<Finished>& finished, const std::vector<Kind>& kind_of_id,
                                 Kind kind) {
  std::vector<int64_t> ids;
  for (const Finished& f : finished)
    if (kind_of_id[f.transfer_id] == kind) ids.push_back(f.transfer_id);
  return ids;
}

TEST(KvTransferWorker, KeepsSubmissionOrderPerDirection) {
  std::mutex mutex;
  std::vector<int64_t> copied;
  KvTransferWorker worker(
      [&](const Transfer& transfer) {
        std::lock_guard lock(mutex);
        copied.push_back(transfer.transfer.id);
      },
      16);
  std::vector<Kind> kind_of_id;
  for (int64_t id = 0; id < 12; ++id) {
    kind_of_id.push_back(id % 3 == 0 ? Kind::kLoad : Kind::kOffload);
    ASSERT_TRUE(worker.submit(make_transfer(id, kind_of_id.back())));
  }
  worker.wait_idle();
  const std::vector<Finished> finished = worker.take_finished();
  ASSERT_EQ(finished.size(), 12u);
  for (const Finished& f : finished) EXPECT_TRUE(f.succeeded) << f.transfer_id;
  EXPECT_EQ(ids_of_kind(finished, kind_of_id, Kind::kLoad), (std::vector<int64_t>{0, 3, 6, 9}));
  EXPECT_EQ(ids_of_kind(finished, kind_of_id, Kind::kOffload), (std::vector<int64_t>{1, 2, 4, 5, 7, 8, 10, 11}));
  // Within a direction, completion order is the order the copies ended (the
  // two directions' threads interleave in any order).
  for (Kind kind : {Kind::kLoad, Kind::kOffload}) {
    std::vector<int64_t> copied_of_kind;
    for (int64_t id : copied)
      if (kind_of_id[static_cast<size_t>(id)] == kind) copied_of_kind.push_back(id);
    EXPECT_EQ(ids_of_kind(finished, kind_of_id, kind), copied_of_kind);
  }
  std::vector<int64_t> finished_ids = ids_of(finished), copied_ids = copied;
  std::sort(finished_ids.begin(), finished_ids.end());
  std::sort(copied_ids.begin(), copied_ids.end());
  EXPECT_EQ(finished_ids, copied_ids);
  EXPECT_TRUE(worker.take_finished().empty());
  EXPECT_EQ(worker.num_pending(), 0);
}

TEST(KvTransferWorker, LoadFinishesWhileAnOffloadIsStuck) {
  Gate offload_gate;
  KvTransferWorker worker(
      [&](const Transfer& transfer) {
        if (transfer.transfer.kind == Kind::kOffload) offload_gate.wait();
      },
      4);
  ASSERT_TRUE(worker.submit(make_transfer(1, Kind::kOffload)));
  ASSERT_TRUE(worker.submit(make_transfer(2, Kind::kOffload)));
  offload_gate.wait_for_waiters(1);
  ASSERT_TRUE(worker.submit(make_transfer(3, Kind::kLoad)));

  std::vector<Finished> finished;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (finished.empty() && std::chrono::steady_clock::now() < deadline) {
    finished = worker.take_finished();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[0].transfer_id, 3);
  EXPECT_TRUE(finished[0].succeeded);
  EXPECT_EQ(worker.num_pending(), 2);

  offload_gate.open();
  worker.wait_idle();
  EXPECT_EQ(ids_of(worker.take_finished()), (std::vector<int64_t>{1, 2}));
}

// The blocking host-load policy's wait: the load that ends, while an offload is stuck, ends it.
TEST(KvTransferWorker, WaitForFinishedReturnsWhenOneTransferEnds) {
  KvTransferWorker idle([](const Transfer&) {}, 4);
  idle.wait_for_finished();  // nothing submitted: at once
  Gate offload_gate, load_gate;
  KvTransferWorker worker(
      [&](const Transfer& transfer) {
        (transfer.transfer.kind == Kind::kOffload ? offload_gate : load_gate).wait();
      },
      4);
  ASSERT_TRUE(worker.submit(make_transfer(1, Kind::kOffload)));
  ASSERT_TRUE(worker.submit(make_transfer(2, Kind::kLoad)));
  load_gate.wait_for_waiters(1);
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    worker.wait_for_finished();
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(returned);  // both copies still running
  load_gate.open();
  waiter.join();
  EXPECT_EQ(ids_of(worker.take_finished()), std::vector<int64_t>{2});
  offload_gate.open();
  worker.wait_idle();
  worker.wait_for_finished();  // one ended and not taken: at once
  EXPECT_EQ(ids_of(worker.take_finished()), std::vector<int64_t>{1});
  worker.wait_for_finished();  // none in flight: at once
}

TEST(KvTransferWorker, FullQueueRefusesWithoutQueuing) {
  Gate gate;
  std::atomic<int> num_copies{0};
  KvTransferWorker worker(
      [&](const Transfer&) {
        gate.wait();
        ++num_copies;
      },
      2);
  // One copying (out of the queue), two waiting: the queue is full.
  ASSERT_TRUE(worker.submit(make_transfer(1, Kind::kOffload)));
  gate.wait_for_waiters(1);
  ASSERT_TRUE(worker.submit(make_transfer(2, Kind::kOffload)));
  ASSERT_TRUE(worker.submit(make_transfer(3, Kind::kOffload)));
  EXPECT_FALSE(worker.submit(make_transfer(4, Kind::kOffload)));
  // The other direction has its own queue.
  ASSERT_TRUE(worker.submit(make_transfer(5, Kind::kLoad)));
  ASSERT_TRUE(worker.submit(make_transfer(6, Kind::kLoad)));
  EXPECT_EQ(worker.num_pending(), 5);

  gate.open();
  worker.wait_idle();
  const std::vector<Finished> finished = worker.take_finished();
  EXPECT_EQ(num_copies.load(), 5);
  ASSERT_EQ(finished.size(), 5u);
  for (const Finished& f : finished) EXPECT_NE(f.transfer_id, 4);
  // Room again once drained.
  EXPECT_TRUE(worker.submit(make_transfer(7, Kind::kOffload)));
  worker.wait_idle();
  EXPECT_EQ(ids_of(worker.take_finished()), (std::vector<int64_t>{7}));
}

TEST(KvTransferWorker, ThrowingCopyMarksTheTransferFailed) {
  KvTransferWorker worker(
      [](const Transfer& transfer) {
        if (transfer.transfer.id == 2) throw Error(ErrorKind::kInvalidArgument, "host block 99 outside a pool of 8");
        if (transfer.transfer.id == 3) throw 42;  // not even a std::exception
      },
      4);
  for (int64_t id = 1; id <= 4; ++id) ASSERT_TRUE(worker.submit(make_transfer(id, Kind::kLoad)));
  worker.wait_idle();
  const std::vector<Finished> finished = worker.take_finished();
  ASSERT_EQ(finished.size(), 4u);
  EXPECT_EQ(ids_of(finished), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_TRUE(finished[0].succeeded);
  EXPECT_FALSE(finished[1].succeeded);
  EXPECT_FALSE(finished[2].succeeded);
  EXPECT_TRUE(finished[3].succeeded);
}

TEST(KvTransferWorker, WaitIdleWaitsForSlowCopies) {
  std::atomic<int> num_done{0};
  KvTransferWorker worker(
      [&](const Transfer&) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        ++num_done;
      },
      8);
  for (int64_t id = 0; id < 3; ++id) ASSERT_TRUE(worker.submit(make_transfer(id, Kind::kOffload)));
  ASSERT_TRUE(worker.submit(make_transfer(3, Kind::kLoad)));
  worker.wait_idle();
  EXPECT_EQ(num_done.load(), 4);
  EXPECT_EQ(worker.num_pending(), 4);  // ended, not taken yet
  EXPECT_EQ(worker.take_finished().size(), 4u);
  EXPECT_EQ(worker.num_pending(), 0);
  worker.wait_idle();  // nothing in flight: returns at once
}

TEST(KvTransferWorker, DestructorRunsQueuedTransfers) {
  Gate gate;
  std::atomic<int> num_copies{0};
  std::thread opener;
  {
    KvTransferWorker worker(
        [&](const Transfer& transfer) {
          if (transfer.transfer.id == 0) gate.wait();
          ++num_copies;
        },
        8);
    for (int64_t id = 0; id < 5; ++id) ASSERT_TRUE(worker.submit(make_transfer(id, Kind::kOffload)));
    for (int64_t id = 5; id < 8; ++id) ASSERT_TRUE(worker.submit(make_transfer(id, Kind::kLoad)));
    gate.wait_for_waiters(1);
    // Opened later, from another thread, while the destructor waits.
    opener = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      gate.open();
    });
  }
  opener.join();
  EXPECT_EQ(num_copies.load(), 8);
}

// Transfer ids are per member: the main and the residual member both plan a
// transfer 1. Each copy sees its member (the pool it copies), and each comes
// back named by it, with its own outcome.
TEST(KvTransferWorker, KeepsTheMembersTransfersApart) {
  std::mutex mutex;
  std::vector<std::pair<KvCacheId, int64_t>> copied;
  KvTransferWorker worker(
      [&](const Transfer& planned) {
        {
          std::lock_guard lock(mutex);
          copied.emplace_back(planned.cache, planned.transfer.id);
        }
        if (planned.cache == KvCacheId::kResidual && planned.transfer.kind == Kind::kLoad)
          throw Error(ErrorKind::kInternal, "residual load fails");
      },
      4);
  ASSERT_TRUE(worker.submit(make_transfer(1, Kind::kOffload, KvCacheId::kMain)));
  ASSERT_TRUE(worker.submit(make_transfer(1, Kind::kOffload, KvCacheId::kResidual)));
  ASSERT_TRUE(worker.submit(make_transfer(2, Kind::kLoad, KvCacheId::kResidual)));
  ASSERT_TRUE(worker.submit(make_transfer(2, Kind::kLoad, KvCacheId::kMain)));
  worker.wait_idle();
  std::vector<Finished> finished = worker.take_finished();
  ASSERT_EQ(finished.size(), 4u);
  auto by_member_and_id = [](const Finished& a, const Finished& b) {
    return std::make_pair(a.cache, a.transfer_id) < std::make_pair(b.cache, b.transfer_id);
  };
  std::sort(finished.begin(), finished.end(), by_member_and_id);
  const std::vector<std::pair<KvCacheId, int64_t>> expected = {
      {KvCacheId::kMain, 1}, {KvCacheId::kMain, 2}, {KvCacheId::kResidual, 1}, {KvCacheId::kResidual, 2}};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(finished[i].cache, expected[i].first) << i;
    EXPECT_EQ(finished[i].transfer_id, expected[i].second) << i;
  }
  EXPECT_TRUE(finished[0].succeeded);
  EXPECT_TRUE(finished[1].succeeded);
  EXPECT_TRUE(finished[2].succeeded);
  EXPECT_FALSE(finished[3].succeeded);  // only the residual member's load failed
  std::sort(copied.begin(), copied.end());
  EXPECT_EQ(copied, expected);
}

TEST(KvTransferWorker, RejectsBadConstruction) {
  EXPECT_THROW(KvTransferWorker([](const Transfer&) {}, 0), Error);
  EXPECT_THROW(KvTransferWorker(nullptr, 4), Error);
}

}  // namespace
}  // namespace loom
