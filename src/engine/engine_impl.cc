// EngineImpl's caller-thread half: construction, submit, metrics, shutdown.
#include "engine/engine_impl.h"

#include <algorithm>
#include <future>

#include "engine/backend_support.h"
#include "engine/kv_identity.h"
#include "engine/request_kv.h"
#include "tokenizer/tokenizer.h"

namespace loom {

std::unique_ptr<Engine> make_engine(LoadedModel model, std::unique_ptr<Backend> backend, EngineConfig config) {
  return std::make_unique<EngineImpl>(std::move(model), std::move(backend), config);
}

EngineImpl::EngineImpl(LoadedModel model, std::unique_ptr<Backend> backend, EngineConfig config)
    : model_(std::move(model)), backend_(std::move(backend)), config_(config),
      capabilities_(backend_->capabilities()), workflows_(workflow_registry_config(config)),
      adapters_(std::min(config.max_adapter_slots, backend_->max_adapter_slots())),
      kv_events_(config.kv_events.enabled ? std::make_unique<KvEventPublisher>(config.kv_events) : nullptr),
      residency_(config.kv_store ? std::make_unique<KvResidency>(kv_events_ ? &kv_events_->sink() : nullptr) : nullptr),
      pools_(*backend_, config,
             config.disk_kv_path.empty() && !config.kv_store && !kv_events_ ? KvBlockHash{}
                                                                              : engine_model_identity(model_, config.fp8_weights),
             residency_ ? static_cast<KvEventSink*>(residency_.get())
                        : kv_events_ ? &kv_events_->sink() : nullptr),
      workflow_sync_(workflows_, config) {
  check_engine_supported(capabilities_, config_, model_.config);  // first: nothing is allocated yet
  if (config_.block_size <= 0) fail(ErrorKind::kInvalidArgument, "block size must be > 0, got {}", config_.block_size);
  if (config_.max_batch_tokens <= 0 || config_.max_running_requests <= 0 || config_.max_loras_per_batch <= 0)
    fail(ErrorKind::kInvalidArgument, "max batch tokens, max running requests and max loras per batch must be > 0");
  if (config_.max_lora_rank < 0) fail(ErrorKind::kInvalidArgument, "max LoRA rank must be >= 0, got {}", config_.max_lora_rank);
  max_context_tokens_ = config_.max_context_tokens > 0 ? config_.max_context_tokens
                                                       : model_.config.max_position_embeddings;
  if (config_.device_kv_plane) {
    if (!capabilities_.kv_layer_notifications)
      throw Error(ErrorKind::kUnsupported,
                  fmt::format("the {} backend cannot stream KV layer by layer (device-to-device KV plane '{}')",
                              capabilities_.name, config_.device_kv_plane->endpoint().plane),
                  "run without a device KV plane: the staged KV path serves disaggregation");
    kv_sender_ = std::make_unique<DeviceKvSender>(*config_.device_kv_plane, model_.config.num_layers, config_.block_size);
    kv_receiver_ = std::make_unique<DeviceKvReceiver>(*config_.device_kv_plane, model_.config.num_layers);
  }
  allocate_pools(pools_.layout(pools_.initial_sizing()));
  eos_ids_ = model_.tokenizer->eos_token_ids();
  thread_ = std::thread([this] { thread_main(); });
}

EngineImpl::~EngineImpl() { shutdown(false); }

bool EngineImpl::caches_kv_block(const KvBlockHash& hash) const { return residency_ && residency_->holds(hash); }

std::vector<KvBlockName> EngineImpl::kv_block_hashes(const EngineRequest& request) {
  std::optional<AdapterRegistry::ReadyAdapter> adapter;
  if (!request.adapter.empty()) {
    adapter = adapters_.find_ready(request.adapter);
    if (!adapter) throw Error(ErrorKind::kNotFound, fmt::format("adapter '{}' is not loaded", request.adapter));
  }
  const RequestKvPlan plan = plan_request_kv(request.adapter, adapter ? adapter->adapter.get() : nullptr,
                                             adapter ? adapter->sharing : KvSharing::kIsolated,
                                             adapter ? adapter->slot : -1, request.prompt_tokens, config_.block_size);
  return pools_.block_names(plan.kv, request.prompt_tokens);  // not on the engine thread: a long step never delays it
}

DeviceKvReservation EngineImpl::reserve_device_kv(const EngineRequest& request, const std::string& peer,
                                                  double timeout_seconds) {
  if (!kv_receiver_) return Engine::reserve_device_kv(request, peer, timeout_seconds);
  EngineRequest probe = request;
  probe.max_new_tokens = 0;  // checked as a request, never queued
  probe.min_new_tokens = 0;
  const CheckedRequest checked = check_request(std::move(probe));
  DeviceKvReservation reservation;
  run_on_engine_thread([&] {
    any_request_admitted_ = true;  // the pools are fixed from now on: the plane writes into them
    reservation = kv_receiver_->reserve(pools_.caches(), checked.pending->kv_plan.kv, request.prompt_tokens, peer,
                                        timeout_seconds);
    inbox_->cv.notify_all();
  });
  return reservation;
}

DeviceKvCancel EngineImpl::cancel_device_kv(DeviceKvTransferId id, const std::string& reason) {
  if (!kv_receiver_) return Engine::cancel_device_kv(id, reason);
  DeviceKvCancel outcome = DeviceKvCancel::kUnknown;
  run_on_engine_thread([&] { outcome = kv_receiver_->cancel(id, reason); });  // the loop then admits its request
  return outcome;
}

EngineImpl::CheckedRequest EngineImpl::check_request(EngineRequest request) {
  if (request.prompt_tokens.empty()) fail(ErrorKind::kInvalidArgument, "the prompt is empty");
  const int32_t vocab_size = model_.config.vocab_size;
  for (TokenId id : request.prompt_tokens)
    if (id < 0 || id >= vocab_size) fail(ErrorKind::kInvalidArgument, "prompt token id {} is outside the vocabulary [0, {})", id, vocab_size);
  if (request.max_new_tokens < 0) fail(ErrorKind::kInvalidArgument, "max tokens must be >= 0, got {}", request.max_new_tokens);
  if (request.min_new_tokens < 0) fail(ErrorKind::kInvalidArgument, "min tokens must be >= 0, got {}", request.min_new_tokens);
  const int64_t num_total_tokens = static_cast<int64_t>(request.prompt_tokens.size()) + request.max_new_tokens;
  if (num_total_tokens > max_context_tokens_)
    throw Error(ErrorKind::kCapacity,
                fmt::format("prompt ({} tokens) + max tokens ({}) exceeds the context limit of {}",
                            request.prompt_tokens.size(), request.max_new_tokens, max_context_tokens_),
                "shorten the prompt or lower max tokens");
  const int64_t num_blocks_needed = (num_total_tokens + config_.block_size - 1) / config_.block_size;
  if (num_blocks_needed > pools_.num_kv_blocks())
    throw Error(ErrorKind::kCapacity,
                fmt::format("prompt + max tokens ({} tokens) does not fit in the KV cache ({} tokens)",
                            num_total_tokens, static_cast<int64_t>(pools_.num_kv_blocks()) * config_.block_size),
                "lower max tokens or give the server a larger KV cache");

  const bool has_workflow_hints =
      !request.workflow.empty() || !request.agent.empty() || request.fixed_prefix_tokens.has_value();
  if (has_workflow_hints)
    check_workflow_hints(WorkflowHints{request.workflow, request.agent, request.fixed_prefix_tokens});

  CheckedRequest checked;
  if (!request.adapter.empty()) {
    checked.adapter = adapters_.find_ready(request.adapter);
    if (!checked.adapter)
      throw Error(ErrorKind::kNotFound, fmt::format("adapter '{}' is not loaded", request.adapter),
                  "list adapters with GET /v1/models");
  }
  const auto& adapter = checked.adapter;
  RequestKvPlan kv_plan = plan_request_kv(request.adapter, adapter ? adapter->adapter.get() : nullptr,
                                          adapter ? adapter->sharing : KvSharing::kIsolated, adapter ? adapter->slot : -1,
                                          request.prompt_tokens, config_.block_size);
  if (!kv_plan.kv.residual_namespace.empty() && num_blocks_needed > pools_.num_residual_kv_blocks())
    throw Error(ErrorKind::kCapacity,
                fmt::format("prompt + max tokens ({} tokens) does not fit in the forked residual cache ({} tokens)",
                            num_total_tokens,
                            static_cast<int64_t>(pools_.num_residual_kv_blocks()) * config_.block_size),
                "lower max tokens or raise --residual-kv-cache-memory");
  const int64_t id = next_id_++;
  // Validates sampling params (throws kInvalidArgument) before anything is queued.
  checked.pending = std::make_unique<PendingRequest>(id, fmt::format("req-{}", id), std::move(request),
                                                     std::move(kv_plan), model_.tokenizer);
  return checked;
}

std::unique_ptr<RequestStream> EngineImpl::submit(EngineRequest request) {
  std::vector<EngineRequest> one;
  one.push_back(std::move(request));
  return std::move(submit_all(std::move(one)).front());
}

std::vector<std::unique_ptr<RequestStream>> EngineImpl::submit_all(std::vector<EngineRequest> requests) {
  std::vector<CheckedRequest> checked;
  checked.reserve(requests.size());
  for (EngineRequest& request : requests) checked.push_back(check_request(std::move(request)));
  // The streams are made once the requests are queued: a refused one's would wake the engine to cancel.
  std::vector<std::unique_ptr<RequestStream>> streams;
  std::vector<std::pair<std::string, std::shared_ptr<RequestChannel>>> channels;
  for (const CheckedRequest& request : checked) channels.emplace_back(request.pending->request_id, request.pending->channel);
  // max_tokens 0 ends here, never queued.
  const auto queues = [](const CheckedRequest& request) { return request.pending->request.max_new_tokens > 0; };
  const auto num_to_queue = static_cast<int32_t>(std::count_if(checked.begin(), checked.end(), queues));
  if (num_to_queue > 0) {
    std::lock_guard<std::mutex> lock(inbox_->mutex);
    if (inbox_->stopping) throw Error(ErrorKind::kUnavailable, "the engine is shutting down", "retry on another server");
    const int32_t num_waiting = num_in_inbox_.load() + num_scheduler_waiting_.load();
    if (num_waiting + num_to_queue > config_.max_waiting_requests)
      throw Error(ErrorKind::kCapacity,
                  num_to_queue == 1
                      ? fmt::format("{} requests are already waiting", num_waiting)
                      : fmt::format("{} sequences requested, {} already waiting, at most {} may wait; none was queued",
                                    num_to_queue, num_waiting, config_.max_waiting_requests),
                  num_to_queue > config_.max_waiting_requests ? "send fewer prompts or a lower n per request"
                                                              : "retry later");
    // Every adapter counted, or none (one may have been unloaded meanwhile).
    for (size_t i = 0; i < checked.size(); ++i) {
      const CheckedRequest& request = checked[i];
      if (!queues(request) || !request.adapter) continue;
      const std::string& name = request.pending->request.adapter;
      if (adapters_.acquire_for_request(name, *request.adapter)) continue;
      for (size_t j = 0; j < i; ++j)
        if (queues(checked[j]) && checked[j].adapter) adapters_.release_request(checked[j].pending->request.adapter);
      throw Error(ErrorKind::kNotFound, fmt::format("adapter '{}' is not loaded", name));
    }
    // Nothing throws past this point. Before the engine thread can see the
    // requests, so its first step already has the workflow (and this agent
    // running) in the registry's snapshot. A full registry keeps serving the
    // request without workflow awareness.
    for (CheckedRequest& request : checked) {
      if (!queues(request)) continue;
      const EngineRequest& engine_request = request.pending->request;
      if (!engine_request.workflow.empty()) workflows_.note_request(engine_request.workflow, engine_request.agent);
      inbox_->new_requests.push_back(std::move(request.pending));
    }
    num_in_inbox_ += num_to_queue;
  }
  if (num_to_queue > 0) inbox_->cv.notify_all();
  for (CheckedRequest& request : checked) {
    if (!request.pending) continue;  // queued
    RequestOutput output;
    output.finished = true;
    output.finish_reason = FinishReason::kLength;
    output.num_prompt_tokens = static_cast<int32_t>(request.pending->request.prompt_tokens.size());
    {
      // Counted before it is pushed, as the engine thread counts the requests it ends.
      std::lock_guard<std::mutex> lock(metrics_mutex_);
      ++metrics_.num_finished_requests_by_reason[finished_reason_label(output)];
    }
    request.pending->channel->push(std::move(output));
  }
  for (auto& [request_id, channel] : channels)
    streams.push_back(std::make_unique<ChannelRequestStream>(request_id, std::move(channel), inbox_));
  return streams;
}

void EngineImpl::run_on_engine_thread(const std::function<void()>& command) {
  auto task = std::make_shared<std::packaged_task<void()>>(command);
  std::future<void> done = task->get_future();
  {
    std::lock_guard<std::mutex> lock(inbox_->mutex);
    if (inbox_->thread_exited) {
      (*task)();
      done.get();
      return;
    }
    inbox_->commands.push_back([task] { (*task)(); });
  }
  inbox_->cv.notify_all();
  done.get();
}

EngineMetrics EngineImpl::take_metrics() {
  std::lock_guard<std::mutex> lock(metrics_mutex_);
  EngineMetrics snapshot = metrics_;
  workflows_.expire_unseen();  // thread-safe; /metrics then counts only live workflows
  snapshot.num_workflows_active = workflows_.snapshot()->num_workflows();
  snapshot.eviction_policy = config_.workflow_aware_eviction ? "workflow" : "lru";
  snapshot.num_waiting += num_in_inbox_.load();  // submitted, not yet in the scheduler
  for (auto* samples : {&metrics_.time_to_first_token, &metrics_.inter_token, &metrics_.end_to_end,
                        &metrics_.queue_time, &metrics_.prefill_time, &metrics_.decode_time, &metrics_.load_wait_time,
                        &metrics_.device_kv_transfer_time, &metrics_.device_kv_wait_time})
    samples->clear();
  metrics_.decode_batch_sizes.clear();
  return snapshot;
}

void EngineImpl::shutdown(bool drain) {
  std::lock_guard<std::mutex> shutdown_lock(shutdown_mutex_);
  {
    std::lock_guard<std::mutex> lock(inbox_->mutex);
    if (!inbox_->stopping) {
      inbox_->stopping = true;
      inbox_->drain = drain;
    } else if (!drain) {
      inbox_->drain = false;
    }
  }
  inbox_->cv.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace loom
