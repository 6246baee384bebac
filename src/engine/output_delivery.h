// The engine's outputs on their way to the requests' streams: gathered during
// a loop iteration, then pushed into each request's RequestChannel by a thread
// of its own, so that the engine thread does not pay the wake-up of every
// stream's reader (one futex wake each: at 256 streams about 1 ms of each
// step; bench/README.md "The engine's own time per decode step").
//
// Order: batches are pushed in the order they were sent, so every channel sees
// its outputs in the order they were added. After finish_async() everything
// queued has been pushed and later sends push on the caller's thread (the
// engine thread has exited; commands then run on their callers' threads).
//
// Thread: add() and send() from one thread at a time (the engine thread, or a
// caller holding the engine's inbox lock once it has exited); the delivery
// thread is internal. Owns that thread: the destructor pushes what is queued,
// then joins it.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "engine/request_channel.h"

namespace loom {

class OutputDelivery {
 public:
  OutputDelivery();
  ~OutputDelivery();
  OutputDelivery(const OutputDelivery&) = delete;
  OutputDelivery& operator=(const OutputDelivery&) = delete;

  // Gathers one output for `channel` (pushed by the next send()).
  void add(std::shared_ptr<RequestChannel> channel, RequestOutput output);
  // Hands what add() gathered to the delivery thread; returns at once. After
  // finish_async(): pushes it on this thread instead.
  void send();
  // Returns once every output sent so far is in its channel; later sends push
  // on the caller's thread.
  void finish_async();

 private:
  using Batch = std::vector<std::pair<std::shared_ptr<RequestChannel>, RequestOutput>>;
  void run();
  void flush();

  Batch gathered_;  // add()'s, not yet sent
  bool synchronous_ = false;

  std::mutex mutex_;
  std::condition_variable work_cv_;  // a batch queued, or stopping
  std::condition_variable idle_cv_;  // the queue drained and nothing being pushed
  std::deque<Batch> queue_;          // guarded by mutex_
  bool pushing_ = false, stopping_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace loom
