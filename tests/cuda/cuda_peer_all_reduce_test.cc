// PeerAllReduce (backend/cuda/peer_all_reduce.h): every rank ends with the sum of
// every rank's data added in rank order (bit for bit the host's), eagerly and
// replayed from CUDA graphs, calls of different sizes interleaved (its two
// staging slots); abort() ends a kernel waiting for a peer that never comes.
// Ranks share GPU 0 (the kernel reads "peer" memory on its own device) and, where
// there are two GPUs, sit on GPUs 0 and 1 over peer access.
#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/peer_all_reduce.h"
#include "cuda_test_util.h"
#include "util/error.h"
#include "util/prng.h"

namespace loom::cuda {
namespace {

using test::visible_gpus;

// One rank's buffer and stream on its device.
struct RankState {
  int device = 0;
  cudaStream_t stream = nullptr;
  DeviceBuffer data;
  std::vector<float> values;
};

class PeerRanks {
 public:
  PeerRanks(const std::vector<int>& devices, int64_t max_bytes) : ranks_(devices.size()) {
    reduce_ = PeerAllReduce::create(devices, max_bytes);
    for (size_t r = 0; r < devices.size(); ++r) {
      ranks_[r].device = devices[r];
      LOOM_CUDA_CHECK(cudaSetDevice(devices[r]));
      LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&ranks_[r].stream, cudaStreamNonBlocking));
      ranks_[r].data.allocate(static_cast<size_t>(max_bytes));
    }
    LOOM_CUDA_CHECK(cudaSetDevice(0));
  }
  ~PeerRanks() {
    for (RankState& rank : ranks_) cudaStreamDestroy(rank.stream);
    cudaSetDevice(0);
  }

  PeerAllReduce* reduce() { return reduce_.get(); }
  std::vector<RankState>& ranks() { return ranks_; }

  // Random values for every rank's first `count` floats, uploaded; returns the host's rank-order sum.
  std::vector<float> fill(int64_t count, Prng& prng) {
    std::vector<float> sum(static_cast<size_t>(count), 0.0f);
    for (size_t r = 0; r < ranks_.size(); ++r) {
      RankState& rank = ranks_[r];
      rank.values = test::random_values(prng, static_cast<size_t>(count), 4.0f, false);
      for (int64_t i = 0; i < count; ++i) sum[i] = r == 0 ? rank.values[i] : sum[i] + rank.values[i];
      upload(rank, rank.data.data(), rank.values);
    }
    return sum;
  }
  // On the rank's own stream, waited for: a pageable cudaMemcpy may return before its DMA lands,
  // and the kernels run on non-blocking streams that do not wait for it.
  static void upload(RankState& rank, void* to, const std::vector<float>& values) {
    LOOM_CUDA_CHECK(cudaSetDevice(rank.device));
    LOOM_CUDA_CHECK(cudaMemcpyAsync(to, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice, rank.stream));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(rank.stream));
  }
  // Every rank's call enqueued (one thread: the kernels of ranks sharing a device run side by side).
  void all_reduce(int64_t count) {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      LOOM_CUDA_CHECK(cudaSetDevice(ranks_[r].device));
      reduce_->all_reduce_sum(static_cast<int32_t>(r), ranks_[r].data.as<float>(), count, ranks_[r].stream);
    }
  }
  void synchronize() {
    for (RankState& rank : ranks_) {
      LOOM_CUDA_CHECK(cudaSetDevice(rank.device));
      LOOM_CUDA_CHECK(cudaStreamSynchronize(rank.stream));
    }
  }
  // Every rank's data equals `sum` bit for bit.
  void expect_sums(const std::vector<float>& sum, const char* where) {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      LOOM_CUDA_CHECK(cudaSetDevice(ranks_[r].device));
      std::vector<float> got(sum.size());
      LOOM_CUDA_CHECK(cudaMemcpy(got.data(), ranks_[r].data.data(), sum.size() * sizeof(float), cudaMemcpyDeviceToHost));
      size_t wrong = 0, first = 0;
      for (size_t i = 0; i < sum.size(); ++i)
        if (got[i] != sum[i] && wrong++ == 0) first = i;
      EXPECT_EQ(wrong, 0u) << where << ": rank " << r << " of " << ranks_.size() << ", " << sum.size()
                           << " floats, first wrong at " << first << ": " << got[first] << " vs " << sum[first];
    }
  }

 private:
  std::unique_ptr<PeerAllReduce> reduce_;
  std::vector<RankState> ranks_;
};

std::vector<std::vector<int>> device_sets() {
  std::vector<std::vector<int>> sets = {{0, 0}, {0, 0, 0, 0}};
  if (visible_gpus() >= 2) sets.push_back({0, 1});
  if (visible_gpus() >= 4) sets.push_back({0, 1, 2, 3});
  return sets;
}

constexpr int64_t kMaxBytes = 1 << 20;

TEST(CudaPeerAllReduce, EveryRankGetsTheRankOrderSum) {
  LOOM_REQUIRE_GPU();
  for (const std::vector<int>& devices : device_sets()) {
    PeerRanks ranks(devices, kMaxBytes);
    ASSERT_NE(ranks.reduce(), nullptr);
    Prng prng(7);
    // Sizes below a block's share, odd tails, a decode step's and the largest it takes, repeated so
    // both staging slots are used after calls of other sizes.
    for (int round = 0; round < 3; ++round) {
      for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{4096}, int64_t{65539}, kMaxBytes / 4}) {
        const std::vector<float> sum = ranks.fill(count, prng);
        ranks.all_reduce(count);
        ranks.synchronize();
        ranks.expect_sums(sum, "eager");
      }
    }
  }
}

