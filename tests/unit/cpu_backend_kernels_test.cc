// CPU backend kernels against plain loops: the threaded/fused GEMM (sgemm and
// skinny paths, tile grids, bias, accumulate), vectorised exp, SiLU, RMSNorm.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "util/prng.h"
#include "util/vector_math.h"

namespace loom::cpu {
namespace {

std::vector<float> random_values(Prng& prng, int64_t count) {
  std::vector<float> values(count);
  for (float& value : values) value = prng.next_symmetric_float();
  return values;
}

struct GemmCase {
  int64_t m, k;
  std::vector<int64_t> out_features;
};

// y_i = alpha * X W_i^T + beta * y_i (+ b_i) for fused outputs, against double loops.
void check_gemm(const GemmCase& shape, int num_threads, bool with_bias, float alpha, float beta) {
  Prng prng(shape.m * 131 + shape.k + num_threads);
  const int64_t ldx = shape.k + 3;  // strided rows
  const std::vector<float> x = random_values(prng, shape.m * ldx);
  std::vector<std::vector<float>> weights, biases, ys, expected;
  for (int64_t n : shape.out_features) {
    weights.push_back(random_values(prng, n * shape.k));
    biases.push_back(random_values(prng, n));
    ys.push_back(random_values(prng, shape.m * n));
    expected.push_back(ys.back());
  }
  std::vector<GemmOutput> outputs;
  for (size_t o = 0; o < shape.out_features.size(); ++o) {
    const int64_t n = shape.out_features[o];
    outputs.push_back({weights[o].data(), n, ys[o].data(), n, with_bias ? biases[o].data() : nullptr});
    for (int64_t r = 0; r < shape.m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        double sum = 0.0;
        for (int64_t i = 0; i < shape.k; ++i) sum += static_cast<double>(x[r * ldx + i]) * weights[o][c * shape.k + i];
        double value = alpha * sum + beta * expected[o][r * n + c];
        if (with_bias) value += biases[o][c];
        expected[o][r * n + c] = static_cast<float>(value);
      }
  }
  omp_set_num_threads(num_threads);
  gemm(x.data(), ldx, shape.m, shape.k, outputs, alpha, beta);
  for (size_t o = 0; o < outputs.size(); ++o)
    for (size_t i = 0; i < ys[o].size(); ++i)
      ASSERT_NEAR(ys[o][i], expected[o][i], 1e-4)
          << "m " << shape.m << " output " << o << " element " << i << " threads " << num_threads;
}

TEST(CpuKernels, GemmMatchesPlainLoopsForEveryPathAndGrid) {
  // m <= 8 takes the skinny kernel, larger m OpenBLAS sgemm; the sizes are above
  // the threading threshold so the tile grid (rows x columns) is exercised.
  const std::vector<GemmCase> cases = {
      {1, 300, {1000}}, {3, 129, {700, 90, 90}}, {8, 256, {200, 333}},
      {9, 100, {50, 400}}, {40, 64, {130}},     {200, 33, {47, 47}}};
  for (int num_threads : {1, 3, 4}) {
    for (const GemmCase& shape : cases) {
      check_gemm(shape, num_threads, /*with_bias=*/true, 1.0f, 0.0f);
      check_gemm(shape, num_threads, /*with_bias=*/false, 0.37f, 1.0f);
    }
  }
  omp_set_num_threads(omp_get_num_procs());
}

TEST(CpuKernels, GemmInsideAParallelRegionRunsSerially) {
  std::vector<int> failures(2, 0);
#pragma omp parallel for num_threads(2)
  for (int i = 0; i < 2; ++i) {
    Prng prng(7 + i);
    const std::vector<float> x = random_values(prng, 16 * 64), w = random_values(prng, 96 * 64);
    std::vector<float> y(16 * 96);
    linear(x.data(), 16, 64, w.data(), nullptr, 96, y.data());
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 96; ++c) {
        double sum = 0.0;
        for (int j = 0; j < 64; ++j) sum += static_cast<double>(x[r * 64 + j]) * w[c * 64 + j];
        if (std::abs(sum - y[r * 96 + c]) > 1e-4) ++failures[i];
      }
  }
  EXPECT_EQ(failures, (std::vector<int>{0, 0}));
}

TEST(CpuKernels, VectorisedExpIsWithinThreeUlpsOfExp) {
  std::vector<float> values;
  for (float x = -87.0f; x <= 0.0f; x += 0.0137f) values.push_back(x);
  std::vector<float> exps = values;
  const float sum = exp_shifted_in_place(exps.data(), static_cast<int64_t>(exps.size()), -1.5f);
  double expected_sum = 0.0;
  for (size_t i = 0; i < values.size(); ++i) {
    const double expected = std::exp(static_cast<double>(values[i] + 1.5f));
    expected_sum += expected;
    ASSERT_NEAR(exps[i], expected, 3.6e-7 * expected) << values[i];
  }
  EXPECT_NEAR(sum, expected_sum, 1e-5 * expected_sum);
  // Far below the range: ~0, never NaN or negative.
  float tiny[9] = {-1000, -200, -100, -90, -88, -87.5f, -1e30f, -50, 0};
  exp_shifted_in_place(tiny, 9, 0.0f);
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(tiny[i] >= 0.0f && tiny[i] < 1e-20f) << i;
  EXPECT_EQ(tiny[8], 1.0f);
}

// The host sampler's log-softmax (util/vector_math.h): the largest logit and the
// sum of exp(logit - max) over a vocabulary-sized row, against a scalar fp64 pass;
// lengths that are and are not multiples of the vector width, and masked (-inf) entries.
TEST(CpuKernels, VectorisedMaxAndExpSumMatchAScalarPass) {
  Prng prng(11);
  for (int64_t count : {1, 7, 8, 9, 1000, 128257}) {
    std::vector<float> logits = random_values(prng, count);
    for (float& x : logits) x *= 12.0f;
    if (count > 100) logits[count / 3] = -std::numeric_limits<float>::infinity();
    float expected_max = logits[0];
    for (float x : logits) expected_max = std::max(expected_max, x);
    EXPECT_EQ(max_value(logits.data(), count), expected_max) << count;
    double expected_sum = 0.0;
    for (float x : logits) expected_sum += std::exp(static_cast<double>(x) - expected_max);
    EXPECT_NEAR(exp_shifted_sum(logits.data(), count, expected_max), expected_sum, 1e-6 * expected_sum) << count;
  }
  const float tail_max[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9.5f};  // the largest past the last full vector
  EXPECT_EQ(max_value(tail_max, 9), 9.5f);
}

TEST(CpuKernels, SiluMultiplyMatchesTorchFormula) {
  Prng prng(3);
  std::vector<float> gate(5000), up = random_values(prng, 5000);
  for (float& g : gate) g = 30.0f * prng.next_symmetric_float();
  gate[0] = -120.0f;  // exp(-g) overflows: silu -> -0
  gate[1] = 120.0f;
  std::vector<float> result = gate;
  silu_multiply(result.data(), up.data(), static_cast<int64_t>(gate.size()));
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    const double expected = g / (1.0 + std::exp(-g)) * up[i];
    ASSERT_NEAR(result[i], expected, 1e-6 * std::max(1.0, std::abs(expected))) << gate[i];
  }
}

TEST(CpuKernels, RmsNormMatchesDoubleReference) {
  Prng prng(5);
  const int64_t rows = 70, width = 333;
  const std::vector<float> x = random_values(prng, rows * width), weight = random_values(prng, width);
  std::vector<float> out(rows * width);
  rms_norm_rows(x.data(), rows, width, weight.data(), 1e-5f, out.data());
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0.0;
    for (int64_t i = 0; i < width; ++i) sum += static_cast<double>(x[r * width + i]) * x[r * width + i];
    const double inverse = 1.0 / std::sqrt(sum / width + 1e-5);
    for (int64_t i = 0; i < width; ++i)
      ASSERT_NEAR(out[r * width + i], x[r * width + i] * inverse * weight[i], 1e-5);
  }
}

}  // namespace
}  // namespace loom::cpu
