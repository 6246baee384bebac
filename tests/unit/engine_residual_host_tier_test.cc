// The forked rCache's host tier through the serving engine (CPU backend, tiny
// random llama, one forked adapter): rCache blocks evicted from the device
// come back from the host instead of being recomputed, and the logits equal,
// bit for bit, those of an engine that never evicted anything; the bCache and
// rCache come back together; failing rCache loads recompute.
#include <gtest/gtest.h>

#include <mutex>
#include <thread>
#include <utility>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine_impl.h"
#include "engine_test_util.h"
#include "model/loader.h"
#include "synthetic/synthetic_model.h"
#include "test_util.h"

namespace loom {
namespace {

constexpr int32_t kPromptTokens = 21;  // 5 full blocks of 4 are cached (the last prompt token never is)
constexpr int32_t kCachedTokens = 20;
constexpr int32_t kOutputTokens = 4;

// Forwards everything, rCache and host tier included, to a CPU backend; records
// what each forward() was asked to compute and the logits it gave; rCache
// loads fail on demand.
class RecordingBackend final : public test::ForwardingBackend {
 public:
  struct Step {
    std::vector<BatchSequence> sequences;
    std::vector<float> logits;
  };

  RecordingBackend(std::unique_ptr<Backend> inner, bool fail_residual_loads)
      : ForwardingBackend(std::move(inner)), fail_residual_loads_(fail_residual_loads) {}
  void allocate_residual_cache(const ResidualCacheShape& shape) override { inner().allocate_residual_cache(shape); }
  ResidualCacheShape residual_cache_shape() const override { return inner().residual_cache_shape(); }
  int64_t residual_bytes_per_token(int32_t max_rank) const override {
    return inner().residual_bytes_per_token(max_rank);
  }
  void allocate_host_kv_cache(KvPoolKind pool, int32_t num_blocks) override {
    inner().allocate_host_kv_cache(pool, num_blocks);
  }
  int32_t num_host_kv_blocks(KvPoolKind pool) const override { return inner().num_host_kv_blocks(pool); }
  void copy_kv_blocks(KvPoolKind pool, KvCopyDirection direction, std::span<const int32_t> device_block_ids,
                      std::span<const int32_t> host_block_ids) override {
    if (fail_residual_loads_ && pool == KvPoolKind::kResidual && direction == KvCopyDirection::kHostToDevice)
      throw Error(ErrorKind::kInternal, "injected rCache load failure");
    inner().copy_kv_blocks(pool, direction, device_block_ids, host_block_ids);
  }
  ForwardResult forward(const Batch& batch) override {
    ForwardResult result = inner().forward(batch);
    std::lock_guard lock(mutex_);
    steps_.push_back({batch.sequences, result.logits});
    return result;
  }

  // The steps recorded since the last call.
  std::vector<Step> take_steps() {
    std::lock_guard lock(mutex_);
    return std::exchange(steps_, {});
  }

 private:
  const bool fail_residual_loads_;
  std::mutex mutex_;
  std::vector<Step> steps_;
};

struct Outcome {
  std::vector<int32_t> tokens;
  int32_t num_cached_prompt_tokens = -1;
  std::vector<RecordingBackend::Step> steps;  // the forward steps that ran it
};

enum class Evict : uint8_t { kNothing, kRCache, kBoth };

// An engine serving one forked adapter, "agent", with (num_host_blocks > 0)
// or without a host tier, and the request the tests run on it.
class ForkedEngine {
 public:
  ForkedEngine(const LoadedModel& model, const std::string& adapter_path, int32_t num_host_blocks,
               bool fail_residual_loads = false) {
    EngineConfig config = test::small_sharing_engine_config();
    config.num_host_kv_blocks = num_host_blocks;  // the rCache gets as many (same-sized device pools)
    auto backend = std::make_unique<RecordingBackend>(make_cpu_backend(model.config, model.weights, {1, 8}),
                                                      fail_residual_loads);
    backend_ = backend.get();
    engine_ = std::make_unique<EngineImpl>(model, std::move(backend), config);
    engine_->load_adapter("agent", adapter_path, KvSharing::kForked);
  }
  ~ForkedEngine() {
    engine_->run_on_engine_thread([&] { EXPECT_EQ(engine_->kv_caches().integrity_error(), ""); });
    engine_->shutdown(false);
  }

