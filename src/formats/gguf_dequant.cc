// Values must equal ggml's dequantize_row_* bit for bit. For Q4_1/Q5_1 and the
// K-quants' "d * q - m" that holds even if the compiler fuses the multiply and
// add into one FMA: the scale has at most 17 significant bits and q at most 5,
// so the product is exact and only the sum rounds. Q6_K multiplies (d * scale) * q
// in ggml's order.
#include "formats/gguf_dequant.h"
#include "formats/tensor.h"

#include <cstring>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "util/error.h"
#include "util/half.h"

namespace loom {

namespace {

constexpr int64_t kBlock = 32;
constexpr int64_t kSuperBlock = 256;

uint16_t load_u16(const uint8_t* bytes) {
  uint16_t value;
  std::memcpy(&value, bytes, sizeof(value));
  return value;
}

uint32_t load_u32(const uint8_t* bytes) {
  uint32_t value;
  std::memcpy(&value, bytes, sizeof(value));
  return value;
}

void dequantize_q8_0_block(const uint8_t* block, float* out) {
  const float d = fp16_to_float(load_u16(block));
  const int8_t* quants = reinterpret_cast<const int8_t*>(block + 2);
  for (int i = 0; i < kBlock; ++i) out[i] = static_cast<float>(quants[i]) * d;
}

void dequantize_q4_0_block(const uint8_t* block, float* out) {
  const float d = fp16_to_float(load_u16(block));
  const uint8_t* quants = block + 2;
  for (int j = 0; j < kBlock / 2; ++j) {
    out[j] = static_cast<float>((quants[j] & 0x0f) - 8) * d;
    out[j + kBlock / 2] = static_cast<float>((quants[j] >> 4) - 8) * d;
  }
}

void dequantize_q4_1_block(const uint8_t* block, float* out) {
  const float d = fp16_to_float(load_u16(block));
  const float m = fp16_to_float(load_u16(block + 2));
  const uint8_t* quants = block + 4;
  for (int j = 0; j < kBlock / 2; ++j) {
    out[j] = static_cast<float>(quants[j] & 0x0f) * d + m;
    out[j + kBlock / 2] = static_cast<float>(quants[j] >> 4) * d + m;
  }
}

// The 5-bit values of a Q5_0/Q5_1 block (0..31).
void q5_values(const uint8_t* high_bits, const uint8_t* quants, int* values) {
  const uint32_t qh = load_u32(high_bits);
  for (int j = 0; j < kBlock / 2; ++j) {
    values[j] = (quants[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    values[j + kBlock / 2] = (quants[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
  }
}

void dequantize_q5_0_block(const uint8_t* block, float* out) {
  const float d = fp16_to_float(load_u16(block));
  int values[kBlock];
  q5_values(block + 2, block + 6, values);
  for (int i = 0; i < kBlock; ++i) out[i] = static_cast<float>(values[i] - 16) * d;
}

void dequantize_q5_1_block(const uint8_t* block, float* out) {
  const float d = fp16_to_float(load_u16(block));
  const float m = fp16_to_float(load_u16(block + 2));
  int values[kBlock];
  q5_values(block + 4, block + 8, values);
  for (int i = 0; i < kBlock; ++i) out[i] = static_cast<float>(values[i]) * d + m;
}


// Q4_K when high_bits is null, else Q5_K.
void dequantize_q45_k_block(const uint8_t* block, bool has_high_bits, float* out) {
  const float d = fp16_to_float(load_u16(block));
  const float dmin = fp16_to_float(load_u16(block + 2));
  const uint8_t* scales = block + 4;
  const uint8_t* high_bits = has_high_bits ? block + 16 : nullptr;
  const uint8_t* quants = block + (has_high_bits ? 48 : 16);
  for (int j = 0; j < 8; ++j) {
    int scale, min;
    ggml_k_scale_min(j, scales, scale, min);
    const float d_j = d * static_cast<float>(scale);
    const float m_j = dmin * static_cast<float>(min);
    const uint8_t* q = quants + 32 * (j / 2);
    const int shift = (j % 2) * 4;
    for (int l = 0; l < 32; ++l) {
      int value = (q[l] >> shift) & 0x0f;
      if (high_bits != nullptr && (high_bits[l] >> j) & 1) value += 16;
      out[32 * j + l] = d_j * static_cast<float>(value) - m_j;
    }
  }
}

void dequantize_q6_k_block(const uint8_t* block, float* out) {
  const uint8_t* low = block;
  const uint8_t* high = block + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(block + 192);
  const float d = fp16_to_float(load_u16(block + 208));
  for (int half = 0; half < 2; ++half) {
    for (int l = 0; l < 32; ++l) {
      const int group = l / 16;
      const int q1 = ((low[l] & 0x0f) | (((high[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((low[l + 32] & 0x0f) | (((high[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((low[l] >> 4) | (((high[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((low[l + 32] >> 4) | (((high[l] >> 6) & 3) << 4)) - 32;
      out[l] = d * static_cast<float>(scales[group]) * static_cast<float>(q1);
      out[l + 32] = d * static_cast<float>(scales[group + 2]) * static_cast<float>(q2);
      out[l + 64] = d * static_cast<float>(scales[group + 4]) * static_cast<float>(q3);
      out[l + 96] = d * static_cast<float>(scales[group + 6]) * static_cast<float>(q4);
    }
    out += 128;
    low += 64;
    high += 32;
    scales += 8;
  }
}

constexpr const char* kTypeNames[] = {
    "F32",     "F16",    "Q4_0",   "Q4_1",   "Q4_2",  "Q4_3",    "Q5_0",   "Q5_1",  "Q8_0",  "Q8_1",
    "Q2_K",    "Q3_K",   "Q4_K",   "Q5_K",   "Q6_K",  "Q8_K",    "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
    "IQ4_NL",  "IQ3_S",  "IQ2_S",  "IQ4_XS", "I8",    "I16",     "I32",    "I64",   "F64",   "IQ1_M",
    "BF16",    "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8",
    "IQ4_NL_8_8", "MXFP4", "NVFP4", "Q1_0",
};

template <typename DecodeBlock>
void dequantize_blocks(const uint8_t* source, int64_t num_blocks, const GgmlBlockLayout& layout, float* out,
                       bool parallel, DecodeBlock decode) {
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t b = 0; b < num_blocks; ++b)
    decode(source + b * layout.bytes_per_block, out + b * layout.elements_per_block);
}

}  // namespace

std::string ggml_type_name(uint32_t type_id) {
  if (type_id < std::size(kTypeNames)) return kTypeNames[type_id];
  if (type_id == kF8E4M3RowType) return "F8_E4M3";  // Loom's tag for e4m3 rows (formats/tensor.h)
  return "type " + std::to_string(type_id);
}

bool is_supported_ggml_type(uint32_t type_id) {
  switch (static_cast<GgmlType>(type_id)) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return true;
  }
  return false;
}

const char* supported_ggml_type_names() {
  return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K";
}

GgmlBlockLayout ggml_block_layout(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return {1, 4};
    case GgmlType::kF16: return {1, 2};
    case GgmlType::kBF16: return {1, 2};
    case GgmlType::kQ8_0: return {kBlock, 2 + kBlock};
    case GgmlType::kQ4_0: return {kBlock, 2 + kBlock / 2};
    case GgmlType::kQ4_1: return {kBlock, 4 + kBlock / 2};
    case GgmlType::kQ5_0: return {kBlock, 6 + kBlock / 2};
    case GgmlType::kQ5_1: return {kBlock, 8 + kBlock / 2};
    case GgmlType::kQ4_K: return {kSuperBlock, 144};
    case GgmlType::kQ5_K: return {kSuperBlock, 176};
    case GgmlType::kQ6_K: return {kSuperBlock, 210};
  }
  fail(ErrorKind::kInternal, "no block layout for ggml type {}", static_cast<uint32_t>(type));
}

int64_t ggml_row_bytes(GgmlType type, int64_t row_length) {
  const GgmlBlockLayout layout = ggml_block_layout(type);
  LOOM_CHECK(row_length % layout.elements_per_block == 0);
  return row_length / layout.elements_per_block * layout.bytes_per_block;
}

void dequantize_ggml(GgmlType type, const uint8_t* source, int64_t num_elements, float* out) {
  const GgmlBlockLayout layout = ggml_block_layout(type);
  LOOM_CHECK(num_elements % layout.elements_per_block == 0);
  const int64_t num_blocks = num_elements / layout.elements_per_block;
#ifdef _OPENMP
  const bool parallel = num_elements > (1 << 18) && !omp_in_parallel();  // not nested in a caller's team
#else
  const bool parallel = false;
#endif
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(out, source, num_elements * sizeof(float));
      return;
    case GgmlType::kF16:
#pragma omp parallel for schedule(static) if (parallel)
      for (int64_t i = 0; i < num_elements; ++i) out[i] = fp16_to_float(load_u16(source + 2 * i));
      return;
    case GgmlType::kBF16:
#pragma omp parallel for schedule(static) if (parallel)
      for (int64_t i = 0; i < num_elements; ++i) out[i] = bf16_to_float(load_u16(source + 2 * i));
      return;
    case GgmlType::kQ8_0: return dequantize_blocks(source, num_blocks, layout, out, parallel, dequantize_q8_0_block);
    case GgmlType::kQ4_0: return dequantize_blocks(source, num_blocks, layout, out, parallel, dequantize_q4_0_block);
    case GgmlType::kQ4_1: return dequantize_blocks(source, num_blocks, layout, out, parallel, dequantize_q4_1_block);
    case GgmlType::kQ5_0: return dequantize_blocks(source, num_blocks, layout, out, parallel, dequantize_q5_0_block);
    case GgmlType::kQ5_1: return dequantize_blocks(source, num_blocks, layout, out, parallel, dequantize_q5_1_block);
    case GgmlType::kQ4_K:
      return dequantize_blocks(source, num_blocks, layout, out, parallel,
                               [](const uint8_t* block, float* values) { dequantize_q45_k_block(block, false, values); });
    case GgmlType::kQ5_K:
      return dequantize_blocks(source, num_blocks, layout, out, parallel,
                               [](const uint8_t* block, float* values) { dequantize_q45_k_block(block, true, values); });
    case GgmlType::kQ6_K: return dequantize_blocks(source, num_blocks, layout, out, parallel, dequantize_q6_k_block);
  }
}

}  // namespace loom
