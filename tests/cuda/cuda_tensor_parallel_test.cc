// Tensor parallelism on the CUDA backend (backend/cuda/tensor_parallel_cuda_backend.h)
// with its ranks on one GPU, joined by a test communicator (SameDeviceGroup
// below: event waits across the ranks' streams and a cuBLAS sum in rank order):
// the sharding itself (heads, kv heads split and replicated, the vocab-parallel
// embedding and lm_head, LoRA shards, every sharing mode in one batch) gives
// the logits of the unsharded backend. The same checks over NCCL (rank r on
// GPU r, nccl_group.h) run where there are GPUs enough; a one-rank NCCL group
// runs on one GPU (the library, graph capture of its all-reduce, abort).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <cublas_v2.h>
#include <gtest/gtest.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_communicator.h"
#include "backend/cuda/nccl_group.h"
#include "backend/cuda/tensor_parallel_cuda_backend.h"
#include "cuda_model_test_util.h"
#include "cuda_test_util.h"
#include "formats/safetensors.h"
#include "model/weights.h"
#include "nccl/nccl_library.h"
#include "synthetic/synthetic_model.h"
#include "synthetic/synthetic_weights.h"
#include "test_util.h"
#include "util/abortable_barrier.h"

namespace loom::cuda {
namespace {

using test::Driver;
using Mode = test::SharingMode;

// Ranks sharing device 0. all_reduce_sum: each rank publishes its buffer and
// an event, waits (on its stream) for every rank's, sums the buffers in rank
// order into its scratch, waits until every rank has read, then copies the sum
// back. Not capturable (the waits cross the ranks' streams).
class SameDeviceGroup {
 public:
  explicit SameDeviceGroup(int32_t size) : barrier_(size), buffers_(size), ready_(size), read_(size) {
    for (int32_t r = 0; r < size; ++r) {
      LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&ready_[r], cudaEventDisableTiming));
      LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&read_[r], cudaEventDisableTiming));
      ranks_.push_back(std::make_unique<Rank>(*this, r));
    }
  }
  ~SameDeviceGroup() {
    ranks_.clear();
    for (cudaEvent_t event : ready_) cudaEventDestroy(event);
    for (cudaEvent_t event : read_) cudaEventDestroy(event);
  }
  std::vector<DeviceCommunicator*> communicators() {
    std::vector<DeviceCommunicator*> pointers;
    for (auto& rank : ranks_) pointers.push_back(rank.get());
    return pointers;
  }
  AbortableBarrier& barrier() { return barrier_; }

 private:
  class Rank final : public DeviceCommunicator {
   public:
    Rank(SameDeviceGroup& group, int32_t rank) : group_(group), rank_(rank) {
      if (cublasCreate(&cublas_) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasCreate failed");
    }
    ~Rank() override { cublasDestroy(cublas_); }
    void all_reduce_sum(float* data, int64_t count, cudaStream_t stream) override {
      const int32_t size = group_.barrier_.size();
      group_.buffers_[rank_] = data;
      LOOM_CUDA_CHECK(cudaEventRecord(group_.ready_[rank_], stream));
      group_.barrier_.arrive_and_wait();
      for (int32_t r = 0; r < size; ++r) LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream, group_.ready_[r], 0));
      scratch_.reserve(count * sizeof(float));
      LOOM_CUDA_CHECK(cudaMemcpyAsync(scratch_.data(), group_.buffers_[0], count * sizeof(float),
                                      cudaMemcpyDeviceToDevice, stream));
      cublasSetStream(cublas_, stream);
      const float one = 1.0f;
      for (int32_t r = 1; r < size; ++r)
        if (cublasSaxpy(cublas_, static_cast<int>(count), &one, group_.buffers_[r], 1, scratch_.as<float>(), 1) !=
            CUBLAS_STATUS_SUCCESS)
          throw std::runtime_error("cublasSaxpy failed");
      LOOM_CUDA_CHECK(cudaEventRecord(group_.read_[rank_], stream));
      group_.barrier_.arrive_and_wait();
      for (int32_t r = 0; r < size; ++r) LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream, group_.read_[r], 0));
      LOOM_CUDA_CHECK(
          cudaMemcpyAsync(data, scratch_.data(), count * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    }
    // Each rank publishes its send buffer, copies every rank's into its receive
    // buffer once all are ready, and returns its buffer to use only when every
    // rank has read it.
    void all_gather(const float* send, float* receive, int64_t count, cudaStream_t stream) override {
      const int32_t size = group_.barrier_.size();
      group_.buffers_[rank_] = const_cast<float*>(send);
      LOOM_CUDA_CHECK(cudaEventRecord(group_.ready_[rank_], stream));
      group_.barrier_.arrive_and_wait();
      for (int32_t r = 0; r < size; ++r) {
        LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream, group_.ready_[r], 0));
        LOOM_CUDA_CHECK(cudaMemcpyAsync(receive + r * count, group_.buffers_[r], count * sizeof(float),
                                        cudaMemcpyDeviceToDevice, stream));
      }
      LOOM_CUDA_CHECK(cudaEventRecord(group_.read_[rank_], stream));
      group_.barrier_.arrive_and_wait();
      for (int32_t r = 0; r < size; ++r) LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream, group_.read_[r], 0));
    }
    bool capturable() const override { return false; }

   private:
    SameDeviceGroup& group_;
    const int32_t rank_;
    cublasHandle_t cublas_ = nullptr;
    DeviceBuffer scratch_;
  };

  AbortableBarrier barrier_;
  std::vector<float*> buffers_;
  std::vector<cudaEvent_t> ready_, read_;
  std::vector<std::unique_ptr<Rank>> ranks_;
};

