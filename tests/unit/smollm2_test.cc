// The real default model end to end: Loom (GGUF loader, tokenizer, CPU backend,
// generator) against transformers on the weights `loom convert` wrote.
// Fixture: tools/golden/smollm2_reference.py. Skipped when the GGUF is absent.
// The fp32 path (weights expanded at load) is what matches transformers; the
// quantized path (LoadOptions::keep_quantized) is checked against it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "formats/safetensors.h"
#include "model/loader.h"
#include "oracles/generator.h"
#include "test_util.h"

namespace loom {
namespace {

std::vector<int32_t> as_ids(const Tensor& tensor) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < tensor.numel(); ++i) ids.push_back(static_cast<int32_t>(tensor.data[i]));
  return ids;
}

class SmolLM2Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = test::smollm2_gguf_path();
    if (path.empty()) return;
    model_ = new LoadedModel(load_model(path));
    quantized_model_ = new LoadedModel(load_model(path, {.keep_quantized = true}));
    golden_ = new TensorMap(read_safetensors(test::fixture_path("golden/smollm2.safetensors")));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete quantized_model_;
    delete golden_;
    model_ = nullptr;
    quantized_model_ = nullptr;
    golden_ = nullptr;
  }
  void SetUp() override {
    if (model_ == nullptr) GTEST_SKIP() << "SmolLM2 GGUF not found (scripts/setup.sh fetches it)";
  }
  std::vector<int32_t> prompt_ids(int index) const { return as_ids(golden_->at(fmt::format("prompt{}.ids", index))); }

  static LoadedModel* model_;
  static LoadedModel* quantized_model_;
  static TensorMap* golden_;
};
LoadedModel* SmolLM2Test::model_ = nullptr;
LoadedModel* SmolLM2Test::quantized_model_ = nullptr;
TensorMap* SmolLM2Test::golden_ = nullptr;

TEST_F(SmolLM2Test, TokenizerMatchesTransformersOnThePrompts) {
  const Tokenizer& tokenizer = *model_->tokenizer;
  const std::string chat =
      tokenizer.chat_template().render({{"user", "What is the capital of France?"}}, true);
  EXPECT_EQ(tokenizer.encode(chat, false), prompt_ids(0));
  EXPECT_EQ(tokenizer.encode("def fibonacci(n):\n    ", true), prompt_ids(1));
  EXPECT_EQ(tokenizer.encode("The quick brown fox jumps over the lazy dog. In 2024, the", true), prompt_ids(2));
}

TEST_F(SmolLM2Test, LastPromptLogitsMatchTransformers) {
  auto backend = make_cpu_backend(model_->config, model_->weights);
  backend->allocate_kv_cache({16, 16});
  for (int index = 0; index < 3; ++index) {
    const std::vector<int32_t> ids = prompt_ids(index);
    Batch batch;
    batch.token_ids = ids;
    for (size_t i = 0; i < ids.size(); ++i) {
      batch.positions.push_back(static_cast<int32_t>(i));
      batch.adapter_slots.push_back(-1);
    }
    BatchSequence sequence;
    sequence.num_new_tokens = static_cast<int32_t>(ids.size());
    sequence.num_blocks = 4;
    batch.sequences.push_back(sequence);
    batch.block_tables = {0, 1, 2, 3};
    ForwardResult result = backend->forward(batch);
    const Tensor& expected = golden_->at(fmt::format("prompt{}.last_logits", index));
    ASSERT_EQ(result.vocab_size, expected.numel());
    float max_diff = 0.0f;
    for (int64_t v = 0; v < expected.numel(); ++v)
      max_diff = std::max(max_diff, std::fabs(result.logits[static_cast<size_t>(v)] - expected.data[v]));
    EXPECT_LT(max_diff, 1e-3f) << "prompt " << index;
    std::printf("prompt %d: max |logit - transformers| = %.3g\n", index, max_diff);
  }
}

TEST_F(SmolLM2Test, GreedyContinuationsMatchTransformers) {
  auto backend = make_cpu_backend(model_->config, model_->weights);
  GeneratorConfig config;
  config.max_context_tokens = model_->config.max_position_embeddings;
  Generator generator(*backend, model_->tokenizer, config);
  std::vector<GenerationRequest> requests(3);
  for (int index = 0; index < 3; ++index) {
    requests[static_cast<size_t>(index)].prompt_tokens = prompt_ids(index);
    requests[static_cast<size_t>(index)].max_new_tokens = 32;
    requests[static_cast<size_t>(index)].ignore_eos = true;
  }
  auto results = generator.generate(requests);
  for (int index = 0; index < 3; ++index) {
    std::vector<int32_t> generated;
    for (const auto& token : results[static_cast<size_t>(index)].tokens) generated.push_back(token.token_id);
    EXPECT_EQ(generated, as_ids(golden_->at(fmt::format("prompt{}.greedy", index)))) << "prompt " << index;
  }
}

