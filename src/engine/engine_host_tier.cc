// EngineImpl's half of the KV host tier (issue 5; kv/kv_cache_manager.h "Host
// tier"): the host pool and transfer worker, the per-step pump between the
// manager (which plans transfers) and the worker (which copies), proactive
// prefetch of the next agents' fixed prefixes, and load-wait metrics.
// Engine thread only.
#include <algorithm>

#include <spdlog/spdlog.h>

#include "engine/engine_impl.h"

namespace loom {

void EngineImpl::setup_host_tier() {
  kv_transfers_.reset();
  num_host_kv_blocks_ = 0;
  int32_t num_blocks = config_.num_host_kv_blocks;
  if (num_blocks <= 0 && config_.host_kv_cache_bytes > 0)
    num_blocks = static_cast<int32_t>(std::min<int64_t>(config_.host_kv_cache_bytes / kv_bytes_per_block_, 1 << 30));
  if (num_blocks <= 0) {
    if (config_.host_kv_cache_bytes > 0)
      throw Error(ErrorKind::kCapacity,
                  fmt::format("a host KV tier of {} bytes holds no block ({} bytes each)", config_.host_kv_cache_bytes,
                              kv_bytes_per_block_),
                  "raise --host-kv-memory");
    return;
  }
  backend_->allocate_host_kv_cache(KvPoolKind::kMain, num_blocks);
  kv_cache_->enable_host_tier(num_blocks);
  Backend* backend = backend_.get();
  auto copy = [backend](const KvCacheManager::Transfer& transfer) {
    const auto direction = transfer.kind == KvCacheManager::Transfer::Kind::kOffload ? KvCopyDirection::kDeviceToHost
                                                                                     : KvCopyDirection::kHostToDevice;
    backend->copy_kv_blocks(KvPoolKind::kMain, direction, transfer.device_block_ids, transfer.host_block_ids);
  };
  kv_transfers_ = std::make_unique<KvTransferWorker>(copy, std::max(config_.max_queued_kv_transfers, 1));
  num_host_kv_blocks_ = num_blocks;
  spdlog::info("KV host tier: {} blocks ({:.1f} MiB)", num_blocks,
               static_cast<double>(num_blocks) * static_cast<double>(kv_bytes_per_block_) / (1 << 20));
}

bool EngineImpl::has_kv_transfers_in_flight() const {
  return kv_cache_ != nullptr && kv_cache_->num_transfers_in_flight() > 0;
}

void EngineImpl::pump_kv_transfers() {
  if (!kv_transfers_) return;
  for (const KvTransferWorker::Finished& finished : kv_transfers_->take_finished())
    kv_cache_->finish_transfer(finished.transfer_id, finished.succeeded);
  for (KvCacheManager::Transfer& transfer : kv_cache_->take_transfers()) {
    const int64_t id = transfer.id;
    if (!kv_transfers_->submit(std::move(transfer))) kv_cache_->finish_transfer(id, false);
  }
}

void EngineImpl::drain_kv_transfers() {
  if (!kv_transfers_) return;
  while (has_kv_transfers_in_flight()) {
    pump_kv_transfers();
    kv_transfers_->wait_idle();
    pump_kv_transfers();
  }
}

void EngineImpl::prefetch_next_agents() {
  if (!kv_transfers_ || config_.prefetch_agents <= 0 || pushed_agent_steps_.empty()) return;
  // Agents about to run, nearest first (steps 0 run now: their requests load on demand).
  std::vector<std::pair<int32_t, const std::string*>> next;
  for (const auto& [agent_key, steps] : pushed_agent_steps_)
    if (steps >= 1 && steps != kStepsFar) next.emplace_back(steps, &agent_key);
  if (next.empty()) return;
  std::sort(next.begin(), next.end(),
            [](const auto& a, const auto& b) { return a.first != b.first ? a.first < b.first : *a.second < *b.second; });
  int32_t max_blocks = kv_cache_->num_total_blocks();
  if (config_.prefetch_max_bytes > 0)
    max_blocks = static_cast<int32_t>(std::min<int64_t>(config_.prefetch_max_bytes / kv_bytes_per_block_, max_blocks));
  const int32_t num_agents = std::min<int32_t>(config_.prefetch_agents, static_cast<int32_t>(next.size()));
  for (int32_t i = 0; i < num_agents && max_blocks > 0; ++i)
    max_blocks -= kv_cache_->prefetch_agent(*next[static_cast<size_t>(i)].second, max_blocks);
}

void EngineImpl::note_load_waits(const ScheduledBatch& plan, SteadyTime now) {
  if (!kv_transfers_) return;
  for (SchedulerRequestId id : plan.waiting_on_load) {
    PendingRequest& request = *active_.at(id);
    if (!request.load_wait_started_at) request.load_wait_started_at = now;
  }
  std::lock_guard<std::mutex> lock(metrics_mutex_);
  metrics_.num_waiting_on_load = static_cast<int32_t>(plan.waiting_on_load.size());
  for (const ScheduledRequest& entry : plan.requests) {
    PendingRequest& request = *active_.at(entry.id);
    if (!request.load_wait_started_at) continue;
    metrics_.load_wait_time.push_back(std::chrono::duration<double>(now - *request.load_wait_started_at).count());
    request.load_wait_started_at.reset();
  }
}

}  // namespace loom
