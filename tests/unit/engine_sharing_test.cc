// KV sharing modes through the serving engine (CPU backend, tiny random llama):
// which blocks each mode reuses (prefix-hit metrics by mode), the rCache pool
// of forked adapters, and that mixing every mode in one batch changes no
// request's tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "engine/batch_builder.h"
#include "engine/engine_impl.h"
#include "engine_test_util.h"
#include "lora/adapter.h"
#include "model/loader.h"
#include "synthetic/synthetic_model.h"
#include "test_util.h"

namespace loom {
namespace {

struct Collected {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::optional<Error> error;
  int32_t num_cached_prompt_tokens = 0;
};

Collected collect(RequestStream& stream) {
  Collected result;
  test::read_stream(stream, [&](const RequestOutput& output) {
    for (const auto& token : output.new_tokens) {
      result.tokens.push_back(token.token_id);
      result.logprobs.push_back(token.logprob);
    }
    result.num_cached_prompt_tokens = output.num_cached_prompt_tokens;
    result.error = output.error;
  });
  return result;
}

// An adapter as the engine loads it: a synthetic adapter directory under a name, in a mode.
struct AdapterSetup {
  std::string name;
  int index = 0;  // adapters/adapterI (0: all seven projections; 1: q, v; 3: k, o, gate, up of even layers)
  KvSharing sharing = KvSharing::kIsolated;
};

class EngineSharingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = new test::TempDir();
    // Every adapter may be served activated.
    model_ = new LoadedModel(
        test::write_and_load_synthetic_model(*directory_, 4, /*alora_invocation=*/true));
    const std::vector<int> invocation = synthetic_alora_invocation_tokens(model_->config);
    invocation_ = new std::vector<int32_t>(invocation.begin(), invocation.end());
  }
  static void TearDownTestSuite() {
    delete invocation_;
    delete model_;
    delete directory_;
  }
  static std::string adapter_path(int i) { return directory_->str() + "/adapters/adapter" + std::to_string(i); }

  static EngineConfig small_config() { return test::small_sharing_engine_config(); }
  static std::unique_ptr<EngineImpl> make(const std::vector<AdapterSetup>& adapters,
                                          EngineConfig config = small_config()) {
    auto engine = std::make_unique<EngineImpl>(*model_, make_cpu_backend(model_->config, model_->weights, {1, 8}),
                                               config);
    for (const AdapterSetup& adapter : adapters)
      engine->load_adapter(adapter.name, adapter_path(adapter.index), adapter.sharing);
    return engine;
  }
  void start(const std::vector<AdapterSetup>& adapters, EngineConfig config = small_config()) {
    engine_ = make(adapters, config);
  }
  void TearDown() override {
    if (!engine_) return;
    engine_->run_on_engine_thread([&] {
      EXPECT_EQ(engine_->kv_cache().integrity_error(), "");
      if (engine_->residual_kv_cache()) {
        EXPECT_EQ(engine_->residual_kv_cache()->integrity_error(), "");
      }
    });
    engine_->shutdown(false);
  }

