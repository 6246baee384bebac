#include "backend/cpu/cpu_kernels.h"

#include <cblas.h>

#include <cmath>

namespace loom::cpu {

namespace {
// Below this many floats touched a parallel region costs more than it saves
// (and on a loaded machine a barrier can wait a whole scheduler quantum).
constexpr int64_t kMinFloatsForThreads = 64 * 1024;
}  // namespace

void linear(const float* x, int64_t num_rows, int64_t in_features, const float* weight,
            const float* bias, int64_t out_features, float* y) {
  if (num_rows == 0) return;
  if (num_rows == 1) {
    // Decode at batch 1: a GEMV, which OpenBLAS 0.3.21 does not pick for M == 1 sgemm.
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(out_features),
                static_cast<int>(in_features), 1.0f, weight, static_cast<int>(in_features), x, 1,
                0.0f, y, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(num_rows),
                static_cast<int>(out_features), static_cast<int>(in_features), 1.0f, x,
                static_cast<int>(in_features), weight, static_cast<int>(in_features), 0.0f, y,
                static_cast<int>(out_features));
  }
  if (bias != nullptr) {
#pragma omp parallel for if (num_rows * out_features >= kMinFloatsForThreads)
    for (int64_t row = 0; row < num_rows; ++row) add_in_place(y + row * out_features, bias, out_features);
  }
}

void linear_accumulate(const float* x, int64_t x_stride, int64_t num_rows, int64_t in_features,
                       const float* weight, int64_t out_features, float alpha, float* y,
                       int64_t y_stride) {
  if (num_rows == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(num_rows),
              static_cast<int>(out_features), static_cast<int>(in_features), alpha, x,
              static_cast<int>(x_stride), weight, static_cast<int>(in_features), 1.0f, y,
              static_cast<int>(y_stride));
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
    for (int64_t i = 0; i < width; ++i) sum_of_squares += static_cast<double>(in_row[i]) * in_row[i];
    const float variance = static_cast<float>(sum_of_squares / static_cast<double>(width));
    const float inverse_rms = 1.0f / std::sqrt(variance + eps);
    for (int64_t i = 0; i < width; ++i) out_row[i] = weight[i] * (in_row[i] * inverse_rms);
  }
}

void silu_multiply(float* gate, const float* up, int64_t count) {
#pragma omp parallel for if (count >= kMinFloatsForThreads)
  for (int64_t i = 0; i < count; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void add_in_place(float* y, const float* x, int64_t count) {
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) y[i] += x[i];
}

}  // namespace loom::cpu
