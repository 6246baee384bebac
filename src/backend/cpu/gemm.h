// Y = alpha * X W^T (+ bias) + beta * Y over OpenMP threads, one single-threaded
// OpenBLAS call per thread (sgemv when X has one row).
//
// Why not OpenBLAS's own threads: its pthread pool spins after each call and
// would fight the OpenMP threads of attention and the row kernels for the same
// cores; with one pool for everything that never happens. Requires
// openblas_set_num_threads(1) (make_cpu_backend does it).
//
// Weights kept in a GGUF block format (GemmOutput::quantized, from
// weight_output): X is quantized once per call (quant/quantized_matmul.h) and
// each tile runs the int8 kernels on its rows and columns, up to
// kMaxQuantizedKernelRows rows; taller X (prefills) dequantizes a slice of W's
// rows at a time into a per-thread fp32 buffer and runs sgemm on it.
//
// Several weights that read the same X (q/k/v, gate/up) go in one call: their
// output columns are laid end to end and cut into one grid of
// (row block x column block) tiles, one tile per thread, so a step pays for one
// parallel region instead of three and small matrices still fill all threads.
#pragma once

#include <cstdint>
#include <span>

#include "backend/cpu/quant/quantized_matmul.h"
#include "formats/tensor.h"

namespace loom::cpu {

// One weight of a (possibly fused) GEMM: y[m, out_features] (rows ldy apart)
// from W [out_features, k] row-major; bias [out_features] or nullptr.
struct GemmOutput {
  const float* weight = nullptr;
  int64_t out_features = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  const float* bias = nullptr;  // added once, after alpha * X W^T (only with beta == 0)
  // Instead of `weight`: W in a block format (then alpha is 1 and beta 0).
  quant::QuantizedMatrix quantized = {};
};

// Rows of X up to which quantized weights use the int8 kernels (above: dequantize + sgemm).
inline constexpr int64_t kMaxQuantizedKernelRows = 128;

// The output of a model weight [out_features, k], fp32 or kept quantized.
GemmOutput weight_output(const Tensor& weight, float* y, int64_t ldy, const float* bias = nullptr);

// For each output: y = alpha * X W^T + beta * y (+ bias). X is [m, k] with rows
// ldx apart. Runs serially when called inside a parallel region or when the
// product is too small to pay for threads; otherwise with omp_get_max_threads().
void gemm(const float* x, int64_t ldx, int64_t m, int64_t k, std::span<const GemmOutput> outputs,
          float alpha, float beta);

}  // namespace loom::cpu