  static EngineRequest request() {
    EngineRequest request;
    for (int32_t i = 0; i < kPromptTokens; ++i) request.prompt_tokens.push_back(10 + (i * 37 + i * i * 3) % 240);
    request.max_new_tokens = kOutputTokens;
    request.adapter = "agent";
    request.ignore_eos = true;
    return request;
  }
  Outcome run() {
    backend_->take_steps();
    Outcome outcome;
    auto stream = engine_->submit(request());
    test::read_stream(*stream, [&](const RequestOutput& output) {
      for (const SampledToken& token : output.new_tokens) outcome.tokens.push_back(token.token_id);
      outcome.num_cached_prompt_tokens = output.num_cached_prompt_tokens;
      EXPECT_FALSE(output.error.has_value()) << output.error->what();
    });
    outcome.steps = backend_->take_steps();
    return outcome;
  }
  // Waits until the engine has applied every transfer of both members.
  void settle() {
    for (int i = 0; i < 2000; ++i) {
      int32_t in_flight = 0;
      engine_->run_on_engine_thread([&] { in_flight = engine_->kv_caches().num_transfers_in_flight(); });
      if (in_flight == 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ADD_FAILURE() << "transfers did not finish";
  }
  // Runs the request, evicts what `evict` says (backed-up blocks go to the
  // host), and runs it again: the second run's outcome.
  Outcome run_again_after(Evict evict) {
    run();
    settle();
    engine_->run_on_engine_thread([&] {
      int32_t num_evicted = 0;
      if (evict == Evict::kRCache) num_evicted = engine_->residual_kv_cache()->evict_all_cached();
      if (evict == Evict::kBoth) num_evicted = engine_->kv_caches().evict_all_cached();
      EXPECT_EQ(num_evicted > 0, evict != Evict::kNothing);
    });
    return run();
  }
  PerKvCache<KvCacheStats> stats() {
    PerKvCache<KvCacheStats> stats;
    engine_->run_on_engine_thread([&] { stats = engine_->kv_caches().stats(); });
    return stats;
  }
  EngineMetrics take_metrics() { return engine_->take_metrics(); }

 private:
  RecordingBackend* backend_ = nullptr;  // owned by engine_
  std::unique_ptr<EngineImpl> engine_;
};

class EngineResidualHostTierTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = new test::TempDir();
    model_ = new LoadedModel(test::write_and_load_synthetic_model(*directory_, 1));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete directory_;
  }

  static std::unique_ptr<ForkedEngine> start(int32_t num_host_blocks, bool fail_residual_loads = false) {
    return std::make_unique<ForkedEngine>(*model_, directory_->str() + "/adapters/adapter0", num_host_blocks,
                                          fail_residual_loads);
  }
  // The same two runs on an engine with no host tier that never evicts.
  static Outcome never_evicted() { return start(0)->run_again_after(Evict::kNothing); }
  // Every logit the runs computed, bit for bit, and what each step computed.
  static void expect_same_computation(const Outcome& actual, const Outcome& expected) {
    EXPECT_EQ(actual.tokens, expected.tokens);
    ASSERT_EQ(actual.steps.size(), expected.steps.size());
    for (size_t i = 0; i < actual.steps.size(); ++i) {
      EXPECT_EQ(actual.steps[i].logits, expected.steps[i].logits) << "step " << i;  // bit-exact
      ASSERT_EQ(actual.steps[i].sequences.size(), 1u);
      EXPECT_EQ(actual.steps[i].sequences[0].num_computed_tokens, expected.steps[i].sequences[0].num_computed_tokens);
      EXPECT_EQ(actual.steps[i].sequences[0].num_new_tokens, expected.steps[i].sequences[0].num_new_tokens);
    }
  }

