// Matrix-vector products of SmolLM2-135M's shapes, one thread: the quantized
// kernels (backend/cpu/quant) at each SIMD level against the fp32 skinny GEMM
// the backend uses for decode steps. Weights are random (speed does not depend
// on the values). Bytes/s counts the weight bytes read per product.
//
//   build-cpu/loom_bench_quantized_matvec --benchmark_filter=Q4_1
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "backend/cpu/quant/quantized_matmul.h"
#include "backend/cpu/skinny_gemm.h"

namespace {

using loom::GgmlType;
using namespace loom::cpu::quant;

struct Shape {
  int64_t out_features, in_features;
};
constexpr Shape kShapes[] = {{576, 576}, {1536, 576}, {576, 1536}, {49152, 576}};

std::vector<float> random_floats(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = normal(rng);
  return values;
}

// Random bytes with every block's f16 scales set to 2^-6 (0x2400): finite values.
std::vector<uint8_t> random_rows(GgmlType type, const Shape& shape) {
  const int64_t row_bytes = loom::ggml_row_bytes(type, shape.in_features);
  std::vector<uint8_t> bytes(static_cast<size_t>(row_bytes * shape.out_features));
  std::mt19937 rng(1);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  const loom::GgmlBlockLayout layout = loom::ggml_block_layout(type);
  const int64_t scale_offset = type == GgmlType::kQ6_K ? 208 : 0;
  for (size_t block = 0; block < bytes.size(); block += static_cast<size_t>(layout.bytes_per_block)) {
    bytes[block + scale_offset] = 0x00;
    bytes[block + scale_offset + 1] = 0x24;
  }
  return bytes;
}

void quantized_matvec(benchmark::State& state, GgmlType type, SimdLevel level, Shape shape, int num_rows) {
  if (!is_simd_level_supported(level)) {
    state.SkipWithError("SIMD level not supported on this CPU");
    return;
  }
  const std::vector<uint8_t> bytes = random_rows(type, shape);
  const QuantizedMatrix w{type, bytes.data(), loom::ggml_row_bytes(type, shape.in_features), shape.out_features,
                          shape.in_features};
  const std::vector<float> x = random_floats(num_rows * shape.in_features, 2);
  std::vector<float> y(static_cast<size_t>(num_rows * shape.out_features));
  QuantizedActivations activations;
  for (auto _ : state) {
    activations.quantize(x.data(), shape.in_features, num_rows, shape.in_features, type);
    quantized_matmul(w, activations, 0, num_rows, 0, shape.out_features, y.data(), shape.out_features, level);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes.size()));
}

void fp32_matvec(benchmark::State& state, Shape shape, int num_rows) {
  const std::vector<float> w = random_floats(shape.out_features * shape.in_features, 1);
  const std::vector<float> x = random_floats(num_rows * shape.in_features, 2);
  std::vector<float> y(static_cast<size_t>(num_rows * shape.out_features));
  for (auto _ : state) {
    loom::cpu::skinny_gemm(x.data(), shape.in_features, num_rows, shape.in_features, w.data(), shape.out_features,
                           1.0f, 0.0f, y.data(), shape.out_features);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(w.size() * sizeof(float)));
}

void register_all() {
  const std::pair<GgmlType, const char*> types[] = {
      {GgmlType::kQ4_1, "Q4_1"}, {GgmlType::kQ8_0, "Q8_0"}, {GgmlType::kQ4_K, "Q4_K"}, {GgmlType::kQ6_K, "Q6_K"}};
  for (const Shape& shape : kShapes) {
    for (int num_rows : {1, 8}) {
      const std::string suffix = "/" + std::to_string(shape.out_features) + "x" + std::to_string(shape.in_features) +
                                 "/rows:" + std::to_string(num_rows);
      benchmark::RegisterBenchmark(("fp32_skinny" + suffix).c_str(), fp32_matvec, shape, num_rows);
      for (const auto& [type, name] : types) {
        if (shape.in_features % loom::ggml_block_layout(type).elements_per_block != 0) continue;  // K-quants: 256
        for (SimdLevel level : {SimdLevel::kAvx2, SimdLevel::kAvx512})
          benchmark::RegisterBenchmark((std::string(name) + "_" + simd_level_name(level) + suffix).c_str(),
                                       quantized_matvec, type, level, shape, num_rows);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
