// Benchmarks of the CUDA backend on the 8B-shape model (random bf16 weights
// drawn on the GPU, as `--model random:llama-8b`):
//   decode   step time at batch 1/16/64/256 with 2K-token contexts, eager and as
//            a CUDA graph, against the bandwidth floor (weight + KV bytes / 3.35 TB/s)
//   prefill  one 8K-token prompt: model FLOPs utilisation against 989 TFLOP/s
//   lora     8 distinct adapters (r=16, all seven projections) in a decode batch
//            of 64 against base only
//   sampling the device sampling kernel on a decode-64 step's logits (greedy and
//            T 0.8 / top-k 50 / top-p 0.9), and a whole step's wall time with
//            the logits copied to the host and sampled there vs sampled on the device
//   attention the attention kernels alone (decode 64 x 2K, prefill 8K causal),
//            to hold against torch's scaled_dot_product_attention (sdpa_reference.py)
//   sharing  the sharing modes (8 rank-16 adapters, all seven projections): the
//            ResidualAttention kernels against plain paged attention (decode 64 x
//            2K; a 1K chunk over an 8K cache), and decode-64 steps of forked and
//            base (ICaRus decoder rows) sequences against isolated ones
// Writes one JSON object (--out) and prints a short table. Times are medians of
// CUDA-event timings after warm-up; the logits' copy to the host is not timed.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>

#include <CLI/CLI.hpp>
#include <cuda_profiler_api.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/sampling.h"
#include "engine/sampler.h"
#include "synthetic/synthetic_model.h"
#include "util/prng.h"

namespace loom::cuda {
namespace {

constexpr double kPeakBandwidth = 3.35e12;  // H100 SXM HBM3, bytes/s
constexpr double kPeakBf16 = 989e12;        // H100 SXM dense bf16, FLOP/s
constexpr int kBlockSize = 16;
constexpr int kContext = 2048;
constexpr int kContextGroups = 128;  // distinct 2K contexts; batch 256 shares them pairwise

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

// Decode batch: sequence s reads context group s % 128 (127 shared blocks) plus
// its own last block, where its new token (position 2047) is written.
Batch decode_batch(int batch_size, const std::vector<int32_t>& slots, Prng& prng, int vocab) {
  Batch batch;
  const int blocks_per_sequence = kContext / kBlockSize;
  for (int s = 0; s < batch_size; ++s) {
    BatchSequence sequence;
    sequence.num_computed_tokens = kContext - 1;
    sequence.num_new_tokens = 1;
    sequence.token_offset = s;
    sequence.block_table_offset = static_cast<int32_t>(batch.block_tables.size());
    sequence.num_blocks = blocks_per_sequence;
    const int group = s % kContextGroups;
    for (int b = 0; b < blocks_per_sequence - 1; ++b) batch.block_tables.push_back(group * (blocks_per_sequence - 1) + b);
    batch.block_tables.push_back(kContextGroups * (blocks_per_sequence - 1) + s);
    batch.sequences.push_back(sequence);
    batch.token_ids.push_back(static_cast<int32_t>(prng.next_below(vocab)));
    batch.positions.push_back(kContext - 1);
    batch.adapter_slots.push_back(slots.empty() ? -1 : slots[s % slots.size()]);
  }
  return batch;
}

Batch prefill_batch(int num_tokens, Prng& prng, int vocab) {
  Batch batch;
  BatchSequence sequence;
  sequence.num_new_tokens = num_tokens;
  sequence.num_blocks = num_tokens / kBlockSize;
  batch.sequences.push_back(sequence);
  for (int t = 0; t < num_tokens; ++t) {
    batch.token_ids.push_back(static_cast<int32_t>(prng.next_below(vocab)));
    batch.positions.push_back(t);
    batch.adapter_slots.push_back(-1);
  }
  for (int b = 0; b < sequence.num_blocks; ++b) batch.block_tables.push_back(b);
  return batch;
}

// The backend with its LoRA launches left out on request, to time what each
// costs a step (results wrong while any is skipped). Only this benchmark builds it.
class LaunchSkippingCudaBackend final : public CudaBackend {
 public:
  using CudaBackend::CudaBackend;
  // Per projection group g (0 q/k/v, 1 o, 2 gate/up, 3 down), bit 2g skips its
  // shrink launch and bit 2g+1 its expand launch; 0 runs everything.
  void set_lora_skip(uint32_t mask) { lora_skip_ = mask; }

 protected:
  void launch_lora_group(int group, const LoraParams& params, Launch launch) override {
    const int32_t skip = static_cast<int32_t>(lora_skip_ >> (2 * group) & 3);
    if (skip == 0) {
      launch_lora(params, launch);
    } else {
      launch_lora_skipping(params, launch, skip);
    }
  }