  // `length` ordinary token ids (never the invocation tokens), varying with `seed`.
  static std::vector<int32_t> tokens(int32_t length, int32_t seed) {
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < length; ++i) ids.push_back(10 + (i * 37 + seed * 101 + i * i * seed) % 240);
    return ids;
  }
  static std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }
  static EngineRequest request(std::vector<int32_t> prompt, int32_t max_new_tokens, const std::string& adapter = "") {
    EngineRequest request;
    request.prompt_tokens = std::move(prompt);
    request.max_new_tokens = max_new_tokens;
    request.adapter = adapter;
    request.ignore_eos = true;
    return request;
  }
  static Collected run_on(EngineImpl& engine, const EngineRequest& request) {
    auto stream = engine.submit(request);
    Collected result = collect(*stream);
    EXPECT_FALSE(result.error.has_value()) << result.error->what();
    return result;
  }
  Collected run(const EngineRequest& request) { return run_on(*engine_, request); }
  // The request alone on a fresh engine that has only its adapter.
  static Collected run_alone(const EngineRequest& request, const std::vector<AdapterSetup>& adapters) {
    std::vector<AdapterSetup> own;
    for (const AdapterSetup& adapter : adapters)
      if (adapter.name == request.adapter) own.push_back(adapter);
    auto engine = make(own);
    Collected result = run_on(*engine, request);
    engine->shutdown(false);
    return result;
  }

  std::map<std::string, int32_t> blocks_by_namespace(bool residual) {
    std::map<std::string, int32_t> blocks;
    engine_->run_on_engine_thread([&] {
      KvCacheManager* manager = residual ? engine_->residual_kv_cache() : &engine_->kv_cache();
      if (manager) blocks = manager->stats().num_blocks_by_namespace;
    });
    return blocks;
  }
  std::vector<int32_t> invocation() const { return *invocation_; }

  static test::TempDir* directory_;
  static LoadedModel* model_;
  static std::vector<int32_t>* invocation_;
  std::unique_ptr<EngineImpl> engine_;
};
test::TempDir* EngineSharingTest::directory_ = nullptr;
LoadedModel* EngineSharingTest::model_ = nullptr;
std::vector<int32_t>* EngineSharingTest::invocation_ = nullptr;

// build_batch alone: per-token slots and sequence fields by mode.
TEST_F(EngineSharingTest, BatchLayoutFollowsEachMode) {
  KvCacheGroup kv_caches(64, 64, 4);
  Scheduler scheduler(SchedulerConfig{}, kv_caches);
  LoraAdapter alora;
  alora.config.alora_invocation_tokens = {7, 8};
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 7, 8, 9};  // invocation start 5
  std::map<SchedulerRequestId, RequestKvPlan> plans;
  plans[1] = plan_request_kv("", nullptr, KvSharing::kIsolated, -1, prompt, 4);
  plans[2] = plan_request_kv("iso", &alora, KvSharing::kIsolated, 3, prompt, 4);
  plans[3] = plan_request_kv("act", &alora, KvSharing::kActivated, 4, prompt, 4);
  plans[4] = plan_request_kv("icarus", &alora, KvSharing::kBase, 5, prompt, 4);
  plans[5] = plan_request_kv("fork", &alora, KvSharing::kForked, 6, prompt, 4);
  plans[6] = plan_request_kv("act", &alora, KvSharing::kActivated, 4, std::vector<int32_t>{1, 2, 3}, 4);
  EXPECT_EQ(plans[2].kv.key, KvKey::single("lora/iso"));
  EXPECT_EQ(plans[3].kv.key, activated_kv_key("act", 5, 4));
  EXPECT_EQ(plans[4].kv.key, KvKey::single("base"));
  EXPECT_EQ(plans[5].kv.key, KvKey::single("fork"));
  EXPECT_EQ(plans[5].kv.residual_namespace, "resid/fork");
  EXPECT_EQ(plans[6].kv.key, KvKey::single("base"));  // not invoked: the base model answers
  EXPECT_EQ(plans[6].scheduler_adapter, "");
  EXPECT_EQ(plans[6].mode_label, "activated");
  EXPECT_EQ(plans[1].mode_label, "none");
  for (const auto& [id, plan] : plans)
    scheduler.add(id, id == 6 ? std::vector<int32_t>{1, 2, 3} : prompt, plan.scheduler_adapter, plan.kv, 0);
  const ScheduledBatch step = scheduler.plan();
  ASSERT_EQ(step.requests.size(), 6u);
  const Batch batch = build_batch(step, scheduler, [&](SchedulerRequestId id) { return plans.at(id).sharing; });
  for (size_t i = 0; i < step.requests.size(); ++i) {
    const SchedulerRequestId id = step.requests[i].id;
    const BatchSequence& sequence = batch.sequences[i];
    std::vector<int32_t> slots(batch.adapter_slots.begin() + sequence.token_offset,
                               batch.adapter_slots.begin() + sequence.token_offset + sequence.num_new_tokens);
    const int32_t n = sequence.num_new_tokens;
    switch (id) {
      case 1: EXPECT_EQ(slots, std::vector<int32_t>(static_cast<size_t>(n), -1)); break;
      case 2: EXPECT_EQ(slots, std::vector<int32_t>(static_cast<size_t>(n), 3)); break;
      case 3: EXPECT_EQ(slots, (std::vector<int32_t>{-1, -1, -1, -1, -1, 4, 4, 4})); break;
      case 4:
        EXPECT_EQ(slots, std::vector<int32_t>(static_cast<size_t>(n), -1));
        EXPECT_EQ(sequence.decoder_adapter_slot, 5);
        break;
      case 5:
        EXPECT_EQ(slots, std::vector<int32_t>(static_cast<size_t>(n), 6));
        EXPECT_EQ(sequence.forked_adapter_slot, 6);
        EXPECT_EQ(sequence.num_residual_blocks, 2);
        EXPECT_EQ(std::vector<int32_t>(batch.residual_block_tables.begin() + sequence.residual_block_table_offset,
                                       batch.residual_block_tables.begin() + sequence.residual_block_table_offset + 2),
                  step.requests[i].residual_block_ids);
        break;
      case 6: EXPECT_EQ(slots, (std::vector<int32_t>{-1, -1, -1})); break;
    }
    if (id != 4) {
      EXPECT_EQ(sequence.decoder_adapter_slot, -1) << id;
    }
    if (id != 5) {
      EXPECT_EQ(sequence.forked_adapter_slot, -1) << id;
    }
  }
}

