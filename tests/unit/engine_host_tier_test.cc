// The KV host tier through the serving engine (CPU backend, tiny
// random llama): the KVFlow Fig. 1 cycle with a device pool that holds three
// agents' fixed prefixes, now backed by host memory. Evicted prefixes load
// back instead of being recomputed (LRU), the next agent's prefix is
// prefetched (workflow policy), outputs equal those of an engine without a
// host tier, and a failing copy or a tiny host pool degrade to recompute.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine_impl.h"
#include "engine_test_util.h"
#include "model/loader.h"
#include "synthetic/synthetic_model.h"
#include "test_util.h"

namespace loom {
namespace {

constexpr int32_t kBlockSize = 4;
constexpr int32_t kFixedTokens = 16;   // 4 blocks per agent's fixed prefix
constexpr int32_t kDynamicTokens = 4;  // 1 block of task input
constexpr int32_t kOutputTokens = 1;  // the pool arithmetic of engine_workflow_test

// Forwards everything to a CPU backend; host -> device copies fail on demand.
class FlakyCopyBackend final : public test::ForwardingBackend {
 public:
  FlakyCopyBackend(std::unique_ptr<Backend> inner, bool fail_loads)
      : ForwardingBackend(std::move(inner)), fail_loads_(fail_loads) {}
  void allocate_host_kv_cache(KvPoolKind pool, int32_t num_blocks) override {
    inner().allocate_host_kv_cache(pool, num_blocks);
  }
  int32_t num_host_kv_blocks(KvPoolKind pool) const override { return inner().num_host_kv_blocks(pool); }
  void copy_kv_blocks(KvPoolKind pool, KvCopyDirection direction, std::span<const int32_t> device_block_ids,
                      std::span<const int32_t> host_block_ids) override {
    if (fail_loads_ && direction == KvCopyDirection::kHostToDevice)
      throw Error(ErrorKind::kInternal, "injected copy failure");
    inner().copy_kv_blocks(pool, direction, device_block_ids, host_block_ids);
  }

 private:
  bool fail_loads_;
};

struct Outcome {
  int32_t num_cached_prompt_tokens = -1;
  std::vector<int32_t> tokens;
};

class EngineHostTierTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = new test::TempDir();
    model_ = new LoadedModel(test::write_and_load_synthetic_model(*directory_, 0));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete directory_;
  }

  struct Options {
    bool workflow_aware = false;
    int32_t num_host_blocks = 64;
    int32_t prefetch_agents = 0;
    bool fail_loads = false;
    bool blocking_loads = false;  // --host-load-policy blocking
  };
  void start(const Options& options) {
    EngineConfig config;
    config.block_size = kBlockSize;
    config.num_kv_blocks = 15;  // three agents' requests (4 fixed + 1 dynamic block) fill it
    config.max_batch_tokens = 64;
    config.workflow_aware_eviction = options.workflow_aware;
    config.num_host_kv_blocks = options.num_host_blocks;
    config.prefetch_agents = options.prefetch_agents;
    config.blocking_host_loads = options.blocking_loads;
    auto backend = std::make_unique<FlakyCopyBackend>(make_cpu_backend(model_->config, model_->weights, {1, 8}),
                                                      options.fail_loads);
    engine_ = std::make_unique<EngineImpl>(*model_, std::move(backend), config);
  }
  void TearDown() override {
    if (!engine_) return;
    engine_->run_on_engine_thread([&] { EXPECT_EQ(engine_->kv_cache().integrity_error(), ""); });
    engine_->shutdown(false);
  }

