#include "engine/request_channel.h"

namespace loom {

void RequestChannel::push(RequestOutput output) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (finished_pushed) return;
    finished_pushed = output.finished;
    outputs.push_back(std::move(output));
  }
  cv.notify_all();
}

ChannelRequestStream::~ChannelRequestStream() {
  if (!saw_finished_) cancel();
}

std::optional<RequestOutput> ChannelRequestStream::next(std::chrono::milliseconds timeout) {
  if (saw_finished_) return std::nullopt;
  std::unique_lock<std::mutex> lock(channel_->mutex);
  if (!channel_->cv.wait_for(lock, timeout, [&] { return !channel_->outputs.empty(); })) return std::nullopt;
  RequestOutput output = std::move(channel_->outputs.front());
  channel_->outputs.pop_front();
  if (output.finished) saw_finished_ = true;
  return output;
}

void ChannelRequestStream::cancel() {
  if (channel_->cancelled.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(channel_->mutex);
    if (channel_->finished_pushed) return;  // nothing left to cancel
  }
  inbox_->wake_for_cancel();
}

}  // namespace loom
