// The CUDA backend's host tier (host_kv_tier.h): random KV blocks device ->
// pinned host -> other device blocks, bit-exact, copied from worker threads;
// a decode over the moved blocks gives the same logits; bad ids and the rCache
// pool are refused.
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "cuda_test_util.h"
#include "synthetic/synthetic_model.h"
#include "test_util.h"
#include "util/prng.h"

namespace loom::cuda {
namespace {

constexpr int kNumBlocks = 12;
constexpr int kBlockSize = 16;
constexpr int kNumHostBlocks = 5;

std::vector<uint16_t> download_pool(const CudaBackend& backend, size_t count) {
  std::vector<uint16_t> bits(count);
  LOOM_CUDA_CHECK(cudaMemcpy(bits.data(), backend.k_pool(0), count * sizeof(uint16_t), cudaMemcpyDeviceToHost));
  return bits;
}

// Runs the copy on a thread of its own, as the transfer worker does.
void copy_on_thread(Backend& backend, KvCopyDirection direction, const std::vector<int32_t>& device_blocks,
                    const std::vector<int32_t>& host_blocks) {
  std::exception_ptr error;
  std::thread worker([&] {
    try {
      backend.copy_kv_blocks(KvPoolKind::kMain, direction, device_blocks, host_blocks);
    } catch (...) {
      error = std::current_exception();
    }
  });
  worker.join();
  if (error) std::rethrow_exception(error);
}

TEST(CudaHostKvTier, RandomBlocksRoundTripBitExact) {
  LOOM_REQUIRE_GPU();
  const ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  auto owner = make_synthetic_cuda_backend(config, 1, false);
  auto& backend = static_cast<CudaBackend&>(*owner);
  backend.allocate_kv_cache({kNumBlocks, kBlockSize});
  backend.allocate_host_kv_cache(KvPoolKind::kMain, kNumHostBlocks);
  EXPECT_EQ(backend.num_host_kv_blocks(KvPoolKind::kMain), kNumHostBlocks);
  EXPECT_EQ(backend.num_host_kv_blocks(KvPoolKind::kResidual), 0);

  // Every layer's K and V pool, back to back: [2 * layers][blocks][block elements].
  const size_t block_elements = static_cast<size_t>(kBlockSize) * config.kv_size();
  const size_t num_arrays = 2 * static_cast<size_t>(config.num_layers);
  const size_t pool_elements = num_arrays * kNumBlocks * block_elements;
  ASSERT_EQ(backend.v_pool(config.num_layers - 1) + kNumBlocks * block_elements, backend.k_pool(0) + pool_elements);
  Prng prng(11);
  std::vector<uint16_t> original(pool_elements);
  for (uint16_t& bits : original) bits = static_cast<uint16_t>(prng.next_below(1 << 16));
  LOOM_CUDA_CHECK(cudaMemcpy(backend.k_pool(0), original.data(), pool_elements * sizeof(uint16_t),
                             cudaMemcpyHostToDevice));
  // A pageable upload may return before it lands, and the tier copies on a non-blocking stream that
  // does not wait for the legacy one: the engine's forward ends synchronised, so must this.
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());

  const std::vector<int32_t> from = {3, 7, 10}, host = {4, 0, 2}, to = {1, 5, 11};
  copy_on_thread(backend, KvCopyDirection::kDeviceToHost, from, host);
  // Scribble over the source blocks: the way back must come from the host copy.
  LOOM_CUDA_CHECK(cudaMemset(backend.k_pool(0), 0, pool_elements * sizeof(uint16_t)));
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());  // cudaMemset is asynchronous to the host
  std::vector<uint16_t> expected(pool_elements, 0);
  copy_on_thread(backend, KvCopyDirection::kHostToDevice, to, host);

  for (size_t array = 0; array < num_arrays; ++array)
    for (size_t i = 0; i < from.size(); ++i)
      std::memcpy(expected.data() + (array * kNumBlocks + to[i]) * block_elements,
                  original.data() + (array * kNumBlocks + from[i]) * block_elements, block_elements * sizeof(uint16_t));
  const std::vector<uint16_t> result = download_pool(backend, pool_elements);
  size_t num_different = 0;
  for (size_t i = 0; i < pool_elements; ++i) num_different += result[i] != expected[i];
  EXPECT_EQ(num_different, 0u);
}

