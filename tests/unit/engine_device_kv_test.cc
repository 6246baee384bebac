// Device-to-device KV between two CPU engines of one process over the
// in-process test plane (kvtransfer/device/in_process_device_kv_plane.h): the
// PE streams a prompt's KV layer by layer into the DE's reservation, the
// blocks join the DE's radix trees (main, and the rCache for forked) only
// once every layer landed, the DE's greedy tokens equal one engine's in every
// sharing mode; a transfer whose peer dies or that misses its deadline frees
// its blocks and the request recomputes, as does one whose reservation is
// cancelled (Engine::cancel_device_kv).
#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine_impl.h"
#include "engine_test_util.h"
#include "kv/kv_key.h"
#include "kvtransfer/device/in_process_device_kv_plane.h"
#include "lora/adapter.h"
#include "synthetic/synthetic_model.h"
#include "test_util.h"

namespace loom {
namespace {

struct Collected {
  std::vector<int32_t> tokens;
  std::optional<Error> error;
  int32_t num_cached_prompt_tokens = 0;
};

Collected collect(RequestStream& stream) {
  Collected result;
  test::read_stream(stream, [&](const RequestOutput& output) {
    for (const auto& token : output.new_tokens) result.tokens.push_back(token.token_id);
    result.num_cached_prompt_tokens = output.num_cached_prompt_tokens;
    result.error = output.error;
  });
  return result;
}

struct Mode {
  const char* label;
  std::string adapter;  // "": the base model
  KvSharing sharing = KvSharing::kIsolated;
};

constexpr int32_t kBlockSize = 4;

class EngineDeviceKvTest : public ::testing::TestWithParam<Mode> {
 protected:
  static void SetUpTestSuite() {
    directory_ = new test::TempDir();
    model_ = new LoadedModel(test::write_and_load_synthetic_model(*directory_, 1, /*alora_invocation=*/true));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete directory_;
  }

  // An engine with its adapter (if any) in `mode`, on `fabric` as endpoint `name` (none: no plane).
  static std::unique_ptr<EngineImpl> make(const Mode& mode, std::shared_ptr<InProcessDeviceKvFabric> fabric,
                                          const std::string& name, int32_t max_batch_tokens = 32) {
    EngineConfig config = test::small_sharing_engine_config();
    config.max_batch_tokens = max_batch_tokens;
    if (fabric) config.device_kv_plane = std::make_shared<InProcessDeviceKvPlane>(fabric, name);
    auto engine = std::make_unique<EngineImpl>(*model_, make_cpu_backend(model_->config, model_->weights, {1, 8}),
                                               config);
    if (!mode.adapter.empty())
      engine->load_adapter(mode.adapter, directory_->str() + "/adapters/adapter0", mode.sharing);
    return engine;
  }

  // 22 tokens (5 full blocks and 2 more); for an activated adapter the invocation sits in block 2.
  static std::vector<int32_t> prompt(const Mode& mode, int32_t seed) {
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < 22; ++i) ids.push_back(10 + (i * 37 + seed * 101 + i * i * seed) % 240);
    if (mode.sharing == KvSharing::kActivated && !mode.adapter.empty()) {
      const std::vector<int> invocation = synthetic_alora_invocation_tokens(model_->config);
      std::copy(invocation.begin(), invocation.end(), ids.begin() + 9);
    }
    return ids;
  }
  // A PE and a DE on one fabric, the request of `seed` and one engine's tokens for it.
  struct Pair {
    std::shared_ptr<InProcessDeviceKvFabric> fabric;
    std::unique_ptr<EngineImpl> pe, de;
    EngineRequest req;
    std::vector<int32_t> expected;
  };
  static Pair pair(const Mode& mode, int32_t seed, int32_t pe_max_batch_tokens = 32) {
    Pair made{std::make_shared<InProcessDeviceKvFabric>(), nullptr, nullptr, request(mode, seed), {}};
    made.pe = make(mode, made.fabric, "pe", pe_max_batch_tokens);
    made.de = make(mode, made.fabric, "de");
    made.expected = reference(mode, made.req);
    return made;
  }
  static EngineRequest request(const Mode& mode, int32_t seed, int32_t max_new_tokens = 6) {
    EngineRequest request;
    request.prompt_tokens = prompt(mode, seed);
    request.max_new_tokens = max_new_tokens;
    request.adapter = mode.adapter;
    request.ignore_eos = true;
    return request;
  }
  static Collected run_on(EngineImpl& engine, const EngineRequest& request) {
    auto stream = engine.submit(request);
    Collected result = collect(*stream);
    EXPECT_FALSE(result.error.has_value()) << result.error->what();
    return result;
  }
  // The request's greedy tokens on one engine without any transfer.
  static std::vector<int32_t> reference(const Mode& mode, const EngineRequest& request) {
    auto engine = make(mode, nullptr, "");
    std::vector<int32_t> tokens = run_on(*engine, request).tokens;
    engine->shutdown(false);
    return tokens;
  }
  // The PE's prefill (one token), streaming into `reservation`.
  static void prefill_with_send(EngineImpl& pe, EngineRequest request, const DeviceKvReservation& reservation) {
    request.max_new_tokens = 1;
    request.device_kv_send = DeviceKvSend{"de", reservation.destination, reservation.first_block};
    run_on(pe, request);
  }
  static EngineRequest receiving(EngineRequest request, const DeviceKvReservation& reservation) {
    request.device_kv_receive = reservation.destination.id;
    return request;
  }

