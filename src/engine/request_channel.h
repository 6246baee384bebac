// The pipes between the engine thread and the threads that submit requests.
//
//   submitter thread                          engine thread
//   Engine::submit ──► EngineInbox.new_requests ──► Scheduler
//   RequestStream::next ◄── RequestChannel.outputs ◄── per-step outputs (pushed by OutputDelivery's thread)
//   RequestStream::cancel ─► RequestChannel.cancelled + EngineInbox.wake()
//
// Both structs are shared (shared_ptr) so a stream outlives the engine safely.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "engine/engine.h"

namespace loom {

struct PendingRequest;  // engine_request.h

// Wakes the engine thread. Guarded by `mutex`.
struct EngineInbox {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::unique_ptr<PendingRequest>> new_requests;
  std::deque<std::function<void()>> commands;  // run on the engine thread
  bool cancel_pending = false;                  // some stream was cancelled
  bool stopping = false, drain = false;
  bool thread_exited = false;

  void wake_for_cancel() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      cancel_pending = true;
    }
    cv.notify_all();
  }
};

// Outputs of one request, from the engine to the stream's consumer.
struct RequestChannel {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<RequestOutput> outputs;
  bool finished_pushed = false;
  std::atomic<bool> cancelled{false};

  // Any thread (OutputDelivery's, or submit()'s for a request it ends at once);
  // one request's outputs come from one thread at a time, in order. Ignores
  // anything after a finished output.
  void push(RequestOutput output);
};

class ChannelRequestStream final : public RequestStream {
 public:
  ChannelRequestStream(std::string request_id, std::shared_ptr<RequestChannel> channel,
                       std::shared_ptr<EngineInbox> inbox)
      : request_id_(std::move(request_id)), channel_(std::move(channel)), inbox_(std::move(inbox)) {}
  ~ChannelRequestStream() override;
  std::optional<RequestOutput> next(std::chrono::milliseconds timeout) override;
  void cancel() override;
  const std::string& request_id() const override { return request_id_; }

 private:
  std::string request_id_;
  std::shared_ptr<RequestChannel> channel_;
  std::shared_ptr<EngineInbox> inbox_;
  bool saw_finished_ = false;
};

}  // namespace loom
