#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace loom {

const ByteLevelAlphabet& ByteLevelAlphabet::get() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

ByteLevelAlphabet::ByteLevelAlphabet() {
  byte_of_code_point_.fill(-1);
  const auto is_printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  uint32_t num_shifted = 0;
  for (int b = 0; b < 256; ++b) {
    code_points_[b] = is_printable(b) ? static_cast<uint32_t>(b) : 256 + num_shifted++;
  }
  for (int b = 0; b < 256; ++b) {
    utf8::append_code_point(byte_texts_[b], code_points_[b]);
    byte_of_code_point_[code_points_[b]] = static_cast<int16_t>(b);
  }
}

std::optional<uint8_t> ByteLevelAlphabet::byte_of(uint32_t code_point) const {
  if (code_point >= byte_of_code_point_.size() || byte_of_code_point_[code_point] < 0) return std::nullopt;
  return static_cast<uint8_t>(byte_of_code_point_[code_point]);
}

std::string ByteLevelAlphabet::encode(std::string_view bytes) const {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += byte_texts_[static_cast<uint8_t>(c)];
  return out;
}

std::optional<std::string> ByteLevelAlphabet::decode(std::string_view text) const {
  if (!utf8::is_valid(text)) return std::nullopt;
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    uint32_t code_point = 0;
    pos += utf8::decode_code_point(text, pos, code_point);
    const auto byte = byte_of(code_point);
    if (!byte) return std::nullopt;
    out.push_back(static_cast<char>(*byte));
  }
  return out;
}

}  // namespace loom
