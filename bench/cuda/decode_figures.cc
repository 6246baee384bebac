// The decode-step figures of loom_cuda_bench (bench_common.h, decode_figures).
#include <array>
#include <cstdio>

#include <fmt/format.h>

#include "backend/cuda/layer_runner.h"
#include "bench_common.h"

namespace loom::cuda::bench {

void decode_figures(BenchContext& context) {
  CudaBackend& backend = context.backend;
  const ModelConfig& config = context.config;
  nlohmann::json& results = context.results;
  Prng& prng = context.prng;
  const int iterations = context.iterations;
  const std::vector<int>& batch_sizes = context.batch_sizes;
  auto wanted = [&](const char* part) { return context.wanted(part); };
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
      tune(backend, [](CudaTuning& t) { t.skinny_max_rows = 0; });
      cublas_graph_ms = time_step(backend, batch, iterations, true).graph_ms;
      tune(backend, [](CudaTuning& t) { t.skinny_max_rows = CudaTuning{}.skinny_max_rows; });
    }
    // The same step with programmatic dependent launches at every size (CudaTuning::programmatic_max_rows;
    // by default 1-row steps only) and with none.
    tune(backend, [](CudaTuning& t) { t.programmatic_max_rows = 1 << 30; });
    const StepTimes programmatic = time_step(backend, batch, iterations, true);
    tune(backend, [](CudaTuning& t) { t.programmatic_max_rows = 0; });
    const StepTimes plain = time_step(backend, batch, iterations, true);
    tune(backend, [](CudaTuning& t) { t.programmatic_max_rows = CudaTuning{}.programmatic_max_rows; });
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

  // L2 read-ahead of the next weights beside the latency-bound kernels (CudaTuning::l2_prefetch), graph steps at every
  // batch size: caps in MiB at its three points (o_proj, gate_up head, next q/k/v head).
  if (wanted("prefetch")) {
    const std::vector<std::array<int, 3>> settings = {{0, 0, 0}, {32, 0, 0}, {16, 0, 0}, {24, 8, 0}, {24, 8, 8},
                                                      {16, 8, 8}, {0, 0, 8},  {32, 8, 8}, {16, 16, 16}};
    const CudaTuning::L2Prefetch default_prefetch = backend.tuning().l2_prefetch;
    std::printf("\n%-28s %10s %10s %8s\n", "L2 prefetch MiB o/gu/qkv", "batch", "graph ms", "x floor");
    for (int batch_size : batch_sizes) {
      const Batch batch = decode_batch(batch_size, {}, prng, config.vocab_size);
      const double floor_ms = decode_floor_ms(backend, batch_size);
      for (const auto& [o_proj, gate_up, qkv] : settings) {
        const int64_t mib = int64_t{1} << 20;
        tune(backend, [&](CudaTuning& t) { t.l2_prefetch = {o_proj * mib, gate_up * mib, qkv * mib, batch_size}; });
        const double graph_ms = time_step(backend, batch, iterations, true).graph_ms;
        results["prefetch"].push_back({{"batch", batch_size}, {"o_proj_mib", o_proj}, {"gate_up_mib", gate_up},
                                       {"qkv_mib", qkv}, {"graph_ms", graph_ms}, {"graph_over_floor", graph_ms / floor_ms}});
        std::printf("%-28s %10d %10.3f %8.3f\n", fmt::format("{}/{}/{}", o_proj, gate_up, qkv).c_str(), batch_size,
                    graph_ms, graph_ms / floor_ms);
      }
    }
    tune(backend, [&](CudaTuning& t) { t.l2_prefetch = default_prefetch; });
  }

