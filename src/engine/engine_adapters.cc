// EngineImpl's adapters and KV pools: load / unload with KV sharing modes, and
// the main + rCache pool sizing (see engine_impl.h).
#include <algorithm>

#include <spdlog/spdlog.h>

#include "engine/backend_support.h"
#include "engine/engine_impl.h"
#include "lora/adapter.h"

namespace loom {

void EngineImpl::allocate_pools(bool with_residual, int64_t residual_bytes, int32_t max_rank) {
  const int32_t block_size = config_.block_size;
  int32_t num_residual_blocks = 0;
  int64_t residual_bytes_per_block = 0;
  if (with_residual) {
    residual_bytes_per_block = backend_->residual_bytes_per_token(max_rank) * block_size;
    if (residual_bytes_per_block <= 0) backend_->allocate_residual_cache({0, block_size, max_rank});  // throws: unsupported
    num_residual_blocks = config_.num_residual_kv_blocks > 0
                              ? config_.num_residual_kv_blocks
                              : static_cast<int32_t>(std::min<int64_t>(residual_bytes / residual_bytes_per_block, 1 << 30));
    if (num_residual_blocks <= 0)
      throw Error(ErrorKind::kCapacity,
                  fmt::format("a forked residual cache of {} bytes holds no block ({} bytes each at rank {})",
                              residual_bytes, residual_bytes_per_block, max_rank),
                  "raise --residual-kv-cache-memory");
  }
  int32_t num_blocks = config_.num_kv_blocks;
  if (num_blocks <= 0) {
    const int64_t main_bytes = config_.kv_cache_bytes - static_cast<int64_t>(num_residual_blocks) * residual_bytes_per_block;
    const int64_t blocks = kv_bytes_per_block_ > 0 ? main_bytes / kv_bytes_per_block_ : 0;
    num_blocks = static_cast<int32_t>(std::clamp<int64_t>(blocks, 0, 1 << 30));
  }
  if (num_blocks <= 0)
    throw Error(ErrorKind::kCapacity,
                fmt::format("a KV cache of {} bytes holds no block{}", config_.kv_cache_bytes,
                            with_residual ? " beside the forked residual cache" : ""),
                "raise the KV cache size");

  // Copies in flight read and write the pools; the scheduler holds leases into the managers.
  drain_kv_transfers();
  kv_transfers_.reset();
  scheduler_.reset();
  residual_kv_cache_ = nullptr;
  kv_cache_ = nullptr;
  kv_caches_.reset();
  backend_->allocate_kv_cache({num_blocks, block_size});
  if (with_residual) backend_->allocate_residual_cache({num_residual_blocks, block_size, max_rank});
  kv_caches_ = std::make_unique<KvCacheGroup>(num_blocks, with_residual ? num_residual_blocks : 0, block_size);
  kv_cache_ = &kv_caches_->main();
  residual_kv_cache_ = kv_caches_->residual();
  scheduler_ = std::make_unique<Scheduler>(
      SchedulerConfig{config_.max_batch_tokens, config_.max_running_requests, config_.max_loras_per_batch}, *kv_caches_);
  num_kv_blocks_ = num_blocks;
  num_residual_kv_blocks_ = num_residual_blocks;
  residual_max_rank_ = with_residual ? max_rank : 0;
  reset_workflow_kv_state();
  setup_host_tier();
  {
    std::lock_guard<std::mutex> lock(metrics_mutex_);
    residual_bytes_per_block_ = residual_bytes_per_block;
  }
  publish_gauges();
}

void EngineImpl::prepare_forked_adapter(const std::string& name, int32_t kv_rank) {
  const std::string rank_hint = "restart the server with --max-lora-rank >= " + std::to_string(kv_rank) +
                                ", or load the adapter with another kv_sharing mode";
  if (config_.max_lora_rank > 0 && kv_rank > config_.max_lora_rank)
    throw Error(ErrorKind::kCapacity,
                fmt::format("adapter '{}' has k/v LoRA rank {}, over the forked residual cache's max rank {}", name,
                            kv_rank, config_.max_lora_rank),
                rank_hint);
  const bool has_pool = residual_kv_cache_ != nullptr;
  if (has_pool && kv_rank <= residual_max_rank_.load()) return;
  if (!has_pool && config_.residual_kv_cache_bytes == 0)
    throw Error(ErrorKind::kCapacity,
                fmt::format("adapter '{}' needs a forked residual cache and the server has none "
                            "(residual KV cache memory 0)",
                            name),
                "start the server with --residual-kv-cache-memory BYTES, or load the adapter with another kv_sharing");
  if (any_request_admitted_)
    throw Error(ErrorKind::kCapacity,
                has_pool ? fmt::format("adapter '{}' has k/v LoRA rank {}, over the forked residual cache's max rank "
                                       "{} (fixed once requests arrived)",
                                       name, kv_rank, residual_max_rank_.load())
                         : fmt::format("adapter '{}' needs a forked residual cache, and the server made none at start",
                                       name),
                has_pool ? rank_hint
                         : "load forked adapters at start (--lora NAME=PATH:forked), or start the server with "
                           "--residual-kv-cache-memory BYTES or --default-sharing forked");
  // Still "at start": size the rCache for the largest k/v rank loaded so far.
  int32_t max_rank = config_.max_lora_rank;
  if (max_rank <= 0) {
    max_rank = std::max(kMinAutoLoraRank, kv_rank);
    std::lock_guard<std::mutex> lock(adapters_mutex_);
    for (const auto& [other_name, entry] : adapters_) max_rank = std::max(max_rank, kv_lora_rank(*entry.adapter));
  }
  const int64_t residual_bytes =
      config_.residual_kv_cache_bytes >= 0 ? config_.residual_kv_cache_bytes : config_.kv_cache_bytes / 8;
  allocate_pools(true, residual_bytes, max_rank);
  spdlog::info("forked residual KV cache: {} blocks of {} bytes at max rank {} (for adapter '{}'); main KV: {} blocks",
               num_residual_kv_blocks_.load(), residual_bytes_per_block_, max_rank, name, num_kv_blocks_.load());
}

int32_t EngineImpl::drop_adapter_kv(const std::string& name) {
  const auto belongs = [&](const std::string& kv_namespace) { return kv_namespace_belongs_to_adapter(kv_namespace, name); };
  drain_kv_transfers();  // the managers drop nothing a copy still pins
  int32_t num_freed = kv_cache_->drop_namespaces(belongs);
  if (residual_kv_cache_) num_freed += residual_kv_cache_->drop_namespaces(belongs);
  return num_freed;
}

void EngineImpl::load_adapter(const std::string& name, const std::string& path, std::optional<KvSharing> sharing) {
  if (name.empty()) fail(ErrorKind::kInvalidArgument, "an adapter needs a name");
  {
    std::lock_guard<std::mutex> lock(adapters_mutex_);
    if (adapters_.count(name)) fail(ErrorKind::kInvalidArgument, "adapter '{}' is already loaded", name);
  }
  std::shared_ptr<const LoraAdapter> adapter = load_lora_adapter(name, path, model_.config);
  const KvSharing mode = choose_kv_sharing(adapter->config, sharing, config_.default_sharing);
  const std::string warning = check_kv_sharing(mode, *adapter, model_.config);
  // Before a slot is taken: a refused adapter never reaches the backend or a batch.
  check_adapter_supported(capabilities_, config_.disabled_kv_sharing, *adapter, mode);
  if (!warning.empty()) spdlog::warn("{}", warning);
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
    adapters_[name] = AdapterEntry{path, adapter, slot, 0, false, mode};
  }
  try {
    run_on_engine_thread([&] {
      if (mode == KvSharing::kForked) prepare_forked_adapter(name, kv_lora_rank(*adapter));
      backend_->set_adapter(slot, adapter);
    });
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
  run_on_engine_thread([&] {
    backend_->set_adapter(slot, nullptr);
    drop_adapter_kv(name);
    publish_gauges();
  });
  std::lock_guard<std::mutex> lock(adapters_mutex_);
  slot_used_[static_cast<size_t>(slot)] = false;
}

std::vector<AdapterInfo> EngineImpl::adapters() const {
  std::lock_guard<std::mutex> lock(adapters_mutex_);
  std::vector<AdapterInfo> infos;
  for (const auto& [name, entry] : adapters_)
    if (entry.ready)
      infos.push_back({name, entry.path, entry.adapter->max_rank(), entry.num_running_requests, entry.sharing});
  return infos;
}

}  // namespace loom
