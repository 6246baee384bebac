// The CPU's quantized kernels (backend/cpu/quant) at every SIMD level this CPU
// runs, against dequantize (formats/gguf_dequant) then a double-precision dot.
//
// Two checks per type and level:
//  - Grid activations: every x block is d * q with d a power of two and one
//    |q| = 127, so quantizing X is exact and only fp32 rounding separates the
//    kernel from the reference: |y - y_ref| <= 1e-5 * (sum |w x| + max|w| sum |x|).
//    One wrongly decoded weight moves y by ~|w x|, far above that.
//  - Gaussian activations: X's int8 rounding moves each x by at most d / 2
//    (d = max |x| of its block / 127), so |y - y_ref| <= sum_i |w_i| d(i) / 2,
//    plus the same fp32 slack (quantized_matmul.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/quant/quantized_matmul.h"
#include "formats/gguf_dequant.h"
#include "test_util.h"
#include "util/half.h"

namespace loom::cpu::quant {
namespace {

std::vector<SimdLevel> supported_levels() {
  std::vector<SimdLevel> levels;
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512})
    if (is_simd_level_supported(level)) levels.push_back(level);
  return levels;
}

void put_half(uint8_t* out, float value) {
  const uint16_t bits = float_to_fp16(value);
  std::memcpy(out, &bits, 2);
}

// Random bytes with sane scales (so values stay near unit size); any bit
// pattern of the quants is valid.
std::vector<uint8_t> random_rows(GgmlType type, int64_t num_rows, int64_t row_length, std::mt19937& rng) {
  const int64_t row_bytes = ggml_row_bytes(type, row_length);
  std::vector<uint8_t> bytes(static_cast<size_t>(num_rows * row_bytes));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(0.002f, 0.05f), signed_unit(-1.0f, 1.0f);
  const GgmlBlockLayout layout = ggml_block_layout(type);
  for (size_t offset = 0; offset < bytes.size(); offset += static_cast<size_t>(layout.bytes_per_block)) {
    uint8_t* block = bytes.data() + offset;
    switch (type) {
      case GgmlType::kF16:
        put_half(block, signed_unit(rng));
        break;
      case GgmlType::kBF16: {
        const uint16_t bits = float_to_bf16(signed_unit(rng));
        std::memcpy(block, &bits, 2);
        break;
      }
      case GgmlType::kQ6_K:
        put_half(block + 208, scale(rng) / 8.0f);
        break;
      case GgmlType::kQ4_1:
      case GgmlType::kQ5_1:
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K:
        put_half(block, scale(rng) / (type == GgmlType::kQ4_K || type == GgmlType::kQ5_K ? 16.0f : 1.0f));
        put_half(block + 2, type == GgmlType::kQ4_K || type == GgmlType::kQ5_K ? scale(rng) / 8.0f
                                                                                  : -8.0f * scale(rng));
        break;
      default:  // Q8_0, Q4_0, Q5_0: one leading f16 d
        put_half(block, scale(rng) / (type == GgmlType::kQ8_0 ? 8.0f : 1.0f));
    }
  }
  return bytes;
}

// Each 32-block is d * q, d = 2^-e, q in [-127, 127] with one |q| = 127.
std::vector<float> grid_activations(int64_t num_rows, int64_t row_length, std::mt19937& rng) {
  std::vector<float> x(static_cast<size_t>(num_rows * row_length));
  std::uniform_int_distribution<int> value(-127, 127), exponent(2, 9), position(0, 31);
  for (int64_t block = 0; block < num_rows * row_length / 32; ++block) {
    const float d = std::ldexp(1.0f, -exponent(rng));
    const int peak = position(rng);
    for (int i = 0; i < 32; ++i)
      x[static_cast<size_t>(block * 32 + i)] = d * static_cast<float>(i == peak ? 127 : value(rng));
  }
  return x;
}

std::vector<float> gaussian_activations(int64_t num_rows, int64_t row_length, std::mt19937& rng) {
  std::vector<float> x(static_cast<size_t>(num_rows * row_length));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  return x;
}

struct Case {
  GgmlType type;
  int64_t row_length;
};