constexpr int kBlockSize = 16;
constexpr int kNumBlocks = 256;

struct Sharded {
  std::shared_ptr<void> group;
  std::unique_ptr<Backend> backend;
};

// Ranks on one device joined by SameDeviceGroup (kSameDevice), or rank r on
// GPU r joined by NCCL (kNccl: the production group, nccl_group.h).
enum class Joined { kSameDevice, kNccl };

// `size` ranks on device 0 joined by a SameDeviceGroup; make(devices, communicators, hooks) builds the group.
template <typename Make>
Sharded on_one_device(int32_t size, Make make) {
  Sharded sharded;
  auto group = std::make_shared<SameDeviceGroup>(size);
  sharded.group = group;
  const std::vector<int> devices(size, 0);
  const std::vector<DeviceCommunicator*> communicators = group->communicators();
  SameDeviceGroup* raw = group.get();
  sharded.backend = make(devices, communicators,
                         TensorParallelGroup{[raw](int32_t failed) { raw->barrier().abort(failed); },
                                             [raw] { raw->barrier().reset(); }, group, AbortableBarrier::kAbortedPrefix});
  return sharded;
}

Sharded make_sharded(const ModelConfig& config, const ModelWeights& weights, int32_t size,
                     Joined joined = Joined::kSameDevice, const CudaBackendConfig& backend_config = {}) {
  Sharded sharded;
  if (joined == Joined::kNccl) {
    std::vector<int> devices;
    for (int32_t r = 0; r < size; ++r) devices.push_back(r);
    auto group = std::make_shared<NcclGroup>(devices);
    sharded.group = group;
    sharded.backend = make_tensor_parallel_cuda_backend(config, weights, backend_config, devices,
                                                        group->communicators(), nccl_tensor_parallel_group(group));
    return sharded;
  }
  return on_one_device(size, [&](std::span<const int> devices, std::span<DeviceCommunicator* const> communicators,
                                 TensorParallelGroup hooks) {
    return make_tensor_parallel_cuda_backend(config, weights, backend_config, devices, communicators, std::move(hooks));
  });
}

// Ranks on one device, each drawing its own slices of the synthetic model of
// `config` and `seed` (make_synthetic_tensor_parallel_cuda_backend).
Sharded make_sharded_synthetic(const ModelConfig& config, uint64_t seed, int32_t size) {
  return on_one_device(size, [&](std::span<const int> devices, std::span<DeviceCommunicator* const> communicators,
                                 TensorParallelGroup hooks) {
    return make_synthetic_tensor_parallel_cuda_backend(config, seed, false, {}, devices, communicators,
                                                       std::move(hooks));
  });
}

