// The serving engine end to end on a random tiny model (CPU backend).
#include <gtest/gtest.h>

#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine_impl.h"
#include "grammar/constraint_compiler.h"
#include "engine_test_util.h"
#include "lora/adapter.h"
#include "model/loader.h"
#include "oracles/generator.h"
#include "synthetic/synthetic_model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace loom {
namespace {

struct Collected {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<std::string> deltas;
  FinishReason finish_reason = FinishReason::kLength;
  std::optional<Error> error;
  int32_t num_cached_prompt_tokens = 0;
};

// Requests that ended with `reason` (finished_reason_label) per `metrics`.
int64_t num_ended(const EngineMetrics& metrics, const std::string& reason) {
  const auto it = metrics.num_finished_requests_by_reason.find(reason);
  return it == metrics.num_finished_requests_by_reason.end() ? 0 : it->second;
}

// Reads a stream to its end; `num_tokens_before`: tokens the caller already read.
Collected collect(RequestStream& stream, size_t num_tokens_before = 0) {
  Collected result;
  const bool finished = test::read_stream(stream, [&](const RequestOutput& output) {
    for (const auto& token : output.new_tokens) result.tokens.push_back(token.token_id);
    result.text += output.text_delta;
    result.deltas.push_back(output.text_delta);
    result.num_cached_prompt_tokens = output.num_cached_prompt_tokens;
    if (!output.finished) return;
    result.finish_reason = output.finish_reason;
    result.error = output.error;
    EXPECT_EQ(output.num_output_tokens, static_cast<int32_t>(num_tokens_before + result.tokens.size()));
  });
  if (finished) {
    EXPECT_FALSE(stream.next(std::chrono::milliseconds(1)).has_value());
  }
  return result;
}

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = new test::TempDir();
    model_ = new LoadedModel(test::write_and_load_synthetic_model(*directory_, 2));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete directory_;
  }
  static std::string adapter_path(int i) { return directory_->str() + "/adapters/adapter" + std::to_string(i); }

  std::unique_ptr<EngineImpl> start(EngineConfig config = small_config()) {
    auto engine = std::make_unique<EngineImpl>(*model_, make_cpu_backend(model_->config, model_->weights, {1, 8}),
                                               config);
    engine->load_adapter("a0", adapter_path(0));
    engine->load_adapter("a1", adapter_path(1));
    return engine;
  }
  static EngineConfig small_config() {
    EngineConfig config;
    config.block_size = 4;
    config.num_kv_blocks = 256;
    config.max_batch_tokens = 24;
    return config;
  }
  void TearDown() override {
    if (engine_) {
      engine_->run_on_engine_thread([&] { EXPECT_EQ(engine_->kv_cache().integrity_error(), ""); });
      engine_->shutdown(false);
    }
  }

  static EngineRequest request(const std::string& text, int32_t max_new_tokens, const std::string& adapter = "") {
    EngineRequest request;
    request.prompt_tokens = model_->tokenizer->encode(text, true);
    request.max_new_tokens = max_new_tokens;
    request.adapter = adapter;
    request.ignore_eos = true;
    return request;
  }

  // The offline Generator's tokens for the request run alone.
  static std::vector<int32_t> generate_alone(const EngineRequest& request) {
    auto backend = make_cpu_backend(model_->config, model_->weights, {1, 8});
    GenerationRequest generation;
    generation.prompt_tokens = request.prompt_tokens;
    generation.max_new_tokens = request.max_new_tokens;
    generation.ignore_eos = request.ignore_eos;
    generation.sampling = request.sampling;
    if (!request.adapter.empty()) {
      backend->set_adapter(0, load_lora_adapter(request.adapter, adapter_path(request.adapter == "a0" ? 0 : 1),
                                                model_->config));
      generation.adapter_slot = 0;
    }
    Generator generator(*backend, model_->tokenizer, {});
    std::vector<int32_t> tokens;
    const std::vector<GenerationResult> results = generator.generate({generation});
    for (const auto& token : results[0].tokens) tokens.push_back(token.token_id);
    return tokens;
  }

  Collected run(const EngineRequest& request) {
    auto stream = engine_->submit(request);
    return collect(*stream);
  }

  static test::TempDir* directory_;
  static LoadedModel* model_;
  std::unique_ptr<EngineImpl> engine_;
};
test::TempDir* EngineTest::directory_ = nullptr;
LoadedModel* EngineTest::model_ = nullptr;

