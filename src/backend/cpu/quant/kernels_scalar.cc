// Portable kernels: every type decoded one 32-element sub-block at a time into
// integer values q with x = scale * q + min (scale per 16-element half, for
// Q6_K's per-16 scales), then integer dot products with the int8 activations.
// The definitions the SIMD kernels must agree with.
#include <cstring>

#include "backend/cpu/quant/kernels.h"
#include "util/half.h"

namespace loom::cpu::quant::detail {

namespace {

struct SubBlock {
  int q[32];
  float scale[2];  // elements 0-15, 16-31
  float min = 0.0f;
};

float load_half(const uint8_t* bytes) {
  uint16_t bits;
  std::memcpy(&bits, bytes, sizeof(bits));
  return fp16_to_float(bits);
}

void set_scale(SubBlock& sub, float scale) { sub.scale[0] = sub.scale[1] = scale; }

void nibbles(const uint8_t* quants, int* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = quants[j] & 0x0f;
    q[j + 16] = quants[j] >> 4;
  }
}

void add_fifth_bits(const uint8_t* high_bits, int* q) {
  uint32_t bits;
  std::memcpy(&bits, high_bits, sizeof(bits));
  for (int i = 0; i < 32; ++i) q[i] |= static_cast<int>((bits >> i) & 1u) << 4;
}


int sub_blocks_per_block(GgmlType type) {
  return type == GgmlType::kQ4_K || type == GgmlType::kQ5_K || type == GgmlType::kQ6_K ? 8 : 1;
}

void decode(GgmlType type, const uint8_t* block, int j, SubBlock& sub) {
  switch (type) {
    case GgmlType::kQ8_0: {
      const int8_t* quants = reinterpret_cast<const int8_t*>(block + 2);
      for (int i = 0; i < 32; ++i) sub.q[i] = quants[i];
      set_scale(sub, load_half(block));
      return;
    }
    case GgmlType::kQ4_0:
      nibbles(block + 2, sub.q);
      set_scale(sub, load_half(block));
      sub.min = -8.0f * sub.scale[0];
      return;
    case GgmlType::kQ4_1:
      nibbles(block + 4, sub.q);
      set_scale(sub, load_half(block));
      sub.min = load_half(block + 2);
      return;
    case GgmlType::kQ5_0:
      nibbles(block + 6, sub.q);
      add_fifth_bits(block + 2, sub.q);
      set_scale(sub, load_half(block));
      sub.min = -16.0f * sub.scale[0];
      return;
    case GgmlType::kQ5_1:
      nibbles(block + 8, sub.q);
      add_fifth_bits(block + 4, sub.q);
      set_scale(sub, load_half(block));
      sub.min = load_half(block + 2);
      return;
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: {
      const bool has_high_bits = type == GgmlType::kQ5_K;
      const uint8_t* quants = block + (has_high_bits ? 48 : 16) + 32 * (j / 2);
      for (int l = 0; l < 32; ++l) {
        sub.q[l] = (quants[l] >> (4 * (j % 2))) & 0x0f;
        if (has_high_bits) sub.q[l] |= ((block[16 + l] >> j) & 1) << 4;
      }
      int scale, min;
      ggml_k_scale_min(j, block + 4, scale, min);
      set_scale(sub, load_half(block) * static_cast<float>(scale));
      sub.min = -load_half(block + 2) * static_cast<float>(min);
      return;
    }
    case GgmlType::kQ6_K: {
      const int half = j / 4, part = j % 4;
      const uint8_t* low = block + 64 * half + 32 * (part % 2);
      const uint8_t* high = block + 128 + 32 * half;
      for (int l = 0; l < 32; ++l)
        sub.q[l] = (((low[l] >> (4 * (part / 2))) & 0x0f) | (((high[l] >> (2 * part)) & 3) << 4)) - 32;
      const int8_t* scales = reinterpret_cast<const int8_t*>(block + 192) + 8 * half + 2 * part;
      const float d = load_half(block + 208);
      sub.scale[0] = d * static_cast<float>(scales[0]);
      sub.scale[1] = d * static_cast<float>(scales[1]);
      return;
    }
    default:
      return;  // F16/BF16 and F32 never reach here
  }
}

void matmul_blocks(const QuantizedMatrix& w, const QuantizedActivations& x, int64_t row_begin, int num_rows,
                   int64_t column_begin, int64_t column_end, float* y, int64_t ldy) {
  const int subs = sub_blocks_per_block(w.type);
  const int64_t bytes_per_block = ggml_block_layout(w.type).bytes_per_block;
  const int64_t num_blocks = w.row_length / (32 * subs);
  SubBlock sub;
  for (int64_t column = column_begin; column < column_end; ++column) {
    const uint8_t* row = w.bytes + column * w.row_bytes;
    for (int r = 0; r < num_rows; ++r) {
      const int8_t* values = x.values(row_begin + r);
      const float* scales = x.scales(row_begin + r);
      const float* sums = x.scaled_sums(row_begin + r);
      float total = 0.0f;
      for (int64_t block = 0; block < num_blocks; ++block) {
        for (int j = 0; j < subs; ++j) {
          decode(w.type, row + block * bytes_per_block, j, sub);
          const int64_t x_block = block * subs + j;
          const int8_t* x_values = values + x_block * 32;
          int dot_low = 0, dot_high = 0;
          for (int i = 0; i < 16; ++i) dot_low += sub.q[i] * x_values[i];
          for (int i = 16; i < 32; ++i) dot_high += sub.q[i] * x_values[i];
          total += scales[x_block] * (sub.scale[0] * static_cast<float>(dot_low) +
                                      sub.scale[1] * static_cast<float>(dot_high)) +
                   sub.min * sums[x_block];
        }
      }
      y[r * ldy + column] = total;
    }
  }
}

void matmul_half(const QuantizedMatrix& w, const QuantizedActivations& x, int64_t row_begin, int num_rows,
                 int64_t column_begin, int64_t column_end, float* y, int64_t ldy) {
  const bool is_bf16 = w.type == GgmlType::kBF16;
  for (int64_t column = column_begin; column < column_end; ++column) {
    const uint8_t* row = w.bytes + column * w.row_bytes;
    for (int r = 0; r < num_rows; ++r) {
      const float* in = x.fp32(row_begin + r);
      float total = 0.0f;
      for (int64_t i = 0; i < w.row_length; ++i) {
        uint16_t bits;
        std::memcpy(&bits, row + 2 * i, sizeof(bits));
        total += (is_bf16 ? bf16_to_float(bits) : fp16_to_float(bits)) * in[i];
      }
      y[r * ldy + column] = total;
    }
  }
}

}  // namespace

void matmul_scalar(const QuantizedMatrix& w, const QuantizedActivations& x, int64_t row_begin, int num_rows,
                   int64_t column_begin, int64_t column_end, float* y, int64_t ldy) {
  if (w.type == GgmlType::kF16 || w.type == GgmlType::kBF16)
    return matmul_half(w, x, row_begin, num_rows, column_begin, column_end, y, ldy);
  matmul_blocks(w, x, row_begin, num_rows, column_begin, column_end, y, ldy);
}

}  // namespace loom::cpu::quant::detail
