// The engine thread's loop: inbox, admission, the requests' ends and the
// once-per-iteration publish (EngineImpl's private half; see engine_impl.h).
#include <spdlog/spdlog.h>

#include "engine/engine_impl.h"

namespace loom {

namespace {

constexpr std::chrono::milliseconds kIntegrityCheckDelay{1000};

double seconds_between(SteadyTime from, SteadyTime to) { return std::chrono::duration<double>(to - from).count(); }

}  // namespace

void EngineImpl::thread_main() {
  for (;;) {
    InboxBatch input = take_inbox();
    pools_.pump_transfers();
    for (auto& command : input.commands) command();  // packaged tasks: exceptions go to the caller
    for (auto& request : input.new_requests) admit(std::move(request));
    poll_device_kv();
    handle_cancellations();
    if (input.stopping && !input.drain) {
      fail_all(Error(ErrorKind::kUnavailable, "the engine is shutting down", "retry on another server"));
      break;
    }
    const bool has_work = scheduler_->has_work();
    if (has_work) step();
    if (kv_receiver_) kv_receiver_->release_claimed();  // the step admitted their requests: they hold the blocks now
    publish();
    if (!has_work && input.stopping) break;
  }
  // From here on run_on_engine_thread runs commands on its caller's thread,
  // under the inbox lock: the last commands and publish() take it too, so
  // that nothing runs beside them.
  std::lock_guard<std::mutex> lock(inbox_->mutex);
  inbox_->thread_exited = true;
  outputs_.finish_async();  // every output so far in its stream; later ones pushed by whoever publishes them
  for (auto& command : inbox_->commands) command();
  inbox_->commands.clear();
  publish();
}

EngineImpl::InboxBatch EngineImpl::take_inbox() {
  InboxBatch input;
  std::unique_lock<std::mutex> lock(inbox_->mutex);
  auto has_input = [&] {
    return !inbox_->new_requests.empty() || !inbox_->commands.empty() || inbox_->cancel_pending || inbox_->stopping;
  };
  if (!scheduler_->has_work() && !has_input() && kv_receiver_ && kv_receiver_->has_pending()) {
    // Device KV transfers landing or parked requests waiting: come back to poll them.
    inbox_->cv.wait_for(lock, std::chrono::milliseconds(1), has_input);
  } else if (!scheduler_->has_work() && !has_input() && pools_.has_transfers_in_flight()) {
    // Idle but copying: come back soon to apply the finished transfers.
    inbox_->cv.wait_for(lock, std::chrono::milliseconds(1), has_input);
  } else if (!scheduler_->has_work() && !has_input()) {
    // The integrity check walks every block of every pool (~0.2 s for a large
    // CPU pool) and nothing else runs meanwhile: only once the idle spell
    // lasted kIntegrityCheckDelay, so that a request or a command (a device KV
    // reservation) arriving right after the last request ended does not wait for it.
    if (!inbox_->cv.wait_for(lock, kIntegrityCheckDelay, has_input)) {
      check_integrity_once();
      inbox_->cv.wait(lock, has_input);
    }
  }
  input.new_requests.swap(inbox_->new_requests);
  input.commands.swap(inbox_->commands);
  num_in_inbox_ -= static_cast<int32_t>(input.new_requests.size());
  inbox_->cancel_pending = false;
  input.stopping = inbox_->stopping;
  input.drain = inbox_->drain;
  idle_checked_ = false;
  return input;
}

void EngineImpl::check_integrity_once() {
  if (idle_checked_) return;
  idle_checked_ = true;
  const std::string problem = pools_.caches().integrity_error();
  if (!problem.empty()) spdlog::error("KV cache integrity check failed: {}", problem);
}

void EngineImpl::admit(std::unique_ptr<PendingRequest> request) {
  const int64_t id = request->id;
  any_request_admitted_ = true;
  if (kv_receiver_ && kv_receiver_->park_if_waiting(request)) return;  // admitted once its transfer settles
  if (request->request.device_kv_send) {
    if (kv_sender_) kv_sender_->start(id, *request->request.device_kv_send, static_cast<int32_t>(request->request.prompt_tokens.size()));
    else spdlog::warn("{}: a device KV send, but this engine has no device KV plane: not sent", request->request_id);
  }
  workflow_sync_.observe_hints(*request);
  scheduler_->add(id, request->request.prompt_tokens, request->kv_plan.scheduler_adapter, request->kv_plan.kv,
                  request->request.priority);
  active_.emplace(id, std::move(request));
}

void EngineImpl::poll_device_kv() {
  if (!kv_receiver_) return;
  kv_receiver_->poll();
  for (auto& request : kv_receiver_->take_ready()) admit(std::move(request));
  for (auto& request : kv_receiver_->take_cancelled()) {
    RequestOutput output = request->failed(Error(ErrorKind::kCancelled, "the request was cancelled"));
    end_unscheduled(std::move(request), std::move(output));
  }
}

void EngineImpl::handle_cancellations() {
  std::vector<int64_t> cancelled;
  for (const auto& [id, request] : active_)
    if (request->channel->cancelled.load()) cancelled.push_back(id);
  for (int64_t id : cancelled)
    end_request(id, active_.at(id)->failed(Error(ErrorKind::kCancelled, "the request was cancelled")));
}

void EngineImpl::end_request(int64_t id, RequestOutput final_output) {
  auto it = active_.find(id);
  LOOM_CHECK(it != active_.end());
  std::unique_ptr<PendingRequest> request = std::move(it->second);
  active_.erase(it);
  scheduler_->finish(id);
  if (kv_sender_) kv_sender_->end_request(id);
  end_unscheduled(std::move(request), std::move(final_output));
}

void EngineImpl::end_unscheduled(std::unique_ptr<PendingRequest> request, RequestOutput final_output) {
  if (!request->request.adapter.empty()) adapters_.release_request(request->request.adapter);
  const SteadyTime now = std::chrono::steady_clock::now();
  step_stats_.add_finished(finished_reason_label(final_output), seconds_between(request->submitted_at, now),
                           request->first_token_at ? std::optional(seconds_between(*request->first_token_at, now))
                                                   : std::nullopt);
  emit(*request, std::move(final_output));
}

void EngineImpl::fail_all(const Error& error) {
  if (kv_receiver_)
    for (auto& request : kv_receiver_->take_all_parked()) {
      RequestOutput output = request->failed(error);
      end_unscheduled(std::move(request), std::move(output));
    }
  std::vector<int64_t> ids;
  for (const auto& [id, request] : active_) ids.push_back(id);
  for (int64_t id : ids) end_request(id, active_.at(id)->failed(error));
}

void EngineImpl::emit(PendingRequest& request, RequestOutput output) {
  outputs_.add(request.channel, std::move(output));
}

void EngineImpl::publish() {
  const EngineGauges gauges = measure_gauges();
  num_scheduler_waiting_ = gauges.num_waiting;
  {
    std::lock_guard<std::mutex> lock(metrics_mutex_);
    step_stats_.publish_into(metrics_);
    gauges.apply_to(metrics_);
    if (kv_sender_) {
      metrics_.num_device_kv_sent = kv_sender_->num_sent();
      metrics_.num_device_kv_send_failures = kv_sender_->num_failures();
      metrics_.num_device_kv_received = kv_receiver_->num_received();
      metrics_.num_device_kv_receive_failures = kv_receiver_->num_failures();
      metrics_.num_device_kv_cancelled = kv_receiver_->num_cancelled();
      metrics_.device_kv_received_blocks = kv_receiver_->num_received_blocks();
      metrics_.device_kv_quarantined_blocks = kv_receiver_->num_quarantined_blocks();
      DeviceKvReceiver::Timings timings = kv_receiver_->take_timings();
      metrics_.device_kv_transfer_time.insert(metrics_.device_kv_transfer_time.end(), timings.transfer.begin(),
                                              timings.transfer.end());
      metrics_.device_kv_wait_time.insert(metrics_.device_kv_wait_time.end(), timings.wait.begin(), timings.wait.end());
    }
  }
  if (kv_events_) kv_events_->flush();
  outputs_.send();
}

EngineGauges EngineImpl::measure_gauges() const {
  EngineGauges gauges;
  gauges.kv_stats = pools_.caches().stats();
  gauges.kv_bytes_per_block[KvCacheId::kMain] = pools_.kv_bytes_per_block();
  gauges.kv_bytes_per_block[KvCacheId::kResidual] = pools_.residual_bytes_per_block();
  gauges.block_size = config_.block_size;
  if (const DiskKvStore* store = pools_.disk_store()) {
    gauges.disk = store->stats();
    gauges.disk_capacity_bytes = config_.disk_kv_bytes;
  }
  gauges.kv_bytes_by_adapter = kv_bytes_by_adapter(gauges.kv_stats, gauges.kv_bytes_per_block, adapters_.names());
  gauges.num_running = scheduler_->num_running();
  gauges.num_waiting = scheduler_->num_waiting();
  gauges.num_preemptions = scheduler_->num_preemptions();
  gauges.num_swap_preemptions = scheduler_->num_swap_preemptions();
  gauges.num_swap_fallbacks = scheduler_->num_swap_fallbacks();
  gauges.backend_caches = backend_->cache_gauges();
  return gauges;
}

}  // namespace loom
