// EngineImpl's adapter commands (load / unload with KV sharing modes) and the
// pool reallocation they may cause (see engine_impl.h).
#include <spdlog/spdlog.h>

#include "engine/backend_support.h"
#include "engine/engine_impl.h"
#include "engine/kv_identity.h"
#include "engine/request_kv.h"
#include "lora/adapter.h"

namespace loom {

void EngineImpl::allocate_pools(const KvPoolLayout& layout) {
  const std::optional<KvPoolLayout> previous = pools_.layout_in_use();
  scheduler_.reset();  // it refers into the group that allocate() replaces
  if (kv_receiver_) kv_receiver_->drop();
  try {
    pools_.allocate(layout);
  } catch (...) {
    // The backend refused the new pools (out of memory, say): serve on with
    // pools of the previous layout (their cached blocks are gone), then report.
    if (previous) {
      pools_.allocate(*previous);
      rebuild_scheduler();
    }
    throw;
  }
  rebuild_scheduler();
}

void EngineImpl::rebuild_scheduler() {
  if (config_.device_kv_plane)
    config_.device_kv_plane->bind_pools(backend_->kv_pool_memory(KvPoolKind::kMain),
                                        pools_.num_residual_kv_blocks() > 0
                                            ? backend_->kv_pool_memory(KvPoolKind::kResidual)
                                            : KvPoolMemory{});
  scheduler_ = std::make_unique<Scheduler>(
      SchedulerConfig{config_.max_batch_tokens, config_.max_running_requests, config_.max_loras_per_batch,
                      config_.blocking_host_loads ? HostLoadPolicy::kBlocking : HostLoadPolicy::kBackground,
                      config_.swap_preemption ? PreemptionMode::kSwap : PreemptionMode::kRecompute},
      pools_.caches());
  workflow_sync_.reset(pools_.caches());
  publish();
}

void EngineImpl::prepare_forked_adapter(const std::string& name, int32_t kv_rank) {
  const std::optional<KvPoolSizing> sizing =
      pools_.sizing_for_forked_adapter(name, kv_rank, adapters_.max_kv_lora_rank(), any_request_admitted_);
  if (!sizing) return;
  allocate_pools(pools_.layout(*sizing));
  spdlog::info("forked residual KV cache: {} blocks of {} bytes at max rank {} (for adapter '{}'); main KV: {} blocks",
               pools_.num_residual_kv_blocks(), pools_.residual_bytes_per_block(), sizing->max_rank, name,
               pools_.num_kv_blocks());
}

void EngineImpl::load_adapter(const std::string& name, const std::string& path, std::optional<KvSharing> sharing) {
  if (name.empty()) fail(ErrorKind::kInvalidArgument, "an adapter needs a name");
  if (adapters_.contains(name)) fail(ErrorKind::kInvalidArgument, "adapter '{}' is already loaded", name);
  std::shared_ptr<const LoraAdapter> adapter = load_lora_adapter(name, path, model_.config);
  const KvSharing mode = choose_kv_sharing(adapter->config, sharing, config_.default_sharing);
  const std::string warning = check_kv_sharing(mode, *adapter, model_.config);
  // Before a slot is taken: a refused adapter never reaches the backend or a batch.
  check_adapter_supported(capabilities_, config_.disabled_kv_sharing, *adapter, mode);
  if (!warning.empty()) spdlog::warn("{}", warning);
  const KvBlockHash identity = pools_.names_blocks() ? adapter_fingerprint(*adapter) : KvBlockHash{};
  const int32_t slot = adapters_.reserve(name, path, adapter, mode);
  try {
    run_on_engine_thread([&] {
      if (mode == KvSharing::kForked) prepare_forked_adapter(name, adapter->max_kv_rank());
      backend_->set_adapter(slot, adapter);
      pools_.set_adapter_identity(name, identity);
    });
  } catch (...) {
    adapters_.cancel_reservation(name);
    throw;
  }
  adapters_.mark_ready(name);
}

void EngineImpl::unload_adapter(const std::string& name) {
  const int32_t slot = adapters_.begin_unload(name);
  run_on_engine_thread([&] {
    backend_->set_adapter(slot, nullptr);
    pools_.drop_adapter_kv(name);
    pools_.forget_adapter_identity(name);
    publish();
  });
  adapters_.release_slot(slot);
}

}  // namespace loom
