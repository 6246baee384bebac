// TensorParallelBackend::forward with scripted ranks: slices of the vocabulary
// joined in rank order on the host, and a group whose ranks make their logits
// whole themselves (CUDA's VocabGather) passing rank 0's result through as it
// is, its device draws included.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "backend/tensor_parallel_backend.h"
#include "engine_test_util.h"
#include "model/tensor_parallel.h"
#include "scheduler_fake_backend.h"
#include "synthetic/synthetic_model.h"

namespace loom {
namespace {

// A rank whose forward returns `result` whatever the batch.
class ScriptedRank final : public test::ForwardingBackend {
 public:
  explicit ScriptedRank(ForwardResult result)
      : ForwardingBackend(std::make_unique<test::FakeBackend>()), result_(std::move(result)) {}
  ForwardResult forward(const Batch&) override { return result_; }

 private:
  ForwardResult result_;
};

constexpr int kRows = 3;

std::unique_ptr<Backend> group_of(const ModelConfig& config, const std::vector<ForwardResult>& results) {
  std::vector<TensorParallelShard> shards;
  std::vector<std::unique_ptr<Backend>> ranks;
  for (size_t r = 0; r < results.size(); ++r) {
    shards.push_back(tensor_parallel_shard(config, static_cast<int32_t>(r), static_cast<int32_t>(results.size())));
    ranks.push_back(std::make_unique<ScriptedRank>(results[r]));
  }
  TensorParallelGroup group{[](int32_t) {}, [] {}, nullptr, ""};
  return std::make_unique<TensorParallelBackend>(config, std::move(shards), std::move(ranks), std::move(group));
}

TEST(TensorParallelBackend, JoinsTheRanksVocabularySlicesInRankOrder) {
  const ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  std::vector<ForwardResult> results(2);
  for (int32_t r = 0; r < 2; ++r) {
    const TensorParallelShard shard = tensor_parallel_shard(config, r, 2);
    ForwardResult& part = results[r];
    part.vocab_size = shard.vocab_slice();
    part.logit_token_index = {0, 1, 2};
    for (int row = 0; row < kRows; ++row)
      for (int32_t i = 0; i < shard.vocab_slice(); ++i)
        part.logits.push_back(static_cast<float>(row * 100000 + shard.vocab_begin + i));
  }
  const ForwardResult whole = group_of(config, results)->forward(Batch{});
  ASSERT_EQ(whole.vocab_size, config.vocab_size);
  ASSERT_EQ(whole.logits.size(), static_cast<size_t>(kRows) * config.vocab_size);
  for (int row = 0; row < kRows; ++row)
    for (int32_t i = 0; i < config.vocab_size; ++i)
      ASSERT_EQ(whole.logits[static_cast<size_t>(row) * config.vocab_size + i], static_cast<float>(row * 100000 + i))
          << "row " << row << " token " << i;
}

TEST(TensorParallelBackend, RanksThatGatherOnTheDevicePassRankZerosResultThrough) {
  const ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  std::vector<ForwardResult> results(2);
  for (ForwardResult& part : results) {
    part.vocab_size = config.vocab_size;  // whole rows: the ranks gathered their slices
    part.logit_token_index = {0, 1, 2};
    part.sampled_token_ids = {7, -1, 9};  // the middle row came back as logits
    part.sampled_logprobs = {-0.5f, 0.0f, -1.5f};
  }
  for (int32_t i = 0; i < config.vocab_size; ++i) results[0].logits.push_back(static_cast<float>(3 * i));
  // Rank 1 copies nothing back; what it would hold is not read.
  const ForwardResult got = group_of(config, results)->forward(Batch{});
  EXPECT_EQ(got.vocab_size, config.vocab_size);
  EXPECT_EQ(got.logits, results[0].logits);
  EXPECT_EQ(got.sampled_token_ids, results[0].sampled_token_ids);
  EXPECT_EQ(got.sampled_logprobs, results[0].sampled_logprobs);
  EXPECT_EQ(got.logit_token_index, results[0].logit_token_index);
}

}  // namespace
}  // namespace loom
