// The per-level kernels behind quantized_matmul (quantized_matmul.h); internal
// to this module. Each computes rows [row_begin, row_begin + num_rows) of X,
// 1 <= num_rows <= kMaxRowsPerKernel, against W rows [column_begin, column_end),
// writing y[(r - row_begin) * ldy + c]. The type is one is_quantized_matmul_type accepts.
#pragma once

#include <cstdint>

#include "backend/cpu/quant/quantized_matmul.h"

namespace loom::cpu::quant::detail {

void matmul_scalar(const QuantizedMatrix& w, const QuantizedActivations& x, int64_t row_begin, int num_rows,
                   int64_t column_begin, int64_t column_end, float* y, int64_t ldy);
void matmul_avx2(const QuantizedMatrix& w, const QuantizedActivations& x, int64_t row_begin, int num_rows,
                 int64_t column_begin, int64_t column_end, float* y, int64_t ldy);
// Only where is_simd_level_supported(kAvx512).
void matmul_avx512(const QuantizedMatrix& w, const QuantizedActivations& x, int64_t row_begin, int num_rows,
                   int64_t column_begin, int64_t column_end, float* y, int64_t ldy);

}  // namespace loom::cpu::quant::detail