TEST_F(EngineSharingTest, ActivatedRequestHitsEveryFullBlockBeforeItsInvocation) {
  start({{"alora", 0, KvSharing::kActivated}});
  const std::vector<int32_t> context = tokens(22, 1);
  // The base model reads the context first (a pipeline's earlier step).
  const Collected base = run(request(context, 4));
  // Invocation start S = 22 lies inside block 5 (block size 4): blocks 0-4 are base K/V.
  const EngineRequest adapted = request(concat(concat(context, invocation()), tokens(3, 2)), 6, "alora");
  const Collected warm = run(adapted);
  EXPECT_EQ(warm.num_cached_prompt_tokens, 20);
  const EngineMetrics metrics = engine_->take_metrics();
  EXPECT_EQ(metrics.prefix_hit_tokens_by_mode.at("activated"), 20);
  EXPECT_EQ(metrics.prefix_queried_tokens_by_mode.at("activated"), 27);
  EXPECT_EQ(metrics.prefix_queried_tokens_by_mode.at("none"), 22);
  // Reusing the base model's blocks changes nothing: same tokens as from a cold cache.
  EXPECT_EQ(warm.tokens, run_alone(adapted, {{"alora", 0, KvSharing::kActivated}}).tokens);
  EXPECT_NE(warm.tokens, run(request(adapted.prompt_tokens, 6)).tokens);  // the adapter does act

  // The branch from the invocation block on is the adapter's own namespace.
  const std::map<std::string, int32_t> blocks = blocks_by_namespace(false);
  EXPECT_EQ(blocks.count("alora/alora@22"), 1u);
  EXPECT_GT(engine_->take_metrics().kv_bytes_by_adapter.at("alora"), 0);
  (void)base;
}

TEST_F(EngineSharingTest, ActivatedMasksFollowTheInvocationStart) {
  const std::vector<AdapterSetup> adapters = {{"alora", 0, KvSharing::kActivated}, {"lora", 0, KvSharing::kIsolated}};
  start(adapters);
  // Invoked at position 0: every token is adapted, as with the plain LoRA.
  const std::vector<int32_t> invoked_first = concat(invocation(), tokens(9, 3));
  EXPECT_EQ(run(request(invoked_first, 6, "alora")).tokens, run(request(invoked_first, 6, "lora")).tokens);
  // Not invoked: the base model answers, and its blocks are the base model's.
  const std::vector<int32_t> plain = tokens(13, 4);
  const Collected base = run(request(plain, 6));
  const Collected not_invoked = run(request(plain, 6, "alora"));
  EXPECT_EQ(not_invoked.tokens, base.tokens);
  EXPECT_EQ(not_invoked.num_cached_prompt_tokens, 12);
  // Only the last occurrence counts: an earlier one changes nothing before the last.
  const std::vector<int32_t> twice = concat(concat(concat(tokens(5, 5), invocation()), tokens(6, 6)), invocation());
  const Collected last = run(request(twice, 5, "alora"));
  EXPECT_EQ(last.tokens, run_alone(request(twice, 5, "alora"), adapters).tokens);
  EXPECT_EQ(blocks_by_namespace(false).count("alora/alora@13"), 1u);
}

