#include "backend/cpu/quant/quantized_matmul.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/quant/kernels.h"
#include "util/error.h"

namespace loom::cpu::quant {

namespace {

constexpr int64_t kBlock = 32;

bool is_half_type(GgmlType type) { return type == GgmlType::kF16 || type == GgmlType::kBF16; }

void quantize_row(const float* x, int64_t row_length, int8_t* values, float* scales, float* scaled_sums) {
  for (int64_t block = 0; block < row_length / kBlock; ++block) {
    const float* in = x + block * kBlock;
    float max_abs = 0.0f;
    for (int i = 0; i < kBlock; ++i) max_abs = std::max(max_abs, std::fabs(in[i]));
    const float d = max_abs / 127.0f;
    const float inverse = d > 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int i = 0; i < kBlock; ++i) {
      // The clamp only matters when in[i] * inverse rounds up past 127 (never by more).
      const int value = std::clamp(static_cast<int>(std::nearbyint(in[i] * inverse)), -127, 127);
      values[block * kBlock + i] = static_cast<int8_t>(value);
      sum += value;
    }
    scales[block] = d;
    scaled_sums[block] = d * static_cast<float>(sum);
  }
}

}  // namespace

bool is_simd_level_supported(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar: return true;
    case SimdLevel::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case SimdLevel::kAvx512:
      return is_simd_level_supported(SimdLevel::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");  // kernels_avx512.cc's target
  }
  return false;
}

SimdLevel best_simd_level() {
  static const SimdLevel best = is_simd_level_supported(SimdLevel::kAvx512) ? SimdLevel::kAvx512
                                : is_simd_level_supported(SimdLevel::kAvx2) ? SimdLevel::kAvx2
                                                                            : SimdLevel::kScalar;
  return best;
}

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar: return "scalar";
    case SimdLevel::kAvx2: return "avx2";
    case SimdLevel::kAvx512: return "avx512-vnni";
  }
  return "unknown";
}

bool is_quantized_matmul_type(GgmlType type) {
  // Every type the loader takes but F32 (which stays a plain fp32 tensor).
  return type != GgmlType::kF32 && is_supported_ggml_type(static_cast<uint32_t>(type));
}

void check_quantized_matmul_type(uint32_t ggml_type, const std::string& what) {
  if (!is_supported_ggml_type(ggml_type) || !is_quantized_matmul_type(static_cast<GgmlType>(ggml_type)))
    throw Error(ErrorKind::kUnsupported,
                fmt::format("{}: the CPU's quantized kernels do not take type {}", what, ggml_type_name(ggml_type)),
                "they take F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K; "
                "--cpu-precision fp32 expands the weights to fp32 instead");
}

void QuantizedActivations::quantize(const float* x, int64_t ldx, int64_t num_rows, int64_t row_length,
                                    GgmlType for_type) {
  num_rows_ = num_rows;
  row_length_ = row_length;
  x_ = x;
  ldx_ = ldx;
  is_int8_ = !is_half_type(for_type);
  if (!is_int8_) return;
  LOOM_CHECK(row_length % kBlock == 0);
  values_.resize(static_cast<size_t>(num_rows * row_length));
  scales_.resize(static_cast<size_t>(num_rows * num_blocks()));
  scaled_sums_.resize(scales_.size());
  const bool parallel = num_rows > 1 && num_rows * row_length >= 64 * 1024 && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t row = 0; row < num_rows; ++row)
    quantize_row(x + row * ldx, row_length, values_.data() + row * row_length,
                 scales_.data() + row * num_blocks(), scaled_sums_.data() + row * num_blocks());
}

void QuantizedActivations::dequantize(float* out) const {
  LOOM_CHECK(is_int8_);
  const bool parallel = num_rows_ > 1 && num_rows_ * row_length_ >= 64 * 1024 && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t row = 0; row < num_rows_; ++row) {
    const int8_t* in = values(row);
    const float* d = scales(row);
    float* y = out + row * row_length_;
    for (int64_t i = 0; i < row_length_; ++i) y[i] = d[i / kBlock] * static_cast<float>(in[i]);
  }
}

void quantized_matmul(const QuantizedMatrix& w, const QuantizedActivations& x, int64_t row_begin,
                      int64_t row_end, int64_t column_begin, int64_t column_end, float* y, int64_t ldy,
                      SimdLevel level) {
  LOOM_CHECK(x.row_length() == w.row_length && x.is_int8() == !is_half_type(w.type));
  LOOM_CHECK(row_begin >= 0 && row_end <= x.num_rows() && column_begin >= 0 && column_end <= w.num_rows);
  auto* kernel = level == SimdLevel::kAvx512 ? detail::matmul_avx512
                 : level == SimdLevel::kAvx2 ? detail::matmul_avx2
                                             : detail::matmul_scalar;
  for (int64_t row = row_begin; row < row_end; row += kMaxRowsPerKernel) {
    const int num_rows = static_cast<int>(std::min(kMaxRowsPerKernel, row_end - row));
    kernel(w, x, row, num_rows, column_begin, column_end, y + (row - row_begin) * ldy, ldy);
  }
}

}  // namespace loom::cpu::quant