  struct PoolCounts {
    int32_t free_main = 0, free_residual = 0;
    int32_t cached_main = 0, cached_residual = 0;  // of the request's prompt, in its namespaces
  };
  static PoolCounts counts(EngineImpl& engine, const Mode& mode, const std::vector<int32_t>& tokens) {
    PoolCounts counts;
    engine.run_on_engine_thread([&] {
      EXPECT_EQ(engine.kv_cache().integrity_error(), "");
      counts.free_main = engine.kv_cache().stats().num_free_blocks;
      const bool forked = mode.sharing == KvSharing::kForked && !mode.adapter.empty();
      const std::string main_namespace =
          mode.adapter.empty() || mode.sharing == KvSharing::kBase ? kBaseKvNamespace
          : forked                                                   ? kForkedBaseKvNamespace
          : mode.sharing == KvSharing::kIsolated                     ? isolated_kv_namespace(mode.adapter)
                                                                     : "";
      if (!main_namespace.empty())
        counts.cached_main = engine.kv_cache().num_cached_prefix_tokens(main_namespace, tokens) / kBlockSize;
      else
        counts.cached_main = engine.kv_cache().num_cached_prefix_tokens(
                                 activated_kv_key(mode.adapter, invocation_start(tokens), kBlockSize), tokens) /
                             kBlockSize;
      if (KvCacheManager* residual = engine.residual_kv_cache()) {
        EXPECT_EQ(residual->integrity_error(), "");
        counts.free_residual = residual->stats().num_free_blocks;
        if (forked)
          counts.cached_residual =
              residual->num_cached_prefix_tokens(residual_kv_namespace(mode.adapter), tokens) / kBlockSize;
      }
    });
    return counts;
  }
  static int32_t invocation_start(const std::vector<int32_t>& tokens) {
    const std::vector<int> invocation = synthetic_alora_invocation_tokens(model_->config);
    const std::vector<int32_t> ids(invocation.begin(), invocation.end());
    return find_alora_invocation_start(tokens, ids).value();
  }
  static bool forked(const Mode& mode) { return mode.sharing == KvSharing::kForked && !mode.adapter.empty(); }

