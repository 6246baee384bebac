// The router's choice of how a prompt's KV reaches the decode engine
// (router/dual_path_scheduler.h choose_kv_path): device to device when both
// ends' planes can reach each other, staged otherwise, and its counters.
#include <gtest/gtest.h>

#include "router/dual_path_scheduler.h"
#include "router/router_metrics.h"

namespace loom::router {
namespace {

DeviceKvInfo gpu(const std::string& host, const std::string& device, const std::string& plane = "cuda_ipc") {
  return {plane, host, device, host + "/" + device, true};
}

TEST(RouterKvPathTest, DeviceWhenBothEndsShareAPlaneThatReachesThem) {
  const KvPathChoice choice = choose_kv_path(gpu("h1", "GPU-a"), gpu("h1", "GPU-b"));
  EXPECT_EQ(choice.path, KvPath::kDevice);
  EXPECT_EQ(choice.reason, "");
  DeviceKvInfo network_pe = gpu("h1", "GPU-a", "nccl"), network_de = gpu("h2", "GPU-b", "nccl");
  network_pe.same_host_only = network_de.same_host_only = false;
  EXPECT_EQ(choose_kv_path(network_pe, network_de).path, KvPath::kDevice);
  EXPECT_STREQ(kv_path_name(KvPath::kDevice), "device");
  EXPECT_STREQ(kv_path_name(KvPath::kStaged), "staged");
}

TEST(RouterKvPathTest, StagedWithTheReasonOtherwise) {
  EXPECT_EQ(choose_kv_path(DeviceKvInfo{}, gpu("h1", "b")).reason, "prefill_no_plane");
  EXPECT_EQ(choose_kv_path(gpu("h1", "a"), DeviceKvInfo{}).reason, "decode_no_plane");
  EXPECT_EQ(choose_kv_path(gpu("h1", "a"), gpu("h1", "b", "nccl")).reason, "plane_mismatch");
  EXPECT_EQ(choose_kv_path(gpu("h1", "a"), gpu("h1", "")).reason, "no_device");
  const KvPathChoice hosts = choose_kv_path(gpu("h1", "a"), gpu("h2", "b"));
  EXPECT_EQ(hosts.path, KvPath::kStaged);
  EXPECT_EQ(hosts.reason, "different_hosts");
  EXPECT_NE(hosts.detail.find("h1 vs h2"), std::string::npos);
  // One end limited to its host is enough to need the same host.
  DeviceKvInfo network = gpu("h2", "b");
  network.same_host_only = false;
  EXPECT_EQ(choose_kv_path(gpu("h1", "a"), network).reason, "different_hosts");
  EXPECT_EQ(choose_kv_path(gpu("", "a"), gpu("", "b")).reason, "different_hosts");  // unknown hosts never match
}

TEST(RouterKvPathTest, PathsAndFallbacksAreCounted) {
  RouterMetrics metrics;
  metrics.count_kv_path("staged", "http://de1", "prefill_no_plane");
  metrics.count_kv_path("staged", "http://de1", "prefill_no_plane");
  metrics.count_kv_path("device", "http://de2", "");
  EXPECT_EQ(metrics.kv_paths("staged"), 2);
  EXPECT_EQ(metrics.kv_paths("device"), 1);
  const std::string text = metrics.prometheus_text();
  EXPECT_NE(text.find("loom_router_kv_path_total{path=\"staged\"} 2"), std::string::npos) << text;
  EXPECT_NE(text.find("loom_router_kv_path_total{path=\"device\"} 1"), std::string::npos);
  EXPECT_NE(text.find("loom_router_kv_path_fallbacks_total{reason=\"prefill_no_plane\"} 2"), std::string::npos);
  EXPECT_NE(text.find("loom_router_engine_kv_path_total{engine=\"http://de1\",path=\"staged\"} 2"), std::string::npos);
  EXPECT_NE(text.find("loom_router_engine_kv_path_total{engine=\"http://de2\",path=\"device\"} 1"), std::string::npos);
}

}  // namespace
}  // namespace loom::router
