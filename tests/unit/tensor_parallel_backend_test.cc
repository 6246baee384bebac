// TensorParallelBackend::forward with scripted ranks: slices of the vocabulary
// joined in rank order on the host, and a group whose ranks make their logits
// whole themselves (CUDA's VocabGather) passing rank 0's result through as it
// is, its device draws included; the ranks' per-layer KV notifications joined
// into one per layer (every rank's event), and their pools seen as one.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
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

// A rank that reports each layer's KV written from its own thread (rank 1 a little behind rank 0, then ahead)
// with a fence naming it, and whose pools are `arrays_per_layer` fake arrays per layer in one allocation.
class LayerReportingRank final : public test::ForwardingBackend {
 public:
  LayerReportingRank(int32_t rank, int32_t num_layers)
      : ForwardingBackend(std::make_unique<test::FakeBackend>()), rank_(rank), num_layers_(num_layers) {}
  BackendCapabilities capabilities() const override {
    BackendCapabilities capabilities = ForwardingBackend::capabilities();
    capabilities.kv_layer_notifications = true;
    return capabilities;
  }
  ForwardResult forward(const Batch& batch) override {
    for (int32_t layer = 0; layer < num_layers_; ++layer) {
      if ((layer < num_layers_ / 2) == (rank_ == 1)) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      KvLayerFence fence;
      fence.event = event(rank_, layer);
      fence.rank = rank_;
      if (batch.kv_layer_listener != nullptr) batch.kv_layer_listener->layer_written(layer, fence);
    }
    return {};
  }
  KvPoolMemory kv_pool_memory(KvPoolKind) override {
    KvPoolMemory pool;
    pool.kind = KvPoolMemory::Kind::kCuda;
    pool.device = rank_ + 4;
    pool.devices = {rank_ + 4};
    pool.arrays_per_layer = 2;
    pool.num_blocks = 8;
    pool.bytes_per_block = 64;
    pool.allocations = {base()};
    for (int32_t a = 0; a < 2 * num_layers_; ++a) pool.arrays.push_back(base() + a * 8 * 64);
    return pool;
  }
  static void* event(int32_t rank, int32_t layer) { return reinterpret_cast<void*>(uintptr_t{1000} * (rank + 1) + layer); }
  std::byte* base() { return reinterpret_cast<std::byte*>(uintptr_t{1} << (40 + rank_)); }

 private:
  const int32_t rank_, num_layers_;
};

class RecordingListener final : public KvLayerListener {
 public:
  // Not thread-safe on purpose (as the engine's DeviceKvSender): the group must call it one call at a time.
  void layer_written(int32_t layer, const KvLayerFence& fence) override {
    if (inside_.fetch_add(1) != 0) overlapped = true;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    calls.push_back({layer, fence});
    inside_.fetch_sub(1);
  }
  std::vector<std::pair<int32_t, KvLayerFence>> calls;
  std::atomic<bool> overlapped{false};

 private:
  std::atomic<int> inside_{0};
};

TEST(TensorParallelBackend, TellsOfEachLayerOnceEveryRankWroteItWithEveryRanksEvent) {
  const ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  const int32_t layers = config.num_layers;
  std::vector<TensorParallelShard> shards;
  std::vector<std::unique_ptr<Backend>> ranks;
  for (int32_t r = 0; r < 2; ++r) {
    shards.push_back(tensor_parallel_shard(config, r, 2));
    ranks.push_back(std::make_unique<LayerReportingRank>(r, layers));
  }
  TensorParallelBackend group(config, std::move(shards), std::move(ranks), {[](int32_t) {}, [] {}, nullptr, ""});
  EXPECT_TRUE(group.capabilities().kv_layer_notifications);

  RecordingListener listener;
  Batch batch;
  batch.kv_layer_listener = &listener;
  group.forward(batch);
  ASSERT_EQ(listener.calls.size(), static_cast<size_t>(layers));
  EXPECT_FALSE(listener.overlapped);
  for (int32_t layer = 0; layer < layers; ++layer) {
    const auto& [told, fence] = listener.calls[static_cast<size_t>(layer)];
    EXPECT_EQ(told, layer);  // in layer order
    EXPECT_EQ(fence.num_ranks, 2);
    EXPECT_EQ(fence.rank_events[0], LayerReportingRank::event(0, layer));
    EXPECT_EQ(fence.rank_events[1], LayerReportingRank::event(1, layer));
  }
  group.forward(Batch{});  // no listener: nothing told
  EXPECT_EQ(listener.calls.size(), static_cast<size_t>(layers));

  // The pools as one: a layer's arrays rank after rank, each rank's device and allocation.
  const KvPoolMemory pool = group.kv_pool_memory(KvPoolKind::kMain);
  EXPECT_EQ(pool.num_ranks, 2);
  EXPECT_EQ(pool.arrays_per_layer, 4);
  EXPECT_EQ(pool.num_layers(), layers);
  EXPECT_EQ(pool.devices, (std::vector<int32_t>{4, 5}));
  ASSERT_EQ(pool.allocations.size(), 2u);
  const std::byte* rank0 = pool.allocations[0];
  const std::byte* rank1 = pool.allocations[1];
  for (int32_t layer = 0; layer < layers; ++layer)
    for (int32_t a = 0; a < 4; ++a) {
      const size_t index = static_cast<size_t>(layer * 4 + a);
      const int32_t rank = a / 2;
      EXPECT_EQ(pool.rank_of_array(index), rank);
      EXPECT_EQ(pool.arrays[index], (rank == 0 ? rank0 : rank1) + (layer * 2 + a % 2) * 8 * 64);
    }
}

}  // namespace
}  // namespace loom