  static test::TempDir* directory_;
  static LoadedModel* model_;
};
test::TempDir* EngineDeviceKvTest::directory_ = nullptr;
LoadedModel* EngineDeviceKvTest::model_ = nullptr;

// The whole path, with a PE that prefills in chunks of 8 tokens (blocks
// complete over three steps): the DE reuses every transferred block and its
// greedy tokens equal one engine's.
TEST_P(EngineDeviceKvTest, TransferredBlocksDecodeAsOneEngine) {
  const Mode mode = GetParam();
  auto [fabric, pe, de, req, expected] = pair(mode, 1, /*pe_max_batch_tokens=*/8);
  const PoolCounts before = counts(*de, mode, req.prompt_tokens);
  EXPECT_EQ(before.cached_main, 0);

  const DeviceKvReservation reservation = de->reserve_device_kv(req, "pe", 30.0);
  EXPECT_EQ(reservation.first_block, 0);
  EXPECT_EQ(reservation.destination.num_blocks(), 5);
  EXPECT_EQ(reservation.destination.residual_blocks.size(), forked(mode) ? 5u : 0u);
  EXPECT_EQ(reservation.num_layers, model_->config.num_layers);
  prefill_with_send(*pe, req, reservation);
  // Every layer of the 5 blocks, as pieces that each cover a step's blocks (the
  // prompt took up to 3 steps): never one piece per block.
  const int64_t num_layers = model_->config.num_layers;
  EXPECT_EQ(fabric->num_pieces() % num_layers, 0);
  EXPECT_GE(fabric->num_pieces(), 2 * num_layers);
  EXPECT_LE(fabric->num_pieces(), 3 * num_layers);

  const Collected decoded = run_on(*de, receiving(req, reservation));
  EXPECT_EQ(decoded.tokens, expected);
  EXPECT_EQ(decoded.num_cached_prompt_tokens, 5 * kBlockSize);
  const PoolCounts after = counts(*de, mode, req.prompt_tokens);
  EXPECT_EQ(after.cached_main, 5);
  if (forked(mode)) {
    EXPECT_EQ(after.cached_residual, 5);
  }
  const EngineMetrics pe_metrics = pe->take_metrics();
  const EngineMetrics de_metrics = de->take_metrics();
  EXPECT_EQ(pe_metrics.num_device_kv_sent, 1);
  EXPECT_EQ(pe_metrics.num_device_kv_send_failures, 0);
  EXPECT_EQ(de_metrics.num_device_kv_received, 1);
  EXPECT_EQ(de_metrics.device_kv_received_blocks, 5);
  // One transfer timed, reservation to landing. The request came after every layer landed: it waits (if at all,
  // until the engine's next poll settles the transfer) less than the transfer took.
  ASSERT_EQ(de_metrics.device_kv_transfer_time.size(), 1u);
  EXPECT_GE(de_metrics.device_kv_transfer_time[0], 0.0);
  ASSERT_LE(de_metrics.device_kv_wait_time.size(), 1u);
  for (double wait : de_metrics.device_kv_wait_time) EXPECT_LE(wait, de_metrics.device_kv_transfer_time[0]);
  EXPECT_EQ(de_metrics.num_device_kv_receive_failures, 0);
  pe->shutdown(false);
  de->shutdown(false);
}

// Pieces held in flight land in reverse order, half first: until the last
// slice landed the blocks are in neither of the DE's trees and its request
// waits; then it reuses them all.
TEST_P(EngineDeviceKvTest, BlocksJoinTheTreesOnlyWhenEveryLayerLanded) {
  const Mode mode = GetParam();
  auto [fabric, pe, de, req, expected] = pair(mode, 2);
  const DeviceKvReservation reservation = de->reserve_device_kv(req, "pe", 30.0);
  fabric->hold_deliveries(true);
  prefill_with_send(*pe, req, reservation);
  const size_t num_held = fabric->num_held();
  ASSERT_EQ(num_held, static_cast<size_t>(model_->config.num_layers));  // one step: one piece per layer

  auto stream = de->submit(receiving(req, reservation));
  std::vector<size_t> order(num_held);
  std::iota(order.rbegin(), order.rend(), size_t{0});  // last layer first
  fabric->deliver_held(std::span<const size_t>(order).first(num_held - 1));
  EXPECT_FALSE(stream->next(std::chrono::milliseconds(100)).has_value()) << "the request ran before layer 0 landed";
  const PoolCounts partial = counts(*de, mode, req.prompt_tokens);
  EXPECT_EQ(partial.cached_main, 0);
  EXPECT_EQ(partial.cached_residual, 0);

  fabric->deliver_held(std::vector<size_t>{0});
  const Collected decoded = collect(*stream);
  EXPECT_FALSE(decoded.error.has_value());
  EXPECT_EQ(decoded.tokens, expected);
  EXPECT_EQ(decoded.num_cached_prompt_tokens, 5 * kBlockSize);
  const PoolCounts after = counts(*de, mode, req.prompt_tokens);
  EXPECT_EQ(after.cached_main, 5);
  if (forked(mode)) {
    EXPECT_EQ(after.cached_residual, 5);
  }
  // The request waited outside the scheduler while layer 0 was held back (one sample), within the transfer's time.
  const EngineMetrics metrics = de->take_metrics();
  ASSERT_EQ(metrics.device_kv_wait_time.size(), 1u);
  EXPECT_GT(metrics.device_kv_wait_time[0], 0.0);
  ASSERT_EQ(metrics.device_kv_transfer_time.size(), 1u);
  EXPECT_GE(metrics.device_kv_transfer_time[0], metrics.device_kv_wait_time[0]);
  pe->shutdown(false);
  de->shutdown(false);
}

// The PE dies with half the layers delivered: the transfer fails at once,
// the reservation's blocks go back to the free list, the request recomputes.
TEST_P(EngineDeviceKvTest, PeerDeathFreesTheReservationAndTheRequestRecomputes) {
  const Mode mode = GetParam();
  auto [fabric, pe, de, req, expected] = pair(mode, 3);
  const PoolCounts before = counts(*de, mode, req.prompt_tokens);
  const DeviceKvReservation reservation = de->reserve_device_kv(req, "pe", 30.0);
  const PoolCounts reserved = counts(*de, mode, req.prompt_tokens);
  EXPECT_EQ(reserved.free_main, before.free_main - 5);
  if (forked(mode)) {
    EXPECT_EQ(reserved.free_residual, before.free_residual - 5);
  }

  fabric->hold_deliveries(true);
  prefill_with_send(*pe, req, reservation);
  std::vector<size_t> half(fabric->num_held() / 2);
  std::iota(half.begin(), half.end(), size_t{0});
  fabric->deliver_held(half);
  fabric->kill("pe");

  const auto started = std::chrono::steady_clock::now();
  const Collected decoded = run_on(*de, receiving(req, reservation));
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
  EXPECT_EQ(decoded.tokens, expected);
  EXPECT_EQ(decoded.num_cached_prompt_tokens, 0);  // recomputed
  const PoolCounts after = counts(*de, mode, req.prompt_tokens);
  // No orphan: what the reservation took is free again or cached by the recompute, nothing else.
  de->run_on_engine_thread([&] {
    const KvCacheStats stats = de->kv_cache().stats();
    EXPECT_EQ(stats.num_in_use_blocks, 0);
    EXPECT_EQ(stats.num_free_blocks + stats.num_cached_blocks, stats.num_total_blocks);
    if (KvCacheManager* residual = de->residual_kv_cache()) {
      EXPECT_EQ(residual->stats().num_in_use_blocks, 0);
    }
  });
  EXPECT_EQ(after.cached_main, 5);  // the recompute's own commit
  EXPECT_EQ(de->take_metrics().num_device_kv_receive_failures, 1);
  pe->shutdown(false);
  de->shutdown(false);
}

// A plane whose peer writes into the DE's memory itself (CUDA IPC; the double's remote_writes): the
// router cancels while the PE's copies are still in flight. The reservation's blocks stay out of the pool
// (quarantined, counted) while the copies land late into them, and go back once the peer has quiesced; the
// request recomputes meanwhile, and nothing it reads was written late.
TEST_P(EngineDeviceKvTest, LateWritesKeepTheBlocksOutOfThePoolUntilThePeerQuiesces) {
  const Mode mode = GetParam();
  auto [fabric, pe, de, req, expected] = pair(mode, 4);
  const PoolCounts before = counts(*de, mode, req.prompt_tokens);
  const DeviceKvReservation reservation = de->reserve_device_kv(req, "pe", 300.0);
  fabric->remote_writes(true);
  fabric->hold_deliveries(true);
  prefill_with_send(*pe, req, reservation);  // its copies issued, none landed yet
  ASSERT_GT(fabric->num_held(), 0u);

  EXPECT_EQ(de->cancel_device_kv(reservation.destination.id, "the prefill answered late"), DeviceKvCancel::kCancelled);
  const Collected decoded = run_on(*de, receiving(req, reservation));
  EXPECT_EQ(decoded.tokens, expected);
  EXPECT_EQ(decoded.num_cached_prompt_tokens, 0);  // recomputed, into other blocks
  const int64_t quarantined = de->take_metrics().device_kv_quarantined_blocks;
  EXPECT_GE(quarantined, 5 * (forked(mode) ? 2 : 1));  // the 5 fresh blocks in each cache the request uses
  de->run_on_engine_thread([&] {
    EXPECT_EQ(de->kv_cache().stats().num_in_use_blocks, 5) << "the reservation's fresh blocks stay leased";
  });

  fabric->deliver_held(std::vector<size_t>{0});  // a copy lands after the DE finished the transfer
  EXPECT_EQ(fabric->num_late_writes(), 1);
  std::vector<size_t> rest(fabric->num_held());
  std::iota(rest.begin(), rest.end(), size_t{0});
  fabric->deliver_held(rest);  // the peer's copies have drained: it has quiesced
  EXPECT_EQ(run_on(*de, req).tokens, expected);  // another loop iteration polls the quarantine
  de->run_on_engine_thread([&] {
    const KvCacheStats stats = de->kv_cache().stats();
    EXPECT_EQ(stats.num_in_use_blocks, 0);
    EXPECT_EQ(stats.num_free_blocks + stats.num_cached_blocks, stats.num_total_blocks);
    EXPECT_EQ(stats.num_total_blocks, before.free_main);  // nothing was cached before: every block is back
    if (KvCacheManager* residual = de->residual_kv_cache()) {
      EXPECT_EQ(residual->stats().num_in_use_blocks, 0);
    }
  });
  EXPECT_EQ(de->take_metrics().device_kv_quarantined_blocks, 0);
  pe->shutdown(false);
  de->shutdown(false);
}

INSTANTIATE_TEST_SUITE_P(Modes, EngineDeviceKvTest,
                         ::testing::Values(Mode{"none", ""}, Mode{"isolated", "a", KvSharing::kIsolated},
                                           Mode{"activated", "a", KvSharing::kActivated},
                                           Mode{"base", "a", KvSharing::kBase},
                                           Mode{"forked", "a", KvSharing::kForked}),
                         [](const ::testing::TestParamInfo<Mode>& info) { return std::string(info.param.label); });

// A decode engine with an in-process plane and a 22-token request for it.
class EngineDeviceKvDeadlineTest : public ::testing::Test {
 protected:
  static EngineConfig with_plane() {
    EngineConfig config = test::small_sharing_engine_config();
    config.device_kv_plane = std::make_shared<InProcessDeviceKvPlane>(std::make_shared<InProcessDeviceKvFabric>(), "de");
    return config;
  }
  static EngineRequest request() {
    EngineRequest req;
    for (int32_t i = 0; i < 22; ++i) req.prompt_tokens.push_back(20 + i);
    req.max_new_tokens = 3;
    req.ignore_eos = true;
    return req;
  }

