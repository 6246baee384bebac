#include "grammar/utf8_ranges.h"

#include <algorithm>

namespace loom::grammar {

void CodepointSet::add(uint32_t first, uint32_t last) {
  if (first > last) return;
  last = std::min(last, kMaxCodepoint);
  ranges_.emplace_back(first, last);
  std::sort(ranges_.begin(), ranges_.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (const auto& range : ranges_) {
    if (!merged.empty() && range.first <= merged.back().second + 1)
      merged.back().second = std::max(merged.back().second, range.second);
    else
      merged.push_back(range);
  }
  ranges_ = std::move(merged);
}

void CodepointSet::add(const CodepointSet& other) {
  for (const auto& [first, last] : other.ranges_) add(first, last);
}

CodepointSet CodepointSet::complement() const {
  CodepointSet result;
  uint32_t next = 0;
  for (const auto& [first, last] : ranges_) {
    if (first > next) result.add(next, first - 1);
    next = last + 1;
  }
  if (next <= kMaxCodepoint) result.add(next, kMaxCodepoint);
  return result;
}

std::string encode_utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

std::optional<uint32_t> decode_utf8(std::string_view text, size_t& offset) {
  static constexpr uint32_t kShortestOfLength[] = {0, 0x80, 0x800, 0x10000};
  const auto lead = static_cast<uint8_t>(text[offset++]);
  if (lead < 0x80) return lead;
  const size_t extra = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0;
  if (extra == 0 || text.size() - offset < extra) return std::nullopt;
  uint32_t cp = lead & (0x3Fu >> extra);
  for (size_t i = 0; i < extra; ++i) {
    const auto byte = static_cast<uint8_t>(text[offset++]);
    if ((byte & 0xC0) != 0x80) return std::nullopt;
    cp = (cp << 6) | (byte & 0x3F);
  }
  if (cp < kShortestOfLength[extra] || cp > kMaxCodepoint || is_surrogate(cp)) return std::nullopt;
  return cp;
}

namespace {

size_t encoded_length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

// [first, last] with both ends of one encoded length: split until every byte
// position spans a contiguous range independently (the classic UTF-8 range
// compilation, as regex engines do it).
void split_same_length(uint32_t first, uint32_t last, std::vector<std::vector<ByteClass>>& out) {
  const size_t length = encoded_length(first);
  for (size_t i = 1; i < length; ++i) {
    const uint32_t mask = (uint32_t{1} << (6 * i)) - 1;
    if ((first & ~mask) != (last & ~mask)) {
      if ((first & mask) != 0) {
        split_same_length(first, first | mask, out);
        split_same_length((first | mask) + 1, last, out);
        return;
      }
      if ((last & mask) != mask) {
        split_same_length(first, (last & ~mask) - 1, out);
        split_same_length(last & ~mask, last, out);
        return;
      }
    }
  }
  const std::string a = encode_utf8(first), b = encode_utf8(last);
  std::vector<ByteClass> sequence;
  for (size_t k = 0; k < a.size(); ++k)
    sequence.push_back(ByteClass::range(static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k])));
  out.push_back(std::move(sequence));
}

}  // namespace

std::vector<std::vector<ByteClass>> utf8_sequences(const CodepointSet& set) {
  std::vector<std::vector<ByteClass>> out;
  static constexpr uint32_t kLengthEnds[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodepoint};
  for (auto [first, last] : set.ranges()) {
    // Surrogates have no UTF-8 encoding: cut them out.
    std::vector<std::pair<uint32_t, uint32_t>> pieces;
    if (first < 0xD800 && last > 0xDFFF) {
      pieces = {{first, 0xD7FF}, {0xE000, last}};
    } else if (first >= 0xD800 && last <= 0xDFFF) {
      continue;
    } else if (first >= 0xD800 && first <= 0xDFFF) {
      pieces = {{0xE000, last}};
    } else if (last >= 0xD800 && last <= 0xDFFF) {
      pieces = {{first, 0xD7FF}};
    } else {
      pieces = {{first, last}};
    }
    for (auto [a, b] : pieces) {
      uint32_t lower = 0;
      for (uint32_t end : kLengthEnds) {
        const uint32_t from = std::max(a, lower), to = std::min(b, end);
        if (from <= to) split_same_length(from, to, out);
        lower = end + 1;
      }
    }
  }
  // One single-byte class for all the ASCII pieces keeps the grammar small.
  ByteClass ascii;
  std::vector<std::vector<ByteClass>> merged;
  for (auto& sequence : out) {
    if (sequence.size() == 1) {
      for (int w = 0; w < 4; ++w) ascii.bits[static_cast<size_t>(w)] |= sequence[0].bits[static_cast<size_t>(w)];
    } else {
      merged.push_back(std::move(sequence));
    }
  }
  if (!ascii.empty()) merged.insert(merged.begin(), {ascii});
  return merged;
}

Symbol codepoint_set_symbol(GrammarBuilder& builder, const CodepointSet& set, const std::string& name) {
  std::vector<Sequence> options;
  for (const auto& classes : utf8_sequences(set)) {
    Sequence sequence;
    for (const ByteClass& c : classes) sequence.push_back(builder.byte_class(c));
    options.push_back(std::move(sequence));
  }
  return builder.alternatives(options, name);
}

}  // namespace loom::grammar
