// Shared by the CUDA backend's benchmarks (cuda_bench.cc, decode_figures.cc):
// the 8B-shape setup's constants, CUDA-event timing, the decode and prefill
// batches they time, and the backend subclass that can leave LoRA launches out.
#pragma once

#include <algorithm>
#include <functional>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "util/prng.h"

namespace loom::cuda::bench {

// The GPU's datasheet peaks, which the floors and MFU figures divide by.
struct DevicePeaks {
  std::string name;               // the device's name (cudaDeviceProp::name)
  double bandwidth = 0;           // DRAM bytes/s
  double bf16 = 0;                // dense bf16 tensor-core FLOP/s
  std::string source;             // where the two numbers come from
};
// By name from a table of NVIDIA datasheet figures (H100 SXM / PCIe / NVL, H200, A100, L40S); for another GPU
// the bandwidth from the device's memory clock and bus width and the bf16 peak from its SMs and clock at
// Hopper's 4096 dense bf16 FLOP per clock per SM (source says "derived"). Prints what it chose.
DevicePeaks device_peaks(int device = 0);
// device_peaks(0), looked up once (the floors below use it).
const DevicePeaks& peaks();
inline constexpr int kBlockSize = 16;
inline constexpr int kContext = 2048;
inline constexpr int kContextGroups = 128;  // distinct 2K contexts; batch 256 shares them pairwise

struct Timer {
  cudaStream_t stream;
  cudaEvent_t start, stop;
  explicit Timer(cudaStream_t s) : stream(s) {
    LOOM_CUDA_CHECK(cudaEventCreate(&start));
    LOOM_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~Timer() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  template <typename F>
  double median_ms(F&& work, int iterations) {
    std::vector<double> times;
    for (int i = 0; i < iterations; ++i) {
      LOOM_CUDA_CHECK(cudaEventRecord(start, stream));
      work();
      LOOM_CUDA_CHECK(cudaEventRecord(stop, stream));
      LOOM_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      times.push_back(ms);
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  }
};

// Changes the backend's tuning for the figures that follow (the benchmark's
// build: CudaBackend::set_tuning drops the captured graphs).
inline void tune(CudaBackend& backend, const std::function<void(CudaTuning&)>& change) {
  CudaTuning tuning = backend.tuning();
  change(tuning);
  backend.set_tuning(tuning);
}

struct StepTimes {
  double eager_ms = 0, graph_ms = 0;
};

// What every group of figures reads: the backend (KV pool allocated and filled),
// its model's config, the JSON being written, the shared draw of token ids, and
// the command line's repetitions, decode batch sizes and parts.
struct BenchContext {
  CudaBackend& backend;
  const ModelConfig& config;
  nlohmann::json& results;
  Prng& prng;
  int iterations;
  const std::vector<int>& batch_sizes;
  const std::vector<std::string>& parts;  // --what
  bool wanted(const char* part) const { return std::find(parts.begin(), parts.end(), part) != parts.end(); }
};

// Decode batch: sequence s reads context group s % 128 (127 shared blocks) plus
// its own last block, where its new token (position 2047) is written.
Batch decode_batch(int batch_size, const std::vector<int32_t>& slots, Prng& prng, int vocab);
// One prompt of num_tokens random tokens from position 0.
Batch prefill_batch(int num_tokens, Prng& prng, int vocab);
// Median eager step and (with_graph) median replay of the same step captured as a CUDA graph.
StepTimes time_step(CudaBackend& backend, const Batch& batch, int iterations, bool with_graph);
// Bytes every decode step must read over peaks().bandwidth: all weights except the
// embedding table (only the batch's rows), plus every attended KV entry.
double decode_floor_ms(const CudaBackend& backend, int batch_size);
double prefill_flops(const ModelConfig& config, int64_t tokens);
// A 4 GiB device-to-device copy's bytes read + written per second.
double measure_copy_bandwidth(cudaStream_t stream);
// Makes every sequence of `batch` forked (slot = its adapter slot), its rCache
// blocks the same ids as its main blocks, all but its new entries present.
void make_forked(Batch& batch);
// Makes every sequence of `batch` use base sharing with its adapter (decoder rows).
void make_base(Batch& batch);
// The attention kernels alone on layer 0's pools, for the batch's plan
// (forked sequences: ResidualAttention over layer 0's rCache, residual_rank > 0).
// wide: the backend's choice of prefill kernel (the wgmma one where it applies); false: the mma.sync one.
// pingpong: wide items on the warp-specialized kernel (attention_pingpong.cu).
double time_attention(CudaBackend& backend, const Batch& batch, int iterations, int32_t residual_rank = 0,
                      bool wide = true, bool pingpong = false);
// Binds 8 synthetic rank-16 adapters on all seven projections to slots 0..7; returns the slots.
std::vector<int32_t> bind_rank16_adapters(Backend& backend, const ModelConfig& config);

// decode_figures.cc: the --what parts decode (steps against the floor), prefetch
// (L2 read-ahead settings), skinny (GEMV variants, a streaming-read probe) and
// rows (1-4 row steps on cuBLAS or the skinny GEMMs).
void decode_figures(BenchContext& context);

}  // namespace loom::cuda::bench
