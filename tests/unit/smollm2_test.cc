// The real default model end to end: Loom (GGUF loader, tokenizer, CPU backend,
// generator) against transformers on the weights `loom convert` wrote.
// Fixture: tools/golden/smollm2_reference.py. Skipped when the GGUF is absent.
#include <gtest/gtest.h>

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
    golden_ = new TensorMap(read_safetensors(test::fixture_path("golden/smollm2.safetensors")));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete golden_;
    model_ = nullptr;
    golden_ = nullptr;
  }
  void SetUp() override {
    if (model_ == nullptr) GTEST_SKIP() << "SmolLM2 GGUF not found (scripts/setup.sh fetches it)";
  }
  std::vector<int32_t> prompt_ids(int index) const { return as_ids(golden_->at(fmt::format("prompt{}.ids", index))); }

  static LoadedModel* model_;
  static TensorMap* golden_;
};
LoadedModel* SmolLM2Test::model_ = nullptr;
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

}  // namespace
}  // namespace loom
