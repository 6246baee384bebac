// --preemption-mode swap through the serving engine (CPU backend, tiny random
// llama): with a device pool too small for three requests at once, a swapped
// request resumes without computing any token twice (the backend counts what
// it computes), and every request's tokens equal those of recompute and of a
// pool large enough for no preemption; a host tier too small for the swaps
// recomputes instead and says so in the metrics; nothing leaks.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine_impl.h"
#include "engine_test_util.h"
#include "model/loader.h"
#include "synthetic/synthetic_model.h"
#include "test_util.h"

namespace loom {
namespace {

// Forwards to a CPU backend, host tier included; counts the tokens each forward computes.
class CountingBackend final : public test::ForwardingBackend {
 public:
  CountingBackend(std::unique_ptr<Backend> inner, std::atomic<int64_t>& num_tokens)
      : ForwardingBackend(std::move(inner)), num_tokens_(num_tokens) {}
  ForwardResult forward(const Batch& batch) override {
    num_tokens_ += static_cast<int64_t>(batch.token_ids.size());
    return inner().forward(batch);
  }
  void allocate_host_kv_cache(KvPoolKind pool, int32_t num_blocks) override {
    inner().allocate_host_kv_cache(pool, num_blocks);
  }
  int32_t num_host_kv_blocks(KvPoolKind pool) const override { return inner().num_host_kv_blocks(pool); }
  void copy_kv_blocks(KvPoolKind pool, KvCopyDirection direction, std::span<const int32_t> device_block_ids,
                      std::span<const int32_t> host_block_ids) override {
    inner().copy_kv_blocks(pool, direction, device_block_ids, host_block_ids);
  }

 private:
  std::atomic<int64_t>& num_tokens_;
};

constexpr int32_t kPromptTokens = 12, kNewTokens = 16;  // 28 tokens: 7 blocks of 4 each
constexpr int32_t kNumRequests = 3;

struct SwapRun {
  std::vector<std::vector<int32_t>> tokens;  // per request
  int64_t num_computed_tokens = 0;
  EngineMetrics metrics;
  KvCacheStats stats;
};

class EngineSwapTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = new test::TempDir();
    model_ = new LoadedModel(test::write_and_load_synthetic_model(*directory_, 0));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete directory_;
  }

  static EngineRequest request(int32_t seed) {
    EngineRequest request;
    for (int32_t i = 0; i < kPromptTokens; ++i) request.prompt_tokens.push_back(10 + (seed * 37 + i * 11) % 200);
    request.max_new_tokens = kNewTokens;
    request.ignore_eos = true;
    return request;
  }

  // Runs the three requests at once on a fresh engine.
  static SwapRun run(int32_t num_kv_blocks, bool swap, int32_t num_host_blocks) {
    EngineConfig config;
    config.block_size = 4;
    config.num_kv_blocks = num_kv_blocks;
    config.max_batch_tokens = 24;
    config.num_host_kv_blocks = num_host_blocks;
    config.swap_preemption = swap;
    std::atomic<int64_t> num_tokens{0};
    auto backend =
        std::make_unique<CountingBackend>(make_cpu_backend(model_->config, model_->weights, {1, 8}), num_tokens);
    EngineImpl engine(*model_, std::move(backend), config);
    std::vector<std::unique_ptr<RequestStream>> streams;
    for (int32_t i = 0; i < kNumRequests; ++i) streams.push_back(engine.submit(request(i)));
    SwapRun result;
    for (auto& stream : streams) {
      std::vector<int32_t>& tokens = result.tokens.emplace_back();
      test::read_stream(*stream, [&](const RequestOutput& output) {
        for (const auto& token : output.new_tokens) tokens.push_back(token.token_id);
      });
    }
    // Backups still copying pin their blocks: the idle engine finishes them within a few ms.
    for (int i = 0; i < 2000; ++i) {
      bool is_idle = false;
      engine.run_on_engine_thread([&] {
        EXPECT_EQ(engine.kv_cache().integrity_error(), "");
        result.stats = engine.kv_cache().stats();
        is_idle = engine.kv_cache().num_transfers_in_flight() == 0;
      });
      if (is_idle) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    result.metrics = engine.take_metrics();
    result.num_computed_tokens = num_tokens;
    engine.shutdown(false);
    return result;
  }

  static void expect_no_leaks(const SwapRun& run) {
    EXPECT_EQ(run.stats.num_in_use_blocks, 0);
    EXPECT_EQ(run.stats.num_host_swap_blocks, 0);
  }

  static test::TempDir* directory_;
  static LoadedModel* model_;
};
test::TempDir* EngineSwapTest::directory_ = nullptr;
LoadedModel* EngineSwapTest::model_ = nullptr;

constexpr int64_t kTokensOnce = kNumRequests * (kPromptTokens + kNewTokens - 1);  // the last token is never fed

TEST_F(EngineSwapTest, SwapComputesNothingTwiceAndMatchesRecomputeAndNoPreemption) {
  const SwapRun roomy = run(256, false, 0);
  EXPECT_EQ(roomy.metrics.num_preemptions, 0);
  EXPECT_EQ(roomy.num_computed_tokens, kTokensOnce);

  const SwapRun swap = run(12, true, 64);
  EXPECT_GT(swap.metrics.num_preemptions, 0);
  EXPECT_EQ(swap.metrics.num_swap_preemptions, swap.metrics.num_preemptions);
  EXPECT_EQ(swap.metrics.num_swap_fallbacks, 0);
  EXPECT_EQ(swap.num_computed_tokens, kTokensOnce);  // no prompt recomputed, no token twice
  EXPECT_EQ(swap.tokens, roomy.tokens);
  expect_no_leaks(swap);

  const SwapRun recompute = run(12, false, 64);
  EXPECT_GT(recompute.metrics.num_preemptions, 0);
  EXPECT_EQ(recompute.metrics.num_swap_preemptions, 0);
  // Its victims recompute their partial blocks (none when preempted at a block boundary, as the
  // engine's timing may have it; scheduler_swap_test pins a partial block down).
  EXPECT_GE(recompute.num_computed_tokens, kTokensOnce);
  EXPECT_EQ(recompute.tokens, roomy.tokens);
  expect_no_leaks(recompute);
}

TEST_F(EngineSwapTest, WithoutHostRoomSwapRecomputesAndCountsIt) {
  const SwapRun roomy = run(256, false, 0);
  const SwapRun swap = run(12, true, 0);  // no host tier at all (serve refuses this; the engine falls back)
  const SwapRun tiny = run(12, true, 1);  // one host block: swaps that find no room, or lose their prefix
  EXPECT_GT(swap.metrics.num_preemptions, 0);
  EXPECT_EQ(swap.metrics.num_swap_preemptions, 0);
  EXPECT_EQ(swap.metrics.num_swap_fallbacks, swap.metrics.num_preemptions);
  EXPECT_GE(swap.num_computed_tokens, kTokensOnce);
  EXPECT_EQ(swap.tokens, roomy.tokens);
  expect_no_leaks(swap);
  EXPECT_GT(tiny.metrics.num_preemptions, 0);
  EXPECT_GT(tiny.metrics.num_swap_fallbacks, 0);
  EXPECT_EQ(tiny.tokens, roomy.tokens);
  expect_no_leaks(tiny);
}

}  // namespace
}  // namespace loom