TEST_F(EngineSharingTest, BaseRequestReusesTheBlocksAnActivatedRequestComputedBeforeItsInvocation) {
  start({{"alora", 1, KvSharing::kActivated}});
  const std::vector<int32_t> context = tokens(18, 7);
  run(request(concat(concat(context, invocation()), tokens(4, 8)), 5, "alora"));
  const EngineRequest base = request(concat(context, tokens(3, 9)), 5);
  const Collected warm = run(base);
  EXPECT_EQ(warm.num_cached_prompt_tokens, 16);  // blocks 0-3; S = 18 is inside block 4
  EXPECT_EQ(engine_->take_metrics().prefix_hit_tokens_by_mode.at("none"), 16);
  EXPECT_EQ(warm.tokens, run_alone(base, {}).tokens);
}

TEST_F(EngineSharingTest, BaseModeReusesTheKvOfTokensAnotherAdapterGenerated) {
  const std::vector<AdapterSetup> adapters = {{"first", 0, KvSharing::kBase}, {"second", 3, KvSharing::kBase}};
  start(adapters);
  const std::vector<int32_t> prompt = tokens(10, 10);
  const Collected first = run(request(prompt, 9, "first"));
  ASSERT_EQ(first.tokens.size(), 9u);
  // The second agent reads the first one's whole exchange: prompt and answer.
  const EngineRequest second = request(concat(concat(prompt, first.tokens), tokens(2, 11)), 6, "second");
  const Collected warm = run(second);
  // 10 + 8 tokens have K/V (the last sampled token was never fed back): 4 full blocks.
  EXPECT_EQ(warm.num_cached_prompt_tokens, 16);
  EXPECT_GT(warm.num_cached_prompt_tokens, static_cast<int32_t>(prompt.size()));
  const EngineMetrics metrics = engine_->take_metrics();
  EXPECT_EQ(metrics.prefix_hit_tokens_by_mode.at("base"), 16);
  EXPECT_EQ(metrics.kv_bytes_by_adapter.at("first"), 0);  // everything is in the base namespace
  EXPECT_EQ(warm.tokens, run_alone(second, adapters).tokens);
  // The base model reuses them too.
  EXPECT_EQ(run(request(second.prompt_tokens, 2)).num_cached_prompt_tokens, 20);
  // The decoder row is the adapter's: not the base model's tokens.
  EXPECT_NE(first.tokens, run(request(prompt, 9)).tokens);
}

