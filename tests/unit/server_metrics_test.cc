// The Prometheus exposition of the server's metrics (MetricsExporter), without
// an engine or a socket: accumulation, the model_name label, tiers that exist,
// finish reasons.
#include <gtest/gtest.h>

#include <string>

#include "server/metrics_exporter.h"

namespace loom::server {
namespace {

// A sample line of the exposition, e.g. has_sample(text, "loom_x", "tier=\"device\"", "1").
bool has_sample(const std::string& text, const std::string& name, const std::string& labels, const std::string& value) {
  const std::string model = "model_name=\"tiny\"";
  const std::string line = name + "{" + (labels.empty() ? model : model + "," + labels) + "} " + value;
  return text.find("\n" + line + "\n") != std::string::npos;
}

TEST(ServerMetricsTest, HistogramsAccumulateAndGaugesReplace) {
  MetricsExporter exporter("tiny");
  EngineMetrics first;
  first.num_running = 3;
  first.kv_bytes_in_use_or_cached = 4096;
  first.prefix_queried_tokens = 100;
  first.prefix_hit_tokens = 40;
  first.time_to_first_token = {0.003, 0.2};
  exporter.absorb(first);
  EngineMetrics second;
  second.num_running = 1;
  second.num_waiting = 2;
  second.kv_bytes_in_use_or_cached = 4096 + 512;
  second.kv_bytes_base = 4096;
  second.kv_bytes_residual = 512;
  second.kv_bytes_host = 2048;
  second.kv_bytes_host_residual = 256;
  second.host_blocks_total = 64;
  second.residual_host_blocks_total = 32;
  second.kv_bytes_by_adapter = {{"a\"1", 300}, {"b", 0}, {"bad\xff", 7}};
  second.prefix_queried_tokens = 150;
  second.prefix_hit_tokens = 60;
  second.prefix_queried_tokens_by_mode = {{"none", 50}, {"forked", 100}};
  second.prefix_hit_tokens_by_mode = {{"none", 10}, {"forked", 50}};
  second.time_to_first_token = {50.0};
  exporter.absorb(second);
  const std::string text = exporter.render();
  auto has = [&](const std::string& name, const std::string& labels, const std::string& value) {
    return has_sample(text, name, labels, value);
  };
  EXPECT_TRUE(has("loom_num_requests_running", "", "1")) << text;
  EXPECT_TRUE(has("loom_num_requests_waiting", "", "2"));
  EXPECT_TRUE(has("loom_prefix_cache_queried_tokens_total", "", "150"));
  EXPECT_TRUE(has("loom_prefix_cache_hit_tokens_total", "", "60"));
  EXPECT_TRUE(has("loom_kv_cache_bytes", "tier=\"device\",kind=\"base\"", "4096"));
  EXPECT_TRUE(has("loom_kv_cache_bytes", "tier=\"host\",kind=\"base\"", "2048"));
  EXPECT_TRUE(has("loom_kv_cache_bytes", "tier=\"host\",kind=\"residual\"", "256"));
  EXPECT_TRUE(has("loom_kv_cache_bytes", "tier=\"device\",kind=\"residual\"", "512"));
  EXPECT_EQ(text.find("tier=\"disk\""), std::string::npos);  // Loom has no disk tier
  EXPECT_TRUE(has("loom_prefix_cache_queried_tokens_total", "mode=\"forked\"", "100"));
  EXPECT_TRUE(has("loom_prefix_cache_queried_tokens_total", "mode=\"isolated\"", "0"));
  EXPECT_TRUE(has("loom_prefix_cache_hit_tokens_total", "mode=\"none\"", "10"));
  EXPECT_TRUE(has("loom_prefix_cache_hit_tokens_total", "mode=\"forked\"", "50"));
  EXPECT_TRUE(has("loom_kv_cache_adapter_bytes", "adapter=\"a\\\"1\"", "300")) << text;
  EXPECT_TRUE(has("loom_kv_cache_adapter_bytes", "adapter=\"b\"", "0"));
  EXPECT_TRUE(has("loom_kv_cache_adapter_bytes", "adapter=\"bad\xEF\xBF\xBD\"", "7")) << text;  // valid UTF-8
  EXPECT_NE(text.find("\n# TYPE loom_time_to_first_token_seconds histogram\n"), std::string::npos);
  EXPECT_TRUE(has("loom_time_to_first_token_seconds_bucket", "le=\"0.005\"", "1"));
  EXPECT_TRUE(has("loom_time_to_first_token_seconds_bucket", "le=\"0.25\"", "2"));
  EXPECT_TRUE(has("loom_time_to_first_token_seconds_bucket", "le=\"40\"", "2"));
  EXPECT_TRUE(has("loom_time_to_first_token_seconds_bucket", "le=\"80\"", "3"));
  EXPECT_TRUE(has("loom_time_to_first_token_seconds_bucket", "le=\"+Inf\"", "3"));
  EXPECT_TRUE(has("loom_time_to_first_token_seconds_count", "", "3"));
  EXPECT_EQ(text.back(), '\n');
}

TEST(ServerMetricsTest, EverySampleHasTheModelNameLabelFirst) {
  MetricsExporter exporter("org/m\"x\\y");  // escaped as a label value
  EngineMetrics metrics;
  metrics.kv_blocks_total = 8;
  metrics.host_blocks_total = 4;
  metrics.residual_blocks_total = 8;
  metrics.residual_host_blocks_total = 4;
  metrics.kv_bytes_by_adapter = {{"a", 1}};
  metrics.num_finished_requests_by_reason = {{"stop", 1}};
  metrics.end_to_end = {0.5};
  exporter.absorb(metrics);
  const std::string text = exporter.render();
  const std::string label = "{model_name=\"org/m\\\"x\\\\y\"";
  int num_samples = 0;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.starts_with("#")) continue;
    ++num_samples;
    const size_t brace = line.find('{');
    ASSERT_NE(brace, std::string::npos) << line;
    EXPECT_EQ(line.substr(brace, label.size()), label) << line;
    const char after = line[brace + label.size()];
    EXPECT_TRUE(after == '}' || after == ',') << line;
  }
  EXPECT_GT(num_samples, 100);
  EXPECT_NE(text.find("loom_e2e_request_latency_seconds_bucket" + label + ",le=\"0.5\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("loom_e2e_request_latency_seconds_sum" + label + "} 0.5\n"), std::string::npos);
}

TEST(ServerMetricsTest, KvUsageFractionOnlyForTiersThatExist) {
  MetricsExporter exporter("tiny");
  exporter.absorb(EngineMetrics{});  // no pool published yet: no fraction, not 0/0
  EXPECT_EQ(exporter.render().find("loom_kv_cache_usage_perc{"), std::string::npos);
  EngineMetrics device_only;
  device_only.kv_blocks_total = 16;
  device_only.kv_blocks_in_use = 4;
  device_only.kv_blocks_cached = 8;  // cached blocks can be evicted: not "used" (vLLM's sense)
  exporter.absorb(device_only);
  std::string text = exporter.render();
  EXPECT_NE(text.find("# TYPE loom_kv_cache_usage_perc gauge\n"), std::string::npos);
  EXPECT_TRUE(has_sample(text, "loom_kv_cache_usage_perc", "tier=\"device\",kind=\"base\"", "0.25")) << text;
  // No rCache pool: no residual fraction.
  EXPECT_EQ(text.find("loom_kv_cache_usage_perc{model_name=\"tiny\",tier=\"device\",kind=\"residual\"}"),
            std::string::npos);
  EXPECT_EQ(text.find("tier=\"host\""), std::string::npos) << text;   // no host tier: no host series at all
  EXPECT_EQ(text.find("tier=\"disk\""), std::string::npos);

  EngineMetrics tiered = device_only;
  tiered.residual_blocks_total = 10;
  tiered.residual_blocks_in_use = 10;
  tiered.host_blocks_total = 40;
  tiered.host_blocks_used = 10;
  tiered.kv_bytes_host = 1000;
  exporter.absorb(tiered);  // the main pool's host tier only
  text = exporter.render();
  EXPECT_TRUE(has_sample(text, "loom_kv_cache_usage_perc", "tier=\"device\",kind=\"base\"", "0.25"));
  EXPECT_TRUE(has_sample(text, "loom_kv_cache_usage_perc", "tier=\"device\",kind=\"residual\"", "1")) << text;
  EXPECT_TRUE(has_sample(text, "loom_kv_cache_usage_perc", "tier=\"host\",kind=\"base\"", "0.25"));
  EXPECT_TRUE(has_sample(text, "loom_kv_cache_bytes", "tier=\"host\",kind=\"base\"", "1000"));
  EXPECT_EQ(text.find("tier=\"host\",kind=\"residual\""), std::string::npos) << text;
  EXPECT_EQ(text.find("tier=\"disk\""), std::string::npos);
}

TEST(ServerMetricsTest, CachesOfTheBackendAndTheServerWithTheirLimits) {
  MetricsExporter exporter("tiny");
  exporter.absorb(EngineMetrics{});
  EXPECT_EQ(exporter.render().find("loom_cache_entries"), std::string::npos);  // no cache: no family
  EngineMetrics metrics;
  metrics.backend_caches = {{"cuda_graphs", 12, 48, -1, 3}};
  exporter.absorb(metrics);
  exporter.set_server_caches([] { return std::vector<CacheGauge>{{"grammars", 2, 64, 5000, 0}}; });
  const std::string text = exporter.render();
  EXPECT_NE(text.find("# TYPE loom_cache_entries gauge\n"), std::string::npos);
  EXPECT_TRUE(has_sample(text, "loom_cache_entries", "cache=\"cuda_graphs\"", "12")) << text;
  EXPECT_TRUE(has_sample(text, "loom_cache_capacity", "cache=\"cuda_graphs\"", "48"));
  EXPECT_TRUE(has_sample(text, "loom_cache_evictions_total", "cache=\"cuda_graphs\"", "3"));
  EXPECT_EQ(text.find("loom_cache_bytes{model_name=\"tiny\",cache=\"cuda_graphs\"}"), std::string::npos);  // unknown
  EXPECT_TRUE(has_sample(text, "loom_cache_entries", "cache=\"grammars\"", "2"));
  EXPECT_TRUE(has_sample(text, "loom_cache_bytes", "cache=\"grammars\"", "5000"));
  EXPECT_TRUE(has_sample(text, "loom_cache_capacity", "cache=\"grammars\"", "64"));
}

TEST(ServerMetricsTest, RequestsByFinishedReason) {
  MetricsExporter exporter("tiny");
  EngineMetrics metrics;
  metrics.num_finished_requests_by_reason = {{"stop", 3}, {"abort", 2}};
  exporter.absorb(metrics);
  const std::string text = exporter.render();
  EXPECT_TRUE(has_sample(text, "loom_request_success_total", "finished_reason=\"stop\"", "3")) << text;
  EXPECT_TRUE(has_sample(text, "loom_request_success_total", "finished_reason=\"length\"", "0"));
  EXPECT_TRUE(has_sample(text, "loom_request_success_total", "finished_reason=\"abort\"", "2"));
  EXPECT_TRUE(has_sample(text, "loom_request_success_total", "finished_reason=\"error\"", "0"));
  EXPECT_FALSE(has_sample(text, "loom_request_success_total", "", "5"));  // no total that mixes aborts in
}

}  // namespace
}  // namespace loom::server

