// --preemption-mode swap through the serving engine (CPU backend, tiny random
// llama): with a device pool too small for three requests at once, a swapped
// request resumes without computing any token twice (the backend counts what
// it computes), and every request's tokens equal those of recompute and of a
// pool large enough for no preemption; a host tier too small for the swaps
// recomputes instead and says so in the metrics; nothing leaks. The same with
// a forked (ForkKV) adapter: its private bCache and rCache blocks swap out to
// both pools' host tiers and back, and nothing leaks in either pool.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <optional>
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
    if (pool == KvPoolKind::kResidual) {
      num_residual_copies_ += 1;
    }
    inner().copy_kv_blocks(pool, direction, device_block_ids, host_block_ids);
  }
  // The forked adapter's rCache pool.
  void allocate_residual_cache(const ResidualCacheShape& shape) override { inner().allocate_residual_cache(shape); }
  ResidualCacheShape residual_cache_shape() const override { return inner().residual_cache_shape(); }
  int64_t residual_bytes_per_token(int32_t max_rank) const override {
    return inner().residual_bytes_per_token(max_rank);
  }
  int64_t num_residual_copies() const { return num_residual_copies_; }

 private:
  std::atomic<int64_t>& num_tokens_;
  std::atomic<int64_t> num_residual_copies_{0};
};

constexpr int32_t kPromptTokens = 12, kNewTokens = 16;  // 28 tokens: 7 blocks of 4 each
constexpr int32_t kNumRequests = 3;

struct SwapRun {
  std::vector<std::vector<int32_t>> tokens;  // per request
  int64_t num_computed_tokens = 0;
  int64_t num_residual_copies = 0;  // host tier copies of the rCache pool (forked)
  EngineMetrics metrics;
  KvCacheStats stats;
  std::optional<KvCacheStats> residual_stats;  // the rCache pool's (forked)
};

class EngineSwapTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = new test::TempDir();
    model_ = new LoadedModel(test::write_and_load_synthetic_model(*directory_, 1));  // adapters/adapter0
  }
  static void TearDownTestSuite() {
    delete model_;
    delete directory_;
  }

  static EngineRequest request(int32_t seed, bool forked) {
    EngineRequest request;
    if (forked) request.adapter = "agent";
    for (int32_t i = 0; i < kPromptTokens; ++i) request.prompt_tokens.push_back(10 + (seed * 37 + i * 11) % 200);
    request.max_new_tokens = kNewTokens;
    request.ignore_eos = true;
    return request;
  }

  // Runs the three requests at once on a fresh engine; `forked`: all three on
  // one forked adapter, with an rCache pool (and its host tier) as large as
  // the main pool (and its host tier).
  static SwapRun run(int32_t num_kv_blocks, bool swap, int32_t num_host_blocks, bool forked = false,
                     bool residual_host_tier = true) {
    EngineConfig config;
    config.block_size = 4;
    config.num_kv_blocks = num_kv_blocks;
    config.max_batch_tokens = 24;
    config.num_host_kv_blocks = num_host_blocks;
    config.swap_preemption = swap;
    if (forked) {
      config.num_residual_kv_blocks = num_kv_blocks;
      config.max_lora_rank = 8;
      if (!residual_host_tier) config.host_residual_kv_cache_bytes = 0;
    }
    std::atomic<int64_t> num_tokens{0};
    auto backend =
        std::make_unique<CountingBackend>(make_cpu_backend(model_->config, model_->weights, {1, 8}), num_tokens);
    CountingBackend* counting = backend.get();
    EngineImpl engine(*model_, std::move(backend), config);
    if (forked) engine.load_adapter("agent", directory_->str() + "/adapters/adapter0", KvSharing::kForked);
    // Queued together (submit_all): submitted one by one, a loaded machine could let the first finish
    // before the last arrived, and then nothing would need preempting.
    std::vector<EngineRequest> requests;
    for (int32_t i = 0; i < kNumRequests; ++i) requests.push_back(request(i, forked));
    std::vector<std::unique_ptr<RequestStream>> streams = engine.submit_all(std::move(requests));
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
        EXPECT_EQ(engine.kv_caches().integrity_error(), "");
        result.stats = engine.kv_cache().stats();
        if (engine.residual_kv_cache() != nullptr) result.residual_stats = engine.residual_kv_cache()->stats();
        is_idle = engine.kv_caches().num_transfers_in_flight() == 0;
      });
      if (is_idle) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    result.metrics = engine.take_metrics();
    result.num_computed_tokens = num_tokens;
    result.num_residual_copies = counting->num_residual_copies();
    engine.shutdown(false);
    return result;
  }

  static void expect_no_leaks(const SwapRun& run) {
    EXPECT_EQ(run.stats.num_in_use_blocks, 0);
    EXPECT_EQ(run.stats.num_host_swap_blocks, 0);
    if (run.residual_stats) {
      EXPECT_EQ(run.residual_stats->num_in_use_blocks, 0);
      EXPECT_EQ(run.residual_stats->num_host_swap_blocks, 0);
    }
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

// Forked (ForkKV) requests swap their private blocks in both pools: the
// bCache's partial block to the main pool's host tier, the rCache's to the
// rCache pool's. Nothing is computed twice, the tokens equal recompute's and
// an unpreempted run's, and neither pool (nor its swap space) keeps a block.
TEST_F(EngineSwapTest, ForkedSwapComputesNothingTwiceAndMatchesRecompute) {
  const SwapRun roomy = run(256, false, 0, /*forked=*/true);
  EXPECT_EQ(roomy.metrics.num_preemptions, 0);
  EXPECT_EQ(roomy.num_computed_tokens, kTokensOnce);
  ASSERT_TRUE(roomy.residual_stats.has_value());
  expect_no_leaks(roomy);

  const SwapRun swap = run(12, true, 64, /*forked=*/true);
  EXPECT_GT(swap.metrics.num_preemptions, 0);
  EXPECT_EQ(swap.metrics.num_swap_preemptions, swap.metrics.num_preemptions);
  EXPECT_EQ(swap.metrics.num_swap_fallbacks, 0);
  EXPECT_EQ(swap.num_computed_tokens, kTokensOnce);  // no prompt recomputed, no token twice
  EXPECT_GT(swap.num_residual_copies, 0);
  // every private block swapped out (the partial last block, in both pools; none when the engine's timing
  // preempts at a block boundary) came back in
  ASSERT_TRUE(swap.residual_stats.has_value());
  EXPECT_EQ(swap.residual_stats->num_swapped_in_blocks, swap.residual_stats->num_swapped_out_blocks);
  EXPECT_EQ(swap.stats.num_swapped_in_blocks, swap.stats.num_swapped_out_blocks);
  EXPECT_EQ(swap.residual_stats->num_swapped_out_blocks > 0, swap.stats.num_swapped_out_blocks > 0);
  EXPECT_EQ(swap.tokens, roomy.tokens);
  expect_no_leaks(swap);

  const SwapRun recompute = run(12, false, 64, /*forked=*/true);
  EXPECT_GT(recompute.metrics.num_preemptions, 0);
  EXPECT_EQ(recompute.metrics.num_swap_preemptions, 0);
  EXPECT_GE(recompute.num_computed_tokens, kTokensOnce);
  EXPECT_EQ(recompute.tokens, roomy.tokens);
  expect_no_leaks(recompute);
}

// A forked request whose rCache pool has no host tier (the main pool has one)
// cannot swap, its rCache blocks having nowhere to go: it is preempted by
// recompute, counted as a fallback, and its tokens are still right.
TEST_F(EngineSwapTest, ForkedWithoutResidualHostTierRecomputes) {
  const SwapRun roomy = run(256, false, 0, /*forked=*/true);
  const SwapRun swap = run(12, true, 64, /*forked=*/true, /*residual_host_tier=*/false);
  EXPECT_GT(swap.metrics.num_preemptions, 0);
  EXPECT_EQ(swap.metrics.num_swap_preemptions, 0);
  EXPECT_EQ(swap.metrics.num_swap_fallbacks, swap.metrics.num_preemptions);
  EXPECT_EQ(swap.num_residual_copies, 0);
  EXPECT_EQ(swap.tokens, roomy.tokens);
  expect_no_leaks(swap);
}

}  // namespace
}  // namespace loom