TEST(CudaHostKvTier, DecodeOverMovedBlocksGivesTheSameLogits) {
  LOOM_REQUIRE_GPU();
  const ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  auto backend = make_synthetic_cuda_backend(config, 2, false);
  backend->allocate_kv_cache({kNumBlocks, kBlockSize});
  backend->allocate_host_kv_cache(KvPoolKind::kMain, kNumHostBlocks);
  const int kPrompt = 40;  // three blocks, the last partly filled
  auto make_step = [&](const std::vector<int32_t>& blocks, int first, int count) {
    Batch batch;
    BatchSequence sequence;
    sequence.num_computed_tokens = first;
    sequence.num_new_tokens = count;
    sequence.num_blocks = static_cast<int32_t>(blocks.size());
    batch.sequences = {sequence};
    batch.block_tables = blocks;
    for (int t = first; t < first + count; ++t) {
      batch.token_ids.push_back((t * 7 + 3) % config.vocab_size);
      batch.positions.push_back(t);
      batch.adapter_slots.push_back(-1);
    }
    return batch;
  };
  const std::vector<int32_t> original = {6, 2, 9}, host = {1, 3, 0}, moved = {4, 10, 7}, empty = {0, 5, 8};
  backend->forward(make_step(original, 0, kPrompt));
  copy_on_thread(*backend, KvCopyDirection::kDeviceToHost, original, host);
  copy_on_thread(*backend, KvCopyDirection::kHostToDevice, moved, host);
  const std::vector<float> with_original = backend->forward(make_step(original, kPrompt, 1)).logits;
  const std::vector<float> with_moved = backend->forward(make_step(moved, kPrompt, 1)).logits;
  const std::vector<float> with_empty = backend->forward(make_step(empty, kPrompt, 1)).logits;
  EXPECT_EQ(with_moved, with_original);  // same kernels over the same bits (no atomics in attention)
  EXPECT_NE(with_empty, with_original);
}

TEST(CudaHostKvTier, RefusesBadIdsAndPoolsNotAllocated) {
  LOOM_REQUIRE_GPU();
  const ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  auto backend = make_synthetic_cuda_backend(config, 1, false);
  backend->allocate_kv_cache({kNumBlocks, kBlockSize});
  const std::vector<int32_t> one = {0};
  loom::test::expect_error(
      [&] { backend->copy_kv_blocks(KvPoolKind::kMain, KvCopyDirection::kDeviceToHost, one, one); },
      ErrorKind::kInvalidArgument, {"no host KV pool"});
  backend->allocate_host_kv_cache(KvPoolKind::kMain, kNumHostBlocks);
  const std::vector<int32_t> bad_device = {0, kNumBlocks}, bad_host = {0, kNumHostBlocks}, two = {0, 1};
  loom::test::expect_error(
      [&] { copy_on_thread(*backend, KvCopyDirection::kDeviceToHost, bad_device, two); },
      ErrorKind::kInvalidArgument, {"device block 12", "pool of 12"});
  loom::test::expect_error(
      [&] { copy_on_thread(*backend, KvCopyDirection::kHostToDevice, two, bad_host); },
      ErrorKind::kInvalidArgument, {"host block 5", "pool of 5"});
  loom::test::expect_error(
      [&] { backend->copy_kv_blocks(KvPoolKind::kMain, KvCopyDirection::kHostToDevice, two, one); },
      ErrorKind::kInvalidArgument, {"2 device blocks to 1 host blocks"});
  // The rCache's host pool needs its device pool first (round trips: cuda_sharing_test.cc).
  loom::test::expect_error([&] { backend->allocate_host_kv_cache(KvPoolKind::kResidual, 4); },
                           ErrorKind::kInvalidArgument, {"host residual pool before its device pool"});
  loom::test::expect_error(
      [&] { backend->copy_kv_blocks(KvPoolKind::kResidual, KvCopyDirection::kDeviceToHost, one, one); },
      ErrorKind::kInvalidArgument, {"no host residual pool"});
  // Another block size since: the host layout no longer matches.
  backend->allocate_kv_cache({kNumBlocks, 2 * kBlockSize});
  loom::test::expect_error(
      [&] { backend->copy_kv_blocks(KvPoolKind::kMain, KvCopyDirection::kDeviceToHost, one, one); },
      ErrorKind::kInvalidArgument, {"reallocate"});
}

}  // namespace
}  // namespace loom::cuda
