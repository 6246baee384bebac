// The x86 block kernels, shared by kernels_avx2.cc and kernels_avx512.cc: each
// includes this once, the AVX-512 one after `#pragma GCC target`, so it gets its
// own copy compiled for its ISA (everything here has internal linkage, so no
// AVX-512 code can leak into the AVX2 path through the linker).
//
// A decoder turns one 32-element sub-block of W into 32 bytes q (unsigned, or
// signed for kSigned types), a per-lane scale (8 lanes of 4 elements each, so
// Q6_K's per-16 scales fit) and a min: x = scale * q + min. `Dot` multiplies 32
// unsigned bytes with 32 signed bytes into 8 int32 lanes of 4 products each.
// Signed types use the sign trick: |q| * (x with q's sign).
//
// Not a public header: include only from those two files. It must not include
// anything the includer has not included before its pragma (an inline function
// first seen under the AVX-512 target could be the one the linker keeps for AVX2
// callers); ggml_k_scale_min comes from formats/gguf_dequant.h through kernels.h.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/cpu/quant/kernels.h"

namespace loom::cpu::quant::detail {
namespace {

inline float half_to_float(const uint8_t* bytes) {
  uint16_t bits;
  std::memcpy(&bits, bytes, sizeof(bits));
  return _cvtsh_ss(bits);
}

inline __m256i load_256(const uint8_t* bytes) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes)); }

// Low nibbles of 16 bytes as elements 0-15, high nibbles as 16-31.
inline __m256i unpack_nibbles_16(const uint8_t* bytes) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes));
  const __m128i mask = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), _mm_and_si128(raw, mask));
}

// Byte i is 0x10 where bit i of the 32 bits at `bytes` is set (Q5's fifth bits).
inline __m256i fifth_bits(const uint8_t* bytes) {
  uint32_t bits;
  std::memcpy(&bits, bytes, sizeof(bits));
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
  const __m256i bit_of_byte = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  const __m256i is_set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit_of_byte), bit_of_byte);
  return _mm256_and_si256(is_set, _mm256_set1_epi8(0x10));
}

inline float horizontal_sum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

struct SubBlock {
  __m256i q;
  __m256 scale;
  float min;
};

struct Q8_0 {
  static constexpr int kSubBlocks = 1, kBytes = 34;
  static constexpr bool kSigned = true, kHasMin = false;
  const uint8_t* block;
  explicit Q8_0(const uint8_t* b) : block(b) {}
  SubBlock get(int) const { return {load_256(block + 2), _mm256_set1_ps(half_to_float(block)), 0.0f}; }
};

struct Q4_0 {
  static constexpr int kSubBlocks = 1, kBytes = 18;
  static constexpr bool kSigned = false, kHasMin = true;
  const uint8_t* block;
  explicit Q4_0(const uint8_t* b) : block(b) {}
  SubBlock get(int) const {
    const float d = half_to_float(block);
    return {unpack_nibbles_16(block + 2), _mm256_set1_ps(d), -8.0f * d};
  }
};

struct Q4_1 {
  static constexpr int kSubBlocks = 1, kBytes = 20;
  static constexpr bool kSigned = false, kHasMin = true;
  const uint8_t* block;
  explicit Q4_1(const uint8_t* b) : block(b) {}
  SubBlock get(int) const {
    return {unpack_nibbles_16(block + 4), _mm256_set1_ps(half_to_float(block)), half_to_float(block + 2)};
  }
};

struct Q5_0 {
  static constexpr int kSubBlocks = 1, kBytes = 22;
  static constexpr bool kSigned = false, kHasMin = true;
  const uint8_t* block;
  explicit Q5_0(const uint8_t* b) : block(b) {}
  SubBlock get(int) const {
    const float d = half_to_float(block);
    return {_mm256_or_si256(unpack_nibbles_16(block + 6), fifth_bits(block + 2)), _mm256_set1_ps(d), -16.0f * d};
  }
};

struct Q5_1 {
  static constexpr int kSubBlocks = 1, kBytes = 24;
  static constexpr bool kSigned = false, kHasMin = true;
  const uint8_t* block;
  explicit Q5_1(const uint8_t* b) : block(b) {}
  SubBlock get(int) const {
    return {_mm256_or_si256(unpack_nibbles_16(block + 8), fifth_bits(block + 4)), _mm256_set1_ps(half_to_float(block)),
            half_to_float(block + 2)};
  }
};

