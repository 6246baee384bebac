// Prometheus text exposition of the engine's numbers (docs/design.md §4, prefix loom_).
// Latency samples drained from Engine::take_metrics() accumulate into
// histograms here; totals and gauges are copied from the latest snapshot.
// Every sample carries vLLM's model_name label (the served model's name) first;
// a histogram's le comes last. Series exist only for what the server has: a
// host tier's only when one is configured, never a tier Loom lacks.
//
// Thread-safe: scrape/absorb/render may be called from any HTTP worker.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace loom::server {

// A cumulative Prometheus histogram with fixed upper bounds.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // "# TYPE name histogram" plus _bucket{...,le=...}, _sum, _count lines;
  // `labels` (escaped, without braces) go on each.
  void render(const std::string& name, const std::string& help, const std::string& labels, std::string& out) const;
  int64_t count() const { return count_; }

 private:
  std::vector<double> upper_bounds_;
  std::vector<int64_t> bucket_counts_;  // per bound, not cumulative; last = +Inf
  double sum_ = 0.0;
  int64_t count_ = 0;
};

class MetricsExporter {
 public:
  explicit MetricsExporter(const std::string& model_name);
  // Folds one snapshot in (samples into histograms; totals and gauges replace).
  void absorb(const EngineMetrics& metrics);
  // The whole exposition, ending with a newline.
  std::string render() const;
  // GET /metrics: takes the engine's snapshot, absorbs and renders it under
  // one lock, so concurrent scrapes absorb snapshots in the order they were
  // taken (a counter never goes back).
  std::string scrape(Engine& engine);
  // The periodic stats line (vLLM's LoggingStatLogger, `--log-stats-interval`):
  // prompt and generation throughput over the `elapsed_seconds` since the last
  // call, requests running / waiting, KV usage per tier that exists, and the
  // prefix-cache hit rate of the tokens looked up since the last call. Takes
  // the engine's snapshot as scrape() does. nullopt when nothing ran and
  // nothing waits (an idle server logs nothing).
  std::optional<std::string> stats_line(Engine& engine, double elapsed_seconds);
  std::optional<std::string> stats_line(const EngineMetrics& snapshot, double elapsed_seconds);
  // The model_name="..." pair every sample starts its labels with (escaped).
  const std::string& model_label() const { return model_label_; }
  // The server's own bounded caches (compiled grammars, chat templates, the
  // tokenizer's), asked at each render beside the engine's backend caches.
  // Set before the first scrape; `source` must be thread-safe.
  void set_server_caches(std::function<std::vector<CacheGauge>()> source) { server_caches_ = std::move(source); }

 private:
  void absorb_locked(const EngineMetrics& metrics);
  std::string render_locked() const;

  const std::string model_label_;  // model_name="...", escaped
  std::function<std::vector<CacheGauge>()> server_caches_;
  mutable std::mutex mutex_;
  EngineMetrics latest_;  // sample vectors unused
  Histogram time_to_first_token_, inter_token_, end_to_end_, queue_time_, prefill_time_, decode_time_;
  Histogram load_wait_time_;  // host tier: time admitted requests waited on loads
  Histogram device_kv_transfer_time_, device_kv_wait_time_;  // device-to-device KV (decode engines)
  Histogram decode_batch_size_;
  // Totals at the last stats_line().
  int64_t logged_prompt_tokens_ = 0, logged_generated_tokens_ = 0, logged_queried_tokens_ = 0, logged_hit_tokens_ = 0;
};

}  // namespace loom::server