namespace loom::server {
namespace {

TEST(ServerMetricsTest, StatsLineIsThroughputSinceTheLastLineAndSilentWhenIdle) {
  MetricsExporter exporter("tiny");
  EngineMetrics metrics;
  EXPECT_EQ(exporter.stats_line(metrics, 10.0), std::nullopt);  // idle: nothing to say
  metrics.num_prompt_tokens = 1000;
  metrics.num_generated_tokens = 50;
  metrics.prefix_queried_tokens = 1000;
  metrics.prefix_hit_tokens = 250;
  metrics.num_running = 3;
  metrics.num_waiting = 1;
  metrics.kv_blocks_total = 200;
  metrics.kv_blocks_in_use = 50;
  metrics.host_blocks_total = 100;
  metrics.host_blocks_used = 10;
  EXPECT_EQ(exporter.stats_line(metrics, 10.0),
            "Avg prompt throughput: 100.0 tokens/s, Avg generation throughput: 5.0 tokens/s, Running: 3 reqs, "
            "Waiting: 1 reqs, device KV cache usage: 25.0%, host KV cache usage: 10.0%, Prefix cache hit rate: 25.0%");
  // The next line counts only what happened since: 500 more prompt tokens, all of them hits.
  metrics.num_prompt_tokens = 1500;
  metrics.prefix_queried_tokens = 1500;
  metrics.prefix_hit_tokens = 750;
  metrics.num_running = 0;
  metrics.num_waiting = 0;
  const std::optional<std::string> line = exporter.stats_line(metrics, 5.0);
  ASSERT_TRUE(line.has_value());
  EXPECT_NE(line->find("Avg prompt throughput: 100.0 tokens/s, Avg generation throughput: 0.0 tokens/s"),
            std::string::npos) << *line;
  EXPECT_NE(line->find("Prefix cache hit rate: 100.0%"), std::string::npos) << *line;
  EXPECT_EQ(exporter.stats_line(metrics, 5.0), std::nullopt);  // nothing since, nothing running
}

}  // namespace
}  // namespace loom::server
