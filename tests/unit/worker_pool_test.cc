// util/worker_pool.h: every index runs once, jobs from several threads share
// the workers, wait() rethrows the first exception, a Job waits on destruction.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "util/worker_pool.h"

namespace loom {
namespace {

TEST(WorkerPool, RunsEveryIndexOnceAcrossJobsAndThreads) {
  WorkerPool pool(3);
  EXPECT_EQ(pool.num_threads(), 3u);
  std::vector<std::atomic<int>> hits(1000);
  std::vector<std::thread> starters;
  for (int s = 0; s < 4; ++s)
    starters.emplace_back([&, s] {
      for (int round = 0; round < 5; ++round)
        pool.start(50, [&, s](size_t i) { hits[static_cast<size_t>(s) * 250 + round * 50 + i].fetch_add(1); }).wait();
    });
  for (std::thread& thread : starters) thread.join();
  for (size_t i = 0; i < hits.size(); ++i) EXPECT_EQ(hits[i].load(), 1) << i;
  pool.start(0, [](size_t) { FAIL() << "an empty job runs nothing"; }).wait();
}

TEST(WorkerPool, WaitRethrowsTheFirstErrorAfterEveryCallRan) {
  WorkerPool pool(2);
  std::atomic<int> ran{0};
  WorkerPool::Job job = pool.start(20, [&](size_t i) {
    ran.fetch_add(1);
    if (i % 7 == 3) throw std::runtime_error("bad row");
  });
  EXPECT_THROW(job.wait(), std::runtime_error);
  EXPECT_EQ(ran.load(), 20);
  job.wait();  // the error is reported once
}

TEST(WorkerPool, AJobWaitsWhenDestroyed) {
  WorkerPool pool(2);
  std::atomic<int> ran{0};
  {
    WorkerPool::Job job = pool.start(8, [&](size_t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      ran.fetch_add(1);
    });
  }
  EXPECT_EQ(ran.load(), 8);
}

}  // namespace
}  // namespace loom
