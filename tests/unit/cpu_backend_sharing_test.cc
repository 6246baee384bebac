// KV sharing on the CPU backend: decoder rows of base (ICaRus) sharing against
// the logical encoder/decoder reference, one batch mixing every mode, hidden
// state capture, and rejection of malformed sharing fields.
// Forked sharing has its own file (cpu_backend_forked_test.cc).
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "reference_model.h"
#include "test_util.h"
#include "util/error.h"

// SequenceInput is filled with designated initializers, leaving defaults out on purpose.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace loom {
namespace {

using test::make_batch;
using test::ReferenceRun;
using test::relative_diff;
using test::SequenceInput;

constexpr double kTolerance = 1e-4;  // relative, fp32 backend against the double reference
//                                                q  k  v  o  gate up down
constexpr std::array<int, kNumLoraTargets> kAllRanks = {8, 4, 2, 6, 3, 5, 7};
const std::vector<int32_t> kBlocks = {9, 4, 14, 1, 7, 12, 3};  // scattered, block size 4

struct Model {
  ModelConfig config;
  std::shared_ptr<ModelWeights> weights;
};

Model make_model(Architecture arch) {
  const ModelConfig config = test::tiny_config(arch);
  return {config, test::random_weights(config, 61)};
}

std::unique_ptr<Backend> new_backend(const Model& model) {
  auto backend = make_cpu_backend(model.config, model.weights, {.num_threads = 0, .max_adapter_slots = 4});
  backend->allocate_kv_cache({48, 4});
  backend->allocate_residual_cache({48, 4, 8});
  return backend;
}

std::vector<int32_t> iota_positions(size_t count) {
  std::vector<int32_t> positions(count);
  for (size_t i = 0; i < count; ++i) positions[i] = static_cast<int32_t>(i);
  return positions;
}

const float* row(const ForwardResult& result, size_t r) { return result.logits.data() + r * result.vocab_size; }

// Base sharing: the logits come from the decoder row (base + adapter on q, o and
// the MLP) reading the base model's K/V; the K/V written are the base model's.
TEST(CpuBackendSharing, DecoderRowsMatchTheLogicalEncoderAndDecoder) {
  constexpr int kSlot = 2;
  for (Architecture arch : {Architecture::kLlama, Architecture::kQwen2}) {
    const Model model = make_model(arch);
    // k/v LoRA included: base sharing must ignore it.
    auto adapter = test::random_adapter(model.config, 62, kAllRanks, 16.0f);
    const auto tokens = test::random_tokens(63, 22, model.config.vocab_size);
    const ReferenceRun base = test::reference_run(model.config, *model.weights, tokens,
                                                  std::vector<const LoraAdapter*>(tokens.size(), nullptr));
    auto decoder = [&](int64_t p) {
      return test::reference_decoder_row(model.config, *model.weights, tokens, base, *adapter, p).logits[0];
    };
    const std::string name = architecture_short_name(arch);

    // A long prefill (chunked attention) with logits for every token, then decode steps.
    auto backend = new_backend(model);
    backend->set_adapter(kSlot, adapter);
    SequenceInput sequence{.tokens = std::vector<int32_t>(tokens.begin(), tokens.begin() + 18),
                           .block_ids = kBlocks, .logits_for_all_tokens = true, .decoder_adapter_slot = kSlot};
    ForwardResult result = backend->forward(make_batch({sequence}));
    ASSERT_EQ(result.logit_token_index.size(), 18u);
    for (int p = 0; p < 18; ++p) {
      EXPECT_EQ(result.logit_token_index[p], p);
      EXPECT_LT(relative_diff(row(result, p), decoder(p)), kTolerance) << name << " prompt token " << p;
    }
    // The adapter matters, and it is not the isolated adapter either.
    const auto isolated = test::reference_logits(model.config, *model.weights, tokens, iota_positions(tokens.size()),
                                                 std::vector<const LoraAdapter*>(tokens.size(), adapter.get()));
    EXPECT_GT(test::max_abs_diff(row(result, 17), base.logits[17]), 1e-2);
    EXPECT_GT(test::max_abs_diff(row(result, 17), isolated[17]), 1e-2);
    sequence.logits_for_all_tokens = false;
    for (int p = 18; p < 21; ++p) {
      sequence.tokens = {tokens[p]};
      sequence.num_computed_tokens = p;
      result = backend->forward(make_batch({sequence}));
      EXPECT_LT(relative_diff(row(result, 0), decoder(p)), kTolerance) << name << " decode " << p;
    }
    // Every entry written so far is the base model's: a base request on top matches the base model.
    result = backend->forward(make_batch({{.tokens = {tokens[21]}, .num_computed_tokens = 21, .block_ids = kBlocks}}));
    EXPECT_LT(relative_diff(row(result, 0), base.logits[21]), kTolerance) << name;

    // A short prefill (token-by-token attention, the decoder row beside its token), last token only.
    backend = new_backend(model);
    backend->set_adapter(kSlot, adapter);
    result = backend->forward(make_batch({{.tokens = std::vector<int32_t>(tokens.begin(), tokens.begin() + 7),
                                           .block_ids = kBlocks, .decoder_adapter_slot = kSlot}}));
    ASSERT_EQ(result.logit_token_index, std::vector<int32_t>{6});
    EXPECT_LT(relative_diff(row(result, 0), decoder(6)), kTolerance) << name;
  }
}

// Runs each sequence of `steps` (step-major: steps[s][i] is sequence i in step s)
// together, and each sequence alone on a fresh backend; all rows must agree.
void expect_batch_equals_alone(const Model& model, const std::vector<std::shared_ptr<LoraAdapter>>& adapters,
                               const std::vector<std::vector<SequenceInput>>& steps) {
  auto bind = [&](Backend& backend) {
    for (size_t slot = 0; slot < adapters.size(); ++slot) backend.set_adapter(static_cast<int32_t>(slot), adapters[slot]);
  };
  auto together = new_backend(model);
  bind(*together);
  std::vector<ForwardResult> batched;
  for (const auto& step : steps) batched.push_back(together->forward(make_batch(step)));

  const size_t num_sequences = steps[0].size();
  for (size_t i = 0; i < num_sequences; ++i) {
    auto alone = new_backend(model);
    bind(*alone);
    for (size_t s = 0; s < steps.size(); ++s) {
      const ForwardResult single = alone->forward(make_batch({steps[s][i]}));
      // Rows of sequence i in the batched result: they follow batch order.
      size_t first_row = 0;
      int32_t token_offset = 0;
      for (size_t j = 0; j < i; ++j) {
        first_row += steps[s][j].logits_for_all_tokens ? steps[s][j].tokens.size() : 1;
        token_offset += static_cast<int32_t>(steps[s][j].tokens.size());
      }
      for (size_t r = 0; r < single.logit_token_index.size(); ++r) {
        ASSERT_EQ(batched[s].logit_token_index[first_row + r], token_offset + single.logit_token_index[r]);
        double worst = 0.0;
        for (int32_t v = 0; v < single.vocab_size; ++v)
          worst = std::max(worst, static_cast<double>(std::abs(row(batched[s], first_row + r)[v] - row(single, r)[v])));
        EXPECT_LT(worst, 1e-4) << "sequence " << i << " step " << s << " row " << r;
      }
    }
  }
}

TEST(CpuBackendSharing, OneBatchMixingEveryModeEqualsEachSequenceAlone) {
  const Model model = make_model(Architecture::kQwen2);
  const std::vector<std::shared_ptr<LoraAdapter>> adapters = {
      test::random_adapter(model.config, 64, kAllRanks, 16.0f),  // 0: isolated
      test::random_adapter(model.config, 65, kAllRanks, 8.0f),   // 1: activated
      test::random_adapter(model.config, 66, kAllRanks, 16.0f),  // 2: base
      test::random_adapter(model.config, 67, kAllRanks, 16.0f)}; // 3: forked
  auto tokens = [&](uint64_t seed, int count) { return test::random_tokens(seed, count, model.config.vocab_size); };
  std::vector<int32_t> activated_slots(10, 1);
  std::fill_n(activated_slots.begin(), 4, -1);  // invocation start at token 4

  const std::vector<SequenceInput> prefill = {
      {.tokens = tokens(1, 9), .block_ids = {0, 1, 2}},
      {.tokens = tokens(2, 6), .adapter_slot = 0, .block_ids = {3, 4}},
      {.tokens = tokens(3, 10), .adapter_slots = activated_slots, .block_ids = {5, 6, 7}},
      {.tokens = tokens(4, 7), .block_ids = {8, 9}, .logits_for_all_tokens = true, .decoder_adapter_slot = 2},
      {.tokens = tokens(5, 17), .adapter_slot = 3, .block_ids = {10, 11, 12, 13, 14}, .forked_adapter_slot = 3,
       .residual_block_ids = {4, 0, 3, 1, 2}},
      {.tokens = tokens(6, 3), .adapter_slot = 3, .block_ids = {15}, .forked_adapter_slot = 3,
       .residual_block_ids = {6}},
  };
  std::vector<SequenceInput> decode = prefill;
  for (size_t i = 0; i < decode.size(); ++i) {
    SequenceInput& sequence = decode[i];
    sequence.num_computed_tokens = static_cast<int32_t>(sequence.tokens.size());
    sequence.tokens = {static_cast<int32_t>(11 + i)};
    sequence.logits_for_all_tokens = false;
    if (!sequence.adapter_slots.empty()) sequence.adapter_slots = {1};
    if (sequence.num_computed_tokens % 4 == 0) sequence.block_ids.push_back(20 + static_cast<int32_t>(i));
    if (sequence.forked_adapter_slot >= 0 && sequence.num_computed_tokens % 4 == 0)
      sequence.residual_block_ids.push_back(20 + static_cast<int32_t>(i));
  }
  expect_batch_equals_alone(model, adapters, {prefill, decode});
}

// hidden_states[l] holds each logits row's residual stream after layer l; the
// last, through the final norm and lm_head, gives the logits.
TEST(CpuBackendSharing, HiddenStatesFollowEachLogitsRow) {
  const Model model = make_model(Architecture::kLlama);
  const ModelConfig& config = model.config;
  auto adapter = test::random_adapter(config, 68, kAllRanks, 16.0f);
  const auto tokens = test::random_tokens(69, 7, config.vocab_size);
  const ReferenceRun base = test::reference_run(config, *model.weights, tokens,
                                                std::vector<const LoraAdapter*>(tokens.size(), nullptr));
  const ReferenceRun isolated = test::reference_run(config, *model.weights, tokens,
                                                    std::vector<const LoraAdapter*>(tokens.size(), adapter.get()));
  const ReferenceRun decoder = test::reference_decoder_row(config, *model.weights, tokens, base, *adapter, 6);

  auto backend = new_backend(model);
  backend->set_adapter(1, adapter);
  Batch batch = make_batch({{.tokens = tokens, .block_ids = {0, 1}, .logits_for_all_tokens = true},
                            {.tokens = tokens, .adapter_slot = 1, .block_ids = {2, 3}},
                            {.tokens = tokens, .block_ids = {4, 5}, .decoder_adapter_slot = 1}});
  EXPECT_TRUE(backend->forward(batch).hidden_states.empty());  // only when asked
  batch.capture_hidden_states = true;

  backend = new_backend(model);
  backend->set_adapter(1, adapter);
  const ForwardResult captured = backend->forward(batch);
  const int64_t hidden = config.hidden_size;
  const size_t num_rows = captured.logit_token_index.size();
  ASSERT_EQ(num_rows, 9u);
  ASSERT_EQ(captured.hidden_states.size(), (config.num_layers + 1) * num_rows * hidden);
  // Row r's reference hidden state after layer l.
  auto expected = [&](size_t r, int l) -> const std::vector<double>& {
    if (r < 7) return base.hidden[l][r];
    return r == 7 ? isolated.hidden[l][6] : decoder.hidden[l][0];
  };
  for (int l = 0; l <= config.num_layers; ++l)
    for (size_t r = 0; r < num_rows; ++r) {
      const float* state = captured.hidden_states.data() + (l * num_rows + r) * hidden;
      EXPECT_LT(relative_diff(state, expected(r, l)), kTolerance) << "layer " << l << " row " << r;
    }
  for (size_t r = 0; r < num_rows; ++r) {
    const float* last = captured.hidden_states.data() + (config.num_layers * num_rows + r) * hidden;
    const std::vector<double> logits = test::reference_detail::logits_of(
        config, *model.weights, std::vector<double>(last, last + hidden));
    EXPECT_LT(relative_diff(row(captured, r), logits), 1e-5) << "row " << r;
  }
}

void expect_invalid(Backend& backend, const Batch& batch, const std::string& needle) {
  test::expect_error([&] { backend.forward(batch); }, ErrorKind::kInvalidArgument, {needle});
}

TEST(CpuBackendSharing, RejectsMalformedSharingFields) {
  const Model model = make_model(Architecture::kLlama);
  auto backend = new_backend(model);
  backend->set_adapter(0, test::random_adapter(model.config, 70, kAllRanks, 8.0f));
  const SequenceInput forked{.tokens = {1, 2, 3}, .adapter_slot = 0, .block_ids = {6}, .forked_adapter_slot = 0,
                             .residual_block_ids = {2}};
  const SequenceInput based{.tokens = {1, 2, 3}, .block_ids = {6}, .decoder_adapter_slot = 0};
  ASSERT_NO_THROW(backend->forward(make_batch({forked, based})));

  SequenceInput input = based;
  input.decoder_adapter_slot = 1;
  expect_invalid(*backend, make_batch({input}), "decoder_adapter_slot 1 has no adapter bound");
  input.decoder_adapter_slot = 4;
  expect_invalid(*backend, make_batch({input}), "decoder_adapter_slot 4 outside");
  input = based;
  input.adapter_slot = 0;
  expect_invalid(*backend, make_batch({input}), "base rows");
  input = forked;
  input.decoder_adapter_slot = 0;
  expect_invalid(*backend, make_batch({input}), "both decoder_adapter_slot");
  input = forked;
  input.forked_adapter_slot = 2;
  expect_invalid(*backend, make_batch({input}), "forked_adapter_slot 2 has no adapter bound");
  input = forked;
  input.adapter_slots = {0, -1, 0};
  expect_invalid(*backend, make_batch({input}), "token 1 has adapter slot -1");
  input = forked;
  input.positions = {0, 1, 5};
  expect_invalid(*backend, make_batch({input}), "expected its KV index 2");
  input = forked;
  input.residual_block_ids = {};
  expect_invalid(*backend, make_batch({input}), "residual blocks cannot hold");
  input = forked;
  input.residual_block_ids = {48};
  expect_invalid(*backend, make_batch({input}), "residual block id 48");
  input = forked;
  input.num_residual_present_tokens = 4;
  expect_invalid(*backend, make_batch({input}), "num_residual_present_tokens 4");
  input = based;
  input.num_kv_present_tokens = -1;
  expect_invalid(*backend, make_batch({input}), "num_kv_present_tokens -1");
  Batch batch = make_batch({forked});
  batch.sequences[0].residual_block_table_offset = 1;
  expect_invalid(*backend, batch, "exceeds residual_block_tables");

  // An adapter whose k/v rank exceeds the rCache's max rank.
  backend->set_adapter(1, test::random_adapter(model.config, 70, {4, 0, 16, 0, 0, 0, 0}, 8.0f));
  input = forked;
  input.adapter_slot = input.forked_adapter_slot = 1;
  expect_invalid(*backend, make_batch({input}), "over the residual cache's max rank 8");

  // No rCache allocated.
  auto bare = make_cpu_backend(model.config, model.weights, {.num_threads = 0, .max_adapter_slots = 4});
  bare->allocate_kv_cache({8, 4});
  bare->set_adapter(0, test::random_adapter(model.config, 70, kAllRanks, 8.0f));
  expect_invalid(*bare, make_batch({forked}), "no residual cache");
  EXPECT_EQ(bare->residual_cache_shape().num_blocks, 0);
  EXPECT_EQ(bare->residual_bytes_per_token(16), model.config.num_layers * 2 * 16 * 4);
  EXPECT_THROW(bare->allocate_residual_cache({0, 4, 8}), Error);
  EXPECT_THROW(bare->allocate_residual_cache({4, 4, 0}), Error);

  // q/k norm: the residual split does not commute with RMSNorm on K.
  const Model qwen3 = make_model(Architecture::kQwen3);
  auto qk_norm_backend = new_backend(qwen3);
  qk_norm_backend->set_adapter(0, test::random_adapter(qwen3.config, 70, kAllRanks, 8.0f));
  test::expect_error([&] { qk_norm_backend->forward(make_batch({forked})); }, ErrorKind::kUnsupported,
                     {"q/k norm"});
  ASSERT_NO_THROW(qk_norm_backend->forward(make_batch({based})));  // base sharing is fine there
}

}  // namespace
}  // namespace loom
