#include "server/metrics_exporter.h"

#include <algorithm>
#include <map>
#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace loom::server {
namespace {

std::vector<double> latency_bounds() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0};
}

// The length of the valid UTF-8 sequence at text[i], or 0 when the bytes
// there are not one (overlong forms, surrogates and > U+10FFFF included).
size_t utf8_sequence_length(const std::string& text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // overlong
    if (lead == 0xED) high = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;   // overlong
    if (lead == 0xF4) high = 0x8F;  // beyond U+10FFFF
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (size_t k = 2; k < length; ++k)
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  return length;
}

// A label value as the exposition format wants it: \\, \" and \n escaped,
// and valid UTF-8 (an adapter name from argv may not be: bad bytes become U+FFFD).
std::string escape_label_value(const std::string& value) {
  std::string escaped;
  for (size_t i = 0; i < value.size();) {
    const size_t length = utf8_sequence_length(value, i);
    if (length == 0) {
      escaped += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    const char c = value[i];
    if (c == '\\' || c == '"') escaped += '\\';
    if (c == '\n') escaped += "\\n";
    else escaped.append(value, i, length);
    i += length;
  }
  return escaped;
}

// The exposition text being built: families and their samples, each sample
// with the model_name label first.
class Exposition {
 public:
  explicit Exposition(const std::string& model_label) : model_label_(model_label) {}

  void family(const std::string& name, const char* type, const std::string& help) {
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  // `labels`: the sample's own labels, escaped, without braces ("" = none).
  template <typename Value>
  void sample(const std::string& name, const std::string& labels, Value value) {
    out_ += fmt::format("{}{{{}}} {}\n", name, with_model(labels), value);
  }
  template <typename Value>
  void scalar(const std::string& name, const char* type, const std::string& help, Value value) {
    family(name, type, help);
    sample(name, "", value);
  }
  std::string with_model(const std::string& labels) const {
    return labels.empty() ? model_label_ : model_label_ + "," + labels;
  }
  std::string& text() { return out_; }

 private:
  const std::string& model_label_;
  std::string out_;
};

// The bounded caches: loom_cache_{entries,capacity,bytes,evictions_total}{cache=NAME}
// (bytes only where the cache knows them).
void render_caches(Exposition& out, const std::vector<CacheGauge>& backend, const std::vector<CacheGauge>& server) {
  std::vector<CacheGauge> caches = backend;
  caches.insert(caches.end(), server.begin(), server.end());
  if (caches.empty()) return;
  auto label = [](const CacheGauge& cache) { return fmt::format("cache=\"{}\"", escape_label_value(cache.name)); };
  out.family("loom_cache_entries", "gauge", "Entries a bounded host-side cache holds now");
  for (const CacheGauge& cache : caches) out.sample("loom_cache_entries", label(cache), cache.entries);
  out.family("loom_cache_capacity", "gauge", "The most entries a bounded cache keeps (its limit)");
  for (const CacheGauge& cache : caches) out.sample("loom_cache_capacity", label(cache), cache.capacity);
  out.family("loom_cache_bytes", "gauge", "Host bytes a bounded cache holds now (caches that know them)");
  for (const CacheGauge& cache : caches)
    if (cache.bytes >= 0) out.sample("loom_cache_bytes", label(cache), cache.bytes);
  out.family("loom_cache_evictions_total", "counter", "Entries a bounded cache dropped to stay within its limit");
  for (const CacheGauge& cache : caches) out.sample("loom_cache_evictions_total", label(cache), cache.evictions);
}

// Prefix-cache counters: the total without a mode (kept for existing
// dashboards) plus one sample per request mode.
void by_mode(Exposition& out, const std::string& name, const std::string& help, int64_t total,
             const std::map<std::string, int64_t>& by_mode_values) {
  out.family(name, "counter", help);
  out.sample(name, "", total);
  std::map<std::string, int64_t> values = {{"none", 0}, {"isolated", 0}, {"activated", 0}, {"base", 0}, {"forked", 0}};
  for (const auto& [mode, value] : by_mode_values) values[mode] = value;
  for (const auto& [mode, value] : values) out.sample(name, fmt::format("mode=\"{}\"", escape_label_value(mode)), value);
}

// One pool's tier: its label pair and blocks (used: vLLM's sense on the
// device, blocks held by requests; on the host, blocks holding backups).
struct TierUsage {
  const char* tier;
  const char* kind;
  int64_t used_blocks, total_blocks;
};

// The tiers that exist (have blocks): the main pool on the device, the rCache
// pool when there is one, each pool's host tier when it has one.
std::vector<TierUsage> existing_tiers(const EngineMetrics& m) {
  std::vector<TierUsage> tiers;
  for (const TierUsage& tier : {TierUsage{"device", "base", m.kv_blocks_in_use, m.kv_blocks_total},
                                TierUsage{"device", "residual", m.residual_blocks_in_use, m.residual_blocks_total},
                                TierUsage{"host", "base", m.host_blocks_used, m.host_blocks_total},
                                TierUsage{"host", "residual", m.residual_host_blocks_used,
                                          m.residual_host_blocks_total}})
    if (tier.total_blocks > 0) tiers.push_back(tier);
  // The disk tier in bytes (its blocks may be of either pool): bytes / cap.
  if (m.disk_capacity_bytes > 0) tiers.push_back(TierUsage{"disk", "all", m.disk_bytes, m.disk_capacity_bytes});
  return tiers;
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), bucket_counts_(upper_bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t bucket = static_cast<size_t>(
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin());
  ++bucket_counts_[bucket];
  sum_ += value;
  ++count_;
}

void Histogram::render(const std::string& name, const std::string& help, const std::string& labels,
                       std::string& out) const {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  const std::string bucket_labels = labels.empty() ? "" : labels + ",";
  int64_t cumulative = 0;
  for (size_t i = 0; i < upper_bounds_.size(); ++i) {
    cumulative += bucket_counts_[i];
    out += fmt::format("{}_bucket{{{}le=\"{}\"}} {}\n", name, bucket_labels, upper_bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{{}le=\"+Inf\"}} {}\n", name, bucket_labels, count_);
  const std::string braced = labels.empty() ? "" : "{" + labels + "}";
  out += fmt::format("{0}_sum{1} {2}\n{0}_count{1} {3}\n", name, braced, sum_, count_);
}

MetricsExporter::MetricsExporter(const std::string& model_name)
    : model_label_(fmt::format("model_name=\"{}\"", escape_label_value(model_name))),
      time_to_first_token_(latency_bounds()), inter_token_(latency_bounds()), end_to_end_(latency_bounds()),
      queue_time_(latency_bounds()), prefill_time_(latency_bounds()), decode_time_(latency_bounds()),
      load_wait_time_(latency_bounds()), device_kv_transfer_time_(latency_bounds()),
      device_kv_wait_time_(latency_bounds()),
      decode_batch_size_({1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}) {}

void MetricsExporter::absorb(const EngineMetrics& metrics) {
  std::lock_guard lock(mutex_);
  absorb_locked(metrics);
}

std::string MetricsExporter::render() const {
  std::lock_guard lock(mutex_);
  return render_locked();
}

std::string MetricsExporter::scrape(Engine& engine) {
  std::lock_guard lock(mutex_);
  absorb_locked(engine.take_metrics());
  return render_locked();
}

std::optional<std::string> MetricsExporter::stats_line(Engine& engine, double elapsed_seconds) {
  return stats_line(engine.take_metrics(), elapsed_seconds);
}

std::optional<std::string> MetricsExporter::stats_line(const EngineMetrics& snapshot, double elapsed_seconds) {
  std::lock_guard lock(mutex_);
  absorb_locked(snapshot);
  const EngineMetrics& m = latest_;
  const int64_t prompt = m.num_prompt_tokens - std::exchange(logged_prompt_tokens_, m.num_prompt_tokens);
  const int64_t generated = m.num_generated_tokens - std::exchange(logged_generated_tokens_, m.num_generated_tokens);
  const int64_t queried = m.prefix_queried_tokens - std::exchange(logged_queried_tokens_, m.prefix_queried_tokens);
  const int64_t hit = m.prefix_hit_tokens - std::exchange(logged_hit_tokens_, m.prefix_hit_tokens);
  if (prompt == 0 && generated == 0 && m.num_running == 0 && m.num_waiting == 0) return std::nullopt;
  const double seconds = elapsed_seconds > 0 ? elapsed_seconds : 1.0;
  std::string line = fmt::format(
      "Avg prompt throughput: {:.1f} tokens/s, Avg generation throughput: {:.1f} tokens/s, Running: {} reqs, "
      "Waiting: {} reqs",
      static_cast<double>(prompt) / seconds, static_cast<double>(generated) / seconds, m.num_running, m.num_waiting);
  for (const TierUsage& usage : existing_tiers(m))
    if (std::string_view(usage.kind) != "residual")
      line += fmt::format(", {} KV cache usage: {:.1f}%", usage.tier,
                          100.0 * static_cast<double>(usage.used_blocks) / static_cast<double>(usage.total_blocks));
  line += fmt::format(", Prefix cache hit rate: {:.1f}%",
                      queried > 0 ? 100.0 * static_cast<double>(hit) / static_cast<double>(queried) : 0.0);
  return line;
}

void MetricsExporter::absorb_locked(const EngineMetrics& metrics) {
  for (double value : metrics.time_to_first_token) time_to_first_token_.observe(value);
  for (double value : metrics.inter_token) inter_token_.observe(value);
  for (double value : metrics.end_to_end) end_to_end_.observe(value);
  for (double value : metrics.queue_time) queue_time_.observe(value);
  for (double value : metrics.prefill_time) prefill_time_.observe(value);
  for (double value : metrics.decode_time) decode_time_.observe(value);
  for (double value : metrics.load_wait_time) load_wait_time_.observe(value);
  for (double value : metrics.device_kv_transfer_time) device_kv_transfer_time_.observe(value);
  for (double value : metrics.device_kv_wait_time) device_kv_wait_time_.observe(value);
  for (int32_t value : metrics.decode_batch_sizes) decode_batch_size_.observe(value);
  latest_ = metrics;
  latest_.time_to_first_token.clear();
  latest_.inter_token.clear();
  latest_.end_to_end.clear();
  latest_.queue_time.clear();
  latest_.prefill_time.clear();
  latest_.decode_time.clear();
  latest_.load_wait_time.clear();
  latest_.device_kv_transfer_time.clear();
  latest_.device_kv_wait_time.clear();
  latest_.decode_batch_sizes.clear();
}

std::string MetricsExporter::render_locked() const {
  const EngineMetrics& m = latest_;
  Exposition out(model_label_);
  out.scalar("loom_num_requests_running", "gauge", "Requests in the running batch", m.num_running);
  out.scalar("loom_num_requests_waiting", "gauge", "Requests waiting to be scheduled", m.num_waiting);

  out.family("loom_kv_cache_usage_perc", "gauge",
             "Fraction of a pool's blocks used (0..1), by tier and kind (device: blocks held by requests, cached "
             "ones count as free, as vLLM's kv_cache_usage_perc; host: blocks holding backups)");
  for (const TierUsage& usage : existing_tiers(m))
    out.sample("loom_kv_cache_usage_perc", fmt::format("tier=\"{}\",kind=\"{}\"", usage.tier, usage.kind),
               static_cast<double>(usage.used_blocks) / static_cast<double>(usage.total_blocks));
  out.family("loom_kv_cache_bytes", "gauge",
             "KV cache bytes held now (in use or cached), by tier and kind (base: the main pool, whatever the mode; "
             "residual: forked adapters' rCache)");
  out.sample("loom_kv_cache_bytes", "tier=\"device\",kind=\"base\"", m.kv_bytes_base);
  out.sample("loom_kv_cache_bytes", "tier=\"device\",kind=\"residual\"", m.kv_bytes_residual);
  if (m.host_blocks_total > 0) out.sample("loom_kv_cache_bytes", "tier=\"host\",kind=\"base\"", m.kv_bytes_host);
  if (m.residual_host_blocks_total > 0)
    out.sample("loom_kv_cache_bytes", "tier=\"host\",kind=\"residual\"", m.kv_bytes_host_residual);
  if (m.disk_capacity_bytes > 0) out.sample("loom_kv_cache_bytes", "tier=\"disk\",kind=\"all\"", m.disk_bytes);
  out.family("loom_kv_cache_bytes_per_token", "gauge",
             "Bytes one token takes across all layers: a K/V slot (base) or an rCache slot (residual)");
  out.sample("loom_kv_cache_bytes_per_token", "kind=\"base\"", m.kv_bytes_per_token_base);
  out.sample("loom_kv_cache_bytes_per_token", "kind=\"residual\"", m.kv_bytes_per_token_residual);
  out.family("loom_kv_cache_adapter_bytes", "gauge",
             "KV bytes held now in an adapter's own namespaces (isolated, activated branches, forked rCache)");
  for (const auto& [adapter, bytes] : m.kv_bytes_by_adapter)
    out.sample("loom_kv_cache_adapter_bytes", fmt::format("adapter=\"{}\"", escape_label_value(adapter)), bytes);
  out.family("loom_kv_cache_blocks", "gauge", "KV cache blocks by state (free + cached + in_use = total)");
  out.sample("loom_kv_cache_blocks", "state=\"free\"", m.kv_blocks_free);
  out.sample("loom_kv_cache_blocks", "state=\"cached\"", m.kv_blocks_cached);
  out.sample("loom_kv_cache_blocks", "state=\"in_use\"", m.kv_blocks_in_use);
  out.scalar("loom_kv_cache_blocks_total", "gauge", "KV cache blocks in the pool", m.kv_blocks_total);
  out.family("loom_residual_kv_cache_blocks", "gauge",
             "Forked rCache blocks by state (free + cached + in_use = total; all 0 without an rCache pool)");
  out.sample("loom_residual_kv_cache_blocks", "state=\"free\"", m.residual_blocks_free);
  out.sample("loom_residual_kv_cache_blocks", "state=\"cached\"", m.residual_blocks_cached);
  out.sample("loom_residual_kv_cache_blocks", "state=\"in_use\"", m.residual_blocks_in_use);
  out.scalar("loom_residual_kv_cache_blocks_total", "gauge", "Forked rCache blocks in the pool",
             m.residual_blocks_total);

  by_mode(out, "loom_prefix_cache_queried_tokens_total",
          "Prompt tokens looked up in the prefix cache (no mode: all; mode: the adapter's KV sharing, none = base "
          "model)",
          m.prefix_queried_tokens, m.prefix_queried_tokens_by_mode);
  by_mode(out, "loom_prefix_cache_hit_tokens_total",
          "Prompt tokens found in the prefix cache (no mode: all; mode: the adapter's KV sharing, none = base model)",
          m.prefix_hit_tokens, m.prefix_hit_tokens_by_mode);
  // vLLM's vllm:num_preemptions_total is the unlabelled total; mode splits it (--preemption-mode).
  out.family("loom_num_preemptions_total", "counter",
             "Requests preempted (no mode: all; mode=recompute: recomputed later, mode=swap: K/V swapped to the host)");
  out.sample("loom_num_preemptions_total", "", m.num_preemptions);
  out.sample("loom_num_preemptions_total", "mode=\"recompute\"", m.num_preemptions - m.num_swap_preemptions);
  out.sample("loom_num_preemptions_total", "mode=\"swap\"", m.num_swap_preemptions);
  out.scalar("loom_swap_fallbacks_total", "counter",
             "Swaps (--preemption-mode swap) that recomputed instead: no host tier or room, a failed copy, a lost prefix",
             m.num_swap_fallbacks);
  out.scalar("loom_swapped_out_tokens_total", "counter", "Tokens of private KV blocks swapped to the host",
             m.num_swapped_out_tokens);
  out.scalar("loom_swapped_in_tokens_total", "counter", "Tokens of private KV blocks swapped back to the device",
             m.num_swapped_in_tokens);
  out.scalar("loom_evicted_tokens_total", "counter", "Cached tokens evicted", m.num_evicted_tokens);
  out.scalar("loom_workflows_active", "gauge",
             "Workflows known now (declared, progressed or seen in a request within --workflow-ttl-seconds)",
             m.num_workflows_active);
  out.family("loom_kv_eviction_policy_info", "gauge", "The KV eviction policy (--eviction-policy), as a label");
  out.sample("loom_kv_eviction_policy_info", fmt::format("policy=\"{}\"", escape_label_value(m.eviction_policy)), 1);
  out.scalar("loom_offloaded_tokens_total", "counter",
             "Tokens backed up from the device to the host tier (main and rCache pools together)",
             m.num_offloaded_tokens);
  out.scalar("loom_loaded_tokens_total", "counter",
             "Tokens loaded from the host tier (prefetches included; main and rCache pools together)",
             m.num_loaded_tokens);
  out.scalar("loom_prefetched_tokens_total", "counter",
             "Tokens loaded from the host tier by proactive prefetch (main and rCache pools together)",
             m.num_prefetched_tokens);
  if (m.disk_capacity_bytes > 0) {
    out.scalar("loom_disk_kv_blocks", "gauge", "Block files in the disk tier's directory, as this server knows it",
               m.disk_blocks);
    out.scalar("loom_disk_kv_stored_blocks_total", "counter", "Blocks this server wrote to the disk tier",
               m.num_disk_stored_blocks);
    out.scalar("loom_disk_kv_loaded_tokens_total", "counter",
               "Tokens read back from the disk tier into the host tier (main and rCache pools together)",
               m.num_disk_loaded_tokens);
    out.scalar("loom_disk_kv_read_bytes_total", "counter", "Payload bytes read back from the disk tier",
               m.disk_read_bytes);
    out.scalar("loom_disk_kv_read_seconds_total", "counter",
               "Seconds spent reading the disk tier (read bandwidth = bytes / seconds)", m.disk_read_seconds);
    out.family("loom_disk_kv_failures_total", "counter",
               "Disk-tier operations that failed: reads of files that did not verify (then recomputed), writes "
               "that did not publish");
    out.sample("loom_disk_kv_failures_total", "op=\"read\"", m.num_disk_read_failures);
    out.sample("loom_disk_kv_failures_total", "op=\"write\"", m.num_disk_write_failures);
  }
  out.family("loom_prefetch_outcome_tokens_total", "counter",
             "Prefetched tokens by what the request that needed them found: ready (in time) or still loading (late)");
  out.sample("loom_prefetch_outcome_tokens_total", "outcome=\"in_time\"", m.num_prefetch_hit_tokens);
  out.sample("loom_prefetch_outcome_tokens_total", "outcome=\"late\"", m.num_prefetch_late_tokens);
  out.scalar("loom_kv_transfer_failures_total", "counter",
             "Host-tier copies that failed or were refused (the blocks are recomputed)", m.num_failed_kv_transfers);
  out.family("loom_kv_device_transfers_total", "counter",
             "Device-to-device KV transfers (docs/disaggregation.md): received whole, failed at this engine or "
             "cancelled by the router (the request recomputed), sent whole or abandoned by it");
  out.sample("loom_kv_device_transfers_total", "direction=\"received\",outcome=\"ok\"", m.num_device_kv_received);
  out.sample("loom_kv_device_transfers_total", "direction=\"received\",outcome=\"failed\"",
             m.num_device_kv_receive_failures);
  out.sample("loom_kv_device_transfers_total", "direction=\"received\",outcome=\"cancelled\"", m.num_device_kv_cancelled);
  out.sample("loom_kv_device_transfers_total", "direction=\"sent\",outcome=\"ok\"", m.num_device_kv_sent);
  out.sample("loom_kv_device_transfers_total", "direction=\"sent\",outcome=\"failed\"", m.num_device_kv_send_failures);
  out.scalar("loom_kv_device_received_blocks_total", "counter",
             "KV blocks that joined this engine's caches through device-to-device transfers", m.device_kv_received_blocks);
  out.scalar("loom_kv_device_quarantined_blocks", "gauge",
             "KV blocks held out of the pools because a failed device-to-device transfer's peer may still write them",
             m.device_kv_quarantined_blocks);
  out.scalar("loom_num_requests_waiting_on_load", "gauge",
             "Waiting requests held back last step because their prefix is loading from the host tier",
             m.num_waiting_on_load);
  out.scalar("loom_prompt_tokens_total", "counter", "Prompt tokens processed", m.num_prompt_tokens);
  out.scalar("loom_generation_tokens_total", "counter", "Tokens generated", m.num_generated_tokens);
  out.family("loom_request_success_total", "counter",
             "Requests ended, by vLLM's finished_reason: stop and length finished (successes), abort was cancelled "
             "(client gone, or a shutdown that does not drain), error failed in the engine");
  std::map<std::string, int64_t> finished = {{"stop", 0}, {"length", 0}, {"abort", 0}, {"error", 0}};
  for (const auto& [reason, num_requests] : m.num_finished_requests_by_reason) finished[reason] = num_requests;
  for (const auto& [reason, num_requests] : finished)
    out.sample("loom_request_success_total", fmt::format("finished_reason=\"{}\"", escape_label_value(reason)),
               num_requests);

  render_caches(out, m.backend_caches, server_caches_ ? server_caches_() : std::vector<CacheGauge>{});

  const std::string labels = out.with_model("");
  time_to_first_token_.render("loom_time_to_first_token_seconds", "Time to first token", labels, out.text());
  inter_token_.render("loom_inter_token_latency_seconds", "Time between output tokens", labels, out.text());
  end_to_end_.render("loom_e2e_request_latency_seconds", "Request latency from arrival to finish", labels, out.text());
  queue_time_.render("loom_request_queue_time_seconds", "Time waiting before first scheduled", labels, out.text());
  load_wait_time_.render("loom_kv_load_wait_seconds",
                         "Time a request waited for its prefix to load from the host tier", labels, out.text());
  device_kv_transfer_time_.render("loom_kv_device_transfer_seconds",
                                  "Device-to-device KV received whole: from the reservation to every layer landed",
                                  labels, out.text());
  device_kv_wait_time_.render("loom_kv_device_wait_seconds",
                              "Time a decode engine's request waited outside the scheduler for its device-to-device "
                              "KV to settle",
                              labels, out.text());
  prefill_time_.render("loom_request_prefill_time_seconds", "Time in prefill", labels, out.text());
  decode_time_.render("loom_request_decode_time_seconds", "Time in decode", labels, out.text());
  decode_batch_size_.render("loom_decode_batch_size", "Sequences per decode step", labels, out.text());
  return std::move(out.text());
}

}  // namespace loom::server
