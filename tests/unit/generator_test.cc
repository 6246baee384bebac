// Offline generator and sampler on a random tiny model.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "engine/stop_strings.h"
#include "lora/adapter.h"
#include "model/loader.h"
#include "oracles/generator.h"
#include "synthetic/synthetic_model.h"
#include "test_util.h"
#include "util/error.h"

namespace loom {
namespace {

class GeneratorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = new test::TempDir();
    model_ = new LoadedModel(test::write_and_load_synthetic_model(*directory_, 1));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete directory_;
  }

  std::vector<GenerationResult> generate(const std::vector<GenerationRequest>& requests, GeneratorConfig config = {},
                                         const TextCallback& on_text = {}) {
    auto backend = make_cpu_backend(model_->config, model_->weights);
    backend->set_adapter(0, load_lora_adapter("a", directory_->str() + "/adapters/adapter0", model_->config));
    Generator generator(*backend, model_->tokenizer, config);
    return generator.generate(requests, on_text);
  }
  static GenerationRequest request(const std::string& text, int max_new_tokens) {
    GenerationRequest request;
    request.prompt_tokens = model_->tokenizer->encode(text, true);
    request.max_new_tokens = max_new_tokens;
    request.ignore_eos = true;
    return request;
  }
  static std::vector<int32_t> ids(const GenerationResult& result) {
    std::vector<int32_t> tokens;
    for (const auto& token : result.tokens) tokens.push_back(token.token_id);
    return tokens;
  }

  static test::TempDir* directory_;
  static LoadedModel* model_;
};
test::TempDir* GeneratorTest::directory_ = nullptr;
LoadedModel* GeneratorTest::model_ = nullptr;

TEST_F(GeneratorTest, ChunkedPrefillAndBlockSizeDoNotChangeTokens) {
  const GenerationRequest long_request = request("a fairly long prompt that spans several blocks of the cache", 10);
  const auto reference = generate({long_request});
  for (int32_t chunk : {1, 3, 7}) {
    for (int32_t block_size : {1, 4, 16}) {
      GeneratorConfig config;
      config.max_batch_tokens = chunk;
      config.block_size = block_size;
      EXPECT_EQ(ids(generate({long_request}, config)[0]), ids(reference[0]))
          << "chunk " << chunk << " block size " << block_size;
    }
  }
}

TEST_F(GeneratorTest, BatchedRequestsEqualRequestsRunAlone) {
  GenerationRequest base = request("one", 8);
  GenerationRequest adapted = request("two words", 8);
  adapted.adapter_slot = 0;
  GenerationRequest sampled = request("three little words", 8);
  sampled.sampling.temperature = 0.8f;
  sampled.sampling.seed = 7;
  const auto together = generate({base, adapted, sampled});
  EXPECT_EQ(ids(together[0]), ids(generate({base})[0]));
  EXPECT_EQ(ids(together[1]), ids(generate({adapted})[0]));
  EXPECT_EQ(ids(together[2]), ids(generate({sampled})[0]));
  EXPECT_NE(ids(together[0]), ids(generate({request("two words", 8)})[0]));
}

TEST_F(GeneratorTest, StopStringsCutTheTextAndAreNeverStreamed) {
  const GenerationRequest plain = request("stop strings", 24);
  const std::string full_text = generate({plain})[0].text;
  ASSERT_GE(full_text.size(), 6u);
  // A stop string taken from the middle of the greedy text.
  const std::string stop = full_text.substr(full_text.size() / 2, 3);
  GenerationRequest stopping = plain;
  stopping.stop_strings = {"never-produced-zzz", stop};
  std::string streamed;
  const auto result = generate({stopping}, {}, [&](size_t, const std::string& delta) {
    EXPECT_EQ(delta.find(stop), std::string::npos);
    streamed += delta;
  })[0];
  EXPECT_EQ(result.text, full_text.substr(0, full_text.find(stop)));
  EXPECT_EQ(streamed, result.text);
  EXPECT_EQ(result.finish_reason, FinishReason::kStop);
}

TEST_F(GeneratorTest, ContextLimitIsACapacityError) {
  GeneratorConfig config;
  config.max_context_tokens = 8;
  try {
    generate({request("this prompt is short", 100)}, config);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kCapacity);
  }
}

