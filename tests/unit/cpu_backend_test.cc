// CPU backend numerics against the naive dense reference in reference_model.h.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "reference_model.h"
#include "util/error.h"

// SequenceInput is filled with designated initializers, leaving defaults out on purpose.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace loom {
namespace {

using test::make_batch;
using test::max_abs_diff;
using test::reference_logits;
using test::SequenceInput;

constexpr double kTolerance = 1e-4;

// Runs `tokens` as one prefill with logits for every token and checks each row
// against the reference. Returns the worst difference.
double check_prefill_against_reference(const ModelConfig& config, uint64_t seed,
                                       const std::vector<int32_t>& positions = {}) {
  auto weights = test::random_weights(config, seed);
  auto backend = make_cpu_backend(config, weights);
  backend->allocate_kv_cache({8, 4});
  SequenceInput input;
  input.tokens = test::random_tokens(seed + 1, 13, config.vocab_size);
  input.positions = positions;
  input.block_ids = {5, 0, 7, 2};
  input.logits_for_all_tokens = true;
  const ForwardResult result = backend->forward(make_batch({input}));

  std::vector<int32_t> reference_positions = positions;
  if (reference_positions.empty())
    for (int32_t i = 0; i < 13; ++i) reference_positions.push_back(i);
  const auto expected = reference_logits(config, *weights, input.tokens, reference_positions,
                                         std::vector<const LoraAdapter*>(13, nullptr));
  EXPECT_EQ(result.vocab_size, config.vocab_size);
  EXPECT_EQ(result.logit_token_index.size(), 13u);
  EXPECT_EQ(result.logits.size(), 13u * config.vocab_size);
  double worst = 0.0;
  for (int32_t row = 0; row < 13; ++row) {
    EXPECT_EQ(result.logit_token_index[row], row);
    worst = std::max(worst, max_abs_diff(result.logits.data() + row * config.vocab_size, expected[row]));
  }
  EXPECT_LT(worst, kTolerance);
  return worst;
}

TEST(CpuBackend, LlamaMatchesReference) { check_prefill_against_reference(test::tiny_config(Architecture::kLlama), 11); }

TEST(CpuBackend, Qwen2WithQkvBiasMatchesReference) {
  check_prefill_against_reference(test::tiny_config(Architecture::kQwen2), 12);
}

TEST(CpuBackend, Qwen3WithQkNormMatchesReference) {
  check_prefill_against_reference(test::tiny_config(Architecture::kQwen3), 13);
}

TEST(CpuBackend, LlamaWithAttentionBiasAndTiedEmbeddingsMatchesReference) {
  ModelConfig config = test::tiny_config(Architecture::kLlama);
  config.qkv_bias = true;
  config.o_bias = true;
  config.tie_word_embeddings = true;
  check_prefill_against_reference(config, 14);
}

TEST(CpuBackend, Llama3RopeScalingMatchesReferenceAndChangesLogits) {
  // Wavelengths of head_dim 16 span 6 .. 2e4 tokens: with these thresholds
  // (16 and 64) the high, medium and low frequency branches are all taken.
  ModelConfig config = test::tiny_config(Architecture::kLlama);
  config.rope_scaling.type = RopeScaling::Type::kLlama3;
  config.rope_scaling.factor = 8.0f;
  config.rope_scaling.low_freq_factor = 1.0f;
  config.rope_scaling.high_freq_factor = 4.0f;
  config.rope_scaling.original_max_position_embeddings = 64;
  std::vector<int32_t> positions;
  for (int32_t i = 0; i < 13; ++i) positions.push_back(300 + 7 * i);
  check_prefill_against_reference(config, 15, positions);

  // The scaled model must differ from the unscaled one at these positions.
  auto weights = test::random_weights(config, 15);
  ModelConfig unscaled = config;
  unscaled.rope_scaling = RopeScaling{};
  const auto tokens = test::random_tokens(16, 13, config.vocab_size);
  const auto scaled_logits = reference_logits(config, *weights, tokens, positions,
                                              std::vector<const LoraAdapter*>(13, nullptr));
  auto backend = make_cpu_backend(unscaled, weights);
  backend->allocate_kv_cache({8, 4});
  SequenceInput input{.tokens = tokens, .positions = positions, .block_ids = {0, 1, 2, 3}};
  const ForwardResult result = backend->forward(make_batch({input}));
  EXPECT_GT(max_abs_diff(result.logits.data(), scaled_logits.back()), 1e-3);
}

TEST(CpuBackend, DecodeAfterPrefillMatchesReference) {
  const ModelConfig config = test::tiny_config(Architecture::kQwen3);
  auto weights = test::random_weights(config, 21);
  auto backend = make_cpu_backend(config, weights);
  backend->allocate_kv_cache({6, 4});
  const auto tokens = test::random_tokens(22, 11, config.vocab_size);
  std::vector<int32_t> positions;
  for (int32_t i = 0; i < 11; ++i) positions.push_back(i);
  const auto expected = reference_logits(config, *weights, tokens, positions,
                                         std::vector<const LoraAdapter*>(11, nullptr));
  const std::vector<int32_t> blocks = {4, 1, 3};

  SequenceInput prefill{.tokens = {tokens.begin(), tokens.begin() + 6}, .block_ids = blocks};
  ForwardResult result = backend->forward(make_batch({prefill}));
  ASSERT_EQ(result.logit_token_index, std::vector<int32_t>{5});
  EXPECT_LT(max_abs_diff(result.logits.data(), expected[5]), kTolerance);
  for (int32_t i = 6; i < 11; ++i) {
    SequenceInput step{.tokens = {tokens[i]}, .num_computed_tokens = i, .block_ids = blocks};
    result = backend->forward(make_batch({step}));
    ASSERT_EQ(result.logits.size(), static_cast<size_t>(config.vocab_size));
    EXPECT_LT(max_abs_diff(result.logits.data(), expected[i]), kTolerance) << "decode token " << i;
  }
}

TEST(CpuBackend, LongBatchRunsAttentionOnThreadsAndMatchesReference) {
  // Enough attention work (two sequences of 70 tokens) for the parallel path.
  const ModelConfig config = test::tiny_config(Architecture::kQwen3);
  auto weights = test::random_weights(config, 25);
  auto backend = make_cpu_backend(config, weights, {.num_threads = 2});
  backend->allocate_kv_cache({40, 4});
  std::vector<SequenceInput> inputs(2);
  std::vector<std::vector<std::vector<double>>> expected;
  for (int s = 0; s < 2; ++s) {
    inputs[s].tokens = test::random_tokens(26 + s, 70, config.vocab_size);
    for (int32_t b = 0; b < 18; ++b) inputs[s].block_ids.push_back(2 * b + s);
    inputs[s].logits_for_all_tokens = true;
    std::vector<int32_t> positions(70);
    for (int32_t i = 0; i < 70; ++i) positions[i] = i;
    expected.push_back(reference_logits(config, *weights, inputs[s].tokens, positions,
                                        std::vector<const LoraAdapter*>(70, nullptr)));
  }
  const ForwardResult result = backend->forward(make_batch(inputs));
  ASSERT_EQ(result.logits.size(), 140u * config.vocab_size);
  for (int row = 0; row < 140; ++row)
    EXPECT_LT(max_abs_diff(result.logits.data() + row * config.vocab_size, expected[row / 70][row % 70]),
              kTolerance)
        << row;
}

TEST(CpuBackend, ReportsKvSizes) {
  const ModelConfig config = test::tiny_config(Architecture::kLlama);
  auto backend = make_cpu_backend(config, test::random_weights(config, 1), {.num_threads = 1, .max_adapter_slots = 3});
  // 2 layers x (K + V) x 2 kv heads x 16 dims x 4 bytes.
  EXPECT_EQ(backend->kv_bytes_per_token(), 2 * 2 * 2 * 16 * 4);
  EXPECT_EQ(backend->max_adapter_slots(), 3);
  EXPECT_EQ(backend->kv_cache_shape().num_blocks, 0);
  backend->allocate_kv_cache({10, 8});
  EXPECT_EQ(backend->kv_cache_shape().num_blocks, 10);
  EXPECT_EQ(backend->kv_cache_shape().block_size, 8);
}

TEST(CpuBackend, RejectsWeightsThatDoNotFitTheConfig) {
  const ModelConfig config = test::tiny_config(Architecture::kLlama);
  auto weights = test::random_weights(config, 1);
  Prng prng(2);
  weights->layers[1].k_proj = test::random_tensor(prng, {config.q_size(), config.hidden_size}, 0.1f);
  try {
    make_cpu_backend(config, weights);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kFormat);
    EXPECT_NE(error.message().find("model.layers.1.self_attn.k_proj.weight"), std::string::npos);
  }
  ModelConfig qwen2 = test::tiny_config(Architecture::kQwen2);
  auto no_bias = test::random_weights(test::tiny_config(Architecture::kLlama), 1);
  EXPECT_THROW(make_cpu_backend(qwen2, no_bias), Error);
}

}  // namespace
}  // namespace loom
