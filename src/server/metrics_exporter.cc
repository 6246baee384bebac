#include "server/metrics_exporter.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

namespace loom::server {
namespace {

std::vector<double> latency_bounds() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0};
}

void header(std::string& out, const std::string& name, const char* type, const std::string& help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void scalar(std::string& out, const std::string& name, const char* type, const std::string& help, double value) {
  header(out, name, type, help);
  out += fmt::format("{} {}\n", name, value);
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

// Prefix-cache counters: the unlabelled total (kept for existing dashboards)
// plus one sample per request mode.
void by_mode(std::string& out, const std::string& name, const std::string& help, int64_t total,
             const std::map<std::string, int64_t>& by_mode_values) {
  header(out, name, "counter", help);
  out += fmt::format("{} {}\n", name, total);
  std::map<std::string, int64_t> values = {{"none", 0}, {"isolated", 0}, {"activated", 0}, {"base", 0}, {"forked", 0}};
  for (const auto& [mode, value] : by_mode_values) values[mode] = value;
  for (const auto& [mode, value] : values)
    out += fmt::format("{}{{mode=\"{}\"}} {}\n", name, escape_label_value(mode), value);
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

void Histogram::render(const std::string& name, const std::string& help, std::string& out) const {
  header(out, name, "histogram", help);
  int64_t cumulative = 0;
  for (size_t i = 0; i < upper_bounds_.size(); ++i) {
    cumulative += bucket_counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, upper_bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name, count_);
}

MetricsExporter::MetricsExporter()
    : time_to_first_token_(latency_bounds()), inter_token_(latency_bounds()), end_to_end_(latency_bounds()),
      queue_time_(latency_bounds()), prefill_time_(latency_bounds()), decode_time_(latency_bounds()),
      load_wait_time_(latency_bounds()),
      decode_batch_size_({1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}) {}

void MetricsExporter::absorb(const EngineMetrics& metrics) {
  std::lock_guard lock(mutex_);
  for (double value : metrics.time_to_first_token) time_to_first_token_.observe(value);
  for (double value : metrics.inter_token) inter_token_.observe(value);
  for (double value : metrics.end_to_end) end_to_end_.observe(value);
  for (double value : metrics.queue_time) queue_time_.observe(value);
  for (double value : metrics.prefill_time) prefill_time_.observe(value);
  for (double value : metrics.decode_time) decode_time_.observe(value);
  for (double value : metrics.load_wait_time) load_wait_time_.observe(value);
  for (int32_t value : metrics.decode_batch_sizes) decode_batch_size_.observe(value);
  latest_ = metrics;
  latest_.time_to_first_token.clear();
  latest_.inter_token.clear();
  latest_.end_to_end.clear();
  latest_.queue_time.clear();
  latest_.prefill_time.clear();
  latest_.decode_time.clear();
  latest_.load_wait_time.clear();
  latest_.decode_batch_sizes.clear();
}

std::string MetricsExporter::render() const {
  std::lock_guard lock(mutex_);
  const EngineMetrics& m = latest_;
  std::string out;
  scalar(out, "loom_num_requests_running", "gauge", "Requests in the running batch", m.num_running);
  scalar(out, "loom_num_requests_waiting", "gauge", "Requests waiting to be scheduled", m.num_waiting);

  header(out, "loom_kv_cache_bytes", "gauge",
         "KV cache bytes held now (in use or cached), by tier and kind (base: the main pool, whatever the mode; "
         "residual: forked adapters' rCache)");
  for (const char* tier : {"device", "host", "disk"})
    for (const char* kind : {"base", "residual"}) {
      int64_t value = 0;
      if (std::string(tier) == "device") value = std::string(kind) == "base" ? m.kv_bytes_base : m.kv_bytes_residual;
      if (std::string(tier) == "host") value = std::string(kind) == "base" ? m.kv_bytes_host : m.kv_bytes_host_residual;
      out += fmt::format("loom_kv_cache_bytes{{tier=\"{}\",kind=\"{}\"}} {}\n", tier, kind, value);
    }
  header(out, "loom_kv_cache_bytes_per_token", "gauge",
         "Bytes one token takes across all layers: a K/V slot (base) or an rCache slot (residual)");
  out += fmt::format("loom_kv_cache_bytes_per_token{{kind=\"base\"}} {}\n", m.kv_bytes_per_token_base);
  out += fmt::format("loom_kv_cache_bytes_per_token{{kind=\"residual\"}} {}\n", m.kv_bytes_per_token_residual);
  header(out, "loom_kv_cache_adapter_bytes", "gauge",
         "KV bytes held now in an adapter's own namespaces (isolated, activated branches, forked rCache)");
  for (const auto& [adapter, bytes] : m.kv_bytes_by_adapter)
    out += fmt::format("loom_kv_cache_adapter_bytes{{adapter=\"{}\"}} {}\n", escape_label_value(adapter), bytes);
  header(out, "loom_kv_cache_blocks", "gauge", "KV cache blocks by state (free + cached + in_use = total)");
  out += fmt::format("loom_kv_cache_blocks{{state=\"free\"}} {}\n", m.kv_blocks_free);
  out += fmt::format("loom_kv_cache_blocks{{state=\"cached\"}} {}\n", m.kv_blocks_cached);
  out += fmt::format("loom_kv_cache_blocks{{state=\"in_use\"}} {}\n", m.kv_blocks_in_use);
  scalar(out, "loom_kv_cache_blocks_total", "gauge", "KV cache blocks in the pool", static_cast<double>(m.kv_blocks_total));
  header(out, "loom_residual_kv_cache_blocks", "gauge",
         "Forked rCache blocks by state (free + cached + in_use = total; all 0 without an rCache pool)");
  out += fmt::format("loom_residual_kv_cache_blocks{{state=\"free\"}} {}\n", m.residual_blocks_free);
  out += fmt::format("loom_residual_kv_cache_blocks{{state=\"cached\"}} {}\n", m.residual_blocks_cached);
  out += fmt::format("loom_residual_kv_cache_blocks{{state=\"in_use\"}} {}\n", m.residual_blocks_in_use);
  scalar(out, "loom_residual_kv_cache_blocks_total", "gauge", "Forked rCache blocks in the pool",
         static_cast<double>(m.residual_blocks_total));

  by_mode(out, "loom_prefix_cache_queried_tokens_total",
          "Prompt tokens looked up in the prefix cache (unlabelled: all; mode: the adapter's KV sharing, none = base "
          "model)",
          m.prefix_queried_tokens, m.prefix_queried_tokens_by_mode);
  by_mode(out, "loom_prefix_cache_hit_tokens_total",
          "Prompt tokens found in the prefix cache (unlabelled: all; mode: the adapter's KV sharing, none = base model)",
          m.prefix_hit_tokens, m.prefix_hit_tokens_by_mode);
  scalar(out, "loom_num_preemptions_total", "counter", "Requests preempted (recomputed later)",
         static_cast<double>(m.num_preemptions));
  scalar(out, "loom_evicted_tokens_total", "counter", "Cached tokens evicted", static_cast<double>(m.num_evicted_tokens));
  scalar(out, "loom_workflows_active", "gauge",
         "Workflows known now (declared, progressed or seen in a request within --workflow-ttl-seconds)",
         m.num_workflows_active);
  header(out, "loom_kv_eviction_policy_info", "gauge", "The KV eviction policy (--eviction-policy), as a label");
  out += fmt::format("loom_kv_eviction_policy_info{{policy=\"{}\"}} 1\n", escape_label_value(m.eviction_policy));
  scalar(out, "loom_offloaded_tokens_total", "counter",
         "Tokens backed up from the device to the host tier (main and rCache pools together)",
         static_cast<double>(m.num_offloaded_tokens));
  scalar(out, "loom_loaded_tokens_total", "counter",
         "Tokens loaded from the host tier (prefetches included; main and rCache pools together)",
         static_cast<double>(m.num_loaded_tokens));
  scalar(out, "loom_prefetched_tokens_total", "counter",
         "Tokens loaded from the host tier by proactive prefetch (main and rCache pools together)",
         static_cast<double>(m.num_prefetched_tokens));
  header(out, "loom_prefetch_outcome_tokens_total", "counter",
         "Prefetched tokens by what the request that needed them found: ready (in time) or still loading (late)");
  out += fmt::format("loom_prefetch_outcome_tokens_total{{outcome=\"in_time\"}} {}\n", m.num_prefetch_hit_tokens);
  out += fmt::format("loom_prefetch_outcome_tokens_total{{outcome=\"late\"}} {}\n", m.num_prefetch_late_tokens);
  scalar(out, "loom_kv_transfer_failures_total", "counter",
         "Host-tier copies that failed or were refused (the blocks are recomputed)",
         static_cast<double>(m.num_failed_kv_transfers));
  scalar(out, "loom_num_requests_waiting_on_load", "gauge",
         "Waiting requests held back last step because their prefix is loading from the host tier",
         m.num_waiting_on_load);
  scalar(out, "loom_prompt_tokens_total", "counter", "Prompt tokens processed", static_cast<double>(m.num_prompt_tokens));
  scalar(out, "loom_generation_tokens_total", "counter", "Tokens generated", static_cast<double>(m.num_generated_tokens));
  scalar(out, "loom_request_success_total", "counter", "Requests finished",
         static_cast<double>(m.num_finished_requests));

  time_to_first_token_.render("loom_time_to_first_token_seconds", "Time to first token", out);
  inter_token_.render("loom_inter_token_latency_seconds", "Time between output tokens", out);
  end_to_end_.render("loom_e2e_request_latency_seconds", "Request latency from arrival to finish", out);
  queue_time_.render("loom_request_queue_time_seconds", "Time waiting before first scheduled", out);
  load_wait_time_.render("loom_kv_load_wait_seconds", "Time a request waited for its prefix to load from the host tier",
                         out);
  prefill_time_.render("loom_request_prefill_time_seconds", "Time in prefill", out);
  decode_time_.render("loom_request_decode_time_seconds", "Time in decode", out);
  decode_batch_size_.render("loom_decode_batch_size", "Sequences per decode step", out);
  return out;
}

}  // namespace loom::server