// Graphs captured per rank (two sums of different sizes each) and replayed over new data, with eager
// calls between replays: the same sums, the call numbers kept in step.
TEST(CudaPeerAllReduce, GraphReplaysEqualTheSums) {
  LOOM_REQUIRE_GPU();
  for (const std::vector<int>& devices : device_sets()) {
    PeerRanks ranks(devices, kMaxBytes);
    ASSERT_NE(ranks.reduce(), nullptr);
    std::vector<RankState>& states = ranks.ranks();
    const int64_t small = 4096, large = 3 * 4096 + 5;
    std::vector<DeviceBuffer> second(states.size());
    std::vector<cudaGraphExec_t> graphs(states.size(), nullptr);
    for (size_t r = 0; r < states.size(); ++r) {
      LOOM_CUDA_CHECK(cudaSetDevice(states[r].device));
      second[r].allocate(large * sizeof(float));
      cudaGraph_t graph = nullptr;
      LOOM_CUDA_CHECK(cudaStreamBeginCapture(states[r].stream, cudaStreamCaptureModeThreadLocal));
      ranks.reduce()->all_reduce_sum(static_cast<int32_t>(r), states[r].data.as<float>(), small, states[r].stream);
      ranks.reduce()->all_reduce_sum(static_cast<int32_t>(r), second[r].as<float>(), large, states[r].stream);
      LOOM_CUDA_CHECK(cudaStreamEndCapture(states[r].stream, &graph));
      LOOM_CUDA_CHECK(cudaGraphInstantiate(&graphs[r], graph, 0));
      cudaGraphDestroy(graph);
    }
    Prng prng(11);
    for (int replay = 0; replay < 4; ++replay) {
      const std::vector<float> small_sum = ranks.fill(small, prng);
      std::vector<float> large_sum(large, 0.0f);
      for (size_t r = 0; r < states.size(); ++r) {
        const std::vector<float> values = test::random_values(prng, large, 4.0f, false);
        for (int64_t i = 0; i < large; ++i) large_sum[i] = r == 0 ? values[i] : large_sum[i] + values[i];
        PeerRanks::upload(states[r], second[r].data(), values);
      }
      for (size_t r = 0; r < states.size(); ++r) {
        LOOM_CUDA_CHECK(cudaSetDevice(states[r].device));
        LOOM_CUDA_CHECK(cudaGraphLaunch(graphs[r], states[r].stream));
      }
      ranks.synchronize();
      ranks.expect_sums(small_sum, "graph");
      for (size_t r = 0; r < states.size(); ++r) {
        LOOM_CUDA_CHECK(cudaSetDevice(states[r].device));
        std::vector<float> got(large);
        LOOM_CUDA_CHECK(cudaMemcpy(got.data(), second[r].data(), large * sizeof(float), cudaMemcpyDeviceToHost));
        EXPECT_EQ(got, large_sum) << "graph, second sum, rank " << r;
      }
      const std::vector<float> eager_sum = ranks.fill(7, prng);  // an eager call between replays
      ranks.all_reduce(7);
      ranks.synchronize();
      ranks.expect_sums(eager_sum, "eager between replays");
    }
    for (size_t r = 0; r < states.size(); ++r) cudaGraphExecDestroy(graphs[r]);
  }
}

TEST(CudaPeerAllReduce, AbortEndsARankWaitingForItsPeer) {
  LOOM_REQUIRE_GPU();
  PeerRanks ranks({0, 0}, kMaxBytes);
  ASSERT_NE(ranks.reduce(), nullptr);
  Prng prng(3);
  ranks.fill(4096, prng);
  const std::vector<float> before = ranks.ranks()[0].values;
  RankState& rank = ranks.ranks()[0];
  ranks.reduce()->all_reduce_sum(0, rank.data.as<float>(), 4096, rank.stream);  // rank 1 never comes
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(cudaStreamQuery(rank.stream), cudaErrorNotReady) << "the kernel did not wait for its peer";
  ranks.reduce()->abort();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  cudaError_t state = cudaErrorNotReady;
  while ((state = cudaStreamQuery(rank.stream)) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(state, cudaSuccess) << "rank 0 still waits 20 s after the abort";
  std::vector<float> after(4096);
  LOOM_CUDA_CHECK(cudaMemcpy(after.data(), rank.data.data(), after.size() * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_EQ(after, before) << "an aborted sum leaves the data as it was";
}

TEST(CudaPeerAllReduce, RefusesTooFewOrTooManyRanksLargeSumsAndUnalignedData) {
  LOOM_REQUIRE_GPU();
  EXPECT_EQ(PeerAllReduce::create(std::vector<int>{0}, kMaxBytes), nullptr);
  EXPECT_EQ(PeerAllReduce::create(std::vector<int>(PeerAllReduce::kMaxRanks + 1, 0), kMaxBytes), nullptr);
  const auto reduce = PeerAllReduce::create(std::vector<int>{0, 0}, kMaxBytes);
  ASSERT_NE(reduce, nullptr);
  DeviceBuffer data(kMaxBytes + 64);
  EXPECT_TRUE(reduce->takes(kMaxBytes / 4));
  EXPECT_FALSE(reduce->takes(kMaxBytes / 4 + 1));  // over the staging slot: NCCL's
  // Unaligned data is refused on the spot (by count alone every rank chose this kernel: a rank falling
  // back to NCCL would leave its peers waiting), before anything is enqueued.
  EXPECT_THROW(reduce->all_reduce_sum(0, data.as<float>() + 1, 16, nullptr), Error);
}

}  // namespace
}  // namespace loom::cuda
