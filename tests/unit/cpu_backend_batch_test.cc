// CPU backend batch handling: KV paging invariances (block size, block order,
// prompt chunking, prefix reuse) and rejection of malformed batches.
#include <gtest/gtest.h>

#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "reference_model.h"
#include "util/error.h"

// SequenceInput is filled with designated initializers, leaving defaults out on purpose.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace loom {
namespace {

using test::make_batch;
using test::max_abs_diff;
using test::SequenceInput;

constexpr int kPromptLength = 21;

class CpuBackendBatch : public ::testing::Test {
 protected:
  CpuBackendBatch()
      : config_(test::tiny_config(Architecture::kLlama)),
        weights_(test::random_weights(config_, 91)),
        prompt_(test::random_tokens(92, kPromptLength, config_.vocab_size)) {}

  std::unique_ptr<Backend> new_backend(int block_size, int num_blocks = 64) {
    auto backend = make_cpu_backend(config_, weights_, {.num_threads = 0, .max_adapter_slots = 2});
    backend->allocate_kv_cache({num_blocks, block_size});
    return backend;
  }

  static std::vector<int32_t> blocks_for(int block_size, int first_block = 0) {
    std::vector<int32_t> ids;
    for (int i = 0; i * block_size < kPromptLength; ++i) ids.push_back(first_block + i);
    return ids;
  }

  // Logits of every prompt token, feeding the prompt in chunks of the given sizes.
  std::vector<float> run_in_chunks(Backend& backend, const std::vector<int>& chunk_sizes,
                                   const std::vector<int32_t>& block_ids) {
    std::vector<float> logits;
    int32_t done = 0;
    for (int chunk : chunk_sizes) {
      SequenceInput input{.tokens = {prompt_.begin() + done, prompt_.begin() + done + chunk},
                          .num_computed_tokens = done, .block_ids = block_ids, .logits_for_all_tokens = true};
      const ForwardResult result = backend.forward(make_batch({input}));
      logits.insert(logits.end(), result.logits.begin(), result.logits.end());
      done += chunk;
    }
    EXPECT_EQ(done, kPromptLength);
    return logits;
  }

  static double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    double worst = 0.0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
      worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
    return worst;
  }

  ModelConfig config_;
  std::shared_ptr<ModelWeights> weights_;
  std::vector<int32_t> prompt_;
};

TEST_F(CpuBackendBatch, ResultsDoNotDependOnBlockSize) {
  auto reference_backend = new_backend(16);
  const std::vector<float> expected = run_in_chunks(*reference_backend, {kPromptLength}, blocks_for(16));
  for (int block_size : {1, 4}) {
    auto backend = new_backend(block_size);
    // Same accumulation order whatever the paging: the logits are bit-identical.
    EXPECT_EQ(run_in_chunks(*backend, {kPromptLength}, blocks_for(block_size)), expected) << block_size;
  }
}

TEST_F(CpuBackendBatch, ResultsDoNotDependOnBlockOrder) {
  auto backend = new_backend(4);
  const std::vector<float> expected = run_in_chunks(*backend, {kPromptLength}, blocks_for(4));
  std::vector<int32_t> shuffled = {40, 3, 17, 63, 8, 22};
  ASSERT_EQ(shuffled.size(), blocks_for(4).size());
  EXPECT_EQ(run_in_chunks(*backend, {kPromptLength}, shuffled), expected);
}

TEST_F(CpuBackendBatch, ResultsDoNotDependOnHowThePromptIsSplit) {
  auto backend = new_backend(4);
  const std::vector<float> whole = run_in_chunks(*backend, {kPromptLength}, blocks_for(4, 0));
  const std::vector<float> chunked = run_in_chunks(*backend, {5, 8, 1, 7}, blocks_for(4, 10));
  const std::vector<float> one_by_one =
      run_in_chunks(*backend, std::vector<int>(kPromptLength, 1), blocks_for(4, 20));
  // Different GEMM shapes round differently; agreement is to float precision.
  EXPECT_LT(max_diff(whole, chunked), 1e-5);
  EXPECT_LT(max_diff(whole, one_by_one), 1e-5);

  std::vector<int32_t> positions(kPromptLength);
  for (int i = 0; i < kPromptLength; ++i) positions[i] = i;
  const auto reference = test::reference_logits(config_, *weights_, prompt_, positions,
                                                std::vector<const LoraAdapter*>(kPromptLength, nullptr));
  for (int i = 0; i < kPromptLength; ++i)
    EXPECT_LT(max_abs_diff(one_by_one.data() + i * config_.vocab_size, reference[i]), 1e-4) << i;
}

TEST_F(CpuBackendBatch, SequenceReusesAnotherSequencesCachedPrefixBlocks) {
  auto backend = new_backend(4);
  const std::vector<float> whole = run_in_chunks(*backend, {kPromptLength}, blocks_for(4, 0));
  // A second request with the same first 12 tokens reads blocks 0-2 as cached
  // and computes the rest into its own blocks, in a batch with an unrelated sequence.
  std::vector<int32_t> table = {0, 1, 2, 30, 31, 32};
  SequenceInput suffix{.tokens = {prompt_.begin() + 12, prompt_.end()}, .num_computed_tokens = 12,
                       .block_ids = table, .logits_for_all_tokens = true};
  SequenceInput other{.tokens = {5, 6, 7}, .block_ids = {50}};
  const ForwardResult result = backend->forward(make_batch({other, suffix}));
  ASSERT_EQ(result.logit_token_index.size(), 1u + (kPromptLength - 12));
  EXPECT_EQ(result.logit_token_index.front(), 2);
  EXPECT_EQ(result.logit_token_index[1], 3);
  const std::vector<float> suffix_logits(result.logits.begin() + config_.vocab_size, result.logits.end());
  const std::vector<float> expected(whole.begin() + 12 * config_.vocab_size, whole.end());
  EXPECT_LT(max_diff(suffix_logits, expected), 1e-5);
}

