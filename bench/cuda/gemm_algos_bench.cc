// The prefill GEMMs of the 8B shape through cuBLASLt, as gemm.cc calls them (Y = X W^T, row-major,
// fp32 accumulation, Loom's output dtype per projection): cuBLASLt's top heuristic against the best
// of its top --candidates algorithms, each timed (median of --iterations CUDA-event timings after
// warm-up), and each shape with the other output dtype. Says how far the prefill GEMMs sit from what
// cuBLASLt can do at these shapes. Writes one JSON object (--out) and prints a table.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <nlohmann/json.hpp>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kernels.h"
#include "bench_common.h"
#include "bench_main.h"

namespace loom::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;  // as gemm.cc

struct Shape {
  const char* name;
  int64_t n, k;
  bool f32_out;  // Loom's output dtype for the projection (layer_runner.cc)
};

struct Layouts {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  Layouts(int64_t m, int64_t n, int64_t k, bool f32_out) {
    LOOM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, no = CUBLAS_OP_N;
    LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &no, sizeof(no)));
    LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, k, n, k));
    LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, m, k));
    LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c, f32_out ? CUDA_R_32F : CUDA_R_16BF, n, m, n));
  }
  ~Layouts() {
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatmulDescDestroy(desc);
  }
};

int run(int argc, char** argv) {
  CLI::App app{"cuBLASLt's heuristic against its timed candidates on the 8B prefill GEMMs"};
  std::string out_path = "gemm_algos.json";
  int iterations = 10, candidates = 16;
  std::vector<int64_t> rows = {8192, 2048};
  app.add_option("--out", out_path, "JSON results");
  app.add_option("--iterations", iterations, "Timed repetitions per algorithm (median)");
  app.add_option("--candidates", candidates, "Heuristic results to time per shape");
  app.add_option("--rows", rows, "Row counts (tokens in a prefill step)");
  CLI11_PARSE(app, argc, argv);

  const std::vector<Shape> shapes = {
      {"qkv", 6144, 4096, true}, {"o", 4096, 4096, true}, {"gate_up", 28672, 4096, false}, {"down", 4096, 14336, true}};
  cudaStream_t stream;
  LOOM_CUDA_CHECK(cudaStreamCreate(&stream));
  cublasLtHandle_t handle;
  LOOM_CUBLAS_CHECK(cublasLtCreate(&handle));
  DeviceBuffer workspace(kWorkspaceBytes);
  int64_t max_m = *std::max_element(rows.begin(), rows.end());
  DeviceBuffer x(static_cast<size_t>(max_m) * 14336 * 2), w(static_cast<size_t>(28672) * 4096 * 2),
      y(static_cast<size_t>(max_m) * 28672 * 4);
  launch_synthetic_fill_bf16(x.as<bf16>(), max_m * 14336, 1, false, 1.0f, stream);
  launch_synthetic_fill_bf16(w.as<bf16>(), int64_t{28672} * 4096, 2, false, 0.02f, stream);
  bench::Timer timer(stream);
  auto time_algo = [&](const Layouts& l, const cublasLtMatmulAlgo_t& algo) {
    const float alpha = 1.0f, beta = 0.0f;
    auto once = [&] {
      return cublasLtMatmul(handle, l.desc, &alpha, w.data(), l.a, x.data(), l.b, &beta, y.data(), l.c, y.data(), l.c,
                            &algo, workspace.data(), kWorkspaceBytes, stream);
    };
    for (int i = 0; i < 3; ++i)
      if (once() != CUBLAS_STATUS_SUCCESS) return -1.0;
    return timer.median_ms([&] { LOOM_CUBLAS_CHECK(once()); }, iterations);
  };

  nlohmann::json results = nlohmann::json::array();
  std::printf("%-8s %6s %-4s %10s %9s %10s %9s %6s %s\n", "gemm", "m", "out", "top-1 ms", "TFLOP/s", "best ms", "TFLOP/s",
              "gain", "best's index");
  for (const int64_t m : rows) {
    for (const Shape& shape : shapes) {
      for (const bool f32_out : {shape.f32_out, !shape.f32_out}) {
        Layouts l(m, shape.n, shape.k, f32_out);
        cublasLtMatmulPreference_t preference;
        LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
        const size_t bytes = kWorkspaceBytes;
        cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof(bytes));
        std::vector<cublasLtMatmulHeuristicResult_t> found(candidates);
        int returned = 0;
        LOOM_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, l.desc, l.a, l.b, l.c, l.c, preference, candidates,
                                                         found.data(), &returned));
        cublasLtMatmulPreferenceDestroy(preference);
        std::vector<double> times;
        for (int i = 0; i < returned; ++i) times.push_back(time_algo(l, found[i].algo));
        int best = 0;
        for (int i = 0; i < returned; ++i)
          if (times[i] > 0 && (times[best] <= 0 || times[i] < times[best])) best = i;
        const double flops = 2.0 * m * shape.n * shape.k;
        const double top = times.empty() ? -1 : times[0], fastest = times.empty() ? -1 : times[best];
        std::printf("%-8s %6ld %-4s %10.3f %9.0f %10.3f %9.0f %5.1f%% %d of %d%s\n", shape.name, static_cast<long>(m),
                    f32_out ? "f32" : "bf16", top, flops / (top * 1e9), fastest, flops / (fastest * 1e9),
                    100.0 * (top / fastest - 1), best, returned, f32_out == shape.f32_out ? "  (Loom's dtype)" : "");
        results.push_back({{"gemm", shape.name}, {"m", m}, {"n", shape.n}, {"k", shape.k}, {"f32_out", f32_out},
                           {"looms_dtype", f32_out == shape.f32_out}, {"times_ms", times}, {"top_ms", top},
                           {"best_ms", fastest}, {"best_index", best}, {"flops", flops}});
      }
    }
  }
  nlohmann::json out = {{"device", cuda_device_description(0)}, {"results", results}};
  std::ofstream(out_path) << out.dump(2) << "\n";
  cublasLtDestroy(handle);
  return 0;
}

}  // namespace
}  // namespace loom::cuda

int main(int argc, char** argv) {
  return loom::cuda::bench::bench_main("loom_gemm_algos_bench", loom::cuda::run, argc, argv);
}