  static std::vector<int32_t> tokens(int32_t length, int32_t seed) {
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < length; ++i) ids.push_back(10 + (seed * 13 + i * 7 + (i * i * (seed + 1)) % 11) % 200);
    return ids;
  }
  EngineRequest agent_request(const std::string& agent, int32_t agent_seed, int32_t call) const {
    EngineRequest request;
    request.prompt_tokens = tokens(kFixedTokens, agent_seed);
    const std::vector<int32_t> dynamic = tokens(kDynamicTokens, 100 + agent_seed * 10 + call);
    request.prompt_tokens.insert(request.prompt_tokens.end(), dynamic.begin(), dynamic.end());
    request.max_new_tokens = kOutputTokens;
    request.ignore_eos = true;
    request.workflow = "w1";
    request.agent = agent;
    if (explicit_prefixes_) request.fixed_prefix_tokens = kFixedTokens;
    return request;
  }
  Outcome run(Engine& engine, const EngineRequest& request) {
    auto stream = engine.submit(request);
    Outcome outcome;
    for (;;) {
      std::optional<RequestOutput> output = stream->next(std::chrono::seconds(30));
      if (!output) {
        ADD_FAILURE() << "no output within 30 s";
        return outcome;
      }
      for (const SampledToken& token : output->new_tokens) outcome.tokens.push_back(token.token_id);
      outcome.num_cached_prompt_tokens = output->num_cached_prompt_tokens;
      if (output->finished) {
        EXPECT_FALSE(output->error.has_value()) << output->error->what();
        return outcome;
      }
    }
  }
  // Waits until the engine has applied every transfer (backups land between requests).
  void settle() {
    for (int i = 0; i < 2000; ++i) {
      int32_t in_flight = 0;
      engine_->run_on_engine_thread([&] { in_flight = engine_->kv_cache().num_transfers_in_flight(); });
      if (in_flight == 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ADD_FAILURE() << "transfers did not finish";
  }

  // KVFlow Fig. 1 (planner -> executor -> expresser -> reviewer -> planner),
  // starting at the expresser; the engine's outcomes in order.
  std::vector<Outcome> run_fig1_cycle() {
    WorkflowSpec spec;
    spec.agents = {{"planner", {"reviewer"}, JoinKind::kAll},
                   {"executor", {"planner"}, JoinKind::kAll},
                   {"expresser", {"executor"}, JoinKind::kAll},
                   {"reviewer", {"expresser"}, JoinKind::kAll}};
    engine_->workflows().declare("w1", spec);
    const std::map<std::string, int32_t> seeds = {{"planner", 1}, {"executor", 2}, {"expresser", 3}, {"reviewer", 4}};
    const std::vector<std::string> order = {"expresser", "reviewer", "planner", "executor", "expresser", "reviewer",
                                            "planner", "executor"};
    std::map<std::string, int32_t> calls;
    std::vector<Outcome> outcomes;
    for (const std::string& agent : order) {
      outcomes.push_back(run(*engine_, agent_request(agent, seeds.at(agent), calls[agent]++)));
      settle();
    }
    return outcomes;
  }
  // The same requests on an engine whose pool never evicts: the reference tokens.
  std::vector<std::vector<int32_t>> reference_tokens() {
    EngineConfig config;
    config.block_size = kBlockSize;
    config.num_kv_blocks = 256;
    EngineImpl reference(*model_, make_cpu_backend(model_->config, model_->weights, {1, 8}), config);
    const std::map<std::string, int32_t> seeds = {{"planner", 1}, {"executor", 2}, {"expresser", 3}, {"reviewer", 4}};
    const std::vector<std::string> order = {"expresser", "reviewer", "planner", "executor", "expresser", "reviewer",
                                            "planner", "executor"};
    std::map<std::string, int32_t> calls;
    std::vector<std::vector<int32_t>> tokens;
    for (const std::string& agent : order) {
      EngineRequest request = agent_request(agent, seeds.at(agent), calls[agent]++);
      request.workflow.clear();
      request.agent.clear();
      request.fixed_prefix_tokens.reset();
      tokens.push_back(run(reference, request).tokens);
    }
    reference.shutdown(false);
    return tokens;
  }
  static std::vector<int32_t> hits(const std::vector<Outcome>& outcomes) {
    std::vector<int32_t> values;
    for (const Outcome& outcome : outcomes) values.push_back(outcome.num_cached_prompt_tokens);
    return values;
  }
  void expect_reference_tokens(const std::vector<Outcome>& outcomes) {
    const std::vector<std::vector<int32_t>> expected = reference_tokens();
    ASSERT_EQ(outcomes.size(), expected.size());
    for (size_t i = 0; i < outcomes.size(); ++i) EXPECT_EQ(outcomes[i].tokens, expected[i]) << "request " << i;
  }

  static test::TempDir* directory_;
  static LoadedModel* model_;
  std::unique_ptr<EngineImpl> engine_;
  bool explicit_prefixes_ = true;  // requests give fixed_prefix_tokens; false: the engine detects the prefixes
};
test::TempDir* EngineHostTierTest::directory_ = nullptr;
LoadedModel* EngineHostTierTest::model_ = nullptr;

// LRU evicts the expresser's prefix before its turn (engine_workflow_test), but
// with a host tier it comes back: every agent's second call hits its whole
// fixed prefix, loaded on demand, and the tokens are those of a fresh engine.
TEST_F(EngineHostTierTest, LruWithHostTierLoadsEvictedPrefixesBack) {
  start({.workflow_aware = false, .num_host_blocks = 64});
  const std::vector<Outcome> outcomes = run_fig1_cycle();
  //                                  expresser reviewer planner executor expresser reviewer planner executor
  EXPECT_EQ(hits(outcomes), (std::vector<int32_t>{0, 0, 0, 0, kFixedTokens, kFixedTokens, kFixedTokens, kFixedTokens}));
  expect_reference_tokens(outcomes);
  const EngineMetrics metrics = engine_->take_metrics();
  EXPECT_EQ(metrics.num_loaded_tokens, 4 * kFixedTokens);  // the four second calls, each its whole prefix
  EXPECT_EQ(metrics.num_prefetched_tokens, 0);
  EXPECT_GT(metrics.num_offloaded_tokens, 0);
  EXPECT_GT(metrics.kv_bytes_host, 0);
  EXPECT_EQ(metrics.load_wait_time.size(), 4u);  // each of them waited on its load
}

// --host-load-policy blocking: the same loads, hits and tokens; each load is waited for
// inside the step that admits its request (the engine's loop around resume_after_loads).
TEST_F(EngineHostTierTest, BlockingHostLoadsGiveTheSameHitsAndTokens) {
  start({.workflow_aware = false, .num_host_blocks = 64, .blocking_loads = true});
  const std::vector<Outcome> outcomes = run_fig1_cycle();
  EXPECT_EQ(hits(outcomes), (std::vector<int32_t>{0, 0, 0, 0, kFixedTokens, kFixedTokens, kFixedTokens, kFixedTokens}));
  expect_reference_tokens(outcomes);
  const EngineMetrics metrics = engine_->take_metrics();
  EXPECT_EQ(metrics.num_loaded_tokens, 4 * kFixedTokens);
  EXPECT_EQ(metrics.load_wait_time.size(), 4u);  // each second call's wait, ended in the step that ran it
}

// Workflow policy + prefetch: while the executor runs, the expresser (next) is
// on the device already and the planner (furthest) goes to the host; the
// planner's prefix is prefetched back before its turn, so no request waits.
TEST_F(EngineHostTierTest, WorkflowPolicyPrefetchesTheNextAgents) {
  start({.workflow_aware = true, .num_host_blocks = 64, .prefetch_agents = 2});
  const std::vector<Outcome> outcomes = run_fig1_cycle();
  const std::vector<int32_t> values = hits(outcomes);
  EXPECT_EQ(values, (std::vector<int32_t>{0, 0, 0, 0, kFixedTokens, kFixedTokens, kFixedTokens, kFixedTokens}));
  expect_reference_tokens(outcomes);
  const EngineMetrics metrics = engine_->take_metrics();
  // Four fixed-prefix blocks pushed to the host came back by prefetch before
  // their agent's turn; what the last calls prefetched is for agents that do
  // not run again here.
  EXPECT_EQ(metrics.num_prefetch_hit_tokens, 4 * kBlockSize);
  EXPECT_GE(metrics.num_prefetched_tokens, metrics.num_prefetch_hit_tokens);
  EXPECT_EQ(metrics.num_prefetch_late_tokens, 0);
  EXPECT_TRUE(metrics.load_wait_time.empty());  // no request waited on a load
}

// The same without fixed_prefix_tokens: an agent's fixed part is detected from
// its prompts, and its first prompt counts as fixed whole until its second call
// (workflow/fixed_prefix_tracker.h rule 3). So the second calls are still
// prefetched before their turn and no request waits on a load; each hits its
// fixed prefix (its first call's input, prefetched along, does not match).
TEST_F(EngineHostTierTest, DetectedPrefixesArePrefetchedFromTheAgentsFirstPrompt) {
  explicit_prefixes_ = false;
  start({.workflow_aware = true, .num_host_blocks = 64, .prefetch_agents = 2});
  const std::vector<Outcome> outcomes = run_fig1_cycle();
  EXPECT_EQ(hits(outcomes), (std::vector<int32_t>{0, 0, 0, 0, kFixedTokens, kFixedTokens, kFixedTokens, kFixedTokens}));
  expect_reference_tokens(outcomes);
  const EngineMetrics metrics = engine_->take_metrics();
  EXPECT_GT(metrics.num_prefetch_hit_tokens, 0);
  EXPECT_EQ(metrics.num_prefetch_late_tokens, 0);
  EXPECT_TRUE(metrics.load_wait_time.empty());  // no request waited on a load
}

// Loads that fail (and a host pool too small for any prefix) recompute: no
// hits from the host, same tokens, the failures counted.
TEST_F(EngineHostTierTest, FailedLoadsRecompute) {
  start({.workflow_aware = false, .num_host_blocks = 64, .fail_loads = true});
  const std::vector<Outcome> outcomes = run_fig1_cycle();
  EXPECT_EQ(hits(outcomes), (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 0, 0}));
  expect_reference_tokens(outcomes);
  EXPECT_EQ(engine_->take_metrics().num_failed_kv_transfers, 4);  // one load per second call
}

TEST_F(EngineHostTierTest, TinyHostPoolDegradesToRecompute) {
  start({.workflow_aware = false, .num_host_blocks = 1});
  const std::vector<Outcome> outcomes = run_fig1_cycle();
  for (size_t i = 4; i < outcomes.size(); ++i) EXPECT_LT(outcomes[i].num_cached_prompt_tokens, kFixedTokens);
  expect_reference_tokens(outcomes);
}

}  // namespace
}  // namespace loom
