// AVX-512 VNNI kernels: the x86 block kernels compiled for AVX-512 F/BW/VL +
// VNNI by the pragma below (the rest of the build stays AVX2, so this code only
// runs where quantized_matmul checked the CPU has them). vpdpbusd does the
// 4-way u8 x s8 dot product in one instruction instead of maddubs + madd.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/cpu/quant/kernels.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")

#include "backend/cpu/quant/block_kernels_x86.h"

namespace loom::cpu::quant::detail {

namespace {

struct VnniDot {
  static __m256i dot(__m256i unsigned_bytes, __m256i signed_bytes) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), unsigned_bytes, signed_bytes);
  }
};

}  // namespace

void matmul_avx512(const QuantizedMatrix& w, const QuantizedActivations& x, int64_t row_begin, int num_rows,
                   int64_t column_begin, int64_t column_end, float* y, int64_t ldy) {
  matmul_x86<VnniDot>(w, x, row_begin, num_rows, column_begin, column_end, y, ldy);
}

}  // namespace loom::cpu::quant::detail

#pragma GCC pop_options