 private:
  uint32_t lora_skip_ = 0;
};

struct StepTimes {
  double eager_ms = 0, graph_ms = 0;
};

StepTimes time_step(CudaBackend& backend, const Batch& batch, int iterations, bool with_graph) {
  Timer timer(backend.stream());
  for (int i = 0; i < 3; ++i) backend.enqueue_forward(batch);  // grow buffers, load modules
  LOOM_CUDA_CHECK(cudaStreamSynchronize(backend.stream()));
  StepTimes times;
  times.eager_ms = timer.median_ms([&] { backend.enqueue_forward(batch); }, iterations);
  if (with_graph) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    LOOM_CUDA_CHECK(cudaStreamBeginCapture(backend.stream(), cudaStreamCaptureModeThreadLocal));
    backend.enqueue_forward(batch);
    LOOM_CUDA_CHECK(cudaStreamEndCapture(backend.stream(), &graph));
    LOOM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; ++i) LOOM_CUDA_CHECK(cudaGraphLaunch(exec, backend.stream()));
    times.graph_ms = timer.median_ms([&] { LOOM_CUDA_CHECK(cudaGraphLaunch(exec, backend.stream())); }, iterations);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  return times;
}

// Bytes every decode step must read: all weights except the embedding table
// (only the batch's rows), plus every attended KV entry.
double decode_floor_ms(const CudaBackend& backend, int batch_size) {
  const ModelConfig& config = backend.config();
  const double embedding = static_cast<double>(config.vocab_size) * config.hidden_size * 2;
  const double weights = static_cast<double>(backend.model().weight_bytes()) - embedding;
  const double kv = static_cast<double>(batch_size) * kContext * backend.kv_bytes_per_token();
  return (weights + kv) / kPeakBandwidth * 1e3;
}

double prefill_flops(const ModelConfig& config, int64_t tokens) {
  const double hidden = config.hidden_size, q = config.q_size(), kv = config.kv_size(), inter = config.intermediate_size;
  const double linear_per_token = 2.0 * (hidden * (q + 2 * kv) + q * hidden + hidden * 2 * inter + inter * hidden);
  const double pairs = static_cast<double>(tokens) * (tokens + 1) / 2;
  const double attention_per_layer = 4.0 * config.num_heads * config.head_dim * pairs;
  return config.num_layers * (linear_per_token * tokens + attention_per_layer) + 2.0 * hidden * config.vocab_size;
}

double measure_copy_bandwidth(cudaStream_t stream) {
  const size_t bytes = 4ull << 30;
  DeviceBuffer a(bytes), b(bytes);
  LOOM_CUDA_CHECK(cudaMemsetAsync(a.data(), 1, bytes, stream));
  Timer timer(stream);
  const double ms = timer.median_ms([&] { LOOM_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, stream)); }, 5);
  return 2.0 * bytes / (ms * 1e-3);
}

// Makes every sequence of `batch` forked (slot = its adapter slot), its rCache
// blocks the same ids as its main blocks, all but its new entries present.
void make_forked(Batch& batch) {
  batch.residual_block_tables = batch.block_tables;
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    BatchSequence& sequence = batch.sequences[s];
    sequence.forked_adapter_slot = batch.adapter_slots[sequence.token_offset];
    sequence.residual_block_table_offset = sequence.block_table_offset;
    sequence.num_residual_blocks = sequence.num_blocks;
    sequence.num_residual_present_tokens = sequence.num_computed_tokens;
  }
}

// Makes every sequence of `batch` use base sharing with its adapter (decoder rows).
void make_base(Batch& batch) {
  for (BatchSequence& sequence : batch.sequences) {
    sequence.decoder_adapter_slot = batch.adapter_slots[sequence.token_offset];
    std::fill_n(batch.adapter_slots.begin() + sequence.token_offset, sequence.num_new_tokens, -1);
  }
}

// The attention kernels alone on layer 0's pools, for the batch's plan
// (forked sequences: ResidualAttention over layer 0's rCache, residual_rank > 0).
// wide: the backend's choice of prefill kernel (the wgmma one where it applies); false: the mma.sync one.
// pingpong: wide items on the warp-specialized kernel (attention_pingpong.cu).
double time_attention(CudaBackend& backend, const Batch& batch, int iterations, int32_t residual_rank = 0,
                      bool wide = true, bool pingpong = false) {
  const ModelConfig& config = backend.config();
  StepPlan plan;
  PlanShape shape{kBlockSize, config.num_heads, config.num_kv_heads, 132, attention_decode_ctas_per_sm(config.head_dim),
                  residual_rank > 0 ? attention_decode_ctas_per_sm(config.head_dim, residual_rank) : 0};
  shape.wide_prefill = wide && attention_wide_supports_head_dim(config.head_dim);
  shape.forked_wide_prefill_keys = shape.wide_prefill ? CudaBackendConfig{}.forked_wide_prefill_keys : 0;
  plan.build(batch, shape, kBlockSize);
  const size_t scratch_entries = static_cast<size_t>(plan.num_scratch_keys()) * config.kv_size();
  DeviceBuffer scratch(std::max<size_t>(2 * scratch_entries * 2, 16));
  DeviceBuffer plan_d(plan.words().size() * 4);
  LOOM_CUDA_CHECK(cudaMemcpy(plan_d.data(), plan.words().data(), plan.words().size() * 4, cudaMemcpyHostToDevice));
  const size_t n = batch.token_ids.size();
  DeviceBuffer q(n * config.q_size() * 2), out(n * config.q_size() * 2);
  launch_synthetic_fill_bf16(q.as<bf16>(), n * config.q_size(), 99, false, 2.0f, backend.stream());
  const size_t partial_rows = static_cast<size_t>(std::max(plan.num_partials(), 1)) * config.num_kv_heads * kAttentionMaxRows;
  DeviceBuffer partial_out(partial_rows * config.head_dim * 4), partial_lse(partial_rows * 4);
  AttentionParams params;
  params.q = q.as<bf16>();
  params.k_cache = backend.k_pool(0);
  params.v_cache = backend.v_pool(0);
  const int32_t* words = plan_d.as<int32_t>();
  params.block_tables = words + plan.sections().block_tables;
  params.sequences = reinterpret_cast<const AttentionSequence*>(words + plan.sections().sequences);
  params.out = out.as<bf16>();
  params.partial_out = partial_out.as<float>();
  params.partial_lse = partial_lse.as<float>();
  params.num_heads = config.num_heads;
  params.num_kv_heads = config.num_kv_heads;
  params.head_dim = config.head_dim;
  params.block_size = kBlockSize;
  params.scale = 1.0f / std::sqrt(static_cast<float>(config.head_dim));
  if (residual_rank > 0) {
    params.residual_pool = backend.residual_pool(0);
    params.residual_block_tables = words + plan.sections().residual_block_tables;
    params.residual_block_size = kBlockSize;
    params.residual_rank_stride = residual_rank_stride(backend.residual_cache_shape().max_rank);
    params.lora_modules = backend.device_lora_modules();
    params.num_layers = config.num_layers;
    params.layer = 0;
    params.inv_freq = backend.model().inverse_frequencies();
  }
  AttentionVariant prefill = plan.prefill_variant();
  if (pingpong && prefill == AttentionVariant::kPrefillWide) prefill = AttentionVariant::kPrefillWidePingPong;
  auto run = [&] {
    launch_attention(params, prefill,
                     reinterpret_cast<const AttentionWorkItem*>(words + plan.sections().prefill_items),
                     plan.num_prefill_items(), backend.stream());
    launch_attention(params, AttentionVariant::kDecode,
                     reinterpret_cast<const AttentionWorkItem*>(words + plan.sections().decode_items),
                     plan.num_decode_items(), backend.stream());
    launch_attention(params, AttentionVariant::kPrefill,
                     reinterpret_cast<const AttentionWorkItem*>(words + plan.sections().forked_prefill_items),
                     plan.num_forked_prefill_items(), backend.stream(), residual_rank);
    launch_attention(params, AttentionVariant::kDecode,
                     reinterpret_cast<const AttentionWorkItem*>(words + plan.sections().forked_decode_items),
                     plan.num_forked_decode_items(), backend.stream(), residual_rank);
    launch_forked_wide_prefill(params, reinterpret_cast<const ResidualRebuildItem*>(words + plan.sections().rebuild_items),
                               plan.num_rebuild_items(),
                               reinterpret_cast<const AttentionWorkItem*>(words + plan.sections().forked_wide_items),
                               plan.num_forked_wide_items(), scratch.as<bf16>(), scratch.as<bf16>() + scratch_entries,
                               backend.stream(), residual_rank);
    launch_attention_combine(params, reinterpret_cast<const AttentionCombineItem*>(words + plan.sections().combine_items),
                             plan.num_combine_items(), backend.stream());
  };
  for (int i = 0; i < 3; ++i) run();
  Timer timer(backend.stream());
  return timer.median_ms(run, iterations);
}

