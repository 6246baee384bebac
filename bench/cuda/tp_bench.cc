// Tensor parallelism's figures (issue 37): the 8B or 70B shape (--preset; random
// bf16 weights, each GPU drawing its own slices as `--model random:llama-8b` does)
// at each --sizes N that fits the visible GPUs and the model, N ranks joined by
// NCCL (N = 1: the backend alone), timed through Backend::forward as the engine
// calls it (each rank's plan, upload and graph replay, the group's threads and
// the results' way back):
//   decode   --batch-sizes rows over 2K contexts (bench_common.h's decode_batch)
//            against the floor (the bytes one GPU must read, its shard of the
//            weights and of the attended KV, over the datasheet bandwidth and
//            over the bandwidth of a device-to-device copy measured on GPU 0) and,
//            for N > 1, the step's all-reduces alone (2 per layer + the
//            embedding's, B x hidden fp32 each), captured in a CUDA graph as
//            the step's are (their share of the step), on the step's path
//            (the peer-access kernel for sums of up to --peer-all-reduce-bytes,
//            NCCL above) and on NCCL alone, and launched eagerly one by one
//   lora     a decode-64 step with 8 rank-16 adapters on all seven projections
//            against the base model's
//   prefill  one --prefill-tokens prompt: MFU against N GPUs' dense bf16 peak
//   loom_tp_bench --sizes 1 2 4 --batch-sizes 1 16 64 [--preset 70b] [--what decode lora prefill]
//                 [--no-vocab-gather] [--peer-all-reduce-bytes 0] --out tp_bench.json
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_communicator.h"
#include "backend/cuda/nccl_group.h"
#include "backend/cuda/tensor_parallel_cuda_backend.h"
#include "bench_main.h"
#include "bench_common.h"
#include "synthetic/synthetic_model.h"
#include "util/error.h"