// Q4_K (kHighBits false) and Q5_K: scales and mins decoded once per super-block.
template <bool kHighBits>
struct Q45_K {
  static constexpr int kSubBlocks = 8, kBytes = kHighBits ? 176 : 144;
  static constexpr bool kSigned = false, kHasMin = true;
  const uint8_t* block;
  float scales[8], mins[8];
  explicit Q45_K(const uint8_t* b) : block(b) {
    const float d = half_to_float(block), dmin = half_to_float(block + 2);
    const uint8_t* packed = block + 4;
    for (int j = 0; j < 8; ++j) {
      int scale, min;
      ggml_k_scale_min(j, packed, scale, min);
      scales[j] = d * static_cast<float>(scale);
      mins[j] = -dmin * static_cast<float>(min);
    }
  }
  SubBlock get(int j) const {
    const __m256i raw = load_256(block + (kHighBits ? 48 : 16) + 32 * (j / 2));
    const __m256i low_mask = _mm256_set1_epi8(0x0f);
    __m256i q = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(raw, 4) : raw, low_mask);
    if (kHighBits) {
      const __m256i bits = _mm256_srl_epi16(load_256(block + 16), _mm_cvtsi32_si128(j));
      q = _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(bits, _mm256_set1_epi8(1)), 4));
    }
    return {q, _mm256_set1_ps(scales[j]), mins[j]};
  }
};

struct Q6_K {
  static constexpr int kSubBlocks = 8, kBytes = 210;
  static constexpr bool kSigned = true, kHasMin = false;
  const uint8_t* block;
  float d;
  explicit Q6_K(const uint8_t* b) : block(b), d(half_to_float(b + 208)) {}
  SubBlock get(int j) const {
    const int half = j / 4, part = j % 4;
    const __m256i low = load_256(block + 64 * half + 32 * (part % 2));
    const __m256i nibble = _mm256_and_si256(part / 2 ? _mm256_srli_epi16(low, 4) : low, _mm256_set1_epi8(0x0f));
    const __m256i high = _mm256_srl_epi16(load_256(block + 128 + 32 * half), _mm_cvtsi32_si128(2 * part));
    const __m256i top = _mm256_slli_epi16(_mm256_and_si256(high, _mm256_set1_epi8(3)), 4);
    const __m256i q = _mm256_sub_epi8(_mm256_or_si256(nibble, top), _mm256_set1_epi8(32));
    const int8_t* scales = reinterpret_cast<const int8_t*>(block + 192) + 8 * half + 2 * part;
    const __m256 scale = _mm256_set_m128(_mm_set1_ps(d * static_cast<float>(scales[1])),
                                         _mm_set1_ps(d * static_cast<float>(scales[0])));
    return {q, scale, 0.0f};
  }
};

// sum_i a[i] * b[i] over `count` floats.
inline float dot_floats(const float* a, const float* b, int64_t count) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float total = horizontal_sum(acc);
  for (; i < count; ++i) total += a[i] * b[i];
  return total;
}

// Each W row's sub-blocks are walked in spans of up to kSpan: a span's mins are
// stored, then dotted with each X row's scaled sums in one vector pass (instead
// of a scalar multiply-add per sub-block and row). With one or two X rows the
// fp32 accumulators alternate between two chains so consecutive sub-blocks do
// not wait on each other's FMA latency.
template <class Decoder, class Dot, int kRows>
void matmul_block_rows(const QuantizedMatrix& w, const QuantizedActivations& x, int64_t row_begin,
                       int64_t column_begin, int64_t column_end, float* y, int64_t ldy) {
  constexpr int64_t kSpanBlocks = 32;  // W blocks per span: 32 (or 256 K-quant sub-blocks)
  constexpr int kChains = kRows <= 2 ? 2 : 1;
  const int64_t num_blocks = w.row_length / (32 * Decoder::kSubBlocks);
  const int8_t* values[kRows];
  const float* scales[kRows];
  const float* sums[kRows];
  for (int r = 0; r < kRows; ++r) {
    values[r] = x.values(row_begin + r);
    scales[r] = x.scales(row_begin + r);
    sums[r] = x.scaled_sums(row_begin + r);
  }
  float mins[kSpanBlocks * Decoder::kSubBlocks];
  for (int64_t column = column_begin; column < column_end; ++column) {
    const uint8_t* row = w.bytes + column * w.row_bytes;
    __m256 acc[kChains][kRows];
    float min_total[kRows];
    for (int r = 0; r < kRows; ++r) {
      for (int chain = 0; chain < kChains; ++chain) acc[chain][r] = _mm256_setzero_ps();
      min_total[r] = 0.0f;
    }
    for (int64_t span = 0; span < num_blocks; span += kSpanBlocks) {
      const int64_t span_end = std::min(num_blocks, span + kSpanBlocks);
      for (int64_t block = span; block < span_end; ++block) {
        const Decoder decoder(row + block * Decoder::kBytes);
#pragma GCC unroll 8
        for (int j = 0; j < Decoder::kSubBlocks; ++j) {
          const int64_t x_block = block * Decoder::kSubBlocks + j;
          const int chain = static_cast<int>(x_block % kChains);
          const SubBlock sub = decoder.get(j);
          if (Decoder::kHasMin) mins[x_block - span * Decoder::kSubBlocks] = sub.min;
          const __m256i unsigned_q = Decoder::kSigned ? _mm256_abs_epi8(sub.q) : sub.q;
#pragma GCC unroll 8
          for (int r = 0; r < kRows; ++r) {
            __m256i x_values = load_256(reinterpret_cast<const uint8_t*>(values[r] + x_block * 32));
            if (Decoder::kSigned) x_values = _mm256_sign_epi8(x_values, sub.q);
            const __m256 products = _mm256_cvtepi32_ps(Dot::dot(unsigned_q, x_values));
            acc[chain][r] = _mm256_fmadd_ps(_mm256_mul_ps(sub.scale, _mm256_broadcast_ss(scales[r] + x_block)),
                                            products, acc[chain][r]);
          }
        }
      }
      if (Decoder::kHasMin) {
        const int64_t first = span * Decoder::kSubBlocks, count = (span_end - span) * Decoder::kSubBlocks;
        for (int r = 0; r < kRows; ++r) min_total[r] += dot_floats(mins, sums[r] + first, count);
      }
    }
    for (int r = 0; r < kRows; ++r) {
      __m256 total = acc[0][r];
      for (int chain = 1; chain < kChains; ++chain) total = _mm256_add_ps(total, acc[chain][r]);
      y[r * ldy + column] = horizontal_sum(total) + min_total[r];
    }
  }
}