TEST_F(EngineTest, ConcurrentRequestsMixingAdaptersEqualRequestsRunAlone) {
  engine_ = start();
  const std::vector<std::string> adapters = {"", "a0", "a1"};
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 12; ++i) {
    // Shared prefixes across adapters, so namespaces must keep them apart.
    std::string text = "a shared context about looms and threads, then request " + std::to_string(i % 4);
    requests.push_back(request(text, 6 + i % 3, adapters[static_cast<size_t>(i % 3)]));
  }
  requests[5].sampling.temperature = 0.7f;
  requests[5].sampling.seed = 11;
  std::vector<Collected> results(requests.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < requests.size(); ++i)
    clients.emplace_back([&, i] { results[i] = collect(*engine_->submit(requests[i])); });
  for (auto& client : clients) client.join();
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_FALSE(results[i].error.has_value());
    EXPECT_EQ(results[i].tokens, generate_alone(requests[i])) << "request " << i;
    EXPECT_EQ(results[i].text, model_->tokenizer->decode(results[i].tokens, true)) << "request " << i;
  }
  EXPECT_NE(results[0].tokens, results[1].tokens);  // base vs a0 on the same prompt
  const EngineMetrics metrics = engine_->take_metrics();
  EXPECT_EQ(num_ended(metrics, "stop") + num_ended(metrics, "length"), 12);
  EXPECT_EQ(num_ended(metrics, "abort") + num_ended(metrics, "error"), 0);
  EXPECT_GT(metrics.prefix_hit_tokens, 0);
  EXPECT_EQ(metrics.kv_blocks_in_use, 0);
  EXPECT_EQ(metrics.time_to_first_token.size(), 12u);
}

TEST_F(EngineTest, ColdWarmAndEvictedCacheGiveTheSameGreedyOutput) {
  engine_ = start();
  const EngineRequest first = request("the same long prompt, long enough to fill several blocks of four", 10, "a1");
  const Collected cold = run(first);
  const Collected warm = run(first);
  EXPECT_EQ(cold.num_cached_prompt_tokens, 0);
  EXPECT_GT(warm.num_cached_prompt_tokens, 8);
  EXPECT_EQ(warm.tokens, cold.tokens);
  int32_t num_evicted = 0;
  engine_->run_on_engine_thread([&] { num_evicted = engine_->kv_cache().evict_all_cached(); });
  EXPECT_GT(num_evicted, 0);
  const Collected evicted = run(first);
  EXPECT_EQ(evicted.num_cached_prompt_tokens, 0);
  EXPECT_EQ(evicted.tokens, cold.tokens);
  // A different continuation of the cached prefix.
  EngineRequest branch = first;
  branch.prompt_tokens.push_back(7);
  const Collected branch_warm = run(branch);
  EXPECT_GT(branch_warm.num_cached_prompt_tokens, 8);
  EXPECT_EQ(branch_warm.tokens, generate_alone(branch));
}

TEST_F(EngineTest, PreemptedRequestsFinishWithTheSameTokens) {
  EngineConfig config = small_config();
  config.num_kv_blocks = 12;  // 48 slots; three requests of ~30 tokens each must take turns
  engine_ = start(config);
  std::vector<EngineRequest> requests = {request("first of three competing prompts", 16),
                                         request("second of three competing prompts", 16, "a0"),
                                         request("third of three competing prompts", 16, "a1")};
  // Queued together: one by one, a loaded machine may finish the first before the last arrives.
  std::vector<std::unique_ptr<RequestStream>> streams = engine_->submit_all(requests);
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(collect(*streams[i]).tokens, generate_alone(requests[i]));
  EXPECT_GT(engine_->take_metrics().num_preemptions, 0);
}

