// Multi-LoRA on the CPU backend: per-module ranks, partial targeting, rsLoRA,
// and batches mixing adapters and base rows.
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
//                                              q  k  v  o  gate up down
constexpr std::array<int, kNumLoraTargets> kAllRanks = {8, 4, 2, 6, 3, 5, 7};
constexpr std::array<int, kNumLoraTargets> kAttentionOnly = {4, 0, 4, 0, 0, 0, 0};
constexpr std::array<int, kNumLoraTargets> kMlpOnly = {0, 0, 0, 0, 2, 2, 16};

class CpuBackendLora : public ::testing::Test {
 protected:
  CpuBackendLora()
      : config_(test::tiny_config(Architecture::kQwen2)), weights_(test::random_weights(config_, 31)) {}

  std::unique_ptr<Backend> new_backend() {
    auto backend = make_cpu_backend(config_, weights_, {.num_threads = 0, .max_adapter_slots = 4});
    backend->allocate_kv_cache({32, 4});
    return backend;
  }

  // Reference logits of the last token of `tokens`, every token using `adapter`.
  std::vector<double> reference_last(const std::vector<int32_t>& tokens, const LoraAdapter* adapter) {
    std::vector<int32_t> positions(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) positions[i] = static_cast<int32_t>(i);
    return reference_logits(config_, *weights_, tokens, positions,
                            std::vector<const LoraAdapter*>(tokens.size(), adapter))
        .back();
  }

  ModelConfig config_;
  std::shared_ptr<ModelWeights> weights_;
};

TEST_F(CpuBackendLora, AdapterWithDifferentRanksPerModuleMatchesReference) {
  auto adapter = test::random_adapter(config_, 41, kAllRanks, 16.0f);
  auto backend = new_backend();
  backend->set_adapter(2, adapter);
  const auto tokens = test::random_tokens(42, 9, config_.vocab_size);
  const ForwardResult result =
      backend->forward(make_batch({{.tokens = tokens, .adapter_slot = 2, .block_ids = {3, 9, 1}}}));
  const auto expected = reference_last(tokens, adapter.get());
  EXPECT_LT(max_abs_diff(result.logits.data(), expected), kTolerance);
  // The adapter must matter, or the comparison above proves nothing.
  EXPECT_GT(max_abs_diff(result.logits.data(), reference_last(tokens, nullptr)), 1e-2);
}

TEST_F(CpuBackendLora, AdapterTargetingSomeModulesMatchesReference) {
  for (const auto& ranks : {kAttentionOnly, kMlpOnly}) {
    auto adapter = test::random_adapter(config_, 43, ranks, 8.0f);
    auto backend = new_backend();
    backend->set_adapter(0, adapter);
    const auto tokens = test::random_tokens(44, 7, config_.vocab_size);
    const ForwardResult result =
        backend->forward(make_batch({{.tokens = tokens, .adapter_slot = 0, .block_ids = {0, 1}}}));
    EXPECT_LT(max_abs_diff(result.logits.data(), reference_last(tokens, adapter.get())), kTolerance);
    EXPECT_GT(max_abs_diff(result.logits.data(), reference_last(tokens, nullptr)), 1e-2);
  }
}

TEST_F(CpuBackendLora, RsLoraScaleIsAlphaOverSqrtRank) {
  // Same seed: same A and B, only the scale differs (alpha / sqrt(r) vs alpha / r).
  auto plain = test::random_adapter(config_, 45, kAllRanks, 4.0f, /*use_rslora=*/false);
  auto rslora = test::random_adapter(config_, 45, kAllRanks, 4.0f, /*use_rslora=*/true);
  ASSERT_FLOAT_EQ(rslora->layers[0][0]->scale, 4.0f / std::sqrt(8.0f));
  auto backend = new_backend();
  backend->set_adapter(0, plain);
  backend->set_adapter(1, rslora);
  const auto tokens = test::random_tokens(46, 6, config_.vocab_size);
  const ForwardResult result = backend->forward(make_batch({
      {.tokens = tokens, .adapter_slot = 0, .block_ids = {0, 1}},
      {.tokens = tokens, .adapter_slot = 1, .block_ids = {2, 3}},
  }));
  const float* plain_row = result.logits.data();
  const float* rslora_row = result.logits.data() + config_.vocab_size;
  EXPECT_LT(max_abs_diff(plain_row, reference_last(tokens, plain.get())), kTolerance);
  EXPECT_LT(max_abs_diff(rslora_row, reference_last(tokens, rslora.get())), kTolerance);
  EXPECT_GT(max_abs_diff(rslora_row, reference_last(tokens, plain.get())), 1e-2);
}