// Runs every level on W [num_columns, row_length] x X [num_rows, row_length]
// and checks each output against the reference within the case's bound.
void check_type(const Case& c, int64_t num_rows, bool grid, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t num_columns = 7;
  const std::vector<uint8_t> bytes = random_rows(c.type, num_columns, c.row_length, rng);
  std::vector<float> w(static_cast<size_t>(num_columns * c.row_length));
  dequantize_ggml(c.type, bytes.data(), num_columns * c.row_length, w.data());
  const std::vector<float> x =
      grid ? grid_activations(num_rows, c.row_length, rng) : gaussian_activations(num_rows, c.row_length, rng);
  const bool is_half = c.type == GgmlType::kF16 || c.type == GgmlType::kBF16;

  const QuantizedMatrix matrix{c.type, bytes.data(), ggml_row_bytes(c.type, c.row_length), num_columns, c.row_length};
  QuantizedActivations activations;
  activations.quantize(x.data(), c.row_length, num_rows, c.row_length, c.type);
  for (SimdLevel level : supported_levels()) {
    std::vector<float> y(static_cast<size_t>(num_rows * num_columns), NAN);
    quantized_matmul(matrix, activations, 0, num_rows, 0, num_columns, y.data(), num_columns, level);
    for (int64_t r = 0; r < num_rows; ++r) {
      for (int64_t col = 0; col < num_columns; ++col) {
        const float* w_row = w.data() + col * c.row_length;
        const float* x_row = x.data() + r * c.row_length;
        double want = 0.0, magnitude = 0.0, sum_abs_x = 0.0, max_abs_w = 0.0, rounding_bound = 0.0;
        for (int64_t i = 0; i < c.row_length; ++i) {
          want += static_cast<double>(w_row[i]) * x_row[i];
          magnitude += std::fabs(static_cast<double>(w_row[i]) * x_row[i]);
          sum_abs_x += std::fabs(x_row[i]);
          max_abs_w = std::max(max_abs_w, std::fabs(static_cast<double>(w_row[i])));
        }
        if (!grid && !is_half) {
          for (int64_t block = 0; block < c.row_length / 32; ++block) {
            double max_abs_x = 0.0, sum_abs_w = 0.0;
            for (int i = 0; i < 32; ++i) {
              max_abs_x = std::max(max_abs_x, std::fabs(static_cast<double>(x_row[block * 32 + i])));
              sum_abs_w += std::fabs(w_row[block * 32 + i]);
            }
            rounding_bound += sum_abs_w * max_abs_x / 127.0 / 2.0;
          }
        }
        const double bound = rounding_bound + 1e-5 * (magnitude + max_abs_w * sum_abs_x) + 1e-7;
        const double got = y[static_cast<size_t>(r * num_columns + col)];
        ASSERT_LE(std::fabs(got - want), bound)
            << ggml_type_name(c.type) << " at " << simd_level_name(level) << ", row " << r << " of " << num_rows
            << ", column " << col << (grid ? " (grid activations)" : " (gaussian activations)") << ": got " << got
            << ", want " << want;
      }
    }
  }
}

const Case kCases[] = {
    {GgmlType::kQ8_0, 96},  {GgmlType::kQ4_0, 96},  {GgmlType::kQ4_1, 96},  {GgmlType::kQ5_0, 96},
    {GgmlType::kQ5_1, 96},  {GgmlType::kQ4_K, 512}, {GgmlType::kQ5_K, 512}, {GgmlType::kQ6_K, 512},
    {GgmlType::kF16, 100},  {GgmlType::kBF16, 100},
};

TEST(QuantizedMatmulTest, EveryTypeAndLevelMatchesTheReferenceOnGridActivations) {
  std::printf("SIMD levels checked:");
  for (SimdLevel level : supported_levels()) std::printf(" %s", simd_level_name(level));
  std::printf(" (best here: %s)\n", simd_level_name(best_simd_level()));
  uint32_t seed = 1;
  for (const Case& c : kCases)
    for (int64_t num_rows : {1, 3, 8, 13}) check_type(c, num_rows, true, seed++);
}

TEST(QuantizedMatmulTest, EveryTypeAndLevelStaysWithinTheActivationRoundingBound) {
  uint32_t seed = 100;
  for (const Case& c : kCases)
    for (int64_t num_rows : {1, 5, 8}) check_type(c, num_rows, false, seed++);
}

