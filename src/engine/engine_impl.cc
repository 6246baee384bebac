#include "engine/engine_impl.h"

#include <future>

#include <spdlog/spdlog.h>

#include "engine/batch_builder.h"
#include "lora/adapter.h"
#include "tokenizer/tokenizer.h"

namespace loom {


std::unique_ptr<Engine> make_engine(LoadedModel model, std::unique_ptr<Backend> backend, EngineConfig config) {
  return std::make_unique<EngineImpl>(std::move(model), std::move(backend), config);
}

EngineImpl::EngineImpl(LoadedModel model, std::unique_ptr<Backend> backend, EngineConfig config)
    : model_(std::move(model)), backend_(std::move(backend)), config_(config) {
  if (config_.block_size <= 0) fail(ErrorKind::kInvalidArgument, "block size must be > 0, got {}", config_.block_size);
  if (config_.max_batch_tokens <= 0 || config_.max_running_requests <= 0 || config_.max_loras_per_batch <= 0)
    fail(ErrorKind::kInvalidArgument, "max batch tokens, max running requests and max loras per batch must be > 0");
  max_context_tokens_ = config_.max_context_tokens > 0 ? config_.max_context_tokens
                                                       : model_.config.max_position_embeddings;
  kv_bytes_per_block_ = backend_->kv_bytes_per_token() * config_.block_size;
  num_kv_blocks_ = config_.num_kv_blocks;
  if (num_kv_blocks_ <= 0) {
    const int64_t blocks = kv_bytes_per_block_ > 0 ? config_.kv_cache_bytes / kv_bytes_per_block_ : 0;
    num_kv_blocks_ = static_cast<int32_t>(std::min<int64_t>(blocks, 1 << 30));
  }
  if (num_kv_blocks_ <= 0)
    throw Error(ErrorKind::kCapacity, fmt::format("a KV cache of {} bytes holds no block", config_.kv_cache_bytes),
                "raise the KV cache size");
  backend_->allocate_kv_cache({num_kv_blocks_, config_.block_size});
  slot_used_.assign(static_cast<size_t>(std::min(config_.max_adapter_slots, backend_->max_adapter_slots())), false);
  eos_ids_ = model_.tokenizer->eos_token_ids();

  kv_cache_ = std::make_unique<KvCacheManager>(num_kv_blocks_, config_.block_size);
  scheduler_ = std::make_unique<Scheduler>(
      SchedulerConfig{config_.max_batch_tokens, config_.max_running_requests, config_.max_loras_per_batch}, *kv_cache_);
  metrics_.kv_blocks_total = num_kv_blocks_;
  metrics_.kv_blocks_free = num_kv_blocks_;
  thread_ = std::thread([this] { thread_main(); });
}

EngineImpl::~EngineImpl() { shutdown(false); }

std::unique_ptr<RequestStream> EngineImpl::submit(EngineRequest request) {
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
  if ((num_total_tokens + config_.block_size - 1) / config_.block_size > num_kv_blocks_)
    throw Error(ErrorKind::kCapacity,
                fmt::format("prompt + max tokens ({} tokens) does not fit in the KV cache ({} tokens)",
                            num_total_tokens, static_cast<int64_t>(num_kv_blocks_) * config_.block_size),
                "lower max tokens or give the server a larger KV cache");

  int32_t slot = -1;
  {
    std::lock_guard<std::mutex> lock(adapters_mutex_);
    if (!request.adapter.empty()) {
      auto it = adapters_.find(request.adapter);
      if (it == adapters_.end() || !it->second.ready)
        throw Error(ErrorKind::kNotFound, fmt::format("adapter '{}' is not loaded", request.adapter),
                    "list adapters with GET /v1/models");
      slot = it->second.slot;
    }
  }
  const int64_t id = next_id_++;
  const std::string kv_namespace = kv_namespace_for_adapter(request.adapter);
  // Validates sampling params (throws kInvalidArgument) before anything is queued.
  auto pending = std::make_unique<PendingRequest>(id, fmt::format("req-{}", id), std::move(request), slot,
                                                  kv_namespace, model_.tokenizer);
  auto stream = std::make_unique<ChannelRequestStream>(pending->request_id, pending->channel, inbox_);
  if (pending->request.max_new_tokens == 0) {
    RequestOutput output;
    output.finished = true;
    output.finish_reason = FinishReason::kLength;
    output.num_prompt_tokens = static_cast<int32_t>(pending->request.prompt_tokens.size());
    pending->channel->push(std::move(output));
    return stream;
  }
  {
    std::lock_guard<std::mutex> lock(inbox_->mutex);
    if (inbox_->stopping) throw Error(ErrorKind::kCapacity, "the engine is shutting down", "retry on another server");
    const int32_t num_waiting = num_in_inbox_.load() + num_scheduler_waiting_.load();
    if (num_waiting >= config_.max_waiting_requests)
      throw Error(ErrorKind::kCapacity, fmt::format("{} requests are already waiting", num_waiting), "retry later");
    if (!pending->request.adapter.empty()) {
      std::lock_guard<std::mutex> adapters_lock(adapters_mutex_);
      auto it = adapters_.find(pending->request.adapter);
      if (it == adapters_.end() || !it->second.ready)  // unloaded meanwhile
        throw Error(ErrorKind::kNotFound, fmt::format("adapter '{}' is not loaded", pending->request.adapter));
      ++it->second.num_running_requests;
    }
    ++num_in_inbox_;
    inbox_->new_requests.push_back(std::move(pending));
  }
  inbox_->cv.notify_all();
  return stream;
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

void EngineImpl::load_adapter(const std::string& name, const std::string& path) {
  if (name.empty()) fail(ErrorKind::kInvalidArgument, "an adapter needs a name");
  {
    std::lock_guard<std::mutex> lock(adapters_mutex_);
    if (adapters_.count(name)) fail(ErrorKind::kInvalidArgument, "adapter '{}' is already loaded", name);
  }
  std::shared_ptr<const LoraAdapter> adapter = load_lora_adapter(name, path, model_.config);
  int32_t slot = -1;
  {
    std::lock_guard<std::mutex> lock(adapters_mutex_);
    if (adapters_.count(name)) fail(ErrorKind::kInvalidArgument, "adapter '{}' is already loaded", name);
    for (size_t i = 0; i < slot_used_.size() && slot < 0; ++i)
      if (!slot_used_[i]) slot = static_cast<int32_t>(i);
    if (slot < 0)
      throw Error(ErrorKind::kCapacity, fmt::format("all {} adapter slots are in use", slot_used_.size()),
                  "unload an adapter first");
    slot_used_[static_cast<size_t>(slot)] = true;
    adapters_[name] = AdapterEntry{path, adapter, slot, 0, false};
  }
  try {
    run_on_engine_thread([&] { backend_->set_adapter(slot, adapter); });
  } catch (...) {
    std::lock_guard<std::mutex> lock(adapters_mutex_);
    adapters_.erase(name);
    slot_used_[static_cast<size_t>(slot)] = false;
    throw;
  }
  std::lock_guard<std::mutex> lock(adapters_mutex_);
  adapters_[name].ready = true;
}

void EngineImpl::unload_adapter(const std::string& name) {
  int32_t slot = -1;
  {
    std::lock_guard<std::mutex> lock(adapters_mutex_);
    auto it = adapters_.find(name);
    if (it == adapters_.end() || !it->second.ready)
      throw Error(ErrorKind::kNotFound, fmt::format("adapter '{}' is not loaded", name));
    if (it->second.num_running_requests > 0)
      throw Error(ErrorKind::kInvalidArgument,
                  fmt::format("adapter '{}' is in use by {} requests", name, it->second.num_running_requests),
                  "retry when they finish");
    slot = it->second.slot;
    adapters_.erase(it);
  }
  const std::string kv_namespace = kv_namespace_for_adapter(name);
  run_on_engine_thread([&] {
    backend_->set_adapter(slot, nullptr);
    kv_cache_->drop_namespace(kv_namespace);
  });
  std::lock_guard<std::mutex> lock(adapters_mutex_);
  slot_used_[static_cast<size_t>(slot)] = false;
}

std::vector<AdapterInfo> EngineImpl::adapters() const {
  std::lock_guard<std::mutex> lock(adapters_mutex_);
  std::vector<AdapterInfo> infos;
  for (const auto& [name, entry] : adapters_)
    if (entry.ready) infos.push_back({name, entry.path, entry.adapter->max_rank(), entry.num_running_requests});
  return infos;
}

EngineMetrics EngineImpl::take_metrics() {
  std::lock_guard<std::mutex> lock(metrics_mutex_);
  EngineMetrics snapshot = metrics_;
  snapshot.num_waiting += num_in_inbox_.load();  // submitted, not yet in the scheduler
  for (auto* samples : {&metrics_.time_to_first_token, &metrics_.inter_token, &metrics_.end_to_end,
                        &metrics_.queue_time, &metrics_.prefill_time, &metrics_.decode_time})
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
