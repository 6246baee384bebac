#include "engine/step_stats.h"

#include "kv/kv_key.h"

namespace loom {
namespace {

template <typename T>
void append_and_clear(std::vector<T>& from, std::vector<T>& to) {
  to.insert(to.end(), from.begin(), from.end());
  from.clear();
}

}  // namespace

void StepStats::add_prefix_lookup(const std::string& mode, int64_t num_prompt_tokens, int64_t num_hit_tokens) {
  num_prefix_queried_tokens_ += num_prompt_tokens;
  num_prefix_hit_tokens_ += num_hit_tokens;
  prefix_queried_tokens_by_mode_[mode] += num_prompt_tokens;
  prefix_hit_tokens_by_mode_[mode] += num_hit_tokens;
  num_prompt_tokens_ += num_prompt_tokens;
}

void StepStats::add_first_token(double time_to_first_token, double prefill_time) {
  ++num_generated_tokens_;
  time_to_first_token_.push_back(time_to_first_token);
  prefill_time_.push_back(prefill_time);
}

void StepStats::add_next_token(double inter_token_time) {
  ++num_generated_tokens_;
  inter_token_.push_back(inter_token_time);
}

void StepStats::add_finished(const std::string& reason, double end_to_end, std::optional<double> decode_time) {
  ++num_finished_requests_by_reason_[reason];
  end_to_end_.push_back(end_to_end);
  if (decode_time) decode_time_.push_back(*decode_time);
}

void StepStats::publish_into(EngineMetrics& metrics) {
  append_and_clear(queue_time_, metrics.queue_time);
  append_and_clear(time_to_first_token_, metrics.time_to_first_token);
  append_and_clear(prefill_time_, metrics.prefill_time);
  append_and_clear(inter_token_, metrics.inter_token);
  append_and_clear(end_to_end_, metrics.end_to_end);
  append_and_clear(decode_time_, metrics.decode_time);
  append_and_clear(load_wait_time_, metrics.load_wait_time);
  append_and_clear(decode_batch_sizes_, metrics.decode_batch_sizes);
  for (const auto& [mode, num_tokens] : prefix_queried_tokens_by_mode_) metrics.prefix_queried_tokens_by_mode[mode] += num_tokens;
  for (const auto& [mode, num_tokens] : prefix_hit_tokens_by_mode_) metrics.prefix_hit_tokens_by_mode[mode] += num_tokens;
  for (const auto& [reason, num_requests] : num_finished_requests_by_reason_)
    metrics.num_finished_requests_by_reason[reason] += num_requests;
  prefix_queried_tokens_by_mode_.clear();
  prefix_hit_tokens_by_mode_.clear();
  num_finished_requests_by_reason_.clear();
  metrics.prefix_queried_tokens += std::exchange(num_prefix_queried_tokens_, 0);
  metrics.prefix_hit_tokens += std::exchange(num_prefix_hit_tokens_, 0);
  metrics.num_prompt_tokens += std::exchange(num_prompt_tokens_, 0);
  metrics.num_generated_tokens += std::exchange(num_generated_tokens_, 0);
  if (num_waiting_on_load_) metrics.num_waiting_on_load = *std::exchange(num_waiting_on_load_, std::nullopt);
}

void EngineGauges::apply_to(EngineMetrics& metrics) const {
  const KvCacheStats& main = kv_stats[KvCacheId::kMain];
  const KvCacheStats& residual = kv_stats[KvCacheId::kResidual];
  const int64_t main_bytes_per_block = kv_bytes_per_block[KvCacheId::kMain];
  const int64_t residual_bytes_per_block = kv_bytes_per_block[KvCacheId::kResidual];
  metrics.kv_bytes_by_adapter = kv_bytes_by_adapter;
  metrics.backend_caches = backend_caches;
  metrics.num_running = num_running;
  metrics.num_waiting = num_waiting;
  metrics.kv_blocks_total = main.num_total_blocks;
  metrics.kv_blocks_free = main.num_free_blocks;
  metrics.kv_blocks_cached = main.num_cached_blocks;
  metrics.kv_blocks_in_use = main.num_in_use_blocks;
  metrics.residual_blocks_total = residual.num_total_blocks;
  metrics.residual_blocks_free = residual.num_free_blocks;
  metrics.residual_blocks_cached = residual.num_cached_blocks;
  metrics.residual_blocks_in_use = residual.num_in_use_blocks;
  metrics.kv_bytes_base = static_cast<int64_t>(main.num_cached_blocks + main.num_in_use_blocks) * main_bytes_per_block;
  metrics.kv_bytes_residual =
      static_cast<int64_t>(residual.num_cached_blocks + residual.num_in_use_blocks) * residual_bytes_per_block;
  metrics.kv_bytes_in_use_or_cached = metrics.kv_bytes_base + metrics.kv_bytes_residual;
  metrics.kv_bytes_per_token_base = main_bytes_per_block / block_size;
  metrics.kv_bytes_per_token_residual = residual_bytes_per_block / block_size;
  metrics.num_evicted_tokens = (main.num_evicted_blocks + residual.num_evicted_blocks) * block_size;
  metrics.num_preemptions = num_preemptions;
  metrics.num_swap_preemptions = num_swap_preemptions;
  metrics.num_swap_fallbacks = num_swap_fallbacks;
  metrics.num_swapped_out_tokens = (main.num_swapped_out_blocks + residual.num_swapped_out_blocks) * block_size;
  metrics.num_swapped_in_tokens = (main.num_swapped_in_blocks + residual.num_swapped_in_blocks) * block_size;
  metrics.kv_bytes_host = static_cast<int64_t>(main.num_host_used_blocks) * main_bytes_per_block;
  metrics.kv_bytes_host_residual = static_cast<int64_t>(residual.num_host_used_blocks) * residual_bytes_per_block;
  metrics.host_blocks_total = main.num_host_total_blocks;
  metrics.host_blocks_used = main.num_host_used_blocks;
  metrics.residual_host_blocks_total = residual.num_host_total_blocks;
  metrics.residual_host_blocks_used = residual.num_host_used_blocks;
  // Host-tier counters: every member's (an absent member's stats are all 0).
  auto total = [&](int64_t KvCacheStats::*counter) {
    int64_t sum = 0;
    for (KvCacheId id : kAllKvCaches) sum += kv_stats[id].*counter;
    return sum;
  };
  metrics.num_offloaded_tokens = total(&KvCacheStats::num_offloaded_blocks) * block_size;
  metrics.num_loaded_tokens = total(&KvCacheStats::num_loaded_blocks) * block_size;
  metrics.num_prefetched_tokens = total(&KvCacheStats::num_prefetched_blocks) * block_size;
  metrics.num_prefetch_hit_tokens = total(&KvCacheStats::num_prefetch_hit_blocks) * block_size;
  metrics.num_prefetch_late_tokens = total(&KvCacheStats::num_prefetch_late_blocks) * block_size;
  metrics.num_failed_kv_transfers = total(&KvCacheStats::num_failed_transfers);
  metrics.num_disk_loaded_tokens = total(&KvCacheStats::num_disk_read_blocks) * block_size;
  if (disk) {
    metrics.disk_blocks = disk->num_blocks;
    metrics.disk_bytes = disk->num_bytes;
    metrics.disk_capacity_bytes = disk_capacity_bytes;
    metrics.num_disk_stored_blocks = disk->num_stored_blocks;
    metrics.num_disk_read_failures = disk->num_read_failures;
    metrics.num_disk_write_failures = disk->num_write_failures;
    metrics.disk_read_bytes = disk->num_loaded_bytes;
    metrics.disk_read_seconds = disk->read_seconds;
  }
}

const char* finished_reason_label(const RequestOutput& final_output) {
  if (!final_output.error) return finish_reason_name(final_output.finish_reason);
  const ErrorKind kind = final_output.error->kind();
  return kind == ErrorKind::kCancelled || kind == ErrorKind::kUnavailable ? "abort" : "error";
}

std::map<std::string, int64_t> kv_bytes_by_adapter(const PerKvCache<KvCacheStats>& kv_stats,
                                                   const PerKvCache<int64_t>& kv_bytes_per_block,
                                                   const std::vector<std::string>& adapter_names) {
  std::map<std::string, int64_t> bytes_by_adapter;
  for (const std::string& name : adapter_names) bytes_by_adapter[name] = 0;
  for (KvCacheId id : kAllKvCaches)
    for (const auto& [kv_namespace, num_blocks] : kv_stats[id].num_blocks_by_namespace) {
      const std::optional<std::string> adapter = adapter_of_kv_namespace(kv_namespace);
      if (!adapter) continue;
      auto it = bytes_by_adapter.find(*adapter);
      if (it != bytes_by_adapter.end()) it->second += num_blocks * kv_bytes_per_block[id];
    }
  return bytes_by_adapter;
}

}  // namespace loom
