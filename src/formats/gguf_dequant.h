// ggml tensor types and their dequantization to fp32, bit-exact with ggml's
// reference dequantize_row_* (and gguf-py's numpy dequantize).
//
// Block layouts (little-endian; f16 = IEEE half):
//   Q8_0 (32, 34 B): f16 d, int8 q[32]          x[i] = d * q[i]
//   Q4_0 (32, 18 B): f16 d, u8 qs[16]           x[j] = d * ((qs[j] & 15) - 8), x[j+16] = d * ((qs[j] >> 4) - 8)
//   Q4_1 (32, 20 B): f16 d, f16 m, u8 qs[16]    x[j] = d * (qs[j] & 15) + m,   x[j+16] = d * (qs[j] >> 4) + m
//   Q5_0 (32, 22 B): f16 d, u32 qh, u8 qs[16]   as Q4_0 with bit j (element j) / j+16 (element j+16)
//                                               of qh as the 5th bit, offset 16 instead of 8
//   Q5_1 (32, 24 B): f16 d, f16 m, u32 qh, u8 qs[16]   as Q4_1 with Q5_0's 5th bits
//   K-quants, super-blocks of 256 elements in 8 sub-blocks of 32:
//   Q4_K (256, 144 B): f16 d, f16 dmin, u8 scales[12] (8 6-bit scales, 8 6-bit mins), u8 qs[128]
//                      sub-block j: x = d * scale[j] * q - dmin * min[j], q the low (j even) or
//                      high (j odd) nibbles of qs[32 * (j / 2) ...]
//   Q5_K (256, 176 B): f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]; as Q4_K, bit j of qh[l]
//                      the 5th bit of element l of sub-block j
//   Q6_K (256, 210 B): u8 ql[128], u8 qh[64], int8 scales[16] (one per 16 elements), f16 d;
//                      x = d * scale * (q - 32), q 6 bits from ql (4) and qh (2)
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
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

// "Q4_K", "IQ2_XXS", ... for any ggml type id (also those we cannot read), or "type <id>".
std::string ggml_type_name(uint32_t type_id);
inline std::string ggml_type_name(GgmlType type) { return ggml_type_name(static_cast<uint32_t>(type)); }

// Whether Loom dequantizes this type.
bool is_supported_ggml_type(uint32_t type_id);

// The list of supported types for error hints: "F32, F16, BF16, Q8_0, ...".
const char* supported_ggml_type_names();

struct GgmlBlockLayout {
  int64_t elements_per_block;
  int64_t bytes_per_block;
};

// Layout of a supported type.
GgmlBlockLayout ggml_block_layout(GgmlType type);

// Bytes of a row of `row_length` elements (a multiple of the block size).
int64_t ggml_row_bytes(GgmlType type, int64_t row_length);

// Decodes `num_elements` values (a multiple of the block size) from `source`
// into `out`. Pure function; parallel over blocks with OpenMP for big tensors.
void dequantize_ggml(GgmlType type, const uint8_t* source, int64_t num_elements, float* out);

// Scale and min (6 bits each) of sub-block j < 8 of a Q4_K / Q5_K super-block
// from its 12 packed scale bytes (ggml's get_scale_min_k4); the CPU kernels use it too.
inline void ggml_k_scale_min(int j, const uint8_t* scales, int& scale, int& min) {
  if (j < 4) {
    scale = scales[j] & 63;
    min = scales[j + 4] & 63;
  } else {
    scale = (scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4);
    min = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

}  // namespace loom