using test::visible_gpus;

// Every sharing mode and the base model in one batch, prefill then decode, at
// every size in `sizes` the model splits into: the sharded logits are the
// unsharded ones (both on the GPU: only the order of the partial sums differs).
void expect_every_mode_unsharded(Architecture arch, Joined joined, std::vector<int32_t> sizes) {
  const ModelConfig config = synthetic_model_config(arch, SyntheticPreset::kTiny);
  const bool forked = !config.qk_norm;
  const auto weights = test::tiny_weights(config, 31, false);
  SyntheticModelOptions options;
  options.arch = arch;
  options.num_adapters = 4;
  options.rank = 8;
  const std::vector<SyntheticAdapterSpec> specs = synthetic_adapter_specs(options, config);
  auto prepare = [&](Backend& backend) {
    backend.allocate_kv_cache({kNumBlocks, kBlockSize});
    if (forked) backend.allocate_residual_cache({kNumBlocks, kBlockSize, 8});
    for (int slot = 0; slot < 4; ++slot)
      backend.set_adapter(slot, std::make_shared<LoraAdapter>(make_synthetic_adapter(specs[slot], config, 31)));
  };
  auto whole = make_cuda_backend(config, *weights);
  prepare(*whole);
  std::vector<std::pair<int32_t, Sharded>> groups;
  for (int32_t size : sizes) {
    try {
      check_tensor_parallel_size(config, size);
    } catch (const Error&) {
      continue;  // e.g. qwen2's 6 heads over 4 ranks
    }
    groups.emplace_back(size, make_sharded(config, *weights, size, joined));
    prepare(*groups.back().second.backend);
    EXPECT_EQ(groups.back().second.backend->capabilities().tensor_parallel_size, size);
  }
  ASSERT_FALSE(groups.empty());

  Driver driver(kNumBlocks, kBlockSize, 5, /*with_residual_pool=*/true);
  const int plain = driver.add_sequence();
  const int isolated = driver.add_sequence();
  const int activated = driver.add_sequence();
  const int based = driver.add_sequence(Mode::kBase, 2);
  const int fork = forked ? driver.add_sequence(Mode::kForked, 0) : -1;
  auto part = [&](int sequence, int length, bool all_logits) {
    std::vector<int32_t> slots(length, -1);
    if (sequence == isolated) std::fill(slots.begin(), slots.end(), 1);
    if (sequence == activated) std::fill(slots.begin() + std::min(length, 5), slots.end(), 2);
    return Driver::Part{sequence, driver.random_tokens(length, config.vocab_size), slots, all_logits};
  };
  std::vector<int> all = {plain, isolated, activated, based};
  if (forked) all.push_back(fork);
  std::vector<Batch> steps;
  std::vector<Driver::Part> prefill = {part(plain, 9, false), part(isolated, 20, true), part(activated, 33, false),
                                       part(based, 40, true)};
  if (forked) prefill.push_back(part(fork, 27, true));
  steps.push_back(driver.make_batch(prefill));
  for (int step = 0; step < 3; ++step) {
    std::vector<Driver::Part> decode;
    for (int s : all) decode.push_back(part(s, 1, false));
    steps.push_back(driver.make_batch(decode));
  }
  for (size_t s = 0; s < steps.size(); ++s) {
    const ForwardResult reference = whole->forward(steps[s]);
    for (auto& [size, sharded] : groups) {
      const ForwardResult got = sharded.backend->forward(steps[s]);
      test::expect_logits_close(got, reference, "TP=" + std::to_string(size) + " step " + std::to_string(s), 1e-4);
    }
  }
}

