// The threads a KV endpoint starts per connection or transfer: each one
// joined at the next start() once it has finished (so a long-lived server
// does not pile up ended threads), the rest taken out at shutdown.
//
// Not thread-safe: the owner guards it with its own mutex, and joins what
// take_all() returns outside that mutex.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

namespace loom::kvlink {

class WorkerThreads {
 public:
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;  // set when the job returned
  };

  void start(std::function<void()> job) {
    reap_finished();
    auto done = std::make_shared<std::atomic<bool>>(false);
    workers_.push_back({std::thread([job = std::move(job), done] {
                          job();
                          *done = true;
                        }),
                        done});
  }

  std::vector<Worker> take_all() { return std::exchange(workers_, {}); }

 private:
  void reap_finished() {
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (*it->done) {
        it->thread.join();
        it = workers_.erase(it);
      } else {
        ++it;
      }
    }
  }

  std::vector<Worker> workers_;
};

}  // namespace loom::kvlink