  // The 1-row skinny GEMM's variants (loads in flight, warps a CTA) alone on the 8B shape's
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
    std::printf("\n%-28s %8s %8s %8s %8s %8s   (GB/s, 20 launches back to back)\n", "unroll/warps", "qkv", "o",
                "gate_up", "down", "lm_head");
    const std::vector<std::pair<int, int>> shapes = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}, {128256, 4096}};
    for (const std::array<int, 2>& v : std::vector<std::array<int, 2>>{{4, 4}, {8, 4}, {4, 8}, {8, 8}, {2, 4}, {4, 2}, {16, 4}}) {
      std::printf("%-28s", fmt::format("{}/{}", v[0], v[1]).c_str());
      nlohmann::json row = {{"unroll", v[0]}, {"warps", v[1]}};
      for (const auto& [n, k] : shapes) {
        const int64_t bytes = int64_t{n} * k * 2;
        const int64_t slices = pool_bytes / bytes;
        const double ms = timer.median_ms([&] {
          for (int i = 0; i < kLaunches; ++i)
            launch_skinny_gemm_variant(x_d.as<bf16>(), k, pool.as<bf16>() + (i % slices) * (bytes / 2), n,
                                       y_d.as<float>(), v[0], v[1], backend.stream());
        }, 5) / kLaunches;
        row["bytes_per_s"].push_back(bytes / (ms * 1e-3));
        std::printf(" %8.0f", bytes / (ms * 1e6));
      }
      results["skinny"].push_back(row);
      std::printf("\n");
    }
    // The FP8 skinny GEMM's variants (--quantization fp8): the same shapes at one byte a weight.
    DeviceBuffer scales(128256 * sizeof(float));
    LOOM_CUDA_CHECK(cudaMemsetAsync(scales.data(), 0, scales.size(), backend.stream()));
    std::printf("%-28s %8s %8s %8s %8s %8s   (GB/s of FP8 weights)\n", "fp8 unroll/rows/warps", "qkv", "o", "gate_up",
                "down", "lm_head");
    for (const std::array<int, 3>& v : std::vector<std::array<int, 3>>{
             {8, 1, 4}, {16, 1, 4}, {4, 2, 4}, {8, 2, 4}, {2, 2, 4}, {4, 2, 8}, {4, 4, 4}, {2, 4, 4}}) {
      std::printf("%-28s", fmt::format("{}/{}/{}", v[0], v[1], v[2]).c_str());
      nlohmann::json row = {{"unroll", v[0]}, {"rows_per_warp", v[1]}, {"warps", v[2]}};
      for (const auto& [n, k] : shapes) {
        const int64_t bytes = int64_t{n} * k;
        const int64_t slices = pool_bytes / bytes;
        const double ms = timer.median_ms([&] {
          for (int i = 0; i < kLaunches; ++i)
            launch_skinny_gemm_fp8_variant(x_d.as<bf16>(), k, pool.as<uint8_t>() + (i % slices) * bytes,
                                           scales.as<float>(), n, y_d.as<float>(), v[0], v[1], v[2], backend.stream());
        }, 5) / kLaunches;
        row["bytes_per_s"].push_back(bytes / (ms * 1e-3));
        std::printf(" %8.0f", bytes / (ms * 1e6));
      }
      results["skinny_fp8"].push_back(row);
      std::printf("\n");
    }
  }

  // What each kind of the step's kernels costs a graph step: left out one kind at a time (results wrong),
  // issue 43, item 4. (The split merged in the attention kernel and other shortest decode chunks were
  // measured beside these once; bench/README.md, "What a decode step's small kernels cost in a graph".)
  if (wanted("launches")) {
    std::printf("\n%-44s %8s %10s %8s\n", "decode launches", "batch", "graph ms", "x floor");
    const std::pair<const char*, uint32_t> settings[] = {
        {"all", 0},           {"without norms", kSkipNorms},     {"without qkv post", kSkipQkv},
        {"without combine", kSkipCombine}, {"without swiglu", kSkipSwiglu}, {"without attention", kSkipAttention},
        {"without all small", kSkipNorms | kSkipQkv | kSkipCombine | kSkipSwiglu}};
    for (int batch_size : batch_sizes) {
      const Batch batch = decode_batch(batch_size, {}, prng, config.vocab_size);
      const double floor_ms = decode_floor_ms(backend, batch_size);
      for (const auto& [name, bits] : settings) {
        backend.measure().skip_kernels = bits;
        const double graph_ms = time_step(backend, batch, iterations, true).graph_ms;
        results["launches"].push_back({{"batch", batch_size}, {"setting", name}, {"skip_kernels", bits},
                                       {"graph_ms", graph_ms}, {"graph_over_floor", graph_ms / floor_ms}});
        std::printf("%-44s %8d %10.3f %8.3f\n", name, batch_size, graph_ms, graph_ms / floor_ms);
      }
    }
    backend.measure().skip_kernels = 0;
  }

  // Steps of 1-4 rows on cuBLAS or the skinny GEMMs, with or without programmatic launches and the L2 read-ahead
  // (the defaults: all three up to 2 rows).
  if (wanted("rows")) {
    std::printf("\n%-44s %8s %10s %8s\n", "2-4 rows", "batch", "graph ms", "x floor");
    const CudaTuning::L2Prefetch default_prefetch = backend.tuning().l2_prefetch;
    const int32_t default_skinny = backend.tuning().skinny_max_rows;
    for (int batch_size : batch_sizes) {
      const Batch batch = decode_batch(batch_size, {}, prng, config.vocab_size);
      const double floor_ms = decode_floor_ms(backend, batch_size);
      struct Setting { const char* name; int skinny, programmatic, prefetch; };
      for (const Setting& setting : {Setting{"cuBLAS from 2 rows", 1, 1, 1}, Setting{"skinny", 4, 1, 1},
                                     Setting{"skinny + pdl", 4, 4, 1}, Setting{"skinny + pdl + prefetch", 4, 4, 4},
                                     Setting{"skinny + prefetch", 4, 1, 4}}) {
        tune(backend, [&](CudaTuning& t) {
          t.skinny_max_rows = setting.skinny;
          t.programmatic_max_rows = setting.programmatic;
          t.l2_prefetch = default_prefetch;
          t.l2_prefetch.max_rows = setting.prefetch;
        });
        const double graph_ms = time_step(backend, batch, iterations, true).graph_ms;
        results["rows"].push_back({{"batch", batch_size}, {"setting", setting.name}, {"graph_ms", graph_ms},
                                   {"graph_over_floor", graph_ms / floor_ms}});
        std::printf("%-44s %8d %10.3f %8.3f\n", setting.name, batch_size, graph_ms, graph_ms / floor_ms);
      }
    }
    tune(backend, [&](CudaTuning& t) { t.skinny_max_rows = default_skinny; });
    tune(backend, [](CudaTuning& t) { t.programmatic_max_rows = CudaTuning{}.programmatic_max_rows; });
    tune(backend, [&](CudaTuning& t) { t.l2_prefetch = default_prefetch; });
  }
}

}  // namespace loom::cuda::bench