// Device sampling under TP (vocab_gather.h): each rank gathers the vocabulary
// slices into whole logits on its device and draws there; the group returns rank
// 0's draws and the host rows' whole logits. Greedy rows and seeded temperature
// rows (one at a high temperature, so the draw reaches far into the vocabulary,
// past the first rank's slice) against the unsharded backend's draws.
void expect_device_sampling_unsharded(Joined joined, int32_t size) {
  const ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  const auto weights = test::tiny_weights(config, 41, false);
  auto whole = make_cuda_backend(config, *weights);
  CudaBackendConfig gathering;
  gathering.tuning.tensor_parallel_vocab_gather = true;
  Sharded sharded = make_sharded(config, *weights, size, joined, gathering);
  EXPECT_TRUE(sharded.backend->capabilities().device_sampling);
  for (Backend* backend : {whole.get(), sharded.backend.get()}) backend->allocate_kv_cache({kNumBlocks, kBlockSize});
  Driver driver(kNumBlocks, kBlockSize, 9, /*with_residual_pool=*/false);
  std::vector<int> sequences;
  for (int s = 0; s < 5; ++s) sequences.push_back(driver.add_sequence());
  const float temperatures[5] = {0.0f, 0.7f, 1.0f, 50.0f, 0.0f};
  int32_t far_draws = 0;
  for (int step = 0; step < 4; ++step) {
    std::vector<Driver::Part> parts;
    for (int s : sequences)
      parts.push_back({s, driver.random_tokens(step == 0 ? 11 + 3 * s : 1, config.vocab_size),
                       std::vector<int32_t>(step == 0 ? 11 + 3 * s : 1, -1), false});
    Batch batch = driver.make_batch(parts);
    for (int s = 0; s < 5; ++s) {
      DeviceSampling row;
      row.on_device = s != 4;  // the last row comes back as logits
      row.temperature = temperatures[s];
      row.seed = 1000 + s;
      row.step = static_cast<uint64_t>(step);
      batch.sampling.push_back(row);
    }
    const ForwardResult reference = whole->forward(batch);
    const ForwardResult got = sharded.backend->forward(batch);
    const std::string where = "TP=" + std::to_string(size) + " step " + std::to_string(step);
    ASSERT_EQ(got.sampled_token_ids.size(), reference.sampled_token_ids.size()) << where;
    EXPECT_EQ(got.sampled_token_ids, reference.sampled_token_ids) << where;
    for (size_t r = 0; r < got.sampled_logprobs.size(); ++r) {
      if (reference.sampled_token_ids[r] >= 0) {
        EXPECT_NEAR(got.sampled_logprobs[r], reference.sampled_logprobs[r], 1e-3) << where << " row " << r;
      }
    }
    EXPECT_EQ(got.vocab_size, config.vocab_size) << where;
    // logits: the host rows alone (the last sequence's), whole.
    ASSERT_EQ(got.logits.size(), static_cast<size_t>(config.vocab_size)) << where;
    ASSERT_EQ(reference.logits.size(), got.logits.size()) << where;
    const test::Closeness host_row = test::compare(got.logits, reference.logits);
    EXPECT_LE(host_row.nmse, 1e-4) << where << " (the host row): " << host_row.describe();
    for (int32_t token : got.sampled_token_ids) far_draws += token >= config.vocab_size / size;
  }
  EXPECT_GT(far_draws, 0) << "no draw came from past rank 0's slice of the vocabulary";
}

class CudaTensorParallel : public ::testing::TestWithParam<Architecture> {};

TEST(CudaTensorParallelSampling, RanksDrawOnTheirGatheredLogitsAsOneGpuDoes) {
  LOOM_REQUIRE_GPU();
  for (int32_t size : {2, 4}) expect_device_sampling_unsharded(Joined::kSameDevice, size);
}

TEST_P(CudaTensorParallel, EveryModeMixedGivesTheUnshardedLogits) {
  LOOM_REQUIRE_GPU();
  expect_every_mode_unsharded(GetParam(), Joined::kSameDevice, {2, 4});
}