  test::TempDir directory_;
  const LoadedModel model_ = test::write_and_load_synthetic_model(directory_, 0);
  EngineImpl de{model_, make_cpu_backend(model_.config, model_.weights, {1, 8}), with_plane()};
  EngineRequest req = request();
};

// A sender that never sends: the DE's request waits no longer than the
// deadline, then recomputes; the reservation leaves nothing behind.
TEST_F(EngineDeviceKvDeadlineTest, ATransferPastItsDeadlineRecomputes) {
  const DeviceKvReservation reservation = de.reserve_device_kv(req, "pe-that-never-sends", 0.3);
  req.device_kv_receive = reservation.destination.id;
  const auto started = std::chrono::steady_clock::now();
  auto stream = de.submit(req);
  const Collected decoded = collect(*stream);
  const auto waited = std::chrono::steady_clock::now() - started;
  EXPECT_FALSE(decoded.error.has_value());
  EXPECT_EQ(decoded.tokens.size(), 3u);
  EXPECT_EQ(decoded.num_cached_prompt_tokens, 0);
  EXPECT_GE(waited, std::chrono::milliseconds(250));
  EXPECT_LT(waited, std::chrono::seconds(10));
  de.run_on_engine_thread([&] {
    EXPECT_EQ(de.kv_cache().integrity_error(), "");
    EXPECT_EQ(de.kv_cache().stats().num_in_use_blocks, 0);
  });
  EXPECT_EQ(de.take_metrics().num_device_kv_receive_failures, 1);
  de.shutdown(false);
}

// The router cancels a reservation whose PE failed: the parked request
// recomputes at once (long before the deadline), the fresh blocks go back to
// the pool; a second cancel finds it settled, an unknown id is kUnknown.
TEST_F(EngineDeviceKvDeadlineTest, ACancelledReservationRecomputesAtOnce) {
  int32_t free_before = 0;
  de.run_on_engine_thread([&] { free_before = de.kv_cache().stats().num_free_blocks; });
  const DeviceKvReservation reservation = de.reserve_device_kv(req, "pe-that-failed", 300.0);
  EXPECT_EQ(de.cancel_device_kv(reservation.destination.id + 1, "a stranger"), DeviceKvCancel::kUnknown);
  req.device_kv_receive = reservation.destination.id;
  const auto started = std::chrono::steady_clock::now();
  auto stream = de.submit(req);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // parked by now (or soon: either way it recomputes)
  EXPECT_EQ(de.cancel_device_kv(reservation.destination.id, "the prefill failed"), DeviceKvCancel::kCancelled);
  const Collected decoded = collect(*stream);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
  EXPECT_FALSE(decoded.error.has_value());
  EXPECT_EQ(decoded.tokens.size(), 3u);
  EXPECT_EQ(decoded.num_cached_prompt_tokens, 0);  // recomputed
  de.run_on_engine_thread([&] {
    EXPECT_EQ(de.kv_cache().integrity_error(), "");
    const KvCacheStats stats = de.kv_cache().stats();
    EXPECT_EQ(stats.num_in_use_blocks, 0);
    EXPECT_EQ(stats.num_free_blocks + stats.num_cached_blocks, stats.num_total_blocks);
    EXPECT_EQ(stats.num_free_blocks + stats.num_cached_blocks, free_before);
  });
  const DeviceKvCancel again = de.cancel_device_kv(reservation.destination.id, "again");
  EXPECT_TRUE(again == DeviceKvCancel::kSettled || again == DeviceKvCancel::kUnknown);  // released after its step
  const EngineMetrics metrics = de.take_metrics();
  EXPECT_EQ(metrics.num_device_kv_cancelled, 1);
  EXPECT_EQ(metrics.num_device_kv_receive_failures, 0);  // the plane did not fail it: the router cancelled it
  de.shutdown(false);
}

// A cancel before the request came: the request, when it comes, recomputes at once.
TEST_F(EngineDeviceKvDeadlineTest, ARequestAfterTheCancelRecomputesAtOnce) {
  const DeviceKvReservation reservation = de.reserve_device_kv(req, "pe-that-failed", 300.0);
  EXPECT_EQ(de.cancel_device_kv(reservation.destination.id, "refused"), DeviceKvCancel::kCancelled);
  EXPECT_EQ(de.cancel_device_kv(reservation.destination.id, "again"), DeviceKvCancel::kSettled);
  req.device_kv_receive = reservation.destination.id;
  const auto started = std::chrono::steady_clock::now();
  auto stream = de.submit(req);
  const Collected decoded = collect(*stream);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
  EXPECT_FALSE(decoded.error.has_value());
  EXPECT_EQ(decoded.tokens.size(), 3u);
  de.run_on_engine_thread([&] { EXPECT_EQ(de.kv_cache().stats().num_in_use_blocks, 0); });
  de.shutdown(false);
}

// A backend without per-layer notifications cannot take a plane.
TEST(EngineDeviceKvPlaneSetupTest, ABackendWithoutLayerNotificationsRefusesAPlane) {
  class NoNotifications : public test::ForwardingBackend {
   public:
    using ForwardingBackend::ForwardingBackend;
    BackendCapabilities capabilities() const override {
      BackendCapabilities capabilities = ForwardingBackend::capabilities();
      capabilities.kv_layer_notifications = false;
      return capabilities;
    }
  };
  test::TempDir directory;
  const LoadedModel model = test::write_and_load_synthetic_model(directory, 0);
  EngineConfig config = test::small_sharing_engine_config();
  config.device_kv_plane =
      std::make_shared<InProcessDeviceKvPlane>(std::make_shared<InProcessDeviceKvFabric>(), "x");
  try {
    EngineImpl engine(model, std::make_unique<NoNotifications>(make_cpu_backend(model.config, model.weights, {1, 8})),
                      config);
    ADD_FAILURE() << "the engine took a plane its backend cannot feed";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kUnsupported);
  }
}

}  // namespace
}  // namespace loom
