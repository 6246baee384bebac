#include "tokenizer/utf8.h"

#include <cstdlib>
#include <memory>

#include <utf8proc.h>

#include "util/error.h"

namespace loom::utf8 {
namespace {

// Result of scanning one sequence at a position.
struct SequenceScan {
  size_t length = 0;   // bytes consumed (valid char or invalid maximal subpart)
  bool valid = false;  // a complete, valid character
  bool truncated = false;  // valid so far but the input ended
};

// Follows the Unicode "maximal subpart" practice that Rust's Utf8Chunks uses.
SequenceScan scan_sequence(std::string_view bytes, size_t pos) {
  const auto byte_at = [&](size_t i) { return static_cast<uint8_t>(bytes[i]); };
  const uint8_t lead = byte_at(pos);
  if (lead < 0x80) return {1, true, false};
  size_t num_continuation = 0;
  uint8_t second_low = 0x80, second_high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    num_continuation = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    num_continuation = 2;
    if (lead == 0xE0) second_low = 0xA0;
    if (lead == 0xED) second_high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    num_continuation = 3;
    if (lead == 0xF0) second_low = 0x90;
    if (lead == 0xF4) second_high = 0x8F;
  } else {
    return {1, false, false};
  }
  for (size_t k = 1; k <= num_continuation; ++k) {
    if (pos + k >= bytes.size()) return {k, false, true};
    const uint8_t byte = byte_at(pos + k);
    const uint8_t low = k == 1 ? second_low : 0x80;
    const uint8_t high = k == 1 ? second_high : 0xBF;
    if (byte < low || byte > high) return {k, false, false};
  }
  return {num_continuation + 1, true, false};
}

utf8proc_int32_t code_point_category(uint32_t code_point) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(code_point));
}

}  // namespace

void append_code_point(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t decode_code_point(std::string_view text, size_t pos, uint32_t& code_point) {
  const auto byte_at = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(text[i])); };
  const uint32_t lead = byte_at(pos);
  if (lead < 0x80) {
    code_point = lead;
    return 1;
  }
  if (lead < 0xE0) {
    code_point = ((lead & 0x1F) << 6) | (byte_at(pos + 1) & 0x3F);
    return 2;
  }
  if (lead < 0xF0) {
    code_point = ((lead & 0x0F) << 12) | ((byte_at(pos + 1) & 0x3F) << 6) | (byte_at(pos + 2) & 0x3F);
    return 3;
  }
  code_point = ((lead & 0x07) << 18) | ((byte_at(pos + 1) & 0x3F) << 12) |
               ((byte_at(pos + 2) & 0x3F) << 6) | (byte_at(pos + 3) & 0x3F);
  return 4;
}

std::string to_valid_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    const SequenceScan scan = scan_sequence(bytes, pos);
    if (scan.valid) {
      out.append(bytes.substr(pos, scan.length));
    } else {
      out.append("\xEF\xBF\xBD");
    }
    pos += scan.length;
  }
  return out;
}

size_t complete_prefix_length(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    const SequenceScan scan = scan_sequence(bytes, pos);
    if (scan.truncated) return pos;
    pos += scan.length;
  }
  return pos;
}

bool is_valid(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    const SequenceScan scan = scan_sequence(bytes, pos);
    if (!scan.valid) return false;
    pos += scan.length;
  }
  return true;
}

bool is_numeric(uint32_t code_point) {
  const auto category = code_point_category(code_point);
  return category == UTF8PROC_CATEGORY_ND || category == UTF8PROC_CATEGORY_NL ||
         category == UTF8PROC_CATEGORY_NO;
}

bool is_whitespace(uint32_t cp) {
  // The Unicode White_Space property (what Rust's char::is_whitespace and \s test).
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

bool is_word_char(uint32_t cp) {
  if (cp == 0x200C || cp == 0x200D) return true;  // Join_Control
  switch (code_point_category(cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

std::string normalize(std::string_view text, NormalizationForm form) {
  bool is_ascii = true;
  for (char c : text) is_ascii &= static_cast<uint8_t>(c) < 0x80;
  if (is_ascii) return std::string(text);  // ASCII is invariant under every form
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalizationForm::kNFC: options |= UTF8PROC_COMPOSE; break;
    case NormalizationForm::kNFD: options |= UTF8PROC_DECOMPOSE; break;
    case NormalizationForm::kNFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalizationForm::kNFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &mapped,
                   static_cast<utf8proc_option_t>(options));
  if (length < 0) fail(ErrorKind::kInvalidArgument, "unicode normalization failed: {}", utf8proc_errmsg(length));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owner(mapped, &std::free);
  return std::string(reinterpret_cast<const char*>(mapped), static_cast<size_t>(length));
}

}  // namespace loom::utf8