// Binds 8 synthetic rank-16 adapters on all seven projections to slots 0..7; returns the slots.
std::vector<int32_t> bind_rank16_adapters(CudaBackend& backend) {
  SyntheticModelOptions options;
  options.num_adapters = 8;
  options.rank = 16;
  options.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  const auto specs = synthetic_adapter_specs(options, backend.config());
  std::vector<int32_t> slots;
  for (int a = 0; a < 8; ++a) {
    backend.set_adapter(a, std::make_shared<LoraAdapter>(make_synthetic_adapter(specs[a], backend.config(), 0)));
    slots.push_back(a);
  }
  return slots;
}

int run(int argc, char** argv) {
  CLI::App app{"CUDA backend benchmarks (8B-shape model, random bf16 weights)"};
  std::string out_path = "cuda_bench.json";
  int iterations = 20;
  std::vector<int> batch_sizes = {1, 16, 64, 256};
  int prefill_tokens = 8192;
  app.add_option("--out", out_path, "JSON results");
  app.add_option("--iterations", iterations, "Timed repetitions per figure (median)");
  app.add_option("--batch-sizes", batch_sizes, "Decode batch sizes");
  app.add_option("--prefill-tokens", prefill_tokens, "Prompt length of the prefill figure");
  std::vector<std::string> parts = {"decode", "lora", "sampling", "prefill", "attention", "sharing"};
  app.add_option("--what", parts, "Figures to measure (decode prefetch skinny rows lora sampling prefill attention sharing)");
  CLI11_PARSE(app, argc, argv);

  nlohmann::json results;
  results["device"] = cuda_device_description(0);
  const ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::k8b);
  const auto load_start = std::chrono::steady_clock::now();
  CudaBackendConfig backend_config;
  backend_config.max_adapter_slots = 8;
  auto owner = make_synthetic_cuda_backend_as(
      config, 0, true, backend_config,
      [](const ModelConfig& model_config, DeviceModel model, cudaStream_t stream, int device,
         const CudaBackendConfig& config_of_backend) -> std::unique_ptr<CudaBackend> {
        return std::make_unique<LaunchSkippingCudaBackend>(model_config, std::move(model), stream, device,
                                                           config_of_backend);
      });
  auto& backend = static_cast<LaunchSkippingCudaBackend&>(*owner);
  results["model"] = {{"name", "random:llama-8b"},
                      {"weight_bytes", backend.model().weight_bytes()},
                      {"load_seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count()}};
  const int blocks_per_sequence = kContext / kBlockSize;
  const int num_blocks = kContextGroups * (blocks_per_sequence - 1) + 256;
  backend.allocate_kv_cache({num_blocks, kBlockSize});
  // Random K/V (never time on zeros).
  const int64_t kv_elements = static_cast<int64_t>(num_blocks) * kBlockSize * backend.kv_bytes_per_token() / 2;
  launch_synthetic_fill_bf16(backend.k_pool(0), kv_elements, 12345, false, 1.0f, backend.stream());
  LOOM_CUDA_CHECK(cudaStreamSynchronize(backend.stream()));
  const double copy_bandwidth = measure_copy_bandwidth(backend.stream());
  results["measured_copy_bandwidth_bytes_per_s"] = copy_bandwidth;
  std::printf("device: %s\nmeasured device-to-device copy: %.2f TB/s (read + write)\n", results["device"].get<std::string>().c_str(),
              copy_bandwidth / 1e12);

  Prng prng(1);
  auto wanted = [&](const char* part) { return std::find(parts.begin(), parts.end(), part) != parts.end(); };
  if (wanted("decode"))
    std::printf("\n%-28s %10s %10s %10s %8s %12s %12s %8s %12s\n", "decode (2K context)", "eager ms", "graph ms", "floor ms",
                "x floor", "pdl eager", "pdl graph", "x floor", "no pdl graph");
  for (int batch_size : batch_sizes) {
    if (!wanted("decode")) break;
    const Batch batch = decode_batch(batch_size, {}, prng, config.vocab_size);
    const StepTimes times = time_step(backend, batch, iterations, true);
    const double floor_ms = decode_floor_ms(backend, batch_size);
    // The same step with cuBLAS for every GEMM (the default takes the skinny kernels at 1 row).
    double cublas_graph_ms = 0;
    if (batch_size <= 2) {
      backend.set_decode_gemm(CudaBackend::DecodeGemm::kCublas);
      cublas_graph_ms = time_step(backend, batch, iterations, true).graph_ms;
      backend.set_decode_gemm(CudaBackend::DecodeGemm::kAuto);
    }
    // The same step with programmatic dependent launches at every size (CudaBackendConfig::programmatic_max_rows;
    // by default 1-row steps only) and with none.
    backend.set_programmatic_max_rows(1 << 30);
    const StepTimes programmatic = time_step(backend, batch, iterations, true);
    backend.set_programmatic_max_rows(0);
    const StepTimes plain = time_step(backend, batch, iterations, true);
    backend.set_programmatic_max_rows(CudaBackendConfig{}.programmatic_max_rows);
    results["decode"].push_back({{"batch", batch_size}, {"context", kContext}, {"eager_ms", times.eager_ms},
                                 {"cublas_gemm_graph_ms", cublas_graph_ms},
                                 {"graph_ms", times.graph_ms}, {"floor_ms", floor_ms},
                                 {"graph_over_floor", times.graph_ms / floor_ms},
                                 {"eager_over_floor", times.eager_ms / floor_ms},
                                 {"programmatic_eager_ms", programmatic.eager_ms},
                                 {"programmatic_graph_ms", programmatic.graph_ms},
                                 {"programmatic_graph_over_floor", programmatic.graph_ms / floor_ms},
                                 {"plain_graph_ms", plain.graph_ms}, {"plain_eager_ms", plain.eager_ms},
                                 {"kv_shared_pairwise", batch_size > kContextGroups}});
    std::printf("%-28s %10.3f %10.3f %10.3f %8.2f %12.3f %12.3f %8.2f %12.3f\n", ("batch " + std::to_string(batch_size)).c_str(),
                times.eager_ms, times.graph_ms, floor_ms, times.graph_ms / floor_ms, programmatic.eager_ms,
                programmatic.graph_ms, programmatic.graph_ms / floor_ms, plain.graph_ms);
  }

  // L2 read-ahead of the next weights beside the latency-bound kernels (CudaBackend::L2Prefetch), graph steps at every
  // batch size: caps in MiB at its three points (o_proj, gate_up head, next q/k/v head).
  if (wanted("prefetch")) {
    const std::vector<std::array<int, 3>> settings = {{0, 0, 0}, {32, 0, 0}, {16, 0, 0}, {24, 8, 0}, {24, 8, 8},
                                                      {16, 8, 8}, {0, 0, 8},  {32, 8, 8}, {16, 16, 16}};
    const CudaBackend::L2Prefetch default_prefetch = backend.l2_prefetch();
    std::printf("\n%-28s %10s %10s %8s\n", "L2 prefetch MiB o/gu/qkv", "batch", "graph ms", "x floor");
    for (int batch_size : batch_sizes) {
      const Batch batch = decode_batch(batch_size, {}, prng, config.vocab_size);
      const double floor_ms = decode_floor_ms(backend, batch_size);
      for (const auto& [o_proj, gate_up, qkv] : settings) {
        const int64_t mib = int64_t{1} << 20;
        backend.set_l2_prefetch({o_proj * mib, gate_up * mib, qkv * mib, batch_size});
        const double graph_ms = time_step(backend, batch, iterations, true).graph_ms;
        results["prefetch"].push_back({{"batch", batch_size}, {"o_proj_mib", o_proj}, {"gate_up_mib", gate_up},
                                       {"qkv_mib", qkv}, {"graph_ms", graph_ms}, {"graph_over_floor", graph_ms / floor_ms}});
        std::printf("%-28s %10d %10.3f %8.3f\n", fmt::format("{}/{}/{}", o_proj, gate_up, qkv).c_str(), batch_size,
                    graph_ms, graph_ms / floor_ms);
      }
    }
    backend.set_l2_prefetch(default_prefetch);
  }

  // The 1-row skinny GEMM's variants (loads in flight, warps a CTA, L2 fetch hint) alone on the 8B shape's
  // projections, each launch on its own slice of a 2 GiB pool (no L2 reuse), and a plain streaming read.
  if (wanted("skinny")) {
    const int64_t pool_bytes = int64_t{2} << 30;
    DeviceBuffer pool(static_cast<size_t>(pool_bytes)), x_d(64 << 10), y_d(128256 * sizeof(float)), sink(64);
    launch_synthetic_fill_bf16(pool.as<bf16>(), pool_bytes / 2, 99, false, 1.0f, backend.stream());
    launch_synthetic_fill_bf16(x_d.as<bf16>(), 16384, 98, false, 1.0f, backend.stream());
    Timer timer(backend.stream());
    constexpr int kLaunches = 20;
    std::printf("\n%-28s", "read probe GB/s:");
    for (const auto& [blocks, threads] : std::vector<std::pair<int, int>>{{132 * 8, 256}, {132 * 16, 256}, {132 * 32, 128}}) {
      const double ms = timer.median_ms([&] {
        launch_read_probe(pool.data(), pool_bytes, sink.as<uint32_t>(), blocks, threads, backend.stream());
      }, 5);
      results["read_probe"].push_back({{"blocks", blocks}, {"threads", threads}, {"bytes_per_s", pool_bytes / (ms * 1e-3)}});
      std::printf(" %dx%d %.0f", blocks, threads, pool_bytes / (ms * 1e6));
    }
    std::printf("\n%-28s %8s %8s %8s %8s %8s   (GB/s, 20 launches back to back)\n", "unroll/warps/hint", "qkv", "o",
                "gate_up", "down", "lm_head");
    const std::vector<std::pair<int, int>> shapes = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}, {128256, 4096}};
    for (const std::array<int, 3>& v : std::vector<std::array<int, 3>>{{4, 4, 0}, {4, 4, 1}, {4, 4, 2}, {8, 4, 0}, {8, 4, 2},
                                                                       {4, 8, 0}, {4, 8, 2}, {8, 8, 0}, {8, 8, 2}, {2, 4, 0},
                                                                       {4, 2, 0}, {16, 4, 0}}) {
      std::printf("%-28s", fmt::format("{}/{}/{}", v[0], v[1], v[2]).c_str());
      nlohmann::json row = {{"unroll", v[0]}, {"warps", v[1]}, {"hint", v[2]}};
      for (const auto& [n, k] : shapes) {
        const int64_t bytes = int64_t{n} * k * 2;
        const int64_t slices = pool_bytes / bytes;
        const double ms = timer.median_ms([&] {
          for (int i = 0; i < kLaunches; ++i)
            launch_skinny_gemm_variant(x_d.as<bf16>(), k, pool.as<bf16>() + (i % slices) * (bytes / 2), n,
                                       y_d.as<float>(), v[0], v[1], v[2], backend.stream());
        }, 5) / kLaunches;
        row["bytes_per_s"].push_back(bytes / (ms * 1e-3));
        std::printf(" %8.0f", bytes / (ms * 1e6));
      }
      results["skinny"].push_back(row);
      std::printf("\n");
    }
  }

  // Steps of 1-4 rows on cuBLAS or the skinny GEMMs, with or without programmatic launches and the L2 read-ahead
  // (the defaults: all three up to 2 rows).
  if (wanted("rows")) {
    std::printf("\n%-44s %8s %10s %8s\n", "2-4 rows", "batch", "graph ms", "x floor");
    const CudaBackend::L2Prefetch default_prefetch = backend.l2_prefetch();
    const int32_t default_skinny = backend.skinny_max_rows();
    for (int batch_size : batch_sizes) {
      const Batch batch = decode_batch(batch_size, {}, prng, config.vocab_size);
      const double floor_ms = decode_floor_ms(backend, batch_size);
      struct Setting { const char* name; int skinny, programmatic, prefetch; };
      for (const Setting& setting : {Setting{"cuBLAS from 2 rows", 1, 1, 1}, Setting{"skinny", 4, 1, 1},
                                     Setting{"skinny + pdl", 4, 4, 1}, Setting{"skinny + pdl + prefetch", 4, 4, 4},
                                     Setting{"skinny + prefetch", 4, 1, 4}}) {
        backend.set_skinny_max_rows(setting.skinny);
        backend.set_programmatic_max_rows(setting.programmatic);
        CudaBackend::L2Prefetch prefetch = default_prefetch;
        prefetch.max_rows = setting.prefetch;
        backend.set_l2_prefetch(prefetch);
        const double graph_ms = time_step(backend, batch, iterations, true).graph_ms;
        results["rows"].push_back({{"batch", batch_size}, {"setting", setting.name}, {"graph_ms", graph_ms},
                                   {"graph_over_floor", graph_ms / floor_ms}});
        std::printf("%-44s %8d %10.3f %8.3f\n", setting.name, batch_size, graph_ms, graph_ms / floor_ms);
      }
    }
    backend.set_skinny_max_rows(default_skinny);
    backend.set_programmatic_max_rows(CudaBackendConfig{}.programmatic_max_rows);
    backend.set_l2_prefetch(default_prefetch);
  }

  if (wanted("lora")) {
    const std::vector<int32_t> slots = bind_rank16_adapters(backend);
    const Batch base = decode_batch(64, {}, prng, config.vocab_size);
    const Batch mixed = decode_batch(64, slots, prng, config.vocab_size);
    const StepTimes base_times = time_step(backend, base, iterations, true);
    const StepTimes lora_times = time_step(backend, mixed, iterations, true);
    // The other placements and kernels (the default: split kernels on the side stream).
    using Overlap = CudaBackend::LoraOverlap;
    using Kernel = CudaBackend::LoraKernel;
    backend.set_lora_overlap(Overlap::kSideStreamPdl);
    const StepTimes pdl_times = time_step(backend, mixed, iterations, true);
    backend.set_lora_overlap(Overlap::kInline);
    const StepTimes inline_times = time_step(backend, mixed, iterations, true);
    // Inline, every launch of the step programmatic (CudaBackendConfig::programmatic_max_rows).
    backend.set_programmatic_max_rows(1 << 30);
    const StepTimes inline_programmatic_times = time_step(backend, mixed, iterations, true);
    const StepTimes base_programmatic_times = time_step(backend, base, iterations, true);
    backend.set_programmatic_max_rows(CudaBackendConfig{}.programmatic_max_rows);
    std::printf("LoRA inline with programmatic launches (graph ms): %.3f (eager %.3f); base model %.3f (eager %.3f)\n",
                inline_programmatic_times.graph_ms, inline_programmatic_times.eager_ms,
                base_programmatic_times.graph_ms, base_programmatic_times.eager_ms);
    results["lora_inline_programmatic"] = {{"graph_ms", inline_programmatic_times.graph_ms},
                                           {"eager_ms", inline_programmatic_times.eager_ms},
                                           {"base_graph_ms", base_programmatic_times.graph_ms},
                                           {"base_eager_ms", base_programmatic_times.eager_ms}};
    backend.set_lora_kernel(Kernel::kFused);
    const StepTimes fused_inline_times = time_step(backend, mixed, iterations, true);
    backend.set_lora_overlap(Overlap::kSideStream);
    const StepTimes fused_times = time_step(backend, mixed, iterations, true);
    backend.set_lora_kernel(Kernel::kFusedAttention);
    const StepTimes fused_attention_times = time_step(backend, mixed, iterations, true);
    backend.set_lora_overlap(Overlap::kInline);
    const StepTimes fused_attention_inline_times = time_step(backend, mixed, iterations, true);
    backend.set_lora_overlap(Overlap::kSideStream);
    backend.set_lora_kernel(Kernel::kSplit);
    std::printf("LoRA fused for q/k/v and o only (graph ms): side stream %.3f (eager %.3f), inline %.3f\n",
                fused_attention_times.graph_ms, fused_attention_times.eager_ms, fused_attention_inline_times.graph_ms);
    results["lora_fused_attention"] = {{"side_stream_graph_ms", fused_attention_times.graph_ms},
                                       {"side_stream_eager_ms", fused_attention_times.eager_ms},
                                       {"inline_graph_ms", fused_attention_inline_times.graph_ms}};
    // Which groups gain from the side stream: each mask puts the groups of its clear bits inline.
    std::printf("LoRA side-stream groups (bit 0 q/k/v, 1 o, 2 gate/up, 3 down; graph ms):");
    for (const uint32_t mask : {0xFu, 0xEu, 0xDu, 0xBu, 0x7u, 0xCu, 0x3u}) {
      backend.set_lora_side_groups(mask);
      const StepTimes mask_times = time_step(backend, mixed, iterations, true);
      results["lora_side_groups"].push_back({{"mask", mask}, {"graph_ms", mask_times.graph_ms}});
      std::printf(" 0x%X %.3f", mask, mask_times.graph_ms);
    }
    std::printf("\n");
    backend.set_lora_side_groups(0xF);
    backend.set_lora_bf16_gate_up(false);
    const StepTimes f32_delta_times = time_step(backend, mixed, iterations, true);
    backend.set_lora_bf16_gate_up(true);
    const StepTimes bf16_delta_times = time_step(backend, mixed, iterations, true);
    results["lora_gate_up_delta"] = {{"f32_graph_ms", f32_delta_times.graph_ms}, {"bf16_graph_ms", bf16_delta_times.graph_ms}};
    std::printf("LoRA gate/up delta (graph ms): fp32 %.3f, bf16 %.3f (default)\n", f32_delta_times.graph_ms,
                bf16_delta_times.graph_ms);
    std::printf("LoRA expand columns per thread (0: 1 column, 128 threads; graph ms):");
    for (const int columns : {2, 1}) {
      backend.set_lora_expand_columns(columns);
      const StepTimes column_times = time_step(backend, mixed, iterations, true);
      results["lora_expand_columns"].push_back(
          {{"columns", columns}, {"graph_ms", column_times.graph_ms}, {"eager_ms", column_times.eager_ms}});
      std::printf(" %d: %.3f (eager %.3f)", columns, column_times.graph_ms, column_times.eager_ms);
    }
    std::printf("\n");
    // What each launch costs the step (results wrong while skipped): bits 2g / 2g+1 skip group g's shrink / expand.
    std::printf("LoRA launches skipped (graph ms):");
    for (const uint32_t mask : {0x10u, 0x20u, 0x40u, 0x80u, 0xFFu}) {
      backend.set_lora_skip(mask);
      const StepTimes skip_times = time_step(backend, mixed, iterations, true);
      results["lora_skip"].push_back({{"mask", mask}, {"graph_ms", skip_times.graph_ms}});
      std::printf(" 0x%02X %.3f", mask, skip_times.graph_ms);
    }
    std::printf("\n");
    backend.set_lora_skip(0);
    results["lora_placements"] = {{"side_stream_graph_ms", lora_times.graph_ms},
                                  {"side_stream_pdl_graph_ms", pdl_times.graph_ms},
                                  {"inline_graph_ms", inline_times.graph_ms},
                                  {"fused_side_stream_graph_ms", fused_times.graph_ms},
                                  {"fused_inline_graph_ms", fused_inline_times.graph_ms}};
    std::printf("LoRA placements (graph ms): side stream %.3f (eager %.3f), + PDL expand %.3f, inline %.3f; fused "
                "kernel side stream %.3f, inline %.3f\n",
                lora_times.graph_ms, lora_times.eager_ms, pdl_times.graph_ms, inline_times.graph_ms,
                fused_times.graph_ms, fused_inline_times.graph_ms);
    results["lora"] = {{"batch", 64}, {"adapters", 8}, {"rank", 16}, {"base_graph_ms", base_times.graph_ms},
                       {"lora_graph_ms", lora_times.graph_ms}, {"base_eager_ms", base_times.eager_ms},
                       {"lora_eager_ms", lora_times.eager_ms}, {"ratio_graph", lora_times.graph_ms / base_times.graph_ms},
                       {"ratio_eager", lora_times.eager_ms / base_times.eager_ms}};
    std::printf("\nmulti-LoRA decode 64 (8 adapters r=16): base %.3f ms, lora %.3f ms, ratio %.3f (graph)\n",
                base_times.graph_ms, lora_times.graph_ms, lora_times.graph_ms / base_times.graph_ms);
    if (wanted("loraprof")) {  // one eager step per kernel choice between cudaProfilerStart/Stop (ncu --profile-from-start off)
      for (const auto kernel : {Kernel::kFused, Kernel::kSplit}) {
        backend.set_lora_kernel(kernel);
        backend.enqueue_forward(mixed);
        LOOM_CUDA_CHECK(cudaStreamSynchronize(backend.stream()));
        LOOM_CUDA_CHECK(cudaProfilerStart());
        backend.enqueue_forward(mixed);
        LOOM_CUDA_CHECK(cudaStreamSynchronize(backend.stream()));
        LOOM_CUDA_CHECK(cudaProfilerStop());
      }
      backend.set_lora_kernel(Kernel::kSplit);
    }
    for (int a = 0; a < 8; ++a) backend.set_adapter(a, nullptr);
  }

  if (wanted("sampling")) {
    const int rows = 64;
    Batch batch = decode_batch(rows, {}, prng, config.vocab_size);
    backend.forward(batch);  // the step's logits stay in device_logits()
    DeviceBuffer rows_d(rows * sizeof(SamplingRow)), out_d(rows * 8);
    auto time_kernel = [&](const SamplingRow& row) {
      const std::vector<SamplingRow> host_rows(rows, row);
      LOOM_CUDA_CHECK(cudaMemcpy(rows_d.data(), host_rows.data(), rows_d.size(), cudaMemcpyHostToDevice));
      Timer timer(backend.stream());
      auto run = [&] {
        launch_sampling(backend.device_logits(), rows, config.vocab_size, rows_d.as<SamplingRow>(),
                        out_d.as<int32_t>(), reinterpret_cast<float*>(out_d.as<int32_t>() + rows), backend.stream());
      };
      for (int i = 0; i < 3; ++i) run();
      return timer.median_ms(run, iterations);
    };
    const double greedy_ms = time_kernel({1, 0.0f, 0, 1.0f, 1, 0, 0, 0});
    const double top_ms = time_kernel({1, 0.8f, 50, 0.9f, 1, 0, 0, 0});
    const double top_p_ms = time_kernel({1, 1.0f, 0, 0.95f, 1, 0, 0, 0});
    // Wall time of a whole step as the engine sees it (forward returns on the host).
    SamplingParams host_params;
    host_params.temperature = 0.8f;
    host_params.top_k = 50;
    host_params.top_p = 0.9f;
    std::vector<Sampler> samplers(rows, Sampler(host_params));
    auto wall_ms = [&](auto&& body) {
      std::vector<double> times;
      for (int i = 0; i < iterations; ++i) {
        const auto start = std::chrono::steady_clock::now();
        body();
        times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      }
      std::sort(times.begin(), times.end());
      return times[times.size() / 2];
    };
    const double host_step_ms = wall_ms([&] {
      const ForwardResult result = backend.forward(batch);
      for (int r = 0; r < rows; ++r) samplers[r].sample(result.logits.data() + static_cast<size_t>(r) * config.vocab_size, config.vocab_size);
    });
    Batch device_batch = batch;
    device_batch.sampling.assign(rows, DeviceSampling{true, 0.8f, 50, 0.9f, 1, 0});
    const double device_step_ms = wall_ms([&] {
      for (DeviceSampling& sampling : device_batch.sampling) ++sampling.step;
      const ForwardResult result = backend.forward(device_batch);
      if (result.sampled_token_ids.size() != static_cast<size_t>(rows)) std::abort();
    });
    results["sampling"] = {{"rows", rows}, {"vocab", config.vocab_size}, {"kernel_greedy_ms", greedy_ms},
                           {"kernel_t0.8_topk50_topp0.9_ms", top_ms}, {"kernel_topp0.95_ms", top_p_ms},
                           {"step_wall_host_sampling_ms", host_step_ms}, {"step_wall_device_sampling_ms", device_step_ms}};
    std::printf("\nsampling 64 rows x %d: kernel greedy %.3f ms, T0.8/top-k 50/top-p 0.9 %.3f ms, top-p 0.95 %.3f ms;"
                " decode-64 step wall (forward + sampling) host %.2f ms, device %.2f ms\n",
                config.vocab_size, greedy_ms, top_ms, top_p_ms, host_step_ms, device_step_ms);
  }

  if (wanted("prefill")) {
    const Batch batch = prefill_batch(prefill_tokens, prng, config.vocab_size);
    const StepTimes times = time_step(backend, batch, std::max(3, iterations / 4), false);
    const double flops = prefill_flops(config, prefill_tokens);
    const double mfu = flops / (times.eager_ms * 1e-3) / kPeakBf16;
    results["prefill"] = {{"tokens", prefill_tokens}, {"ms", times.eager_ms}, {"flops", flops}, {"mfu", mfu},
                          {"tflops", flops / (times.eager_ms * 1e-3) / 1e12}};
    std::printf("\nprefill %d tokens: %.1f ms, %.1f TFLOP/s, MFU %.1f%%\n", prefill_tokens, times.eager_ms,
                flops / (times.eager_ms * 1e-3) / 1e12, 100 * mfu);
    backend.set_pingpong_prefill(false);  // the same prefill with attention_wide.cu's kernel
    const double wgmma_ms = time_step(backend, batch, std::max(3, iterations / 4), false).eager_ms;
    backend.set_pingpong_prefill(true);
    results["prefill"]["wgmma_ms"] = wgmma_ms;
    results["prefill"]["wgmma_mfu"] = flops / (wgmma_ms * 1e-3) / kPeakBf16;
    std::printf("prefill %d tokens, wgmma attention (attention_wide.cu): %.1f ms, MFU %.1f%%\n", prefill_tokens,
                wgmma_ms, 100 * flops / (wgmma_ms * 1e-3) / kPeakBf16);
  }

  if (wanted("attention")) {
    const Batch decode16 = decode_batch(16, {}, prng, config.vocab_size);
    const double decode16_ms = time_attention(backend, decode16, iterations);
    const double decode16_bytes = 16.0 * kContext * config.kv_size() * 2 * 2;
    results["attention_decode16"] = {{"batch", 16}, {"ms", decode16_ms}, {"bandwidth_bytes_per_s", decode16_bytes / (decode16_ms * 1e-3)}};
    std::printf("\nattention alone, one layer: decode 16x2K %.3f ms (%.2f TB/s of K/V)\n", decode16_ms,
                decode16_bytes / (decode16_ms * 1e-3) / 1e12);
    const Batch decode = decode_batch(64, {}, prng, config.vocab_size);
    const double decode_ms = time_attention(backend, decode, iterations);
    const double decode_bytes = 64.0 * kContext * config.kv_size() * 2 * 2;
    results["attention"] = {
        {"decode", {{"batch", 64}, {"context", kContext}, {"heads", config.num_heads}, {"kv_heads", config.num_kv_heads},
                    {"head_dim", config.head_dim}, {"ms", decode_ms}, {"kv_bytes", decode_bytes},
                    {"bandwidth_bytes_per_s", decode_bytes / (decode_ms * 1e-3)}}}};
    std::printf("\nattention alone, one layer: decode 64x2K %.3f ms (%.2f TB/s of K/V)\n", decode_ms,
                decode_bytes / (decode_ms * 1e-3) / 1e12);
    // Causal prefill on the three kernels (the ping-pong one is the backend's choice), at the prompt length and 32K.
    nlohmann::json prefill_runs = nlohmann::json::array();
    for (const int tokens : {prefill_tokens, 32768}) {
      const Batch prefill = prefill_batch(tokens, prng, config.vocab_size);
      const double pairs = static_cast<double>(tokens) * (tokens + 1) / 2;
      const double flop = 4.0 * config.num_heads * config.head_dim * pairs;
      const int prefill_iterations = std::max(3, iterations / 2);
      const double wide_ms = time_attention(backend, prefill, prefill_iterations, 0, true);
      const double mma_sync_ms = time_attention(backend, prefill, prefill_iterations, 0, false);
      const double pingpong_ms = time_attention(backend, prefill, prefill_iterations, 0, true, true);
      prefill_runs.push_back({{"tokens", tokens}, {"heads", config.num_heads}, {"kv_heads", config.num_kv_heads},
                              {"head_dim", config.head_dim}, {"causal", true}, {"flops", flop}, {"ms", wide_ms},
                              {"tflops", flop / (wide_ms * 1e-3) / 1e12}, {"mma_sync_ms", mma_sync_ms},
                              {"mma_sync_tflops", flop / (mma_sync_ms * 1e-3) / 1e12}, {"pingpong_ms", pingpong_ms},
                              {"pingpong_tflops", flop / (pingpong_ms * 1e-3) / 1e12}});
      std::printf("attention alone, one layer: prefill %d causal: ping-pong %.3f ms (%.0f TFLOP/s); wgmma kernel %.3f ms "
                  "(%.0f TFLOP/s); mma.sync kernel %.3f ms (%.0f TFLOP/s)\n",
                  tokens, pingpong_ms, flop / (pingpong_ms * 1e-3) / 1e12, wide_ms, flop / (wide_ms * 1e-3) / 1e12,
                  mma_sync_ms, flop / (mma_sync_ms * 1e-3) / 1e12);
    }
    results["attention"]["prefill"] = prefill_runs[0];
    results["attention"]["prefill_runs"] = prefill_runs;
  }

  if (wanted("sharing")) {
    const std::vector<int32_t> slots = bind_rank16_adapters(backend);
    backend.allocate_residual_cache({num_blocks, kBlockSize, 16});
    const int64_t residual_elements = static_cast<int64_t>(num_blocks) * kBlockSize *
                                      backend.residual_bytes_per_token(16) / 2;
    launch_synthetic_fill_bf16(backend.residual_pool(0), residual_elements, 777, false, 1.0f, backend.stream());
    // Kernels: decode 64 x 2K, and a 1K-token chunk over an 8K cache.
    const Batch plain_decode = decode_batch(64, slots, prng, config.vocab_size);
    Batch forked_decode = plain_decode;
    make_forked(forked_decode);
    const double plain_decode_ms = time_attention(backend, plain_decode, iterations);
    const double forked_decode_ms = time_attention(backend, forked_decode, iterations, 16);
    Batch plain_chunk = prefill_batch(8192 + 1024, prng, config.vocab_size);
    plain_chunk.sequences[0].num_computed_tokens = 8192;
    plain_chunk.sequences[0].num_new_tokens = 1024;
    plain_chunk.token_ids.erase(plain_chunk.token_ids.begin(), plain_chunk.token_ids.begin() + 8192);
    plain_chunk.positions.erase(plain_chunk.positions.begin(), plain_chunk.positions.begin() + 8192);
    plain_chunk.adapter_slots.assign(1024, 0);
    Batch forked_chunk = plain_chunk;
    make_forked(forked_chunk);
    const double plain_chunk_ms = time_attention(backend, plain_chunk, std::max(3, iterations / 2));
    const double forked_chunk_ms = time_attention(backend, forked_chunk, std::max(3, iterations / 2), 16);
    // The same chunk on ResidualAttention's mma.sync prefill (no scratch rebuild).
    const double forked_chunk_narrow_ms = time_attention(backend, forked_chunk, std::max(3, iterations / 2), 16, false);
    // Steps: 64 decodes of the same 8 adapters, isolated vs forked vs base.
    Batch base_decode = plain_decode;
    make_base(base_decode);
    const StepTimes isolated_step = time_step(backend, plain_decode, iterations, true);
    const StepTimes forked_step = time_step(backend, forked_decode, iterations, true);
    const StepTimes base_step = time_step(backend, base_decode, iterations, true);
    results["sharing"] = {
        {"adapters", 8}, {"rank", 16},
        {"kernel_decode", {{"batch", 64}, {"context", kContext}, {"paged_ms", plain_decode_ms},
                           {"residual_ms", forked_decode_ms}, {"ratio", forked_decode_ms / plain_decode_ms}}},
        {"kernel_chunk", {{"cached", 8192}, {"new", 1024}, {"paged_ms", plain_chunk_ms},
                          {"residual_ms", forked_chunk_ms}, {"ratio", forked_chunk_ms / plain_chunk_ms},
                          {"residual_attention_kernel_ms", forked_chunk_narrow_ms}}},
        {"step_decode64", {{"isolated_graph_ms", isolated_step.graph_ms}, {"forked_graph_ms", forked_step.graph_ms},
                           {"base_graph_ms", base_step.graph_ms}, {"isolated_eager_ms", isolated_step.eager_ms},
                           {"forked_eager_ms", forked_step.eager_ms}, {"base_eager_ms", base_step.eager_ms},
                           {"forked_ratio", forked_step.graph_ms / isolated_step.graph_ms},
                           {"base_ratio", base_step.graph_ms / isolated_step.graph_ms}}}};
    std::printf("\nsharing (8 adapters r=16): ResidualAttention decode 64x2K %.3f ms vs paged %.3f ms (%.2fx); "
                "1K chunk over 8K %.3f vs %.3f ms (%.2fx; on the ResidualAttention prefill kernel %.3f ms)\n",
                forked_decode_ms, plain_decode_ms, forked_decode_ms / plain_decode_ms, forked_chunk_ms, plain_chunk_ms,
                forked_chunk_ms / plain_chunk_ms, forked_chunk_narrow_ms);
    std::printf("decode-64 step (graph ms): isolated %.3f, forked %.3f (%.3fx), base %.3f (%.3fx)\n",
                isolated_step.graph_ms, forked_step.graph_ms, forked_step.graph_ms / isolated_step.graph_ms,
                base_step.graph_ms, base_step.graph_ms / isolated_step.graph_ms);
    for (int a = 0; a < 8; ++a) backend.set_adapter(a, nullptr);
  }

  std::ofstream(out_path) << results.dump(2) << "\n";
  std::printf("\nwrote %s\n", out_path.c_str());
  return 0;
}

}  // namespace
}  // namespace loom::cuda

int main(int argc, char** argv) {
  try {
    return loom::cuda::run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "loom_cuda_bench: %s\n", error.what());
    return 1;
  }
}