// Logits of every step of a sequence fed `prompt` then `continuation` (teacher
// forcing): row 0 after the prompt, row i after continuation[i - 1].
std::vector<std::vector<float>> teacher_forced_logits(Backend& backend, const std::vector<int32_t>& prompt,
                                                      const std::vector<int32_t>& continuation) {
  std::vector<std::vector<float>> rows;
  int32_t num_computed = 0;
  std::vector<int32_t> step_tokens = prompt;
  for (size_t step = 0; step <= continuation.size(); ++step) {
    Batch batch;
    batch.token_ids = step_tokens;
    for (size_t i = 0; i < step_tokens.size(); ++i) {
      batch.positions.push_back(num_computed + static_cast<int32_t>(i));
      batch.adapter_slots.push_back(-1);
    }
    BatchSequence sequence;
    sequence.num_computed_tokens = num_computed;
    sequence.num_new_tokens = static_cast<int32_t>(step_tokens.size());
    sequence.num_blocks = 8;
    batch.sequences.push_back(sequence);
    batch.block_tables = {0, 1, 2, 3, 4, 5, 6, 7};
    rows.push_back(backend.forward(batch).logits);
    num_computed += static_cast<int32_t>(step_tokens.size());
    if (step < continuation.size()) step_tokens = {continuation[step]};
  }
  return rows;
}

int32_t argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// The fp32 path's greedy continuations (the golden ones) replayed through the
// quantized path: at each step the quantized model must pick the fp32 token
// unless the fp32 model itself is undecided there (top-2 logits closer than
// kNearTie); its logits stay within kMaxLogitGap of the fp32 ones. Prints the
// first step where the quantized choice differs and the gaps there.
TEST_F(SmolLM2Test, QuantizedPathFollowsTheFp32GreedyContinuations) {
  constexpr float kNearTie = 0.5f, kMaxLogitGap = 2.0f;  // measured: near-ties < 0.1, gaps 0.85-1.37
  constexpr size_t kSteps = 16;
  auto fp32 = make_cpu_backend(model_->config, model_->weights);
  auto quantized = make_cpu_backend(quantized_model_->config, quantized_model_->weights);
  fp32->allocate_kv_cache({8, 16});
  quantized->allocate_kv_cache({8, 16});
  for (int index = 0; index < 3; ++index) {
    std::vector<int32_t> greedy = as_ids(golden_->at(fmt::format("prompt{}.greedy", index)));
    greedy.resize(std::min(greedy.size(), kSteps));
    const auto want = teacher_forced_logits(*fp32, prompt_ids(index), greedy);
    const auto got = teacher_forced_logits(*quantized, prompt_ids(index), greedy);
    int first_difference = -1;
    float max_gap = 0.0f;
    for (size_t step = 0; step < want.size(); ++step) {
      ASSERT_EQ(want[step].size(), got[step].size());
      for (size_t v = 0; v < want[step].size(); ++v) max_gap = std::max(max_gap, std::fabs(want[step][v] - got[step][v]));
      const int32_t fp32_token = argmax(want[step]), quantized_token = argmax(got[step]);
      if (fp32_token == quantized_token) continue;
      const float fp32_margin = want[step][fp32_token] - want[step][quantized_token];
      const float quantized_margin = got[step][quantized_token] - got[step][fp32_token];
      if (first_difference < 0) {
        first_difference = static_cast<int>(step);
        std::printf("prompt %d: step %zu: quantized picks %d, fp32 %d (fp32 prefers its token by %.3f, the quantized "
                    "path its own by %.3f)\n",
                    index, step, quantized_token, fp32_token, fp32_margin, quantized_margin);
      }
      EXPECT_LT(fp32_margin, kNearTie) << "prompt " << index << " step " << step;
    }
    std::printf("prompt %d: %s over %zu steps, max |logit gap| %.3f\n", index,
                first_difference < 0 ? "same greedy tokens" : "differs", want.size(), max_gap);
    EXPECT_LT(max_gap, kMaxLogitGap) << "prompt " << index;
  }
}

}  // namespace
}  // namespace loom
