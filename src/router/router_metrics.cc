#include "router/router_metrics.h"

#include <fmt/format.h>

namespace loom::router {
namespace {

// A label value in Prometheus' text format: \, " and newline escaped.
std::string escape_label(const std::string& value) {
  std::string escaped;
  for (char c : value) {
    if (c == '\\' || c == '"') escaped += '\\';
    if (c == '\n') {
      escaped += "\\n";
      continue;
    }
    escaped += c;
  }
  return escaped;
}

template <typename Value>
void write_family(std::string& out, const char* name, const char* help, const char* label,
                  const std::map<std::string, Value>& samples, std::initializer_list<const char*> always) {
  out += fmt::format("# HELP {} {}\n# TYPE {} counter\n", name, help, name);
  std::map<std::string, Value> all = samples;
  for (const char* value : always) all.try_emplace(value, Value{});
  for (const auto& [value, count] : all) out += fmt::format("{}{{{}=\"{}\"}} {}\n", name, label, escape_label(value), count);
}

}  // namespace

void RouterMetrics::count_request(const std::string& path) {
  std::lock_guard lock(mutex_);
  ++requests_by_path_[path];
}

void RouterMetrics::add_transfer(const std::string& direction, int64_t bytes, double seconds) {
  std::lock_guard lock(mutex_);
  transfer_bytes_[direction] += bytes;
  transfer_seconds_[direction] += seconds;
}

void RouterMetrics::add_storage_read(const std::string& side, int64_t bytes) {
  std::lock_guard lock(mutex_);
  storage_read_bytes_[side] += bytes;
}

void RouterMetrics::count_engine_failure(const std::string& url) {
  std::lock_guard lock(mutex_);
  ++engine_failures_[url];
}

void RouterMetrics::count_retry() {
  std::lock_guard lock(mutex_);
  ++retries_;
}

void RouterMetrics::count_kv_path(const std::string& path, const std::string& decode_url,
                                  const std::string& fallback_reason) {
  std::lock_guard lock(mutex_);
  ++kv_paths_[path];
  ++engine_kv_paths_[{decode_url, path}];
  if (!fallback_reason.empty()) ++kv_path_fallbacks_[fallback_reason];
}

int64_t RouterMetrics::kv_paths(const std::string& path) const {
  std::lock_guard lock(mutex_);
  auto found = kv_paths_.find(path);
  return found == kv_paths_.end() ? 0 : found->second;
}

double RouterMetrics::link_bandwidth() const {
  std::lock_guard lock(mutex_);
  int64_t bytes = 0;
  double seconds = 0.0;
  for (const auto& [direction, count] : transfer_bytes_) bytes += count;
  for (const auto& [direction, count] : transfer_seconds_) seconds += count;
  return bytes > 0 && seconds > 0.0 ? static_cast<double>(bytes) / seconds : 0.0;
}

int64_t RouterMetrics::requests(const std::string& path) const {
  std::lock_guard lock(mutex_);
  auto found = requests_by_path_.find(path);
  return found == requests_by_path_.end() ? 0 : found->second;
}

int64_t RouterMetrics::retries() const {
  std::lock_guard lock(mutex_);
  return retries_;
}

std::string RouterMetrics::prometheus_text() const {
  std::lock_guard lock(mutex_);
  std::string out;
  write_family(out, "loom_router_requests_total",
               "Requests routed, by KV read path (direct: sent whole to a decode engine)", "path", requests_by_path_,
               {"prefill", "decode", "none", "direct"});
  write_family(out, "loom_router_kv_transfer_bytes_total", "KV bytes engines reported sending to their peer",
               "direction", transfer_bytes_, {"pe_to_de", "de_to_pe"});
  write_family(out, "loom_router_kv_transfer_seconds_total", "Seconds engines reported spending on those sends",
               "direction", transfer_seconds_, {"pe_to_de", "de_to_pe"});
  write_family(out, "loom_router_storage_read_bytes_total", "KV bytes read from storage, by the side that read them",
               "side", storage_read_bytes_, {"prefill", "decode"});
  write_family(out, "loom_router_engine_failures_total", "Engine calls that failed (no connection, timeout, 5xx, "
               "malformed reply)", "engine", engine_failures_, {});
  write_family(out, "loom_router_kv_path_total", "Disaggregated requests by how the prompt's KV reached the decode "
               "engine: device (device to device), staged (through host buffers and the KV link) or recompute (the "
               "device transfer was cancelled: the prefill engine failed after the reservation)", "path",
               kv_paths_, {"device", "staged", "recompute"});
  write_family(out, "loom_router_kv_path_fallbacks_total", "Requests whose KV did not go device to device, by why",
               "reason", kv_path_fallbacks_, {});
  out += "# HELP loom_router_engine_kv_path_total Disaggregated requests by decode engine and KV path\n"
         "# TYPE loom_router_engine_kv_path_total counter\n";
  for (const auto& [key, count] : engine_kv_paths_)
    out += fmt::format("loom_router_engine_kv_path_total{{engine=\"{}\",path=\"{}\"}} {}\n", escape_label(key.first),
                       key.second, count);
  out += fmt::format("# HELP loom_router_retries_total Requests moved to another engine after a failure\n"
                     "# TYPE loom_router_retries_total counter\nloom_router_retries_total {}\n",
                     retries_);
  return out;
}

}  // namespace loom::router