TEST_F(EngineTest, StopStringsAreHeldBackAndCut) {
  engine_ = start();
  const EngineRequest plain = request("stop strings", 24);
  const Collected full = run(plain);
  ASSERT_GE(full.text.size(), 6u);
  const std::string stop = full.text.substr(full.text.size() / 2, 3);
  EngineRequest stopping = plain;
  stopping.stop_strings = {"never-produced-zzz", stop};
  const Collected cut = run(stopping);
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(stop)));
  for (const auto& delta : cut.deltas) EXPECT_EQ(delta.find(stop), std::string::npos);
  EXPECT_EQ(cut.finish_reason, FinishReason::kStop);
}

TEST_F(EngineTest, StopTokenIdsAndMinTokens) {
  engine_ = start();
  const EngineRequest plain = request("stop tokens", 8);
  const Collected full = run(plain);
  EngineRequest stopping = plain;
  stopping.stop_token_ids = {full.tokens[2]};
  const Collected stopped = run(stopping);
  EXPECT_EQ(stopped.finish_reason, FinishReason::kStop);
  EXPECT_LE(stopped.tokens.size(), 3u);
  EXPECT_EQ(stopped.tokens.back(), full.tokens[2]);
  stopping.min_new_tokens = 5;
  const Collected at_least = run(stopping);
  ASSERT_GE(at_least.tokens.size(), 5u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NE(at_least.tokens[i], full.tokens[2]);
}

TEST_F(EngineTest, CancellingAndDroppingStreamsFreeTheirBlocks) {
  engine_ = start();
  auto cancelled = engine_->submit(request("a request that is cancelled after its first token", 900));
  auto dropped = engine_->submit(request("a request whose stream is dropped", 900, "a0"));
  const std::optional<RequestOutput> first = cancelled->next(std::chrono::seconds(30));
  ASSERT_TRUE(first.has_value());
  cancelled->cancel();
  dropped.reset();
  const Collected rest = collect(*cancelled, first->new_tokens.size());
  ASSERT_TRUE(rest.error.has_value());
  // Counted before its last output was pushed: an abort, not a success.
  EXPECT_GE(num_ended(engine_->take_metrics(), "abort"), 1);
  EngineMetrics metrics;
  for (int i = 0; i < 300; ++i) {
    metrics = engine_->take_metrics();
    if (metrics.num_running == 0 && metrics.num_waiting == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(metrics.kv_blocks_in_use, 0);
  EXPECT_EQ(metrics.kv_blocks_free + metrics.kv_blocks_cached, metrics.kv_blocks_total);
  EXPECT_EQ(num_ended(metrics, "abort"), 2);  // the dropped stream too
  EXPECT_EQ(num_ended(metrics, "stop") + num_ended(metrics, "length") + num_ended(metrics, "error"), 0);
  engine_->unload_adapter("a0");  // no longer in use
}

TEST_F(EngineTest, AdaptersLoadAndUnloadAtRunTime) {
  engine_ = start();
  EXPECT_EQ(engine_->adapters().size(), 2u);
  // Long enough that it is still running when unload is tried (a short one can
  // finish first on a fast machine); cancelled once the refusal is checked.
  auto running = engine_->submit(request("keeps a1 busy for a while", 900, "a1"));
  const std::optional<RequestOutput> first = running->next(std::chrono::seconds(30));
  ASSERT_TRUE(first.has_value());
  try {
    engine_->unload_adapter("a1");
    FAIL() << "unloading an adapter in use must be refused";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kInvalidArgument);
  }
  running->cancel();
  collect(*running, first->new_tokens.size());
  engine_->unload_adapter("a1");
  EXPECT_EQ(engine_->adapters().size(), 1u);
  try {
    engine_->submit(request("x", 2, "a1"));
    FAIL() << "expected kNotFound";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kNotFound);
  }
  engine_->load_adapter("again", adapter_path(1));
  const EngineRequest renamed = request("the same adapter under a new name", 6, "again");
  EngineRequest as_a1 = renamed;
  as_a1.adapter = "a1";
  EXPECT_EQ(run(renamed).tokens, generate_alone(as_a1));
}

TEST_F(EngineTest, BadRequestsAreTypedErrors) {
  EngineConfig config = small_config();
  config.max_context_tokens = 32;
  engine_ = start(config);
  auto kind_of = [&](EngineRequest r) {
    try {
      engine_->submit(std::move(r));
    } catch (const Error& error) {
      return error.kind();
    }
    return ErrorKind::kInternal;
  };
  EXPECT_EQ(kind_of(request("x", 4, "missing")), ErrorKind::kNotFound);
  EXPECT_EQ(kind_of(request("x", 100)), ErrorKind::kCapacity);
  EngineRequest hot = request("x", 4);
  hot.sampling.temperature = -1.0f;
  EXPECT_EQ(kind_of(hot), ErrorKind::kInvalidArgument);
  EngineRequest empty = request("x", 4);
  empty.prompt_tokens.clear();
  EXPECT_EQ(kind_of(empty), ErrorKind::kInvalidArgument);
  EngineRequest out_of_vocab = request("x", 4);
  out_of_vocab.prompt_tokens.push_back(model_->config.vocab_size);
  EXPECT_EQ(kind_of(out_of_vocab), ErrorKind::kInvalidArgument);
  EXPECT_EQ(run(request("still serving", 3)).tokens.size(), 3u);
}

TEST_F(EngineTest, SubmitAllQueuesEveryRequestOrNone) {
  EngineConfig config = small_config();
  config.max_waiting_requests = 4;
  engine_ = start(config);
  auto fan_out = [&](int count, const std::string& adapter) {
    std::vector<EngineRequest> requests;
    for (int i = 0; i < count; ++i) requests.push_back(request("fan out " + std::to_string(i), 6, adapter));
    return requests;
  };
  auto kind_of = [&](std::vector<EngineRequest> requests) {
    try {
      engine_->submit_all(std::move(requests));
    } catch (const Error& error) {
      return error.kind();
    }
    return ErrorKind::kInternal;
  };
  EXPECT_EQ(kind_of(fan_out(5, "a0")), ErrorKind::kCapacity);  // one more than may wait: none queued
  std::vector<EngineRequest> bad_last = fan_out(3, "");
  bad_last.back().sampling.temperature = -1.0f;
  EXPECT_EQ(kind_of(std::move(bad_last)), ErrorKind::kInvalidArgument);
  const EngineMetrics metrics = engine_->take_metrics();
  EXPECT_EQ(metrics.num_waiting, 0);
  EXPECT_EQ(metrics.num_running, 0);
  EXPECT_TRUE(metrics.num_finished_requests_by_reason.empty());  // nothing was started, so nothing was aborted
  engine_->unload_adapter("a0");  // the refused requests never counted against it
  engine_->load_adapter("a0", adapter_path(0));

  // The whole limit at once is taken, in order; max_tokens 0 never queues.
  std::vector<EngineRequest> full = fan_out(4, "a0");
  full.push_back(request("nothing to generate", 0));
  auto streams = engine_->submit_all(std::move(full));
  ASSERT_EQ(streams.size(), 5u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(collect(*streams[static_cast<size_t>(i)]).tokens.size(), 6u);
  EXPECT_TRUE(collect(*streams[4]).tokens.empty());
  EXPECT_EQ(num_ended(engine_->take_metrics(), "length"), 5);
}

// EngineRequest::constraint_after (a reasoning model's "</think>"): sampling is
// free until the output's bytes hold the marker, the grammar governs from the
// next token on. The marker is the greedy output's own first tokens, so the
// constrained run writes it and then follows the grammar.
TEST_F(EngineTest, ConstraintStartsAfterTheMarker) {
  engine_ = start();
  const EngineRequest free_request = request("think first, then answer", 10);
  const Collected free = run(free_request);
  ASSERT_EQ(free.tokens.size(), 10u);
  const std::string marker = model_->tokenizer->token_bytes(free.tokens[0]) + model_->tokenizer->token_bytes(free.tokens[1]);
  grammar::ConstraintCompiler compiler(grammar::TokenVocabulary::from_tokenizer(*model_->tokenizer));

  EngineRequest gated = free_request;
  gated.max_new_tokens = 40;
  gated.constraint = compiler.regex("(yes|no)!");
  gated.constraint_after = marker;
  const Collected answer = run(gated);
  EXPECT_FALSE(answer.error.has_value());
  ASSERT_GE(answer.tokens.size(), 3u);
  EXPECT_EQ(std::vector<int32_t>(answer.tokens.begin(), answer.tokens.begin() + 2),
            std::vector<int32_t>(free.tokens.begin(), free.tokens.begin() + 2));
  EXPECT_EQ(answer.finish_reason, FinishReason::kStop);  // the grammar ended it
  const size_t at = answer.text.find(marker);
  ASSERT_NE(at, std::string::npos) << answer.text;
  const std::string after = answer.text.substr(at + marker.size());
  EXPECT_TRUE(after == "yes!" || after == "no!") << answer.text;

  // A marker never written: the grammar never starts, the output is the free one.
  gated.constraint_after = "\x01never\x01";
  gated.max_new_tokens = 10;
  EXPECT_EQ(run(gated).tokens, free.tokens);
}

TEST_F(EngineTest, KvBlocksDeriveFromTheCacheBytes) {
  EngineConfig config = small_config();
  config.num_kv_blocks = 0;
  const int64_t bytes_per_block = make_cpu_backend(model_->config, model_->weights)->kv_bytes_per_token() * 4;
  config.kv_cache_bytes = bytes_per_block * 37 + bytes_per_block / 2;
  engine_ = start(config);
  EXPECT_EQ(engine_->num_kv_blocks(), 37);
  EXPECT_EQ(engine_->take_metrics().kv_blocks_total, 37);
  // 37 blocks of 4 tokens: 148 slots, whatever the context length.
  try {
    engine_->submit(request("x", 150));
    FAIL() << "expected kCapacity";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kCapacity);
  }
}

TEST_F(EngineTest, ShutdownDrainsOrCancels) {
  engine_ = start();
  auto drained = engine_->submit(request("finishes during a draining shutdown", 12));
  engine_->shutdown(true);
  const Collected result = collect(*drained);
  EXPECT_FALSE(result.error.has_value());
  EXPECT_EQ(result.tokens.size(), 12u);
  EXPECT_THROW(engine_->submit(request("too late", 2)), Error);

  auto engine = start();
  auto cancelled = engine->submit(request("cancelled by shutdown", 900));
  engine->shutdown(false);
  const Collected cut = collect(*cancelled);
  ASSERT_TRUE(cut.error.has_value());
  EXPECT_EQ(cut.error->kind(), ErrorKind::kUnavailable);  // the shutdown's kind (kCapacity before it had its own)
  EXPECT_EQ(num_ended(engine->take_metrics(), "abort"), 1);
  EXPECT_EQ(num_ended(engine_->take_metrics(), "length"), 1);  // the drained one: 12 tokens, ignore_eos

  // max_tokens 0 ends at submit, counted before its output is pushed.
  EngineRequest empty = request("nothing to generate", 0);
  auto idle = start();
  const Collected nothing = collect(*idle->submit(empty));
  EXPECT_TRUE(nothing.tokens.empty());
  EXPECT_EQ(num_ended(idle->take_metrics(), "length"), 1);
}

}  // namespace
}  // namespace loom