TEST(StopStringFilterTest, IncludeStopKeepsTheMatchedStringAndTheLongestAtOnePlace) {
  StopStringFilter cut({"ab", "abc"});
  EXPECT_EQ(cut.push("xxa", false).text, "xx") << "'a' may start a stop string";
  const StopStringFilter::Result stopped = cut.push("bcd", false);
  EXPECT_TRUE(stopped.stopped);
  EXPECT_EQ(stopped.text, "");
  StopStringFilter keep({"ab", "abc"}, true);
  EXPECT_EQ(keep.push("xxa", false).text, "xx");
  const StopStringFilter::Result kept = keep.push("bcd", false);
  EXPECT_TRUE(kept.stopped);
  EXPECT_EQ(kept.text, "abc") << "both match at one place: the longer is the stop string";
  size_t length = 0;
  EXPECT_EQ(find_stop_string("12ab", {"b", "ab"}, &length), 2u);
  EXPECT_EQ(length, 2u);
  EXPECT_EQ(find_stop_string("none", {"x"}, &length), std::string::npos);
}

SamplingParams sampling(float temperature, int top_k, float top_p, uint64_t seed, int num_top_logprobs) {
  SamplingParams params;
  params.temperature = temperature;
  params.top_k = top_k;
  params.top_p = top_p;
  params.seed = seed;
  params.num_top_logprobs = num_top_logprobs;
  return params;
}

TEST(SamplerTest, GreedyTopKOneAndTinyTopPAgree) {
  std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.9f, 0.0f};
  Sampler greedy({});
  EXPECT_EQ(greedy.sample(logits.data(), 5).token_id, 1);
  Sampler top_k_one(sampling(1.0f, 1, 1.0f, 3, 0));
  Sampler tiny_top_p(sampling(1.0f, 0, 0.01f, 3, 0));
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(top_k_one.sample(logits.data(), 5).token_id, 1);
    EXPECT_EQ(tiny_top_p.sample(logits.data(), 5).token_id, 1);
  }
}

TEST(SamplerTest, LogprobsAreNormalisedAndTopListIsSorted) {
  std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.9f, 0.0f};
  Sampler sampler(sampling(0.0f, 0, 1.0f, 0, 5));
  SampledToken token = sampler.sample(logits.data(), 5);
  ASSERT_EQ(token.top_logprobs.size(), 5u);
  double total = 0.0;
  for (size_t i = 0; i < token.top_logprobs.size(); ++i) {
    total += std::exp(token.top_logprobs[i].second);
    if (i > 0) {
      EXPECT_GE(token.top_logprobs[i - 1].second, token.top_logprobs[i].second);
    }
  }
  EXPECT_NEAR(total, 1.0, 1e-6);
  EXPECT_EQ(token.top_logprobs[0].first, 1);
  EXPECT_FLOAT_EQ(token.logprob, token.top_logprobs[0].second);
}

TEST(SamplerTest, HighTemperatureSamplesFollowTheDistribution) {
  std::vector<float> logits = {0.0f, std::log(3.0f)};  // p = 0.25, 0.75
  Sampler sampler(sampling(1.0f, 0, 1.0f, 11, 0));
  int ones = 0;
  for (int i = 0; i < 4000; ++i) ones += sampler.sample(logits.data(), 2).token_id;
  EXPECT_NEAR(ones / 4000.0, 0.75, 0.03);
}

TEST(SamplerTest, BadParametersAreRejected) {
  EXPECT_THROW(Sampler(sampling(-1.0f, 0, 1.0f, 0, 0)), Error);
  EXPECT_THROW(Sampler(sampling(1.0f, 0, 0.0f, 0, 0)), Error);
  EXPECT_THROW(Sampler(sampling(1.0f, -2, 1.0f, 0, 0)), Error);
  SamplingParams params;
  params.presence_penalty = 2.5f;
  EXPECT_THROW(Sampler{params}, Error);
  params = {};
  params.repetition_penalty = 0.0f;
  EXPECT_THROW(Sampler{params}, Error);
  params = {};
  params.min_p = 1.5f;
  EXPECT_THROW(Sampler{params}, Error);
  params = {};
  params.logit_bias = {{3, 101.0f}};
  EXPECT_THROW(Sampler{params}, Error);
}

