// Workflow-aware eviction through the serving engine (KVFlow; CPU
// backend, tiny random llama): the KVFlow Fig. 1 cycle with a pool that holds
// three agents' fixed prefixes, under --eviction-policy lru and workflow;
// hints without a declared graph; bad hints.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine_impl.h"
#include "model/loader.h"
#include "synthetic/synthetic_model.h"
#include "test_util.h"

namespace loom {
namespace {

constexpr int32_t kBlockSize = 4;
constexpr int32_t kFixedTokens = 16;   // 4 blocks per agent's fixed prefix
constexpr int32_t kDynamicTokens = 4;  // 1 block of task input

struct Outcome {
  int32_t num_cached_prompt_tokens = -1;
  std::optional<Error> error;
};

Outcome collect(RequestStream& stream) {
  Outcome outcome;
  for (;;) {
    std::optional<RequestOutput> output = stream.next(std::chrono::seconds(30));
    if (!output) {
      ADD_FAILURE() << "no output within 30 s";
      return outcome;
    }
    outcome.num_cached_prompt_tokens = output->num_cached_prompt_tokens;
    if (output->finished) {
      outcome.error = output->error;
      return outcome;
    }
  }
}

class EngineWorkflowTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = new test::TempDir();
    model_ = new LoadedModel(test::write_and_load_synthetic_model(*directory_, 0));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete directory_;
  }

  // A pool of 15 blocks: three agents' requests (4 fixed + 1 dynamic block
  // each) fill it; a fourth must evict.
  void start(bool workflow_aware, int32_t num_kv_blocks = 15, int32_t max_workflows = 10000,
             int32_t max_workflow_agents = 256) {
    EngineConfig config;
    config.block_size = kBlockSize;
    config.num_kv_blocks = num_kv_blocks;
    config.max_batch_tokens = 64;
    config.workflow_aware_eviction = workflow_aware;
    config.max_workflows = max_workflows;
    config.max_workflow_agents = max_workflow_agents;
    engine_ = std::make_unique<EngineImpl>(*model_, make_cpu_backend(model_->config, model_->weights, {1, 8}), config);
  }
  void TearDown() override {
    if (!engine_) return;
    engine_->run_on_engine_thread([&] { EXPECT_EQ(engine_->kv_cache().integrity_error(), ""); });
    engine_->shutdown(false);
  }

  // Token ids that differ between seeds from the first one on.
  static std::vector<int32_t> tokens(int32_t length, int32_t seed) {
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < length; ++i) ids.push_back(10 + (seed * 13 + i * 7 + (i * i * (seed + 1)) % 11) % 200);
    return ids;
  }
  // One agent's request: its fixed prefix + this call's dynamic input, one output token.
  static EngineRequest agent_request(const std::string& workflow, const std::string& agent, int32_t agent_seed,
                                     int32_t call, std::optional<int32_t> fixed_prefix_tokens = kFixedTokens) {
    EngineRequest request;
    request.prompt_tokens = tokens(kFixedTokens, agent_seed);
    const std::vector<int32_t> dynamic = tokens(kDynamicTokens, 100 + agent_seed * 10 + call);
    request.prompt_tokens.insert(request.prompt_tokens.end(), dynamic.begin(), dynamic.end());
    request.max_new_tokens = 1;
    request.ignore_eos = true;
    request.workflow = workflow;
    request.agent = agent;
    request.fixed_prefix_tokens = fixed_prefix_tokens;
    return request;
  }
  int32_t run(const EngineRequest& request) {
    auto stream = engine_->submit(request);
    const Outcome outcome = collect(*stream);
    EXPECT_FALSE(outcome.error.has_value()) << outcome.error->what();
    return outcome.num_cached_prompt_tokens;
  }

  static WorkflowSpec fig1_cycle() {
    WorkflowSpec spec;
    spec.agents = {{"planner", {"reviewer"}, JoinKind::kAll},
                   {"executor", {"planner"}, JoinKind::kAll},
                   {"expresser", {"executor"}, JoinKind::kAll},
                   {"reviewer", {"expresser"}, JoinKind::kAll}};
    return spec;
  }

  // KVFlow Fig. 1, starting at the expresser so that the pool is full of the
  // expresser's, reviewer's and planner's prefixes when the executor runs.
  // Returns the prefix-hit tokens of each request in order.
  std::vector<int32_t> run_fig1_cycle() {
    engine_->workflows().declare("w1", fig1_cycle());
    const std::vector<std::pair<std::string, int32_t>> agents = {
        {"planner", 1}, {"executor", 2}, {"expresser", 3}, {"reviewer", 4}};
    const std::vector<std::string> order = {"expresser", "reviewer", "planner", "executor", "expresser", "reviewer"};
    std::map<std::string, int32_t> calls;
    std::vector<int32_t> hits;
    for (const std::string& agent : order) {
      int32_t seed = 0;
      for (const auto& [name, agent_seed] : agents)
        if (name == agent) seed = agent_seed;
      hits.push_back(run(agent_request("w1", agent, seed, calls[agent]++)));
    }
    return hits;
  }

  static test::TempDir* directory_;
  static LoadedModel* model_;
  std::unique_ptr<EngineImpl> engine_;
};
test::TempDir* EngineWorkflowTest::directory_ = nullptr;
LoadedModel* EngineWorkflowTest::model_ = nullptr;

