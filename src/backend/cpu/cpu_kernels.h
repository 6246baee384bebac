// Row-wise fp32 kernels of the CPU backend. All matrices are row-major and
// dense (row stride = number of columns) unless a stride argument says otherwise.
// Each function is pure: it reads its inputs and writes only its outputs.
// Thread: callable from any thread. Large calls run an OpenMP parallel region
// with omp_get_max_threads() threads (inside a parallel region they run serially).
// GEMMs go through gemm.h (one single-threaded OpenBLAS call per thread).
#pragma once

#include <cstdint>

#include "formats/tensor.h"

namespace loom::cpu {

// Y[m, out] = X[m, in] W[out, in]^T (+ bias[out] when bias != nullptr).
// This is torch.nn.Linear; see gemm.h to run several weights on one input together.
void linear(const float* x, int64_t num_rows, int64_t in_features, const float* weight,
            const float* bias, int64_t out_features, float* y);

// The same for a model weight [out, in], fp32 or kept quantized (gemm.h).
void linear(const float* x, int64_t num_rows, int64_t in_features, const Tensor& weight, const float* bias,
            int64_t out_features, float* y);

// Y[m, out] += alpha * X[m, in] W[out, in]^T, with X's rows `x_stride` apart
// and Y's rows `y_stride` apart (to work on column slices or strided rows).
void linear_accumulate(const float* x, int64_t x_stride, int64_t num_rows, int64_t in_features,
                       const float* weight, int64_t out_features, float alpha, float* y,
                       int64_t y_stride);

// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * weight, for num_rows rows of
// `width` floats (HF LlamaRMSNorm in fp32). `out` may alias `x`.
void rms_norm_rows(const float* x, int64_t num_rows, int64_t width, const float* weight, float eps,
                   float* out);

// gate[i] = silu(gate[i]) * up[i] over `count` floats (SwiGLU; result in gate).
void silu_multiply(float* gate, const float* up, int64_t count);

// y[i] += x[i] over `count` floats.
void add_in_place(float* y, const float* x, int64_t count);

}  // namespace loom::cpu
