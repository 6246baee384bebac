// ggml tensor types and their dequantization to fp32, bit-exact with ggml's
// reference dequantize_row_* (and gguf-py's numpy dequantize).
//
// Block layouts (32 elements per block, little-endian):
//   Q8_0: f16 d, int8 q[32]          x[i] = d * q[i]
//   Q4_0: f16 d, u8 qs[16]           x[j] = d * ((qs[j] & 15) - 8), x[j+16] = d * ((qs[j] >> 4) - 8)
//   Q4_1: f16 d, f16 m, u8 qs[16]    x[j] = d * (qs[j] & 15) + m,   x[j+16] = d * (qs[j] >> 4) + m
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace loom {

// Values are ggml's `enum ggml_type`.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ8_0 = 8,
  kBF16 = 30,
};

// "Q4_K", "IQ2_XXS", ... for any ggml type id (also those we cannot read), or "type <id>".
std::string ggml_type_name(uint32_t type_id);

// Whether Loom dequantizes this type.
bool is_supported_ggml_type(uint32_t type_id);

struct GgmlBlockLayout {
  int64_t elements_per_block;
  int64_t bytes_per_block;
};

// Layout of a supported type.
GgmlBlockLayout ggml_block_layout(GgmlType type);

// Decodes `num_elements` values (a multiple of the block size) from `source`
// into `out`. Pure function; parallel over blocks with OpenMP for big tensors.
void dequantize_ggml(GgmlType type, const uint8_t* source, int64_t num_elements, float* out);

}  // namespace loom