TEST_F(EngineSharingTest, SecondForkedAgentAllocatesResidualBlocksOnly) {
  start({{"agent0", 0, KvSharing::kForked}, {"agent1", 3, KvSharing::kForked}});
  const std::vector<int32_t> context = tokens(40, 12);
  run(request(context, 4, "agent0"));
  const std::map<std::string, int32_t> main_before = blocks_by_namespace(false);
  const EngineMetrics before = engine_->take_metrics();
  ASSERT_EQ(main_before.at("fork"), 10);  // 40 prompt + 3 generated tokens: 10 full blocks
  EXPECT_EQ(blocks_by_namespace(true).at("resid/agent0"), 10);

  run(request(context, 1, "agent1"));
  EXPECT_EQ(blocks_by_namespace(false), main_before);  // no new main-pool block
  const std::map<std::string, int32_t> residual = blocks_by_namespace(true);
  EXPECT_EQ(residual.at("resid/agent1"), 10);
  const EngineMetrics after = engine_->take_metrics();
  EXPECT_EQ(after.kv_bytes_base, before.kv_bytes_base);
  const int64_t residual_block_bytes = after.kv_bytes_per_token_residual * 4;
  EXPECT_EQ(after.kv_bytes_residual - before.kv_bytes_residual, 10 * residual_block_bytes);
  EXPECT_EQ(after.kv_bytes_by_adapter.at("agent1"), 10 * residual_block_bytes);
  // Per token: 2 * rank values against 2 * num_kv_heads * head_dim (rank 8 here).
  const int64_t kv_size = model_->config.num_kv_heads * model_->config.head_dim;
  EXPECT_EQ(after.kv_bytes_per_token_base * 8, after.kv_bytes_per_token_residual * kv_size);
  EXPECT_EQ(after.kv_bytes_per_token_base, after.kv_bytes_per_token_residual * 4);
}

TEST_F(EngineSharingTest, ForkedRequestRecomputesWhatWasEvictedAndKeepsItsTokens) {
  start({{"agent", 0, KvSharing::kForked}, {"same", 0, KvSharing::kIsolated}});
  const EngineRequest again = request(tokens(23, 13), 8, "agent");
  const Collected cold = run(again);
  // Alone, a forked agent is the isolated adapter (K = bK + RoPE(rK B_k), V = bV + rV B_v).
  EngineRequest isolated = again;
  isolated.adapter = "same";
  const Collected reference = run(isolated);
  EXPECT_EQ(cold.tokens, reference.tokens);
  for (size_t t = 0; t < cold.logprobs.size() && t < reference.logprobs.size(); ++t)
    EXPECT_NEAR(cold.logprobs[t], reference.logprobs[t], 1e-3) << "token " << t;
  // The base tree evicted, the residual tree kept: base K/V are recomputed.
  int32_t num_evicted = 0;
  engine_->run_on_engine_thread([&] { num_evicted = engine_->kv_cache().evict_all_cached(); });
  EXPECT_GT(num_evicted, 0);
  EXPECT_GT(blocks_by_namespace(true).at("resid/agent"), 0);
  const Collected base_evicted = run(again);
  EXPECT_EQ(base_evicted.tokens, cold.tokens);
  // The other way round.
  engine_->run_on_engine_thread([&] { num_evicted = engine_->residual_kv_cache()->evict_all_cached(); });
  EXPECT_GT(num_evicted, 0);
  EXPECT_EQ(run(again).tokens, cold.tokens);
  // And fully warm.
  const Collected warm = run(again);
  EXPECT_EQ(warm.num_cached_prompt_tokens, 20);
  EXPECT_EQ(warm.tokens, cold.tokens);
}

