// Vectorised exp for the CPU backend's softmax and SiLU and the host sampler's
// log-softmax: glibc's expf is scalar (~6 ns an element) and without
// -ffast-math the compiler will not vectorise it.
// Cephes-style range reduction + degree-5 polynomial: within 2 ulp of expf for
// x in [-87, 88]; below that it gives ~1e-38, above it saturates at ~1.65e38.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace loom {

#if defined(__AVX2__) && defined(__FMA__)

inline __m256 exp_avx2(__m256 x) {
  x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3365478515625f));
  // x = n ln2 + r, |r| <= ln2 / 2, with ln2 split in two for an exact n ln2.
  const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
}

#endif

// values[i] = exp(values[i] - shift); returns the sum of the results (fp32).
inline float exp_shifted_in_place(float* values, int64_t count, float shift) {
  int64_t i = 0;
  float sum = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 shift_vector = _mm256_set1_ps(shift);
  __m256 sum_vector = _mm256_setzero_ps();
  for (; i + 8 <= count; i += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(values + i), shift_vector));
    _mm256_storeu_ps(values + i, e);
    sum_vector = _mm256_add_ps(sum_vector, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum_vector);
  for (float lane : lanes) sum += lane;
#endif
  for (; i < count; ++i) {
    values[i] = std::exp(values[i] - shift);
    sum += values[i];
  }
  return sum;
}

// The largest of values[0..count) (count > 0; NaN entries are skipped, as std::max does past the first).
inline float max_value(const float* values, int64_t count) {
  int64_t i = 0;
  float best = values[0];
#if defined(__AVX2__) && defined(__FMA__)
  if (count >= 8) {
    __m256 best_vector = _mm256_loadu_ps(values);
    for (i = 8; i + 8 <= count; i += 8) best_vector = _mm256_max_ps(_mm256_loadu_ps(values + i), best_vector);
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, best_vector);
    for (float lane : lanes) best = std::max(best, lane);
  }
#endif
  for (; i < count; ++i) best = std::max(best, values[i]);
  return best;
}

// The sum of exp(values[i] - shift), each term in fp32 (within 2 ulp), summed in fp64.
inline double exp_shifted_sum(const float* values, int64_t count, float shift) {
  int64_t i = 0;
  double sum = 0.0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 shift_vector = _mm256_set1_ps(shift);
  __m256d low = _mm256_setzero_pd(), high = _mm256_setzero_pd();
  for (; i + 8 <= count; i += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(values + i), shift_vector));
    low = _mm256_add_pd(low, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    high = _mm256_add_pd(high, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(low, high));
  for (double lane : lanes) sum += lane;
#endif
  for (; i < count; ++i) sum += static_cast<double>(std::exp(values[i] - shift));
  return sum;
}

// gate[i] = gate[i] / (1 + exp(-gate[i])) * up[i] (torch's silu, then the product).
inline void silu_multiply_span(float* gate, const float* up, int64_t count) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= count; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
#endif
  for (; i < count; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace loom