// `--model random:... -tp N`: each rank draws its slices on its GPU. The
// values are make-model's, so the group equals one sharded from the host
// weights of the same seed bit for bit, prefill and decode, every architecture
// (q/k/v biases, o's columns, replicated kv heads at TP=4, uneven vocab slices).
TEST_P(CudaTensorParallel, RanksDrawingTheirSlicesEqualTheHostsShards) {
  LOOM_REQUIRE_GPU();
  const ModelConfig config = synthetic_model_config(GetParam(), SyntheticPreset::kTiny);
  const auto weights = test::tiny_weights(config, 17, false);
  for (int32_t size : {2, 4}) {
    try {
      check_tensor_parallel_size(config, size);
    } catch (const Error&) {
      continue;
    }
    Sharded drawn = make_sharded_synthetic(config, 17, size);
    Sharded cut = make_sharded(config, *weights, size);
    Driver driver(kNumBlocks, kBlockSize, 3, /*with_residual_pool=*/false);
    const int a = driver.add_sequence(), b = driver.add_sequence();
    for (Backend* backend : {drawn.backend.get(), cut.backend.get()}) backend->allocate_kv_cache({kNumBlocks, kBlockSize});
    for (int step = 0; step < 3; ++step) {
      std::vector<Driver::Part> parts;
      for (int s : {a, b}) {
        const int length = step == 0 ? 13 + 10 * s : 1;
        parts.push_back({s, driver.random_tokens(length, config.vocab_size), std::vector<int32_t>(length, -1), step == 0});
      }
      const Batch batch = driver.make_batch(parts);
      const ForwardResult want = cut.backend->forward(batch);
      const ForwardResult got = drawn.backend->forward(batch);
      EXPECT_EQ(got.logits, want.logits) << "TP=" << size << " step " << step;
      EXPECT_EQ(got.vocab_size, config.vocab_size);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllArchs, CudaTensorParallel,
                         ::testing::Values(Architecture::kLlama, Architecture::kQwen2, Architecture::kQwen3,
                                           Architecture::kMistral),
                         [](const auto& info) { return std::string(architecture_short_name(info.param)); });

// A batch one rank refuses ends the step on every rank with that rank's error, and the group works on.
TEST(CudaTensorParallelGroup, ABadBatchFailsEveryRankAndTheGroupWorksOn) {
  LOOM_REQUIRE_GPU();
  const ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  const auto weights = test::tiny_weights(config, 32, false);
  Sharded sharded = make_sharded(config, *weights, 2);
  sharded.backend->allocate_kv_cache({kNumBlocks, kBlockSize});
  Driver driver(kNumBlocks, kBlockSize, 6);
  const int s = driver.add_sequence();
  Batch bad = driver.make_batch({{s, {1, 2, 3}, {-1, -1, -1}, false}});
  bad.token_ids[1] = config.vocab_size + 5;
  loom::test::expect_error([&] { sharded.backend->forward(bad); }, ErrorKind::kInvalidArgument, {"outside the vocabulary"});
  Driver fresh(kNumBlocks, kBlockSize, 7);
  const int t = fresh.add_sequence();
  EXPECT_EQ(sharded.backend->forward(fresh.make_batch({{t, {1, 2, 3}, {-1, -1, -1}, false}})).logits.size(),
            static_cast<size_t>(config.vocab_size));
}

}  // namespace
}  // namespace loom::cuda

namespace loom::cuda {
namespace {

// A bf16 checkpoint kept in its file mapping (16-bit rows, as the CLI loads one
// for cuda): each rank's shard views it (column slices keep the row stride) and
// its upload reads only its rows and columns; TP=2 gives the unsharded logits.
TEST(CudaTensorParallelGroup, RanksCutTheirShardsFromSixteenBitRowsInPlace) {
  LOOM_REQUIRE_GPU();
  const ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  const TensorMap tensors = model_weights_to_tensor_map(config, *test::tiny_weights(config, 33, false));
  loom::test::TempDir directory;
  const std::string path = directory.str() + "/model.safetensors";
  write_safetensors(path, tensors, StoredDtype::kBF16);
  const ModelWeights kept = build_model_weights(config, read_safetensors(path, {.keep_16bit = true}), path);
  ASSERT_TRUE(has_quantized_tensors(kept));
  auto whole = make_cuda_backend(config, kept);
  Sharded sharded = make_sharded(config, kept, 2);
  Driver driver(kNumBlocks, kBlockSize, 8);
  const int s = driver.add_sequence();
  std::vector<int32_t> tokens = driver.random_tokens(40, config.vocab_size);
  const Batch batch = driver.make_batch({{s, tokens, std::vector<int32_t>(tokens.size(), -1), true}});
  whole->allocate_kv_cache({kNumBlocks, kBlockSize});
  sharded.backend->allocate_kv_cache({kNumBlocks, kBlockSize});
  test::expect_logits_close(sharded.backend->forward(batch), whole->forward(batch), "bf16 rows, TP=2", 1e-4);
}

}  // namespace
}  // namespace loom::cuda

