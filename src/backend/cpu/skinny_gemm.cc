#include "backend/cpu/skinny_gemm.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace loom::cpu {

namespace {

inline void store(float* out, float alpha, float beta, float sum) {
  *out = beta == 0.0f ? alpha * sum : *out + alpha * sum;
}

#if defined(__AVX2__) && defined(__FMA__)

inline float horizontal_sum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

// One row of W at a time against all kRows rows of X: W streams through once,
// X stays in L1, kRows independent FMA chains keep the FMA units busy.
template <int kRows>
void skinny_rows(const float* x, int64_t ldx, int64_t k, const float* w, int64_t n, float alpha,
                 float beta, float* y, int64_t ldy) {
  const int64_t k_vector = k / 8 * 8;
  for (int64_t column = 0; column < n; ++column) {
    const float* w_row = w + column * k;
    __m256 acc[kRows];
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < k_vector; i += 8) {
      const __m256 w_vector = _mm256_loadu_ps(w_row + i);
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r)
        acc[r] = _mm256_fmadd_ps(w_vector, _mm256_loadu_ps(x + r * ldx + i), acc[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      float sum = horizontal_sum(acc[r]);
      for (int64_t i = k_vector; i < k; ++i) sum += w_row[i] * x[r * ldx + i];
      store(y + r * ldy + column, alpha, beta, sum);
    }
  }
}

#else

template <int kRows>
void skinny_rows(const float* x, int64_t ldx, int64_t k, const float* w, int64_t n, float alpha,
                 float beta, float* y, int64_t ldy) {
  for (int64_t column = 0; column < n; ++column) {
    for (int r = 0; r < kRows; ++r) {
      float sum = 0.0f;
      for (int64_t i = 0; i < k; ++i) sum += w[column * k + i] * x[r * ldx + i];
      store(y + r * ldy + column, alpha, beta, sum);
    }
  }
}

#endif

}  // namespace

void skinny_gemm(const float* x, int64_t ldx, int64_t m, int64_t k, const float* w, int64_t n,
                 float alpha, float beta, float* y, int64_t ldy) {
  switch (m) {
    case 1: return skinny_rows<1>(x, ldx, k, w, n, alpha, beta, y, ldy);
    case 2: return skinny_rows<2>(x, ldx, k, w, n, alpha, beta, y, ldy);
    case 3: return skinny_rows<3>(x, ldx, k, w, n, alpha, beta, y, ldy);
    case 4: return skinny_rows<4>(x, ldx, k, w, n, alpha, beta, y, ldy);
    case 5: return skinny_rows<5>(x, ldx, k, w, n, alpha, beta, y, ldy);
    case 6: return skinny_rows<6>(x, ldx, k, w, n, alpha, beta, y, ldy);
    case 7: return skinny_rows<7>(x, ldx, k, w, n, alpha, beta, y, ldy);
    case 8: return skinny_rows<8>(x, ldx, k, w, n, alpha, beta, y, ldy);
    default: return;
  }
}

}  // namespace loom::cpu
