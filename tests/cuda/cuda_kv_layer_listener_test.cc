// Per-layer KV notifications on CUDA (backend.h KvLayerListener, for the
// device-to-device KV plane of docs/disaggregation.md): a step with a listener
// tells it once per layer, in order, with an event after which that layer's
// K/V in the pool is final; a copy stream waiting on the event reads exactly
// what the pool holds after the step. The step's logits equal a step without a
// listener, and kv_pool_memory() names the pools' arrays.
#include <vector>

#include <gtest/gtest.h>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "cuda_model_test_util.h"
#include "cuda_test_util.h"
#include "synthetic/synthetic_model.h"

namespace loom::cuda {
namespace {

constexpr int kBlocks = 64, kBlockSize = 16;

// Snapshots each layer's K array as soon as its event fires, on its own stream.
class SnapshotListener final : public KvLayerListener {
 public:
  SnapshotListener(const KvPoolMemory& memory, size_t array_bytes) : memory_(memory), array_bytes_(array_bytes) {
    LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    snapshots_.assign(memory.num_layers(), std::vector<uint8_t>(array_bytes));
  }
  ~SnapshotListener() override { cudaStreamDestroy(stream_); }

  void layer_written(int32_t layer, const KvLayerFence& fence) override {
    layers_.push_back(layer);
    events_non_null_ = events_non_null_ && fence.event != nullptr;
    LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(fence.event)));
    LOOM_CUDA_CHECK(cudaMemcpyAsync(snapshots_[layer].data(), memory_.arrays[layer * memory_.arrays_per_layer],
                                    array_bytes_, cudaMemcpyDeviceToHost, stream_));
  }

  void wait() { LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  const std::vector<int32_t>& layers() const { return layers_; }
  bool events_non_null() const { return events_non_null_; }
  const std::vector<uint8_t>& snapshot(int layer) const { return snapshots_[layer]; }

 private:
  KvPoolMemory memory_;
  size_t array_bytes_;
  cudaStream_t stream_ = nullptr;
  std::vector<std::vector<uint8_t>> snapshots_;  // pageable: the copies are synchronous to the host, still ordered
  std::vector<int32_t> layers_;
  bool events_non_null_ = true;
};

TEST(CudaKvLayerListener, EachLayerIsFinalWhenItsEventFires) {
  LOOM_REQUIRE_GPU();
  const ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  auto listened = make_synthetic_cuda_backend_impl(config, 3, false);
  auto plain = make_synthetic_cuda_backend_impl(config, 3, false);
  for (CudaBackend* backend : {listened.get(), plain.get()}) backend->allocate_kv_cache({kBlocks, kBlockSize});

  const KvPoolMemory memory = listened->kv_pool_memory(KvPoolKind::kMain);
  EXPECT_EQ(memory.kind, KvPoolMemory::Kind::kCuda);
  EXPECT_EQ(memory.arrays_per_layer, 2);
  ASSERT_EQ(memory.num_layers(), config.num_layers);
  EXPECT_EQ(memory.num_blocks, kBlocks);
  EXPECT_EQ(memory.bytes_per_block, static_cast<int64_t>(kBlockSize) * listened->kv_bytes_per_token() /
                                        (2 * config.num_layers));
  for (int layer = 0; layer < config.num_layers; ++layer) {
    EXPECT_EQ(static_cast<void*>(memory.arrays[2 * layer]), static_cast<void*>(listened->k_pool(layer)));
    EXPECT_EQ(static_cast<void*>(memory.arrays[2 * layer + 1]), static_cast<void*>(listened->v_pool(layer)));
  }
  EXPECT_TRUE(listened->kv_pool_memory(KvPoolKind::kResidual).empty());  // no rCache pool allocated

  const size_t array_bytes = static_cast<size_t>(memory.bytes_per_block) * kBlocks;
  test::Driver driver(kBlocks, kBlockSize, 9);
  const int a = driver.add_sequence(), b = driver.add_sequence();
  const std::vector<Batch> steps = {
      driver.make_batch({{a, driver.random_tokens(200, config.vocab_size), std::vector<int32_t>(200, -1), false},
                         {b, driver.random_tokens(37, config.vocab_size), std::vector<int32_t>(37, -1), false}}),
      driver.make_batch({{a, {3}, {-1}, false}, {b, {4}, {-1}, false}})};  // a decode step: no graph with a listener
  for (const Batch& step : steps) {
    SnapshotListener listener(memory, array_bytes);
    Batch with_listener = step;
    with_listener.kv_layer_listener = &listener;
    const int64_t replays = listened->graph_stats().replays;
    const ForwardResult got = listened->forward(with_listener);
    const ForwardResult expected = plain->forward(step);
    listener.wait();
    EXPECT_EQ(got.logits, expected.logits);
    EXPECT_EQ(listened->graph_stats().replays, replays);
    std::vector<int32_t> in_order(config.num_layers);
    for (int layer = 0; layer < config.num_layers; ++layer) in_order[layer] = layer;
    EXPECT_EQ(listener.layers(), in_order);
    EXPECT_TRUE(listener.events_non_null());
    for (int layer = 0; layer < config.num_layers; ++layer) {
      std::vector<uint8_t> final_pool(array_bytes);
      LOOM_CUDA_CHECK(cudaMemcpy(final_pool.data(), memory.arrays[2 * layer], array_bytes, cudaMemcpyDeviceToHost));
      EXPECT_EQ(listener.snapshot(layer), final_pool) << "layer " << layer << ": K read at its event";
    }
  }
}

}  // namespace
}  // namespace loom::cuda
