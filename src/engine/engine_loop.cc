// The engine thread's loop (EngineImpl's private half; see engine_impl.h).
#include <thread>

#include <spdlog/spdlog.h>

#include "engine/batch_builder.h"
#include "engine/engine_impl.h"

namespace loom {

namespace {

double seconds_between(SteadyTime from, SteadyTime to) { return std::chrono::duration<double>(to - from).count(); }

}  // namespace

void EngineImpl::thread_main() {
  for (;;) {
    std::deque<std::unique_ptr<PendingRequest>> new_requests;
    std::deque<std::function<void()>> commands;
    bool stopping = false, drain = false;
    {
      std::unique_lock<std::mutex> lock(inbox_->mutex);
      auto has_input = [&] {
        return !inbox_->new_requests.empty() || !inbox_->commands.empty() || inbox_->cancel_pending ||
               inbox_->stopping;
      };
      if (!scheduler_->has_work() && !has_input() && has_kv_transfers_in_flight()) {
        // Idle but copying: come back soon to apply the finished transfers.
        inbox_->cv.wait_for(lock, std::chrono::milliseconds(1), has_input);
      } else if (!scheduler_->has_work() && !has_input()) {
        if (!idle_checked_) {
          idle_checked_ = true;
          const std::string problem = kv_cache_->integrity_error();
          if (!problem.empty()) spdlog::error("KV cache integrity check failed: {}", problem);
          const std::string residual_problem = residual_kv_cache_ ? residual_kv_cache_->integrity_error() : "";
          if (!residual_problem.empty())
            spdlog::error("forked residual KV cache integrity check failed: {}", residual_problem);
        }
        inbox_->cv.wait(lock, has_input);
      }
      new_requests.swap(inbox_->new_requests);
      commands.swap(inbox_->commands);
      num_in_inbox_ -= static_cast<int32_t>(new_requests.size());
      inbox_->cancel_pending = false;
      stopping = inbox_->stopping;
      drain = inbox_->drain;
    }
    idle_checked_ = false;
    pump_kv_transfers();
    for (auto& command : commands) command();  // packaged tasks: exceptions go to the caller
    for (auto& request : new_requests) admit(std::move(request));
    handle_cancellations();
    if (stopping && !drain) {
      fail_all(Error(ErrorKind::kCapacity, "the engine is shutting down", "retry on another server"));
      break;
    }
    if (!scheduler_->has_work()) {
      if (stopping) break;
      continue;
    }
    step();
  }
  std::deque<std::function<void()>> leftover;
  {
    std::lock_guard<std::mutex> lock(inbox_->mutex);
    inbox_->thread_exited = true;
    leftover.swap(inbox_->commands);
  }
  for (auto& command : leftover) command();
  publish_gauges();
}

void EngineImpl::admit(std::unique_ptr<PendingRequest> request) {
  const int64_t id = request->id;
  any_request_admitted_ = true;
  observe_workflow_hints(*request);
  scheduler_->add(id, request->request.prompt_tokens, request->kv_plan.scheduler_adapter, request->kv_plan.kv,
                  request->request.priority);
  active_.emplace(id, std::move(request));
}

void EngineImpl::handle_cancellations() {
  std::vector<int64_t> cancelled;
  for (const auto& [id, request] : active_)
    if (request->channel->cancelled.load()) cancelled.push_back(id);
  for (int64_t id : cancelled) {
    RequestOutput output = active_.at(id)->failed(Error(ErrorKind::kInvalidArgument, "the request was cancelled"));
    end_request(id, std::move(output));
  }
}

void EngineImpl::end_request(int64_t id, RequestOutput final_output) {
  auto it = active_.find(id);
  LOOM_CHECK(it != active_.end());
  std::unique_ptr<PendingRequest> request = std::move(it->second);
  active_.erase(it);
  scheduler_->finish(id);
  if (!request->request.adapter.empty()) {
    std::lock_guard<std::mutex> lock(adapters_mutex_);
    auto adapter = adapters_.find(request->request.adapter);
    if (adapter != adapters_.end()) --adapter->second.num_running_requests;
  }
  {
    const SteadyTime now = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(metrics_mutex_);
    ++metrics_.num_finished_requests;
    metrics_.end_to_end.push_back(seconds_between(request->submitted_at, now));
    if (request->first_token_at) metrics_.decode_time.push_back(seconds_between(*request->first_token_at, now));
  }
  request->channel->push(std::move(final_output));
  publish_gauges();
}

void EngineImpl::fail_all(const Error& error) {
  std::vector<int64_t> ids;
  for (const auto& [id, request] : active_) ids.push_back(id);
  for (int64_t id : ids) end_request(id, active_.at(id)->failed(error));
}

void EngineImpl::publish_gauges() {
  const KvCacheStats stats = kv_cache_->stats();
  const KvCacheStats residual_stats = residual_kv_cache_ ? residual_kv_cache_->stats() : KvCacheStats{};
  std::vector<std::string> adapter_names;
  {
    std::lock_guard<std::mutex> lock(adapters_mutex_);
    for (const auto& [name, entry] : adapters_) adapter_names.push_back(name);
  }
  std::map<std::string, int64_t> bytes_by_adapter;
  for (const std::string& name : adapter_names) bytes_by_adapter[name] = 0;
  auto add_namespaces = [&](const KvCacheStats& pool_stats, int64_t bytes_per_block) {
    for (const auto& [kv_namespace, num_blocks] : pool_stats.num_blocks_by_namespace)
      for (const std::string& name : adapter_names)
        if (kv_namespace_belongs_to_adapter(kv_namespace, name)) bytes_by_adapter[name] += num_blocks * bytes_per_block;
  };
  num_scheduler_waiting_ = scheduler_->num_waiting();
  std::lock_guard<std::mutex> lock(metrics_mutex_);
  add_namespaces(stats, kv_bytes_per_block_);
  add_namespaces(residual_stats, residual_bytes_per_block_);
  metrics_.kv_bytes_by_adapter = std::move(bytes_by_adapter);
  metrics_.num_running = scheduler_->num_running();
  metrics_.num_waiting = scheduler_->num_waiting();
  metrics_.kv_blocks_total = stats.num_total_blocks;
  metrics_.kv_blocks_free = stats.num_free_blocks;
  metrics_.kv_blocks_cached = stats.num_cached_blocks;
  metrics_.kv_blocks_in_use = stats.num_in_use_blocks;
  metrics_.residual_blocks_total = residual_stats.num_total_blocks;
  metrics_.residual_blocks_free = residual_stats.num_free_blocks;
  metrics_.residual_blocks_cached = residual_stats.num_cached_blocks;
  metrics_.residual_blocks_in_use = residual_stats.num_in_use_blocks;
  metrics_.kv_bytes_base =
      static_cast<int64_t>(stats.num_cached_blocks + stats.num_in_use_blocks) * kv_bytes_per_block_;
  metrics_.kv_bytes_residual =
      static_cast<int64_t>(residual_stats.num_cached_blocks + residual_stats.num_in_use_blocks) *
      residual_bytes_per_block_;
  metrics_.kv_bytes_in_use_or_cached = metrics_.kv_bytes_base + metrics_.kv_bytes_residual;
  metrics_.kv_bytes_per_token_base = kv_bytes_per_block_ / config_.block_size;
  metrics_.kv_bytes_per_token_residual = residual_bytes_per_block_ / config_.block_size;
  metrics_.num_evicted_tokens = (stats.num_evicted_blocks + residual_stats.num_evicted_blocks) * config_.block_size;
  metrics_.num_preemptions = scheduler_->num_preemptions();
  const int64_t block_size = config_.block_size;
  metrics_.kv_bytes_host = static_cast<int64_t>(stats.num_host_used_blocks) * kv_bytes_per_block_;
  metrics_.num_offloaded_tokens = stats.num_offloaded_blocks * block_size;
  metrics_.num_loaded_tokens = stats.num_loaded_blocks * block_size;
  metrics_.num_prefetched_tokens = stats.num_prefetched_blocks * block_size;
  metrics_.num_prefetch_hit_tokens = stats.num_prefetch_hit_blocks * block_size;
  metrics_.num_prefetch_late_tokens = stats.num_prefetch_late_blocks * block_size;
  metrics_.num_failed_kv_transfers = stats.num_failed_transfers;
}

void EngineImpl::step() {
  sync_workflows();  // before plan(): its allocations evict by the current steps (thread_main pumped transfers)
  const ScheduledBatch plan = scheduler_->plan();
  const SteadyTime scheduled_at = std::chrono::steady_clock::now();
  note_load_waits(plan, scheduled_at);
  prefetch_next_agents();  // after plan(): demand loads and admissions go first
  pump_kv_transfers();
  publish_gauges();
  if (plan.empty()) {  // nothing fits, or every waiting request waits on a load: do not spin
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return;
  }

  for (const ScheduledRequest& entry : plan.requests) {
    PendingRequest& request = *active_.at(entry.id);
    std::lock_guard<std::mutex> lock(metrics_mutex_);
    if (!request.first_scheduled_at) {
      request.first_scheduled_at = scheduled_at;
      metrics_.queue_time.push_back(seconds_between(request.submitted_at, scheduled_at));
    }
    if (entry.num_prefix_hit_tokens >= 0) {
      const auto num_prompt_tokens = static_cast<int64_t>(request.request.prompt_tokens.size());
      const std::string& mode = request.kv_plan.mode_label;
      request.num_cached_prompt_tokens = entry.num_prefix_hit_tokens;
      metrics_.prefix_queried_tokens += num_prompt_tokens;
      metrics_.prefix_hit_tokens += entry.num_prefix_hit_tokens;
      metrics_.prefix_queried_tokens_by_mode[mode] += num_prompt_tokens;
      metrics_.prefix_hit_tokens_by_mode[mode] += entry.num_prefix_hit_tokens;
      metrics_.num_prompt_tokens += num_prompt_tokens;
    }
  }

  Batch batch =
      build_batch(plan, *scheduler_, [&](SchedulerRequestId id) { return active_.at(id)->kv_plan.sharing; });
  // Device sampling where the backend has it: only token ids come back for the
  // requests that need nothing else (rows that sample nothing this step take a
  // greedy id too, so that their logits stay on the device).
  if (capabilities_.device_sampling) {
    batch.sampling.resize(plan.requests.size());
    for (size_t i = 0; i < plan.requests.size(); ++i) {
      const PendingRequest& request = *active_.at(plan.requests[i].id);
      if (plan.requests[i].samples_next_token && !request.can_sample_on_device()) continue;
      const SamplingParams& params = request.request.sampling;
      batch.sampling[i] = {true, params.temperature, params.top_k, params.top_p, params.seed,
                           static_cast<uint64_t>(request.num_output_tokens)};
    }
  }
  ForwardResult result;
  try {
    result = backend_->forward(batch);
    LOOM_CHECK(result.logit_token_index.size() == plan.requests.size());
  } catch (const Error& error) {
    spdlog::error("forward pass failed: {}", error.what());
    for (const ScheduledRequest& entry : plan.requests) end_request(entry.id, active_.at(entry.id)->failed(error));
    return;
  } catch (const std::exception& error) {
    spdlog::error("forward pass failed: {}", error.what());
    const Error internal(ErrorKind::kInternal, fmt::format("forward pass failed: {}", error.what()));
    for (const ScheduledRequest& entry : plan.requests) end_request(entry.id, active_.at(entry.id)->failed(internal));
    return;
  }
  scheduler_->complete_step(plan);
  declare_fixed_prefixes(plan);
  pump_kv_transfers();  // the backups complete_step planned start while we sample

  int32_t num_decodes = 0;
  const SteadyTime now = std::chrono::steady_clock::now();
  const bool any_device_sampled = !result.sampled_token_ids.empty();
  size_t num_host_rows = 0;  // result.logits holds only the rows not sampled on the device
  for (size_t row = 0; row < plan.requests.size(); ++row) {
    const ScheduledRequest& entry = plan.requests[row];
    const bool device_sampled = any_device_sampled && result.sampled_token_ids[row] >= 0;
    const size_t logits_row = device_sampled ? 0 : num_host_rows++;
    if (!entry.samples_next_token) continue;
    if (entry.num_new_tokens == 1) ++num_decodes;
    PendingRequest& request = *active_.at(entry.id);
    RequestOutput output =
        device_sampled
            ? request.on_sampled_token({result.sampled_token_ids[row], result.sampled_logprobs[row], {}}, eos_ids_)
            : request.on_logits(result.logits.data() + logits_row * static_cast<size_t>(result.vocab_size),
                                result.vocab_size, eos_ids_);
    {
      std::lock_guard<std::mutex> lock(metrics_mutex_);
      ++metrics_.num_generated_tokens;
      if (!request.first_token_at) {
        request.first_token_at = now;
        metrics_.time_to_first_token.push_back(seconds_between(request.submitted_at, now));
        metrics_.prefill_time.push_back(seconds_between(*request.first_scheduled_at, now));
      } else {
        metrics_.inter_token.push_back(seconds_between(*request.last_token_at, now));
      }
      request.last_token_at = now;
    }
    if (output.finished) {
      end_request(entry.id, std::move(output));
    } else {
      scheduler_->append_token(entry.id, output.new_tokens.back().token_id);
      request.channel->push(std::move(output));
    }
  }
  std::lock_guard<std::mutex> lock(metrics_mutex_);
  if (num_decodes > 0) metrics_.decode_batch_sizes.push_back(num_decodes);
}

}  // namespace loom