namespace loom::cuda {
namespace {

using namespace bench;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// What one GPU of an N-rank group must read in a decode step of `batch` rows.
double floor_ms(const ModelConfig& config, int32_t size, int batch) {
  const double hidden = config.hidden_size, q = config.q_size(), kv = config.kv_size(),
               inter = config.intermediate_size;
  const double layer_params = hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inter;
  const double weights = 2.0 * (config.num_layers * layer_params + hidden * config.vocab_size) / size;
  const int32_t kv_shards = std::min(size, config.num_kv_heads);  // kv heads replicated past their count
  const double kv_bytes = 2.0 * 2 * config.num_layers * kv * static_cast<double>(batch) * kContext / kv_shards;
  return (weights + kv_bytes) / peaks().bandwidth * 1e3;
}

struct AllReduceTimes {
  double eager_ms = 0;  // launched one by one from the host, then a sync
  double graph_ms = 0;  // captured in one CUDA graph per rank and replayed: as inside a captured step
};

// The step's all-reduces alone: every rank on its own thread, `calls` all-reduces of count floats,
// median of `iterations`.
AllReduceTimes all_reduce_ms(NcclGroup& group, const std::vector<int>& devices, int64_t count, int calls,
                             int iterations) {
  const std::vector<DeviceCommunicator*> ranks = group.communicators();
  std::vector<std::vector<double>> eager(ranks.size()), replay(ranks.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks.size(); ++r) {
    threads.emplace_back([&, r] {
      LOOM_CUDA_CHECK(cudaSetDevice(devices[r]));
      cudaStream_t stream = nullptr;
      LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      DeviceBuffer data(static_cast<size_t>(count) * sizeof(float));
      LOOM_CUDA_CHECK(cudaMemsetAsync(data.data(), 0, data.size(), stream));
      auto all = [&] {
        for (int c = 0; c < calls; ++c) ranks[r]->all_reduce_sum(data.as<float>(), count, stream);
      };
      auto timed = [&](const std::function<void()>& work, std::vector<double>& into) {
        for (int i = 0; i < iterations + 2; ++i) {
          const auto start = std::chrono::steady_clock::now();
          work();
          LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
          if (i >= 2) into.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
        }
      };
      timed(all, eager[r]);
      if (ranks[r]->capturable()) {
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        LOOM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        all();
        LOOM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
        LOOM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        timed([&] { LOOM_CUDA_CHECK(cudaGraphLaunch(exec, stream)); }, replay[r]);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
      }
      cudaStreamDestroy(stream);
    });
  }
  for (std::thread& thread : threads) thread.join();
  return {median(eager[0]), replay[0].empty() ? 0.0 : median(replay[0])};
}

// Median wall time of `backend.forward(batch)` over `iterations` calls after `warmup` (graph capture).
double forward_ms(Backend& backend, const Batch& batch, int iterations, int warmup = 3) {
  std::vector<double> steps;
  for (int i = 0; i < iterations + warmup; ++i) {
    const auto start = std::chrono::steady_clock::now();
    backend.forward(batch);
    if (i >= warmup) steps.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  return median(steps);
}

int run(int argc, char** argv) {
  CLI::App app{"Tensor-parallel decode steps, LoRA and prefill (8B or 70B shape, random bf16 weights, NCCL)"};
  std::vector<int> sizes = {1, 2, 4}, batch_sizes = {1, 16, 64};
  std::vector<std::string> parts = {"decode", "lora", "prefill"};
  std::string preset = "8b";
  int prefill_tokens = 8192;
  int iterations = 20;
  bool vocab_gather = CudaTuning{}.tensor_parallel_vocab_gather;
  int64_t peer_bytes = CudaTuning{}.tensor_parallel_peer_all_reduce_bytes;
  std::string out_path = "tp_bench.json";
  app.add_option("--sizes", sizes, "Tensor-parallel sizes (those the visible GPUs allow)");
  app.add_option("--batch-sizes", batch_sizes, "Decode batch sizes");
  app.add_option("--iterations", iterations, "Timed steps per figure (median)");
  app.add_flag("--vocab-gather,!--no-vocab-gather", vocab_gather,
               "CudaTuning::tensor_parallel_vocab_gather (logits made whole on the device; the default)");
  app.add_option("--peer-all-reduce-bytes", peer_bytes,
                 "CudaTuning::tensor_parallel_peer_all_reduce_bytes (0: every sum on NCCL)")->capture_default_str();
  app.add_option("--out", out_path, "JSON results");
  app.add_option("--preset", preset, "Model shape: 8b or 70b (70b needs TP >= 2 on 141 GB GPUs)")->capture_default_str();
  app.add_option("--what", parts, "decode (steps against the floor, the all-reduces' share), lora (8 rank-16 adapters "
                                  "in a decode-64 step against the base model's), prefill (one prompt: MFU)");
  app.add_option("--prefill-tokens", prefill_tokens, "Prompt length of the prefill figure")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  auto wanted = [&](const char* part) { return std::find(parts.begin(), parts.end(), part) != parts.end(); };

  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess) visible = 0;
  const ModelConfig config = synthetic_model_config(Architecture::kLlama, synthetic_preset_from_name(preset));
  nlohmann::json results;
  results["model"] = "random:llama-" + preset;
  results["device"] = cuda_device_description(0);
  results["visible_gpus"] = visible;
  results["vocab_gather"] = vocab_gather;
  results["peer_all_reduce_bytes"] = peer_bytes;
  std::printf("%d GPUs: %s\n", visible, results["device"].get<std::string>().c_str());
  // The targets are against the floor at the measured bandwidth (a device-to-device copy on GPU 0),
  // beside the datasheet's.
  double measured_bandwidth = 0;
  {
    cudaStream_t stream = nullptr;
    LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    measured_bandwidth = measure_copy_bandwidth(stream);
    cudaStreamDestroy(stream);
  }
  results["measured_copy_bandwidth_bytes_per_s"] = measured_bandwidth;
  const double to_measured = peaks().bandwidth / measured_bandwidth;  // floor at the measured bandwidth / datasheet's
  std::printf("copy bandwidth %.2f TB/s (datasheet %.2f)\n", measured_bandwidth / 1e12, peaks().bandwidth / 1e12);

  const int blocks_per_sequence = kContext / kBlockSize;
  const int num_blocks = kContextGroups * (blocks_per_sequence - 1) + 256;
  Prng prng(1);
  for (int size : sizes) {
    if (size > visible) {
      std::printf("TP=%d: %d GPUs visible, skipped\n", size, visible);
      continue;
    }
    std::vector<int> devices;
    for (int r = 0; r < size; ++r) devices.push_back(r);
    CudaBackendConfig backend_config;
    backend_config.tuning.tensor_parallel_vocab_gather = vocab_gather;
    backend_config.tuning.tensor_parallel_peer_all_reduce_bytes = peer_bytes;
    std::shared_ptr<NcclGroup> group, nccl_only;
    std::unique_ptr<Backend> backend;
    // Random weights drawn on each GPU, a rank its slices only (as `--model random:llama-8b -tp N`).
    try {
      check_tensor_parallel_size(config, size);
    } catch (const Error& error) {
      std::printf("TP=%d: %s, skipped\n", size, error.what());
      continue;
    }
    if (size == 1) {
      backend = make_synthetic_cuda_backend(config, 0, true, backend_config);
    } else {
      group = std::make_shared<NcclGroup>(devices, peer_bytes);
      if (group->peer_all_reduce()) nccl_only = std::make_shared<NcclGroup>(devices, 0);
      results["sizes"][std::to_string(size)]["peer_all_reduce"] = group->peer_all_reduce();
      backend = make_synthetic_tensor_parallel_cuda_backend(config, 0, true, backend_config, devices,
                                                            group->communicators(), nccl_tensor_parallel_group(group));
    }
    backend->allocate_kv_cache({num_blocks, kBlockSize});
    nlohmann::json& figures = results["sizes"][std::to_string(size)];
    const bool device_sampling = backend->capabilities().device_sampling;
    auto decode = [&](int batch_size, const std::vector<int32_t>& slots) {
      Batch batch = decode_batch(batch_size, slots, prng, config.vocab_size);
      if (device_sampling) batch.sampling.assign(batch.sequences.size(), DeviceSampling{.on_device = true});
      return batch;
    };
    for (int batch_size : batch_sizes) {
      if (!wanted("decode")) break;
      const double step_ms = forward_ms(*backend, decode(batch_size, {}), iterations);
      const double floor = floor_ms(config, size, batch_size);
      nlohmann::json figure = {{"step_ms", step_ms},
                               {"floor_ms", floor},
                               {"x_floor", step_ms / floor},
                               {"measured_floor_ms", floor * to_measured},
                               {"x_measured_floor", step_ms / (floor * to_measured)}};
      std::string reduces;
      if (group) {
        const AllReduceTimes reduce = all_reduce_ms(*group, devices, static_cast<int64_t>(batch_size) * config.hidden_size,
                                                    2 * config.num_layers + 1, iterations);
        figure["all_reduce_eager_ms"] = reduce.eager_ms;
        figure["all_reduce_graph_ms"] = reduce.graph_ms;
        figure["all_reduce_share"] = reduce.graph_ms / step_ms;  // the graph figure: the step replays its graphs
        reduces = fmt::format(", the step's all-reduces alone {:.3f} ms in a graph ({:.0f}% of the step), {:.3f} ms eager",
                              reduce.graph_ms, 100.0 * reduce.graph_ms / step_ms, reduce.eager_ms);
        if (nccl_only) {
          const AllReduceTimes nccl = all_reduce_ms(*nccl_only, devices, static_cast<int64_t>(batch_size) * config.hidden_size,
                                                    2 * config.num_layers + 1, iterations);
          figure["all_reduce_nccl_graph_ms"] = nccl.graph_ms;
          figure["all_reduce_nccl_eager_ms"] = nccl.eager_ms;
          reduces += fmt::format("; NCCL alone {:.3f} ms in a graph", nccl.graph_ms);
        }
      }
      figures[std::to_string(batch_size)] = figure;
      std::printf("TP=%d batch %3d: step %.3f ms, floor %.3f ms (%.2fx; %.2fx at the measured bandwidth)%s\n", size,
                  batch_size, step_ms, floor, step_ms / floor, step_ms / (floor * to_measured), reduces.c_str());
    }
    if (wanted("lora")) {  // issue 37: multi-LoRA under TP, each rank its shard of every adapter
      const double base_ms = forward_ms(*backend, decode(64, {}), iterations);
      const std::vector<int32_t> slots = bind_rank16_adapters(*backend, config);
      const double lora_ms = forward_ms(*backend, decode(64, slots), iterations);
      for (int32_t slot : slots) backend->set_adapter(slot, nullptr);
      figures["lora_decode_64"] = {{"base_ms", base_ms}, {"lora_ms", lora_ms}, {"ratio", lora_ms / base_ms}};
      std::printf("TP=%d decode 64, 8 rank-16 adapters: %.3f ms against the base model's %.3f ms (%.2fx)\n", size,
                  lora_ms, base_ms, lora_ms / base_ms);
    }
    if (wanted("prefill")) {
      const double prefill = forward_ms(*backend, prefill_batch(prefill_tokens, prng, config.vocab_size), 3, 1);
      const double mfu = prefill_flops(config, prefill_tokens) / (prefill * 1e-3) / (peaks().bf16 * size);
      figures["prefill"] = {{"tokens", prefill_tokens}, {"ms", prefill}, {"mfu", mfu}};
      std::printf("TP=%d prefill %d tokens: %.1f ms, %.1f%% of %d GPUs' dense bf16 peak\n", size, prefill_tokens,
                  prefill, 100.0 * mfu, size);
    }
  }
  std::ofstream(out_path) << results.dump(2) << "\n";
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}

}  // namespace
}  // namespace loom::cuda

int main(int argc, char** argv) {
  return loom::cuda::bench::bench_main("loom_tp_bench", loom::cuda::run, argc, argv);
}