// LRU: when the executor runs, the least recently used prefix is the
// expresser's, which runs next: evicted, so the expresser recomputes it, and
// evicts the reviewer's in turn (LRU on a cycle longer than the cache misses
// every time).
TEST_F(EngineWorkflowTest, LruEvictsTheExpresserBeforeItsTurn) {
  start(/*workflow_aware=*/false);
  const std::vector<int32_t> hits = run_fig1_cycle();
  //                                 expresser reviewer planner executor expresser reviewer
  EXPECT_EQ(hits, (std::vector<int32_t>{0, 0, 0, 0, 0, 0}));
}

// Workflow policy: when the executor runs (steps: expresser 1, reviewer 2,
// planner 3), dynamic suffixes go first, then the planner's prefix (furthest);
// the expresser and then the reviewer hit their whole fixed prefix.
TEST_F(EngineWorkflowTest, WorkflowPolicyKeepsTheNextAgentsPrefixes) {
  start(/*workflow_aware=*/true);
  const std::vector<int32_t> hits = run_fig1_cycle();
  EXPECT_EQ(hits, (std::vector<int32_t>{0, 0, 0, 0, kFixedTokens, kFixedTokens}));
  const auto snapshot = engine_->workflows().snapshot();
  EXPECT_EQ(snapshot->steps_to_execution("w1", "reviewer"), 0);
  EXPECT_EQ(snapshot->steps_to_execution("w1", "planner"), 1);
  EXPECT_EQ(snapshot->steps_to_execution("w1", "expresser"), 3);
}

// No graph: the latest request's agent runs (0), the others drop out; the
// fixed prefix is detected from the agent's prompts; requests are served.
TEST_F(EngineWorkflowTest, HintsWithoutAGraphFollowTheLatestAgent) {
  start(/*workflow_aware=*/true, /*num_kv_blocks=*/32);
  EXPECT_EQ(run(agent_request("free", "a", 1, 0, std::nullopt)), 0);
  EXPECT_EQ(run(agent_request("free", "a", 1, 1, std::nullopt)), kFixedTokens);
  EXPECT_EQ(run(agent_request("free", "b", 2, 0, std::nullopt)), 0);
  const auto snapshot = engine_->workflows().snapshot();
  const WorkflowSteps* steps = snapshot->workflow("free");
  ASSERT_NE(steps, nullptr);
  EXPECT_FALSE(steps->has_graph);
  EXPECT_EQ(steps->running, std::vector<std::string>{"b"});
  EXPECT_EQ(snapshot->steps_to_execution("free", "b"), 0);
  EXPECT_EQ(snapshot->steps_to_execution("free", "a"), std::nullopt);
  EXPECT_EQ(run(agent_request("free", "a", 1, 2, std::nullopt)), kFixedTokens);

  // Ending the workflow forgets it; its requests still work (and recreate it).
  EXPECT_TRUE(engine_->workflows().end("free"));
  EXPECT_EQ(engine_->workflows().snapshot()->workflow("free"), nullptr);
  EXPECT_EQ(run(agent_request("free", "b", 2, 1, std::nullopt)), kFixedTokens);
  EXPECT_NE(engine_->workflows().snapshot()->workflow("free"), nullptr);
}

TEST_F(EngineWorkflowTest, BadHintsAreRejectedAtSubmit) {
  start(/*workflow_aware=*/true);
  auto expect_invalid = [&](EngineRequest request) {
    try {
      engine_->submit(std::move(request));
      ADD_FAILURE() << "submit accepted bad hints";
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::kInvalidArgument) << error.what();
    }
  };
  expect_invalid(agent_request("a/b", "planner", 1, 0));            // ids are URL-safe, no '/'
  expect_invalid(agent_request("", "planner", 1, 0));               // an agent needs a workflow
  expect_invalid(agent_request("w", "planner", 1, 0, -1));          // negative fixed prefix
  EXPECT_EQ(engine_->workflows().snapshot()->num_workflows(), 0);  // nothing was noted
  EXPECT_EQ(engine_->take_metrics().eviction_policy, "workflow");
}

// --max-workflows / --max-workflow-agents reach the registry: request hints
// of a new workflow beyond the cap are served but not tracked (the registry
// never grows past it), and a graph over the agent cap is refused.
TEST_F(EngineWorkflowTest, WorkflowCapsFromTheConfig) {
  start(/*workflow_aware=*/true, /*num_kv_blocks=*/32, /*max_workflows=*/1, /*max_workflow_agents=*/3);
  EXPECT_EQ(engine_->workflows().max_workflows(), 1);
  EXPECT_EQ(engine_->workflows().max_agents_per_workflow(), 3);
  run(agent_request("first", "a", 1, 0));
  run(agent_request("second", "a", 2, 0));  // served, untracked
  run(agent_request("third", "b", 3, 0));
  const auto snapshot = engine_->workflows().snapshot();
  EXPECT_EQ(snapshot->num_workflows(), 1);
  EXPECT_NE(snapshot->workflow("first"), nullptr);
  EXPECT_EQ(snapshot->workflow("second"), nullptr);
  try {
    engine_->workflows().declare("first", fig1_cycle());  // 4 agents
    ADD_FAILURE() << "a 4-agent graph was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kInvalidArgument);
  }
  try {
    engine_->workflows().declare("other", WorkflowSpec{});
    ADD_FAILURE() << "a second workflow was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kCapacity);
  }
}

}  // namespace
}  // namespace loom