TEST_F(CpuBackendLora, MixedBatchEqualsEachSequenceAlone) {
  auto adapter_a = test::random_adapter(config_, 51, kAllRanks, 16.0f);
  auto adapter_b = test::random_adapter(config_, 52, kAttentionOnly, 8.0f, true);
  auto adapter_c = test::random_adapter(config_, 53, kMlpOnly, 4.0f);
  // Sequences 0 and 3 share slot 1, with base rows between them (a non-contiguous
  // group); sequence 4 switches from base to adapter c mid-prompt, as aLoRA does.
  std::vector<SequenceInput> inputs(5);
  inputs[0] = {.tokens = test::random_tokens(60, 7, 97), .adapter_slot = 1, .block_ids = {0, 1}};
  inputs[1] = {.tokens = test::random_tokens(61, 3, 97), .adapter_slot = -1, .block_ids = {2}};
  inputs[2] = {.tokens = test::random_tokens(62, 9, 97), .adapter_slot = 3, .block_ids = {3, 4, 5}};
  inputs[3] = {.tokens = test::random_tokens(63, 5, 97), .adapter_slot = 1, .block_ids = {6, 7}};
  inputs[4] = {.tokens = test::random_tokens(64, 8, 97), .adapter_slots = {-1, -1, -1, -1, 0, 0, 0, 0},
               .block_ids = {8, 9}};
  const std::vector<const LoraAdapter*> by_slot = {adapter_c.get(), adapter_a.get(), nullptr, adapter_b.get()};

  auto backend = new_backend();
  backend->set_adapter(0, adapter_c);
  backend->set_adapter(1, adapter_a);
  backend->set_adapter(3, adapter_b);
  for (SequenceInput& input : inputs) input.logits_for_all_tokens = true;
  const ForwardResult mixed = backend->forward(make_batch(inputs));

  int64_t row = 0;
  for (size_t s = 0; s < inputs.size(); ++s) {
    auto alone_backend = new_backend();
    alone_backend->set_adapter(0, adapter_c);
    alone_backend->set_adapter(1, adapter_a);
    alone_backend->set_adapter(3, adapter_b);
    const ForwardResult alone = alone_backend->forward(make_batch({inputs[s]}));

    std::vector<const LoraAdapter*> per_token;
    for (size_t i = 0; i < inputs[s].tokens.size(); ++i) {
      const int32_t slot = inputs[s].adapter_slots.empty() ? inputs[s].adapter_slot : inputs[s].adapter_slots[i];
      per_token.push_back(slot < 0 ? nullptr : by_slot[slot]);
    }
    std::vector<int32_t> positions(inputs[s].tokens.size());
    for (size_t i = 0; i < positions.size(); ++i) positions[i] = static_cast<int32_t>(i);
    const auto expected = reference_logits(config_, *weights_, inputs[s].tokens, positions, per_token);

    for (size_t i = 0; i < inputs[s].tokens.size(); ++i, ++row) {
      const float* mixed_row = mixed.logits.data() + row * config_.vocab_size;
      const float* alone_row = alone.logits.data() + i * config_.vocab_size;
      for (int v = 0; v < config_.vocab_size; ++v)
        ASSERT_NEAR(mixed_row[v], alone_row[v], 1e-5) << "sequence " << s << " token " << i;
      EXPECT_LT(max_abs_diff(mixed_row, expected[i]), kTolerance) << "sequence " << s << " token " << i;
    }
  }
  EXPECT_EQ(row * config_.vocab_size, static_cast<int64_t>(mixed.logits.size()));
}

TEST_F(CpuBackendLora, DecodeStepMixingAdaptersMatchesReference) {
  auto adapter_a = test::random_adapter(config_, 71, kAllRanks, 16.0f);
  auto adapter_b = test::random_adapter(config_, 72, kMlpOnly, 8.0f);
  auto backend = new_backend();
  backend->set_adapter(0, adapter_a);
  backend->set_adapter(1, adapter_b);
  const std::vector<int32_t> slots = {1, -1, 0, 1};
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SequenceInput> prefill;
  for (int s = 0; s < 4; ++s) {
    prompts.push_back(test::random_tokens(80 + s, 5 + s, config_.vocab_size));
    prefill.push_back({.tokens = prompts[s], .adapter_slot = slots[s], .block_ids = {3 * s, 3 * s + 1, 3 * s + 2}});
  }
  backend->forward(make_batch(prefill));

  std::vector<SequenceInput> decode;
  for (int s = 0; s < 4; ++s) {
    const int32_t next = (7 * s + 3) % config_.vocab_size;
    decode.push_back({.tokens = {next}, .adapter_slot = slots[s],
                      .num_computed_tokens = static_cast<int32_t>(prompts[s].size()), .block_ids = {3 * s, 3 * s + 1, 3 * s + 2}});
    prompts[s].push_back(next);
  }
  const ForwardResult result = backend->forward(make_batch(decode));
  ASSERT_EQ(result.logit_token_index, (std::vector<int32_t>{0, 1, 2, 3}));
  const std::vector<const LoraAdapter*> by_slot = {adapter_a.get(), adapter_b.get()};
  for (int s = 0; s < 4; ++s) {
    const auto expected = reference_last(prompts[s], slots[s] < 0 ? nullptr : by_slot[slots[s]]);
    EXPECT_LT(max_abs_diff(result.logits.data() + s * config_.vocab_size, expected), kTolerance) << s;
  }
}

TEST_F(CpuBackendLora, RejectsAdaptersThatDoNotFitAndUnboundSlots) {
  auto backend = new_backend();
  EXPECT_THROW(backend->set_adapter(4, test::random_adapter(config_, 1, kAllRanks, 8.0f)), Error);
  EXPECT_THROW(backend->set_adapter(-1, nullptr), Error);

  ModelConfig other = config_;
  other.intermediate_size = 128;  // an adapter made for another base model
  try {
    backend->set_adapter(0, test::random_adapter(other, 1, kMlpOnly, 8.0f));
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kInvalidArgument);
  }
  ModelConfig fewer_layers = config_;
  fewer_layers.num_layers = 1;
  EXPECT_THROW(backend->set_adapter(0, test::random_adapter(fewer_layers, 1, kAllRanks, 8.0f)), Error);

  // Unbound, then bound, then freed again.
  const Batch batch = make_batch({{.tokens = {1, 2, 3}, .adapter_slot = 2, .block_ids = {0}}});
  EXPECT_THROW(backend->forward(batch), Error);
  backend->set_adapter(2, test::random_adapter(config_, 2, kAllRanks, 8.0f));
  EXPECT_NO_THROW(backend->forward(batch));
  backend->set_adapter(2, nullptr);
  EXPECT_THROW(backend->forward(batch), Error);
}

}  // namespace
}  // namespace loom