// F16/BF16 rows against fp32 activations. kColumns W rows at a time, each X
// row's accumulators independent: one accumulator chain per product would
// leave batch-1 decode waiting on FMA latency (4 cycles per 8 elements).
template <bool kBf16>
inline __m256 load_half8(const uint16_t* source) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(source));
  return kBf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16)) : _mm256_cvtph_ps(bits);
}

template <bool kBf16>
inline float half_to_float(const uint16_t* row, int64_t i) {
  uint16_t half_bits;  // the file's alignment may leave row odd-aligned
  std::memcpy(&half_bits, reinterpret_cast<const unsigned char*>(row) + 2 * i, sizeof(half_bits));
  if (!kBf16) return _cvtsh_ss(half_bits);
  const uint32_t word = static_cast<uint32_t>(half_bits) << 16;
  float weight;
  std::memcpy(&weight, &word, sizeof(weight));
  return weight;
}

template <bool kBf16, int kRows, int kColumns>
void matmul_half_columns(const QuantizedMatrix& w, const float* const (&in)[kRows], int64_t column, float* y,
                         int64_t ldy) {
  const int64_t length = w.row_length, vector_length = length / 8 * 8;
  const uint16_t* rows[kColumns];
  for (int c = 0; c < kColumns; ++c) rows[c] = reinterpret_cast<const uint16_t*>(w.bytes + (column + c) * w.row_bytes);
  __m256 acc[kRows][kColumns];
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kColumns; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t i = 0; i < vector_length; i += 8) {
    __m256 weights[kColumns];
#pragma GCC unroll 4
    for (int c = 0; c < kColumns; ++c) weights[c] = load_half8<kBf16>(rows[c] + i);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m256 x = _mm256_loadu_ps(in[r] + i);
#pragma GCC unroll 4
      for (int c = 0; c < kColumns; ++c) acc[r][c] = _mm256_fmadd_ps(weights[c], x, acc[r][c]);
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kColumns; ++c) {
      float total = horizontal_sum(acc[r][c]);
      for (int64_t i = vector_length; i < length; ++i) total += half_to_float<kBf16>(rows[c], i) * in[r][i];
      y[r * ldy + column + c] = total;
    }
}

template <bool kBf16, int kRows>
void matmul_half_rows(const QuantizedMatrix& w, const QuantizedActivations& x, int64_t row_begin,
                      int64_t column_begin, int64_t column_end, float* y, int64_t ldy) {
  // 16 ymm registers: kRows x kColumns accumulators + kColumns weights + one x.
  constexpr int kColumns = kRows <= 2 ? 4 : kRows <= 4 ? 2 : 1;
  const float* in[kRows];
  for (int r = 0; r < kRows; ++r) in[r] = x.fp32(row_begin + r);
  int64_t column = column_begin;
  for (; column + kColumns <= column_end; column += kColumns)
    matmul_half_columns<kBf16, kRows, kColumns>(w, in, column, y, ldy);
  for (; column < column_end; ++column) matmul_half_columns<kBf16, kRows, 1>(w, in, column, y, ldy);
}