// Greedy picks of `sampler` over `steps` steps of the same logits.
std::vector<int32_t> greedy_picks(Sampler& sampler, const std::vector<float>& logits, int steps) {
  std::vector<int32_t> picks;
  for (int i = 0; i < steps; ++i)
    picks.push_back(sampler.sample(logits.data(), static_cast<int32_t>(logits.size())).token_id);
  return picks;
}

TEST(SamplerTest, LogitBiasSteersTheChoiceButNotTheLogprobs) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f};
  SamplingParams params;
  params.logit_bias = {{0, 5.0f}};
  Sampler favour_zero(params);
  const SampledToken token = favour_zero.sample(logits.data(), 3);
  EXPECT_EQ(token.token_id, 0);
  const double log_normalizer = std::log(std::exp(0.0) + std::exp(1.0) + std::exp(2.0));
  EXPECT_NEAR(token.logprob, 0.0 - log_normalizer, 1e-6) << "logprobs of the raw distribution";
  params.logit_bias = {{2, -100.0f}, {7, 50.0f}};  // an id past the vocabulary changes nothing
  Sampler ban_two(params);
  EXPECT_EQ(greedy_picks(ban_two, logits, 3), (std::vector<int32_t>{1, 1, 1}));
}

TEST(SamplerTest, FrequencyAndPresencePenaltiesFollowTheOutputCounts) {
  SamplingParams params;
  params.frequency_penalty = 0.5f;  // each repeat costs 0.5 more
  Sampler frequency(params);
  EXPECT_EQ(greedy_picks(frequency, {1.0f, 0.9f}, 4), (std::vector<int32_t>{0, 1, 0, 1}));
  params = {};
  params.presence_penalty = 0.6f;  // once, whatever the count
  Sampler presence(params);
  EXPECT_EQ(greedy_picks(presence, {1.0f, 0.5f}, 4), (std::vector<int32_t>{0, 1, 0, 0}));
  Sampler none({});
  EXPECT_EQ(greedy_picks(none, {1.0f, 0.9f}, 3), (std::vector<int32_t>{0, 0, 0}));
}

TEST(SamplerTest, RepetitionPenaltyCoversThePromptAndDividesOrMultiplies) {
  SamplingParams params;
  params.repetition_penalty = 2.0f;
  Sampler positive(params);
  const std::vector<int32_t> prompt = {0};
  positive.set_prompt(prompt);  // token 0: 2.0 -> 1.0, below token 1's 1.5
  EXPECT_EQ(greedy_picks(positive, {2.0f, 1.5f, -1.0f}, 1), (std::vector<int32_t>{1}));
  Sampler negative(params);
  const std::vector<int32_t> prompt_two = {1};
  negative.set_prompt(prompt_two);  // token 1: -0.5 -> -1.0, below token 2's -0.8
  EXPECT_EQ(greedy_picks(negative, {-2.0f, -0.5f, -0.8f}, 1), (std::vector<int32_t>{2}));
  // Output tokens count too: after picking 1 it falls to 0.75 < 0.9.
  Sampler output(params);
  EXPECT_EQ(greedy_picks(output, {0.0f, 1.5f, 0.9f}, 2), (std::vector<int32_t>{1, 2}));
}

TEST(SamplerTest, MinPDropsTokensBelowItsShareOfTheTopProbability) {
  const std::vector<float> logits = {0.0f, -1.0f, -5.0f};  // relative probabilities 1, 0.37, 0.0067
  SamplingParams params;
  params.temperature = 1.0f;
  params.seed = 5;
  params.min_p = 0.1f;
  Sampler sampler(params);
  std::vector<int> counts(3, 0);
  for (int i = 0; i < 3000; ++i) ++counts[static_cast<size_t>(sampler.sample(logits.data(), 3).token_id)];
  EXPECT_EQ(counts[2], 0);
  EXPECT_NEAR(counts[1] / 3000.0, std::exp(-1.0) / (1.0 + std::exp(-1.0)), 0.03);
  params.min_p = 0.0f;
  Sampler unfiltered(params);
  int rare = 0;
  for (int i = 0; i < 3000; ++i) rare += unfiltered.sample(logits.data(), 3).token_id == 2;
  EXPECT_GT(rare, 0) << "without min_p the 0.5% token shows up in 3000 draws";
}

}  // namespace
}  // namespace loom
