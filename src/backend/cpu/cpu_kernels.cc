#include "backend/cpu/cpu_kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/gemm.h"
#include "util/vector_math.h"
#include "util/error.h"

namespace loom::cpu {

namespace {
// Below this many floats touched a parallel region costs more than it saves
// (and on a loaded machine a barrier can wait a whole scheduler quantum).
constexpr int64_t kMinFloatsForThreads = 64 * 1024;
}  // namespace

void linear(const float* x, int64_t num_rows, int64_t in_features, const float* weight,
            const float* bias, int64_t out_features, float* y) {
  const GemmOutput output{weight, out_features, y, out_features, bias};
  gemm(x, in_features, num_rows, in_features, {&output, 1}, 1.0f, 0.0f);
}

void linear(const float* x, int64_t num_rows, int64_t in_features, const Tensor& weight, const float* bias,
            int64_t out_features, float* y) {
  LOOM_CHECK(weight.shape.size() == 2 && weight.shape[0] == out_features && weight.shape[1] == in_features);
  const GemmOutput output = weight_output(weight, y, out_features, bias);
  gemm(x, in_features, num_rows, in_features, {&output, 1}, 1.0f, 0.0f);
}

void linear_accumulate(const float* x, int64_t x_stride, int64_t num_rows, int64_t in_features,
                       const float* weight, int64_t out_features, float alpha, float* y,
                       int64_t y_stride) {
  const GemmOutput output{weight, out_features, y, y_stride, nullptr};
  gemm(x, x_stride, num_rows, in_features, {&output, 1}, alpha, 1.0f);
}

void rms_norm_rows(const float* x, int64_t num_rows, int64_t width, const float* weight, float eps,
                   float* out) {
#pragma omp parallel for if (num_rows * width >= kMinFloatsForThreads)
  for (int64_t row = 0; row < num_rows; ++row) {
    const float* in_row = x + row * width;
    float* out_row = out + row * width;
    // Double accumulation: the mean of squares torch computes (pairwise in fp32) is
    // closest to the exact value, which double reaches regardless of the width.
    double sum_of_squares = 0.0;
#pragma omp simd reduction(+ : sum_of_squares)
    for (int64_t i = 0; i < width; ++i) sum_of_squares += static_cast<double>(in_row[i]) * in_row[i];
    const float variance = static_cast<float>(sum_of_squares / static_cast<double>(width));
    const float inverse_rms = 1.0f / std::sqrt(variance + eps);
    for (int64_t i = 0; i < width; ++i) out_row[i] = weight[i] * (in_row[i] * inverse_rms);
  }
}

void silu_multiply(float* gate, const float* up, int64_t count) {
  constexpr int64_t kSpan = 1024;
  const int64_t num_spans = (count + kSpan - 1) / kSpan;
#pragma omp parallel for if (count >= kMinFloatsForThreads / 4)
  for (int64_t span = 0; span < num_spans; ++span)
    silu_multiply_span(gate + span * kSpan, up + span * kSpan, std::min(kSpan, count - span * kSpan));
}

void add_in_place(float* y, const float* x, int64_t count) {
  // The residual adds of a prefill are large enough to be worth threads.
#pragma omp parallel for simd if (count >= kMinFloatsForThreads && !omp_in_parallel())
  for (int64_t i = 0; i < count; ++i) y[i] += x[i];
}

}  // namespace loom::cpu