  static test::TempDir* directory_;
  static LoadedModel* model_;
};
test::TempDir* EngineResidualHostTierTest::directory_ = nullptr;
LoadedModel* EngineResidualHostTierTest::model_ = nullptr;

TEST_F(EngineResidualHostTierTest, EvictedRCacheComesBackFromTheHostBitExactly) {
  auto engine = start(/*num_host_blocks=*/64);
  const Outcome outcome = engine->run_again_after(Evict::kRCache);
  // The whole prefix hit: the rCache was loaded (the bCache never left), not recomputed.
  EXPECT_EQ(outcome.num_cached_prompt_tokens, kCachedTokens);
  ASSERT_FALSE(outcome.steps.empty());
  const BatchSequence& prefill = outcome.steps[0].sequences.at(0);
  EXPECT_EQ(prefill.num_computed_tokens, kCachedTokens);
  EXPECT_EQ(prefill.num_new_tokens, kPromptTokens - kCachedTokens);
  EXPECT_EQ(prefill.num_residual_present_tokens, kCachedTokens);
  const PerKvCache<KvCacheStats> after = engine->stats();
  EXPECT_EQ(after[KvCacheId::kResidual].num_loaded_blocks, kCachedTokens / 4);
  EXPECT_EQ(after[KvCacheId::kMain].num_loaded_blocks, 0);
  EXPECT_GT(after[KvCacheId::kResidual].num_offloaded_blocks, 0);
  const EngineMetrics metrics = engine->take_metrics();
  EXPECT_EQ(metrics.num_loaded_tokens, kCachedTokens);
  EXPECT_GT(metrics.kv_bytes_host_residual, 0);
  EXPECT_EQ(metrics.load_wait_time.size(), 1u);  // it waited on the rCache load
  expect_same_computation(outcome, never_evicted());
}

TEST_F(EngineResidualHostTierTest, BCacheAndRCacheComeBackTogetherBitExactly) {
  auto engine = start(64);
  const Outcome outcome = engine->run_again_after(Evict::kBoth);
  EXPECT_EQ(outcome.num_cached_prompt_tokens, kCachedTokens);
  const PerKvCache<KvCacheStats> after = engine->stats();
  for (KvCacheId id : kAllKvCaches) EXPECT_EQ(after[id].num_loaded_blocks, kCachedTokens / 4) << kv_cache_name(id);
  EXPECT_EQ(engine->take_metrics().num_loaded_tokens, 2 * kCachedTokens);  // counted once per pool
  expect_same_computation(outcome, never_evicted());
}

TEST_F(EngineResidualHostTierTest, FailedRCacheLoadsRecompute) {
  auto engine = start(64, /*fail_residual_loads=*/true);
  const Outcome outcome = engine->run_again_after(Evict::kRCache);
  EXPECT_EQ(outcome.num_cached_prompt_tokens, 0);  // the rCache is recomputed (the bCache is reused as present)
  ASSERT_FALSE(outcome.steps.empty());
  EXPECT_EQ(outcome.steps[0].sequences.at(0).num_kv_present_tokens, kCachedTokens);
  EXPECT_EQ(outcome.tokens, never_evicted().tokens);
  EXPECT_EQ(engine->stats()[KvCacheId::kResidual].num_failed_transfers, 1);
}

// Without a host tier the evicted rCache is lost: the baseline the tests above beat.
TEST_F(EngineResidualHostTierTest, WithoutAHostTierTheEvictedRCacheIsRecomputed) {
  auto engine = start(0);
  const Outcome outcome = engine->run_again_after(Evict::kRCache);
  EXPECT_EQ(outcome.num_cached_prompt_tokens, 0);
  EXPECT_EQ(outcome.tokens, never_evicted().tokens);
}

}  // namespace
}  // namespace loom
