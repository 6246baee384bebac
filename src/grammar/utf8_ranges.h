// Sets of Unicode code points and their spelling as UTF-8 byte sequences, for
// character classes ([^"\\], \w, [α-ω]) in a byte-level grammar.
#pragma once

#include <cstdint>
#include <string>
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

// The UTF-8 encoding of one code point (no surrogates).
std::string encode_utf8(uint32_t codepoint);

// Byte-class sequences whose union is exactly the UTF-8 encodings of the set
// (surrogates never included). Each sequence is 1 to 4 classes long.
std::vector<std::vector<ByteClass>> utf8_sequences(const CodepointSet& set);

// A rule matching one code point of `set`.
Symbol codepoint_set_symbol(GrammarBuilder& builder, const CodepointSet& set, const std::string& name);

}  // namespace loom::grammar