TEST_F(EngineSharingTest, OneBatchMixingEveryModeEqualsEachRequestAlone) {
  const std::vector<AdapterSetup> adapters = {
      {"alora0", 0, KvSharing::kActivated}, {"alora1", 1, KvSharing::kActivated}, {"iso", 3, KvSharing::kIsolated},
      {"icarus0", 0, KvSharing::kBase},     {"icarus1", 3, KvSharing::kBase},     {"fork0", 0, KvSharing::kForked},
      {"fork1", 1, KvSharing::kForked}};
  start(adapters);
  const std::vector<int32_t> shared = tokens(14, 20);  // exact modes share it; forked agents get their own
  std::vector<EngineRequest> requests;
  for (int round = 0; round < 2; ++round) {
    const std::vector<int32_t> tail = tokens(3 + round, 21 + round);
    requests.push_back(request(concat(shared, tail), 6));
    requests.push_back(request(concat(concat(shared, invocation()), tail), 7, "alora0"));
    requests.push_back(request(concat(concat(shared, tail), invocation()), 5, "alora1"));
    requests.push_back(request(concat(shared, tail), 6, "iso"));
    requests.push_back(request(concat(shared, tail), 7, "icarus0"));
    requests.push_back(request(concat(tail, shared), 6, "icarus1"));
    requests.push_back(request(tokens(17 + round, 30 + round), 6, "fork0"));
    requests.push_back(request(tokens(12 + round, 40 + round), 7, "fork1"));
  }
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (const EngineRequest& r : requests) streams.push_back(engine_->submit(r));
  std::vector<Collected> results;
  for (auto& stream : streams) results.push_back(collect(*stream));
  for (size_t i = 0; i < requests.size(); ++i) {
    const Collected alone = run_alone(requests[i], adapters);
    const std::string which = "request " + std::to_string(i) + " (" + requests[i].adapter + ")";
    ASSERT_FALSE(results[i].error.has_value()) << which;
    EXPECT_EQ(results[i].tokens, alone.tokens) << which;
    ASSERT_EQ(results[i].logprobs.size(), alone.logprobs.size()) << which;
    for (size_t t = 0; t < alone.logprobs.size(); ++t)
      EXPECT_NEAR(results[i].logprobs[t], alone.logprobs[t], 1e-4) << which << " token " << t;
  }
  const EngineMetrics metrics = engine_->take_metrics();
  // They did run together: decode steps held most of them at once.
  ASSERT_FALSE(metrics.decode_batch_sizes.empty());
  EXPECT_GE(*std::max_element(metrics.decode_batch_sizes.begin(), metrics.decode_batch_sizes.end()), 10);
  for (const char* mode : {"none", "activated", "isolated", "base", "forked"})
    EXPECT_GT(metrics.prefix_queried_tokens_by_mode.at(mode), 0) << mode;
  EXPECT_GT(metrics.kv_bytes_residual, 0);
}

TEST_F(EngineSharingTest, UnloadingAnActivatedAdapterDropsItsBranches) {
  start({{"alora", 0, KvSharing::kActivated}, {"other", 1, KvSharing::kActivated}});
  const std::vector<int32_t> context = tokens(12, 50);
  run(request(concat(concat(context, invocation()), tokens(9, 51)), 4, "alora"));
  run(request(concat(concat(context, tokens(2, 52)), invocation()), 4, "alora"));
  run(request(concat(concat(context, invocation()), tokens(9, 53)), 4, "other"));
  std::map<std::string, int32_t> blocks = blocks_by_namespace(false);
  EXPECT_GT(blocks.at("alora/alora@12"), 0);
  EXPECT_GT(blocks.at("alora/alora@14"), 0);
  const int32_t num_base_blocks = blocks.at("base");
  EXPECT_GT(engine_->take_metrics().kv_bytes_by_adapter.at("alora"), 0);
  engine_->unload_adapter("alora");
  blocks = blocks_by_namespace(false);
  EXPECT_EQ(blocks.count("alora/alora@12"), 0u);
  EXPECT_EQ(blocks.count("alora/alora@14"), 0u);
  EXPECT_GT(blocks.at("alora/other@12"), 0);
  EXPECT_EQ(blocks.at("base"), num_base_blocks);
  EXPECT_EQ(engine_->take_metrics().kv_bytes_by_adapter.count("alora"), 0u);
}