TEST_F(CpuBackendBatch, EmptyBatchGivesNoLogits) {
  auto backend = new_backend(4);
  const ForwardResult result = backend->forward(Batch{});
  EXPECT_TRUE(result.logits.empty());
  EXPECT_TRUE(result.logit_token_index.empty());
}

void expect_invalid(Backend& backend, const Batch& batch, const std::string& message_part) {
  try {
    backend.forward(batch);
    ADD_FAILURE() << "expected an error mentioning '" << message_part << "'";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kInvalidArgument) << error.what();
    EXPECT_NE(error.message().find(message_part), std::string::npos) << error.what();
  }
}

TEST_F(CpuBackendBatch, RejectsMalformedBatchesWithoutTouchingTheCache) {
  auto backend = new_backend(4, 8);
  const std::vector<float> before = run_in_chunks(*backend, {kPromptLength}, blocks_for(4, 0));
  const SequenceInput good{.tokens = {1, 2, 3, 4, 5}, .block_ids = {6, 7}};

  Batch batch = make_batch({good});
  batch.block_tables[1] = 8;  // == num_blocks
  expect_invalid(*backend, batch, "block id 8");
  batch.block_tables[1] = -1;
  expect_invalid(*backend, batch, "block id -1");

  batch = make_batch({{.tokens = {1, 2, 3, 4, 5}, .block_ids = {6}}});  // 5 tokens, 4 slots
  expect_invalid(*backend, batch, "cannot hold");
  batch = make_batch({good});
  batch.sequences[0].block_table_offset = 1;
  expect_invalid(*backend, batch, "exceeds block_tables");

  batch = make_batch({good});
  batch.positions.pop_back();
  expect_invalid(*backend, batch, "differ in size");
  batch = make_batch({good});
  batch.adapter_slots.push_back(-1);
  expect_invalid(*backend, batch, "differ in size");
  batch = make_batch({good});
  batch.positions[2] = -4;
  expect_invalid(*backend, batch, "negative position");

  batch = make_batch({good});
  batch.token_ids[0] = config_.vocab_size;
  expect_invalid(*backend, batch, "outside the vocabulary");
  batch = make_batch({good});
  batch.token_ids[0] = -1;
  expect_invalid(*backend, batch, "outside the vocabulary");

  batch = make_batch({good, good});
  batch.sequences[1].token_offset = 2;  // overlaps sequence 0
  expect_invalid(*backend, batch, "back to back");
  batch = make_batch({good});
  batch.sequences[0].num_new_tokens = 4;  // token 4 belongs to no sequence
  expect_invalid(*backend, batch, "cover 4 tokens");
  batch = make_batch({good});
  batch.sequences[0].num_new_tokens = 6;
  expect_invalid(*backend, batch, "exceed");
  batch = make_batch({good});
  batch.sequences[0].num_computed_tokens = -1;
  expect_invalid(*backend, batch, "num_computed_tokens");
  batch = make_batch({good, good});
  batch.sequences[1].num_new_tokens = 0;
  expect_invalid(*backend, batch, "num_new_tokens");

  batch = make_batch({{.tokens = {1, 2, 3}, .adapter_slot = 2, .block_ids = {6}}});  // 2 slots
  expect_invalid(*backend, batch, "adapter slot 2");
  batch = make_batch({{.tokens = {1, 2, 3}, .adapter_slot = -2, .block_ids = {6}}});
  expect_invalid(*backend, batch, "adapter slot -2");
  batch = make_batch({{.tokens = {1, 2, 3}, .adapter_slot = 1, .block_ids = {6}}});
  expect_invalid(*backend, batch, "no adapter bound");

  // None of the rejected batches wrote KV: re-reading the prompt's blocks as
  // cached gives the same last-token logits as before.
  const SequenceInput last{.tokens = {prompt_.back()}, .num_computed_tokens = kPromptLength - 1,
                           .block_ids = blocks_for(4, 0)};
  const ForwardResult result = backend->forward(make_batch({last}));
  const std::vector<float> expected(before.end() - config_.vocab_size, before.end());
  EXPECT_LT(max_diff(result.logits, expected), 1e-5);
}

TEST_F(CpuBackendBatch, RejectsForwardBeforeTheCacheExistsAndBadCacheShapes) {
  auto backend = make_cpu_backend(config_, weights_);
  expect_invalid(*backend, make_batch({{.tokens = {1}, .block_ids = {0}}}), "not allocated");
  EXPECT_THROW(backend->allocate_kv_cache({0, 16}), Error);
  EXPECT_THROW(backend->allocate_kv_cache({4, 0}), Error);
}

}  // namespace
}  // namespace loom
