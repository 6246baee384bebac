// FP8 E4M3 ("e4m3fn": OCP FP8, torch.float8_e4m3fn, safetensors F8_E4M3,
// CUDA __nv_fp8_e4m3), scalar and exact, no hardware dependence.
//
// Bits S EEEE MMM, exponent bias 7:
//   E == 0          subnormal  (-1)^S * M/8 * 2^-6   (0x00 / 0x80: +0 / -0)
//   E in 1..15      normal     (-1)^S * (1 + M/8) * 2^(E-7)
//   E == 15, M == 7 NaN        (0x7F, 0xFF); there are no infinities
// Largest finite magnitude 448 (0x7E), smallest subnormal 2^-9.
#pragma once

#include <cstdint>
#include <cstring>

namespace loom {

inline constexpr float kE4M3Max = 448.0f;

inline bool e4m3_is_nan(uint8_t bits) { return (bits & 0x7fu) == 0x7fu; }

inline float e4m3_to_float(uint8_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x80u) << 24;
  const uint32_t exponent = (bits >> 3) & 0xfu;
  const uint32_t mantissa = bits & 0x7u;
  uint32_t word;
  if (exponent == 0xfu && mantissa == 0x7u) {
    word = sign | 0x7fc00000u;
  } else if (exponent == 0) {  // M * 2^-9, exact in float
    float magnitude = static_cast<float>(mantissa) * (1.0f / 512.0f);
    std::memcpy(&word, &magnitude, sizeof(word));
    word |= sign;
  } else {
    word = sign | ((exponent + 127u - 7u) << 23) | (mantissa << 20);
  }
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

// Round to nearest even. Saturates: magnitudes beyond 448 (infinities too)
// give +-448, as quantizers clamp to the format's range before casting; NaN
// gives 0x7F (sign kept).
inline uint8_t float_to_e4m3(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  const uint8_t sign = static_cast<uint8_t>((word >> 24) & 0x80u);
  const uint32_t abs = word & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  if (abs >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448
  if (abs < 0x3c800000u) {  // below 2^-6: subnormal steps of 2^-9 (rounding up to 2^-6 gives 0x08, right too)
    float magnitude;
    std::memcpy(&magnitude, &abs, sizeof(magnitude));
    return static_cast<uint8_t>(sign | static_cast<uint32_t>(__builtin_nearbyintf(magnitude * 512.0f)));
  }
  // Normal: keep 3 of float's 23 mantissa bits, rounding to nearest even.
  const uint32_t rounded = abs + 0x7ffffu + ((abs >> 20) & 1u);
  const uint32_t exponent = (rounded >> 23) - 127u + 7u;
  const uint32_t mantissa = (rounded >> 20) & 0x7u;
  if (exponent > 15u || (exponent == 15u && mantissa == 7u)) return static_cast<uint8_t>(sign | 0x7eu);
  return static_cast<uint8_t>(sign | (exponent << 3) | mantissa);
}

}  // namespace loom