TEST_F(EngineSharingTest, ForkedAdaptersNeedAnRCachePoolOfTheirRank) {
  // k/v rank 8 over a max rank of 4.
  EngineConfig config = small_config();
  config.max_lora_rank = 4;
  auto engine = make({}, config);
  test::expect_error([&] { engine->load_adapter("big", adapter_path(0), KvSharing::kForked); },
                     ErrorKind::kCapacity, {"big", "rank 8", "--max-lora-rank"});
  engine->load_adapter("small", adapter_path(1), KvSharing::kForked);  // v rank 4
  engine->shutdown(false);

  // No rCache pool at all.
  config = small_config();
  config.num_residual_kv_blocks = 0;
  config.residual_kv_cache_bytes = 0;
  engine = make({}, config);
  test::expect_error([&] { engine->load_adapter("f", adapter_path(1), KvSharing::kForked); }, ErrorKind::kCapacity,
                     {"--residual-kv-cache-memory"});
  EXPECT_TRUE(engine->adapters().empty());
  engine->shutdown(false);

  // Auto: the first forked adapter loaded before any request makes the pool
  // (an eighth of the KV bytes), sized for the largest rank loaded, >= 16.
  config = EngineConfig{};
  config.block_size = 4;
  config.kv_cache_bytes = 1 << 20;
  engine = make({{"iso", 0, KvSharing::kIsolated}}, config);
  const int32_t num_blocks_alone = engine->num_kv_blocks();
  EXPECT_EQ(engine->num_residual_kv_blocks(), 0);
  engine->load_adapter("f", adapter_path(1), KvSharing::kForked);
  EXPECT_GT(engine->num_residual_kv_blocks(), 0);
  EXPECT_EQ(engine->residual_max_rank(), 16);
  EXPECT_LT(engine->num_kv_blocks(), num_blocks_alone);
  EXPECT_EQ(run_on(*engine, request(tokens(9, 60), 3, "f")).tokens.size(), 3u);
  // Once requests ran, the pools are fixed.
  engine->unload_adapter("f");
  engine->load_adapter("f", adapter_path(1), KvSharing::kForked);  // fits: v rank 4
  for (const AdapterInfo& info : engine->adapters())
    EXPECT_EQ(info.sharing, info.name == "f" ? KvSharing::kForked : KvSharing::kIsolated) << info.name;
  engine->shutdown(false);
}

// The backend refuses the rCache pool a forked adapter asks for (out of
// memory, say): the load fails with the backend's error and the engine serves
// on with pools as they were.
TEST_F(EngineSharingTest, ARefusedPoolReallocationLeavesTheEngineServing) {
  class RefusesResidualCache : public test::ForwardingBackend {
   public:
    using ForwardingBackend::ForwardingBackend;
    int64_t residual_bytes_per_token(int32_t max_rank) const override { return inner().residual_bytes_per_token(max_rank); }
    void allocate_residual_cache(const ResidualCacheShape&) override {
      throw Error(ErrorKind::kCapacity, "out of device memory for the rCache pool");
    }
  };
  EngineConfig config;
  config.block_size = 4;
  config.kv_cache_bytes = 1 << 20;  // auto: the first forked adapter makes the rCache pool
  auto engine = std::make_unique<EngineImpl>(
      *model_, std::make_unique<RefusesResidualCache>(make_cpu_backend(model_->config, model_->weights, {1, 8})),
      config);
  engine->load_adapter("iso", adapter_path(0), KvSharing::kIsolated);
  const int32_t num_blocks = engine->num_kv_blocks();
  test::expect_error([&] { engine->load_adapter("f", adapter_path(1), KvSharing::kForked); }, ErrorKind::kCapacity,
                     {"out of device memory"});
  EXPECT_EQ(engine->num_kv_blocks(), num_blocks);
  EXPECT_EQ(engine->num_residual_kv_blocks(), 0);
  ASSERT_EQ(engine->adapters().size(), 1u);
  EXPECT_EQ(run_on(*engine, request(tokens(9, 60), 3)).tokens.size(), 3u);
  EXPECT_EQ(run_on(*engine, request(tokens(9, 60), 3, "iso")).tokens.size(), 3u);
  engine->run_on_engine_thread([&] { EXPECT_EQ(engine->kv_caches().integrity_error(), ""); });
  engine->shutdown(false);
}

TEST_F(EngineSharingTest, AdaptersReportTheirMode) {
  start({{"default", 0, KvSharing::kIsolated}});
  engine_->load_adapter("chosen", adapter_path(2));  // alora_invocation_tokens in its config: activated
  std::map<std::string, KvSharing> modes;
  for (const AdapterInfo& info : engine_->adapters()) modes[info.name] = info.sharing;
  EXPECT_EQ(modes.at("default"), KvSharing::kIsolated);
  EXPECT_EQ(modes.at("chosen"), KvSharing::kActivated);
}

}  // namespace
}  // namespace loom
