// Sets of Unicode code points and their spelling as UTF-8 byte sequences, for
// character classes ([^"\\], \w, [α-ω]) in a byte-level grammar.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grammar/grammar.h"

namespace loom::grammar {

constexpr uint32_t kMaxCodepoint = 0x10FFFF;

// A set of code points as sorted, disjoint, non-adjacent inclusive ranges.
class CodepointSet {
 public:
  void add(uint32_t first, uint32_t last);
  void add(const CodepointSet& other);
  // Everything in [0, kMaxCodepoint] not in the set (surrogates excluded).
  CodepointSet complement() const;
  const std::vector<std::pair<uint32_t, uint32_t>>& ranges() const { return ranges_; }
  bool empty() const { return ranges_.empty(); }

 private:
  std::vector<std::pair<uint32_t, uint32_t>> ranges_;
};

inline bool is_surrogate(uint32_t codepoint) { return codepoint >= 0xD800 && codepoint <= 0xDFFF; }

// The UTF-8 encoding of one code point (no surrogates).
std::string encode_utf8(uint32_t codepoint);

// The code point whose UTF-8 encoding starts at text[offset] (offset < text.size()),
// advancing offset past it; nullopt for anything but well-formed UTF-8 (a stray or
// truncated sequence, a bad continuation byte, an overlong form, a surrogate, past U+10FFFF).
std::optional<uint32_t> decode_utf8(std::string_view text, size_t& offset);

// Byte-class sequences whose union is exactly the UTF-8 encodings of the set
// (surrogates never included). Each sequence is 1 to 4 classes long.
std::vector<std::vector<ByteClass>> utf8_sequences(const CodepointSet& set);

// A rule matching one code point of `set`.
Symbol codepoint_set_symbol(GrammarBuilder& builder, const CodepointSet& set, const std::string& name);

}  // namespace loom::grammar
