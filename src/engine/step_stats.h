// What the engine measures, gathered on the engine thread without a lock and
// published into EngineMetrics once per engine-loop iteration (under the
// metrics mutex, taken once there).
//
//   StepStats     events of the step: samples (queue time, TTFT, prefill,
//                 inter-token, end-to-end, decode, load waits, decode batch
//                 sizes) and counter increments (prefix lookups by mode,
//                 prompt / generated tokens, ended requests by reason).
//                 publish_into appends and adds them, then starts empty again.
//   EngineGauges  point-in-time values (KV blocks and bytes per member and per
//                 adapter, running / waiting, preemptions, host tier counters),
//                 measured once per publish; apply_to overwrites them.
//
// Thread: engine thread only; publish_into / apply_to under the caller's lock
// of the EngineMetrics they fill.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "kv/kv_cache_group.h"
#include "kvstore/disk_kv_store.h"

namespace loom {

class StepStats {
 public:
  // A request's first scheduling: seconds since it was submitted.
  void add_queue_time(double seconds) { queue_time_.push_back(seconds); }
  // A request's prefix lookup at admission (`mode`: RequestKvPlan::mode_label).
  void add_prefix_lookup(const std::string& mode, int64_t num_prompt_tokens, int64_t num_hit_tokens);
  // A generated token: its request's first (TTFT since submit, prefill since
  // first scheduled) or a later one (seconds since the previous token).
  void add_first_token(double time_to_first_token, double prefill_time);
  void add_next_token(double inter_token_time);
  // A request's end: why (finished_reason_label), end-to-end seconds and, when
  // it produced a token, the seconds since its first.
  void add_finished(const std::string& reason, double end_to_end, std::optional<double> decode_time);
  // Requests that decoded one token in a step (only steps with any).
  void add_decode_batch(int32_t num_decodes) { decode_batch_sizes_.push_back(num_decodes); }
  // Host tier: requests held back by this plan because their prefix was loading,
  // and the seconds an admitted request waited on loads.
  void set_num_waiting_on_load(int32_t num_requests) { num_waiting_on_load_ = num_requests; }
  void add_load_wait(double seconds) { load_wait_time_.push_back(seconds); }

  // Appends the samples and adds the counts to `metrics`, then empties this.
  void publish_into(EngineMetrics& metrics);

 private:
  std::vector<double> queue_time_, time_to_first_token_, prefill_time_, inter_token_, end_to_end_, decode_time_,
      load_wait_time_;
  std::vector<int32_t> decode_batch_sizes_;
  std::map<std::string, int64_t> prefix_queried_tokens_by_mode_, prefix_hit_tokens_by_mode_;
  std::map<std::string, int64_t> num_finished_requests_by_reason_;
  int64_t num_prefix_queried_tokens_ = 0, num_prefix_hit_tokens_ = 0, num_prompt_tokens_ = 0;
  int64_t num_generated_tokens_ = 0;
  std::optional<int32_t> num_waiting_on_load_;
};

struct EngineGauges {
  PerKvCache<KvCacheStats> kv_stats;        // per member ({} for an absent one)
  PerKvCache<int64_t> kv_bytes_per_block;   // per member (0 for an absent one)
  int32_t block_size = 0;
  std::map<std::string, int64_t> kv_bytes_by_adapter;
  int32_t num_running = 0, num_waiting = 0;
  int64_t num_preemptions = 0, num_swap_preemptions = 0, num_swap_fallbacks = 0;
  std::optional<DiskKvStoreStats> disk;  // the disk tier's store, when there is one
  int64_t disk_capacity_bytes = 0;
  std::vector<CacheGauge> backend_caches;

  // Overwrites the gauges of `metrics` (its samples and counters stay).
  void apply_to(EngineMetrics& metrics) const;
};

// vLLM's finished_reason of a request's final output: "stop" or "length" when
// it finished, "abort" when it was cancelled (ErrorKind::kCancelled, or
// kUnavailable: a shutdown that does not drain), "error" for any other failure.
const char* finished_reason_label(const RequestOutput& final_output);

// Bytes of each adapter's namespaces (lora/, alora/...@, resid/) in every
// member, in one pass over the namespaces; every name in `adapter_names` gets
// an entry (0 when it holds nothing).
std::map<std::string, int64_t> kv_bytes_by_adapter(const PerKvCache<KvCacheStats>& kv_stats,
                                                   const PerKvCache<int64_t>& kv_bytes_per_block,
                                                   const std::vector<std::string>& adapter_names);

}  // namespace loom
