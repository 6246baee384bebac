// The router's own counters, scraped as Prometheus text at GET /metrics:
//   loom_router_requests_total{path="prefill"|"decode"|"none"|"direct"}
//   loom_router_kv_transfer_bytes_total{direction="pe_to_de"|"de_to_pe"}
//   loom_router_kv_transfer_seconds_total{direction=...}
//   loom_router_storage_read_bytes_total{side="prefill"|"decode"}
//   loom_router_engine_failures_total{engine="URL"}
//   loom_router_retries_total
//   loom_router_kv_path_total{path="device"|"staged"|"recompute"}: how each disaggregated request's KV went
//     (recompute: reserved for device to device, then the PE side failed: the DE recomputed)
//   loom_router_kv_path_fallbacks_total{reason=...}: why a request did not go device to device
//     (KvPathChoice::reason, reserve_failed: staged; prefill_refused_send / prefill_failed: recompute;
//     router/device_kv_flow.h)
//   loom_router_engine_kv_path_total{engine="URL",path=...}: the same per decode engine
// The measured PE <-> DE link bandwidth (link_bandwidth()) is the ratio of the
// two transfer totals.
//
// Threads: every method is safe from any thread (one mutex).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace loom::router {

class RouterMetrics {
 public:
  void count_request(const std::string& path);
  // One /loom/kv/send reply: `direction` "pe_to_de" or "de_to_pe".
  void add_transfer(const std::string& direction, int64_t bytes, double seconds);
  void add_storage_read(const std::string& side, int64_t bytes);
  void count_engine_failure(const std::string& url);
  void count_retry();
  // One disaggregated request's KV path ("device" or "staged") to the DE at
  // `decode_url`; `fallback_reason` (a short label, KvPathChoice::reason) when staged.
  void count_kv_path(const std::string& path, const std::string& decode_url, const std::string& fallback_reason);
  int64_t kv_paths(const std::string& path) const;

  // Bytes/s over every transfer so far; 0 before any (unknown).
  double link_bandwidth() const;
  int64_t requests(const std::string& path) const;
  int64_t retries() const;
  std::string prometheus_text() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, int64_t> requests_by_path_;
  std::map<std::string, int64_t> transfer_bytes_;
  std::map<std::string, double> transfer_seconds_;
  std::map<std::string, int64_t> storage_read_bytes_;
  std::map<std::string, int64_t> engine_failures_;
  int64_t retries_ = 0;
  std::map<std::string, int64_t> kv_paths_;
  std::map<std::string, int64_t> kv_path_fallbacks_;
  std::map<std::pair<std::string, std::string>, int64_t> engine_kv_paths_;  // (url, path)
};

}  // namespace loom::router
