// GPT-2's byte-level alphabet: each byte maps to one printable code point
// ("Ġ" for a space), so that BPE runs on strings with no control characters.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace loom {

class ByteLevelAlphabet {
 public:
  // The process-wide immutable table (built once, thread-safe).
  static const ByteLevelAlphabet& get();

  uint32_t code_point(uint8_t byte) const { return code_points_[byte]; }
  // The UTF-8 string of the code point standing for `byte`.
  const std::string& byte_text(uint8_t byte) const { return byte_texts_[byte]; }
  std::optional<uint8_t> byte_of(uint32_t code_point) const;

  // Raw bytes -> byte-level string ("a b" -> "aĠb").
  std::string encode(std::string_view bytes) const;
  // Byte-level string -> raw bytes; nullopt if some character is outside the alphabet.
  std::optional<std::string> decode(std::string_view text) const;

 private:
  ByteLevelAlphabet();
  std::array<uint32_t, 256> code_points_{};
  std::array<std::string, 256> byte_texts_;
  std::array<int16_t, 512> byte_of_code_point_{};  // all code points are < 0x144
};

}  // namespace loom
