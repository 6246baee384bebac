// Values must equal ggml's dequantize_row_* bit for bit. For Q4_1 that holds
// even if the compiler fuses d * q + m into one FMA: d has an 11-bit and q a
// 4-bit significand, so the product is exact and only the sum rounds.
#include "formats/gguf_dequant.h"

#include <cstring>

#include "util/error.h"
#include "util/half.h"

namespace loom {

namespace {

constexpr int64_t kBlock = 32;

uint16_t load_u16(const uint8_t* bytes) {
  uint16_t value;
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

constexpr const char* kTypeNames[] = {
    "F32",     "F16",    "Q4_0",   "Q4_1",   "Q4_2",  "Q4_3",    "Q5_0",   "Q5_1",  "Q8_0",  "Q8_1",
    "Q2_K",    "Q3_K",   "Q4_K",   "Q5_K",   "Q6_K",  "Q8_K",    "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
    "IQ4_NL",  "IQ3_S",  "IQ2_S",  "IQ4_XS", "I8",    "I16",     "I32",    "I64",   "F64",   "IQ1_M",
    "BF16",    "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8",
    "IQ4_NL_8_8", "MXFP4", "NVFP4", "Q1_0",
};

}  // namespace

std::string ggml_type_name(uint32_t type_id) {
  if (type_id < std::size(kTypeNames)) return kTypeNames[type_id];
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
      return true;
  }
  return false;
}

GgmlBlockLayout ggml_block_layout(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return {1, 4};
    case GgmlType::kF16: return {1, 2};
    case GgmlType::kBF16: return {1, 2};
    case GgmlType::kQ8_0: return {kBlock, 2 + kBlock};
    case GgmlType::kQ4_0: return {kBlock, 2 + kBlock / 2};
    case GgmlType::kQ4_1: return {kBlock, 4 + kBlock / 2};
  }
  fail(ErrorKind::kInternal, "no block layout for ggml type {}", static_cast<uint32_t>(type));
}

void dequantize_ggml(GgmlType type, const uint8_t* source, int64_t num_elements, float* out) {
  const GgmlBlockLayout layout = ggml_block_layout(type);
  LOOM_CHECK(num_elements % layout.elements_per_block == 0);
  const int64_t num_blocks = num_elements / layout.elements_per_block;
  const bool parallel = num_elements > (1 << 18);
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
    case GgmlType::kQ8_0:
#pragma omp parallel for schedule(static) if (parallel)
      for (int64_t b = 0; b < num_blocks; ++b)
        dequantize_q8_0_block(source + b * layout.bytes_per_block, out + b * kBlock);
      return;
    case GgmlType::kQ4_0:
#pragma omp parallel for schedule(static) if (parallel)
      for (int64_t b = 0; b < num_blocks; ++b)
        dequantize_q4_0_block(source + b * layout.bytes_per_block, out + b * kBlock);
      return;
    case GgmlType::kQ4_1:
#pragma omp parallel for schedule(static) if (parallel)
      for (int64_t b = 0; b < num_blocks; ++b)
        dequantize_q4_1_block(source + b * layout.bytes_per_block, out + b * kBlock);
      return;
  }
}

}  // namespace loom