template <class Decoder, class Dot>
void matmul_decoder(const QuantizedMatrix& w, const QuantizedActivations& x, int64_t row_begin, int num_rows,
                    int64_t column_begin, int64_t column_end, float* y, int64_t ldy) {
  switch (num_rows) {
    case 1: return matmul_block_rows<Decoder, Dot, 1>(w, x, row_begin, column_begin, column_end, y, ldy);
    case 2: return matmul_block_rows<Decoder, Dot, 2>(w, x, row_begin, column_begin, column_end, y, ldy);
    case 3: return matmul_block_rows<Decoder, Dot, 3>(w, x, row_begin, column_begin, column_end, y, ldy);
    case 4: return matmul_block_rows<Decoder, Dot, 4>(w, x, row_begin, column_begin, column_end, y, ldy);
    case 5: return matmul_block_rows<Decoder, Dot, 5>(w, x, row_begin, column_begin, column_end, y, ldy);
    case 6: return matmul_block_rows<Decoder, Dot, 6>(w, x, row_begin, column_begin, column_end, y, ldy);
    case 7: return matmul_block_rows<Decoder, Dot, 7>(w, x, row_begin, column_begin, column_end, y, ldy);
    default: return matmul_block_rows<Decoder, Dot, 8>(w, x, row_begin, column_begin, column_end, y, ldy);
  }
}

template <bool kBf16>
void matmul_half(const QuantizedMatrix& w, const QuantizedActivations& x, int64_t row_begin, int num_rows,
                 int64_t column_begin, int64_t column_end, float* y, int64_t ldy) {
  switch (num_rows) {
    case 1: return matmul_half_rows<kBf16, 1>(w, x, row_begin, column_begin, column_end, y, ldy);
    case 2: return matmul_half_rows<kBf16, 2>(w, x, row_begin, column_begin, column_end, y, ldy);
    case 3: return matmul_half_rows<kBf16, 3>(w, x, row_begin, column_begin, column_end, y, ldy);
    case 4: return matmul_half_rows<kBf16, 4>(w, x, row_begin, column_begin, column_end, y, ldy);
    case 5: return matmul_half_rows<kBf16, 5>(w, x, row_begin, column_begin, column_end, y, ldy);
    case 6: return matmul_half_rows<kBf16, 6>(w, x, row_begin, column_begin, column_end, y, ldy);
    case 7: return matmul_half_rows<kBf16, 7>(w, x, row_begin, column_begin, column_end, y, ldy);
    default: return matmul_half_rows<kBf16, 8>(w, x, row_begin, column_begin, column_end, y, ldy);
  }
}

template <class Dot>
void matmul_x86(const QuantizedMatrix& w, const QuantizedActivations& x, int64_t row_begin, int num_rows,
                int64_t column_begin, int64_t column_end, float* y, int64_t ldy) {
  switch (w.type) {
    case GgmlType::kQ8_0: return matmul_decoder<Q8_0, Dot>(w, x, row_begin, num_rows, column_begin, column_end, y, ldy);
    case GgmlType::kQ4_0: return matmul_decoder<Q4_0, Dot>(w, x, row_begin, num_rows, column_begin, column_end, y, ldy);
    case GgmlType::kQ4_1: return matmul_decoder<Q4_1, Dot>(w, x, row_begin, num_rows, column_begin, column_end, y, ldy);
    case GgmlType::kQ5_0: return matmul_decoder<Q5_0, Dot>(w, x, row_begin, num_rows, column_begin, column_end, y, ldy);
    case GgmlType::kQ5_1: return matmul_decoder<Q5_1, Dot>(w, x, row_begin, num_rows, column_begin, column_end, y, ldy);
    case GgmlType::kQ4_K:
      return matmul_decoder<Q45_K<false>, Dot>(w, x, row_begin, num_rows, column_begin, column_end, y, ldy);
    case GgmlType::kQ5_K:
      return matmul_decoder<Q45_K<true>, Dot>(w, x, row_begin, num_rows, column_begin, column_end, y, ldy);
    case GgmlType::kQ6_K: return matmul_decoder<Q6_K, Dot>(w, x, row_begin, num_rows, column_begin, column_end, y, ldy);
    case GgmlType::kF16: return matmul_half<false>(w, x, row_begin, num_rows, column_begin, column_end, y, ldy);
    case GgmlType::kBF16: return matmul_half<true>(w, x, row_begin, num_rows, column_begin, column_end, y, ldy);
    case GgmlType::kF32: return;
  }
}

}  // namespace
}  // namespace loom::cpu::quant::detail