namespace loom::cuda {
namespace {

bool nccl_loads() { return nccl_library().loaded(); }

TEST(CudaNcclTensorParallelSampling, RanksDrawOnTheirGatheredLogitsAsOneGpuDoes) {
  LOOM_REQUIRE_GPU();
  if (!nccl_loads()) GTEST_SKIP() << "NCCL does not load: " << nccl_library().failure;
  if (visible_gpus() < 2) GTEST_SKIP() << "needs two GPUs";
  expect_device_sampling_unsharded(Joined::kNccl, 2);
  if (visible_gpus() >= 4) expect_device_sampling_unsharded(Joined::kNccl, 4);
}

// Over NCCL, rank r on GPU r: the same every-mode check at 2 (and 4) GPUs.
class CudaNcclTensorParallel : public ::testing::TestWithParam<Architecture> {};

TEST_P(CudaNcclTensorParallel, EveryModeMixedGivesTheUnshardedLogits) {
  LOOM_REQUIRE_GPU();
  if (!nccl_loads()) GTEST_SKIP() << "NCCL does not load: " << nccl_library().failure;
  if (visible_gpus() < 2) GTEST_SKIP() << "needs two GPUs";
  std::vector<int32_t> sizes = {2};
  if (visible_gpus() >= 4) sizes.push_back(4);
  expect_every_mode_unsharded(GetParam(), Joined::kNccl, sizes);
}

INSTANTIATE_TEST_SUITE_P(AllArchs, CudaNcclTensorParallel,
                         ::testing::Values(Architecture::kLlama, Architecture::kQwen2, Architecture::kQwen3,
                                           Architecture::kMistral),
                         [](const auto& info) { return std::string(architecture_short_name(info.param)); });

// A one-rank NCCL group on one GPU: the library loads, its all-reduce runs in
// every step (captured into the decode graphs: NCCL groups are capturable) and
// the logits are the plain backend's.
TEST(CudaNcclGroup, OneRankOverNcclGivesTheBackendsLogits) {
  LOOM_REQUIRE_GPU();
  if (!nccl_loads()) GTEST_SKIP() << "NCCL does not load: " << nccl_library().failure;
  expect_every_mode_unsharded(Architecture::kLlama, Joined::kNccl, {1});
}

// A device missing or listed twice is a clear error before NCCL is asked; a
// one-rank all-reduce leaves the data as it was; after abort() every call
// throws the group's "ended" error instead of waiting.
TEST(CudaNcclGroup, RefusesBadDevicesAndThrowsOnceAborted) {
  LOOM_REQUIRE_GPU();
  if (!nccl_loads()) GTEST_SKIP() << "NCCL does not load: " << nccl_library().failure;
  loom::test::expect_error([] { NcclGroup twice(std::vector<int>{0, 0}); }, ErrorKind::kUnavailable,
                           {"listed for two ranks"});
  loom::test::expect_error([] { NcclGroup missing(std::vector<int>{0, visible_gpus()}); }, ErrorKind::kUnavailable,
                           {"2 ranks need 2 GPUs", "is not there"});
  NcclGroup group(std::vector<int>{0});
  DeviceCommunicator* rank = group.communicators().at(0);
  EXPECT_TRUE(rank->capturable());
  constexpr int64_t kCount = 1000;
  std::vector<float> values(kCount);
  for (int64_t i = 0; i < kCount; ++i) values[i] = 0.5f * static_cast<float>(i) - 7.0f;
  DeviceBuffer buffer(kCount * sizeof(float));
  LOOM_CUDA_CHECK(cudaMemcpy(buffer.data(), values.data(), kCount * sizeof(float), cudaMemcpyHostToDevice));
  cudaStream_t stream = nullptr;
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  rank->all_reduce_sum(buffer.as<float>(), kCount, stream);
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> summed(kCount);
  LOOM_CUDA_CHECK(cudaMemcpy(summed.data(), buffer.data(), kCount * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_EQ(summed, values);
  group.abort(0);
  EXPECT_TRUE(group.aborted());
  loom::test::expect_error([&] { rank->all_reduce_sum(buffer.as<float>(), kCount, stream); }, ErrorKind::kInternal,
                           {AbortableBarrier::kAbortedPrefix, "restart the server"});
  cudaStreamDestroy(stream);
}

// Two GPUs: rank 0 enters an all-reduce rank 1 never joins; abort() from
// another thread (what a failing rank does) ends rank 0's wait.
// Sums of up to 4 MiB take the peer-access kernel (its abort flag ends the wait), larger ones NCCL.
TEST(CudaNcclGroup, AbortEndsARankWaitingForItsPeer) {
  LOOM_REQUIRE_GPU();
  if (!nccl_loads()) GTEST_SKIP() << "NCCL does not load: " << nccl_library().failure;
  if (visible_gpus() < 2) GTEST_SKIP() << "needs two GPUs";
  for (const size_t bytes : {size_t{1} << 20, size_t{16} << 20}) {
    SCOPED_TRACE(bytes);
    NcclGroup group(std::vector<int>{0, 1});
    LOOM_CUDA_CHECK(cudaSetDevice(0));
    DeviceBuffer buffer(bytes);
    cudaStream_t stream = nullptr;
    LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    // The abort comes from another thread while rank 0 waits: in the call itself (NCCL
    // connects to the peer at its first collective, and rank 0's enqueue waits for it)
    // or on the stream (the collective's kernel waits for rank 1's data).
    std::thread failing_rank([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      group.abort(1);
    });
    bool call_ended = false;
    try {
      group.communicators()[0]->all_reduce_sum(buffer.as<float>(), static_cast<int64_t>(bytes / sizeof(float)), stream);
    } catch (const Error& error) {
      call_ended = true;
      EXPECT_NE(std::string(error.what()).find("rank 1 failed"), std::string::npos) << error.what();
    }
    cudaError_t state = cudaErrorNotReady;
    if (!call_ended) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while ((state = cudaStreamQuery(stream)) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    failing_rank.join();
    EXPECT_TRUE(call_ended || state != cudaErrorNotReady) << "rank 0 still waits 20 s after the abort";
    cudaGetLastError();
    EXPECT_TRUE(group.aborted());
    // Every later call is refused.
    loom::test::expect_error([&] { group.communicators()[0]->all_reduce_sum(buffer.as<float>(), 16, stream); },
                       ErrorKind::kInternal, {"rank 1 failed"});
    cudaStreamDestroy(stream);
  }
}

}  // namespace
}  // namespace loom::cuda

namespace loom::cuda {
namespace {

// The group's host tier: a forked sequence's KV and rCache blocks offloaded,
// loaded back into other device blocks (every rank's part of a main block, the
// rCache into every rank), and decoding over the moved blocks gives the same
// logits; a host block holds every rank's part (kv_bytes_per_token is the
// group's).
TEST(CudaTensorParallelGroup, HostTierMovesEveryRanksBlocks) {
  LOOM_REQUIRE_GPU();
  const ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  const auto weights = test::tiny_weights(config, 34, false);
  Sharded sharded = make_sharded(config, *weights, 2);
  Backend& backend = *sharded.backend;
  EXPECT_TRUE(backend.capabilities().host_kv_tier);
  EXPECT_TRUE(backend.capabilities().residual_host_kv_tier);
  SyntheticModelOptions options;
  options.num_adapters = 1;
  options.rank = 8;
  backend.set_adapter(0, std::make_shared<LoraAdapter>(
                             make_synthetic_adapter(synthetic_adapter_specs(options, config)[0], config, 34)));
  backend.allocate_kv_cache({kNumBlocks, kBlockSize});
  backend.allocate_residual_cache({kNumBlocks, kBlockSize, 8});
  constexpr int kHostBlocks = 6;
  backend.allocate_host_kv_cache(KvPoolKind::kMain, kHostBlocks);
  backend.allocate_host_kv_cache(KvPoolKind::kResidual, kHostBlocks);
  EXPECT_EQ(backend.num_host_kv_blocks(KvPoolKind::kMain), kHostBlocks);
  EXPECT_EQ(static_cast<int64_t>(backend.host_kv_block(KvPoolKind::kMain, 0).size()),
            backend.kv_bytes_per_token() * kBlockSize);

  Driver driver(kNumBlocks, kBlockSize, 9, /*with_residual_pool=*/true);
  const int s = driver.add_sequence(Mode::kForked, 0);
  backend.forward(driver.make_batch({{s, driver.random_tokens(40, config.vocab_size), std::vector<int32_t>(40, -1), false}}));
  const std::vector<int32_t> main = driver.sequence(s).main_blocks, residual = driver.sequence(s).residual_blocks;
  ASSERT_EQ(main.size(), 3u);
  const Batch decode = driver.make_batch({{s, driver.random_tokens(1, config.vocab_size), {-1}, false}});
  // Device blocks no sequence uses: where the blocks come back, and never-written ones.
  auto unused = [&](int32_t from, const std::vector<int32_t>& taken) {
    std::vector<int32_t> ids;
    for (int32_t id = from; static_cast<int32_t>(ids.size()) < 3; --id)
      if (std::find(taken.begin(), taken.end(), id) == taken.end()) ids.push_back(id);
    return ids;
  };
  const std::vector<int32_t> moved = unused(kNumBlocks - 1, main), moved_residual = unused(kNumBlocks - 1, residual);
  const std::vector<int32_t> empty = unused(kNumBlocks - 20, main), empty_residual = unused(kNumBlocks - 20, residual);
  const std::vector<int32_t> host = {4, 0, 2};
  std::thread([&] {
    backend.copy_kv_blocks(KvPoolKind::kMain, KvCopyDirection::kDeviceToHost, main, host);
    backend.copy_kv_blocks(KvPoolKind::kResidual, KvCopyDirection::kDeviceToHost, residual, host);
    backend.copy_kv_blocks(KvPoolKind::kMain, KvCopyDirection::kHostToDevice, moved, host);
    backend.copy_kv_blocks(KvPoolKind::kResidual, KvCopyDirection::kHostToDevice, moved_residual, host);
  }).join();
  auto remapped = [&](const std::vector<int32_t>& to, const std::vector<int32_t>& to_residual) {
    Batch batch = decode;
    for (int32_t& id : batch.block_tables) id = to[std::find(main.begin(), main.end(), id) - main.begin()];
    for (int32_t& id : batch.residual_block_tables)
      id = to_residual[std::find(residual.begin(), residual.end(), id) - residual.begin()];
    return batch;
  };
  const std::vector<float> with_moved = backend.forward(remapped(moved, moved_residual)).logits;
  const std::vector<float> with_empty = backend.forward(remapped(empty, empty_residual)).logits;
  const std::vector<float> with_original = backend.forward(decode).logits;
  EXPECT_EQ(with_moved, with_original);
  EXPECT_NE(with_empty, with_original);
  loom::test::expect_error(
      [&] { backend.copy_kv_blocks(KvPoolKind::kMain, KvCopyDirection::kDeviceToHost, main, std::vector<int32_t>{0, 1, kHostBlocks}); },
      ErrorKind::kInvalidArgument, {"host block 6"});
}

}  // namespace
}  // namespace loom::cuda
