// AVX2 kernels: the build's baseline ISA (-mavx2 -mfma -mf16c), so no target attributes.
#include "backend/cpu/quant/block_kernels_x86.h"

namespace loom::cpu::quant::detail {

namespace {

// maddubs sums pairs into int16 (|q| <= 128, |x| <= 127: at most 32512, no
// saturation), madd sums pairs of those into int32.
struct MaddubsDot {
  static __m256i dot(__m256i unsigned_bytes, __m256i signed_bytes) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(unsigned_bytes, signed_bytes), _mm256_set1_epi16(1));
  }
};

}  // namespace

void matmul_avx2(const QuantizedMatrix& w, const QuantizedActivations& x, int64_t row_begin, int num_rows,
                 int64_t column_begin, int64_t column_end, float* y, int64_t ldy) {
  matmul_x86<MaddubsDot>(w, x, row_begin, num_rows, column_begin, column_end, y, ldy);
}

}  // namespace loom::cpu::quant::detail