TEST(QuantizedMatmulTest, RowAndColumnRangesWriteOnlyTheirSlice) {
  std::mt19937 rng(5);
  const int64_t k = 64, num_columns = 6, num_rows = 10;
  const std::vector<uint8_t> bytes = random_rows(GgmlType::kQ4_1, num_columns, k, rng);
  const QuantizedMatrix matrix{GgmlType::kQ4_1, bytes.data(), ggml_row_bytes(GgmlType::kQ4_1, k), num_columns, k};
  const std::vector<float> x = gaussian_activations(num_rows, k, rng);
  QuantizedActivations activations;
  activations.quantize(x.data(), k, num_rows, k, GgmlType::kQ4_1);
  std::vector<float> full(num_rows * num_columns);
  quantized_matmul(matrix, activations, 0, num_rows, 0, num_columns, full.data(), num_columns, best_simd_level());
  // Rows 2..9 x columns 1..4, written from y's row 0 (= activation row 2).
  std::vector<float> part(num_rows * num_columns, -1.0f);
  quantized_matmul(matrix, activations, 2, 10, 1, 4, part.data(), num_columns, best_simd_level());
  for (int64_t r = 0; r < num_rows; ++r)
    for (int64_t c = 0; c < num_columns; ++c) {
      // Inside the slice: equal but for summation order (row chunks differ).
      const bool inside = r < 8 && c >= 1 && c < 4;
      if (inside)
        EXPECT_NEAR(part[r * num_columns + c], full[(r + 2) * num_columns + c], 1e-5f) << r << "," << c;
      else
        EXPECT_EQ(part[r * num_columns + c], -1.0f) << r << "," << c;
    }
}

TEST(QuantizedMatmulTest, UnsupportedTypesNameTheType) {
  test::expect_error([] { check_quantized_matmul_type(10, "blk.0.attn_q.weight"); }, ErrorKind::kUnsupported,
                     {"blk.0.attn_q.weight", "Q2_K"});
  test::expect_error([] { check_quantized_matmul_type(0, "output.weight"); }, ErrorKind::kUnsupported,
                     {"output.weight", "F32"});
  EXPECT_NO_THROW(check_quantized_matmul_type(static_cast<uint32_t>(GgmlType::kQ6_K), "x"));
}

// gemm() takes the int8 kernels up to kMaxQuantizedKernelRows rows of X and
// dequantize + sgemm above, with X rounded as the kernels round it there: a
// row's result must not depend on how many rows share its product (only on
// fp32 summation order).
TEST(QuantizedMatmulTest, GemmRowsDoNotDependOnTheNumberOfRowsInTheProduct) {
  std::mt19937 rng(11);
  const int64_t k = 256, num_columns = 48, tall = kMaxQuantizedKernelRows + 72;
  for (GgmlType type : {GgmlType::kQ4_1, GgmlType::kQ6_K}) {
    const std::vector<uint8_t> bytes = random_rows(type, num_columns, k, rng);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(tall * k));
    for (float& value : x) value = normal(rng);
    GemmOutput output;
    output.out_features = num_columns;
    output.quantized = {type, bytes.data(), ggml_row_bytes(type, k), num_columns, k};
    std::vector<float> alone(static_cast<size_t>(3 * num_columns)), together(static_cast<size_t>(tall * num_columns));
    output.y = alone.data();
    output.ldy = num_columns;
    gemm(x.data(), k, 3, k, std::span<const GemmOutput>(&output, 1), 1.0f, 0.0f);
    output.y = together.data();
    gemm(x.data(), k, tall, k, std::span<const GemmOutput>(&output, 1), 1.0f, 0.0f);
    for (int64_t i = 0; i < 3 * num_columns; ++i) {
      float scale = 0.0f;  // the row's terms' size, for the fp32 slack
      for (int64_t j = 0; j < k; ++j) scale += std::fabs(x[static_cast<size_t>(i / num_columns * k + j)]);
      EXPECT_NEAR(together[static_cast<size_t>(i)], alone[static_cast<size_t>(i)], 1e-5f * scale)
          << ggml_type_name(type) << " row " << i / num_columns << " column " << i % num_columns;
    }
  }
}

}  // namespace
}  // namespace loom::cpu::quant
