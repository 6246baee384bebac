#include "grammar/regex_compiler.h"

#include <algorithm>
#include <vector>

#include "grammar/utf8_ranges.h"
#include "util/error.h"

namespace loom::grammar {
namespace {

CodepointSet digit_set() {
  CodepointSet set;
  set.add('0', '9');
  return set;
}
CodepointSet word_set() {
  CodepointSet set;
  set.add('0', '9');
  set.add('A', 'Z');
  set.add('a', 'z');
  set.add('_', '_');
  return set;
}
CodepointSet space_set() {
  CodepointSet set;
  set.add('\t', '\r');  // \t \n \v \f \r
  set.add(' ', ' ');
  return set;
}

constexpr int64_t kUnbounded = -1;

// Lengths in characters (an escape such as \" is one): the sum, the product, kUnbounded absorbing.
int64_t add_lengths(int64_t a, int64_t b) { return a == kUnbounded || b == kUnbounded ? kUnbounded : a + b; }
int64_t times(int64_t count, int64_t length) {
  if (length == 0 || count == 0) return 0;
  return count == kUnbounded || length == kUnbounded ? kUnbounded : count * length;
}

// A parsed piece: its grammar symbols (none when only measuring) and its longest string.
struct Piece {
  Sequence sequence;
  int64_t max_length = 0;
};

// Parses the pattern into `builder`'s rules, or, with no builder, only measures it.
class RegexParser {
 public:
  RegexParser(GrammarBuilder* builder, std::string_view pattern, const RegexOptions& options)
      : builder_(builder), pattern_(pattern), options_(options) {}

  Symbol parse() {
    if (at('^')) ++offset_;
    std::vector<Piece> options = parse_alternation(0);
    if (offset_ < pattern_.size()) unsupported(pattern_[offset_] == ')' ? "an unbalanced ')'" : "this construct");
    max_length_ = 0;
    for (const Piece& option : options) max_length_ = longest(max_length_, option.max_length);
    return builder_ ? builder_->alternatives(sequences(options), "regex") : Symbol{};
  }
  int64_t max_length() const { return max_length_; }

 private:
  static int64_t longest(int64_t a, int64_t b) { return a == kUnbounded || b == kUnbounded ? kUnbounded : std::max(a, b); }
  static std::vector<Sequence> sequences(const std::vector<Piece>& pieces) {
    std::vector<Sequence> out;
    for (const Piece& piece : pieces) out.push_back(piece.sequence);
    return out;
  }

  [[noreturn]] void unsupported(const std::string& what) const {
    fail(ErrorKind::kUnsupported, "regex: {} at offset {} is not supported", what, offset_);
  }
  bool at(char c) const { return offset_ < pattern_.size() && pattern_[offset_] == c; }
  bool at_end_anchor() const { return at('$') && offset_ + 1 == pattern_.size(); }

  // One code point of the pattern (UTF-8).
  uint32_t next_codepoint() {
    const size_t start = offset_;
    const std::optional<uint32_t> cp = decode_utf8(pattern_, offset_);
    if (!cp) {
      offset_ = start;
      unsupported("invalid UTF-8");
    }
    return *cp;
  }

  uint32_t parse_hex(size_t digits) {
    uint32_t value = 0;
    for (size_t i = 0; i < digits; ++i) {
      if (offset_ >= pattern_.size() || !std::isxdigit(static_cast<unsigned char>(pattern_[offset_])))
        unsupported("a malformed hex escape");
      const char c = pattern_[offset_++];
      value = value * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return value;
  }

  // After "\u": four hex digits, or a surrogate pair (\uD83D\uDE00 is U+1F600, as JSON spells it).
  uint32_t parse_utf16_escape() {
    const uint32_t unit = parse_hex(4);
    if (unit >= 0xD800 && unit <= 0xDBFF && pattern_.substr(offset_, 2) == "\\u") {
      const size_t low_start = offset_;
      offset_ += 2;
      const uint32_t low = parse_hex(4);
      if (low >= 0xDC00 && low <= 0xDFFF) return 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
      offset_ = low_start;
    }
    if (is_surrogate(unit)) unsupported("a lone surrogate \\u escape");
    return unit;
  }

  // After a backslash: a set (\d...) or one code point.
  CodepointSet parse_escape(bool in_class) {
    if (offset_ >= pattern_.size()) unsupported("a trailing backslash");
    const char c = pattern_[offset_++];
    CodepointSet set;
    switch (c) {
      case 'd': return digit_set();
      case 'D': return digit_set().complement();
      case 'w': return word_set();
      case 'W': return word_set().complement();
      case 's': return space_set();
      case 'S': return space_set().complement();
      case 'n': set.add('\n', '\n'); return set;
      case 'r': set.add('\r', '\r'); return set;
      case 't': set.add('\t', '\t'); return set;
      case 'f': set.add('\f', '\f'); return set;
      case 'v': set.add('\v', '\v'); return set;
      case '0': set.add(0, 0); return set;
      case 'x': { const uint32_t cp = parse_hex(2); set.add(cp, cp); return set; }
      case 'u': { const uint32_t cp = parse_utf16_escape(); set.add(cp, cp); return set; }
      case 'b': if (in_class) { set.add('\b', '\b'); return set; } unsupported("the word boundary \\b");
      case 'B': unsupported("\\B");
      case 'A': case 'z': case 'Z': unsupported(fmt::format("the anchor \\{}", c));
      default:
        if (std::isdigit(static_cast<unsigned char>(c))) unsupported("a backreference");
        if (std::isalnum(static_cast<unsigned char>(c))) unsupported(fmt::format("the escape \\{}", c));
        set.add(static_cast<uint8_t>(c), static_cast<uint8_t>(c));
        return set;
    }
  }

  CodepointSet parse_class() {  // after '['
    bool negated = false;
    if (at('^')) {
      negated = true;
      ++offset_;
    }
    CodepointSet set;
    bool first = true;
    while (true) {
      if (offset_ >= pattern_.size()) unsupported("an unterminated '['");
      if (at(']') && !first) {
        ++offset_;
        break;
      }
      first = false;
      if (at('[') && offset_ + 1 < pattern_.size() && pattern_[offset_ + 1] == ':') unsupported("POSIX classes [:...:]");
      CodepointSet item;
      bool single = true;
      uint32_t low = 0;
      if (at('\\')) {
        ++offset_;
        item = parse_escape(true);
        single = item.ranges().size() == 1 && item.ranges()[0].first == item.ranges()[0].second;
        if (single) low = item.ranges()[0].first;
      } else {
        low = next_codepoint();
        item.add(low, low);
      }
      if (single && at('-') && offset_ + 1 < pattern_.size() && pattern_[offset_ + 1] != ']') {
        ++offset_;
        uint32_t high = 0;
        if (at('\\')) {
          ++offset_;
          const CodepointSet end = parse_escape(true);
          if (end.ranges().size() != 1 || end.ranges()[0].first != end.ranges()[0].second) unsupported("a class range ending in a set");
          high = end.ranges()[0].first;
        } else {
          high = next_codepoint();
        }
        if (high < low) unsupported("a reversed class range");
        item = CodepointSet();
        item.add(low, high);
      }
      set.add(item);
    }
    return negated ? set.complement() : set;
  }

  // A set as a piece of one character (JSON-string mode restricts it).
  Piece set_sequence(CodepointSet set) {
    if (options_.json_string) {
      CodepointSet unsafe;
      unsafe.add(0, 0x1F);
      unsafe.add('"', '"');
      unsafe.add('\\', '\\');
      CodepointSet allowed;
      const CodepointSet safe = unsafe.complement();
      for (const auto& [first, last] : safe.ranges()) allowed.add(first, last);
      CodepointSet restricted;  // set ∩ allowed
      for (const auto& [a1, b1] : set.ranges())
        for (const auto& [a2, b2] : allowed.ranges())
          if (std::max(a1, a2) <= std::min(b1, b2)) restricted.add(std::max(a1, a2), std::min(b1, b2));
      // A lone " or \ becomes its escape.
      if (set.ranges().size() == 1 && set.ranges()[0].first == set.ranges()[0].second &&
          (set.ranges()[0].first == '"' || set.ranges()[0].first == '\\')) {
        if (!builder_) return {{}, 1};
        return {builder_->literal(set.ranges()[0].first == '"' ? "\\\"" : "\\\\"), 1};
      }
      set = restricted;
      if (set.empty()) unsupported("a character class that only matches characters JSON must escape");
    }
    if (!builder_) return {{}, 1};
    if (set.ranges().size() == 1 && set.ranges()[0].first == set.ranges()[0].second)
      return {builder_->literal(encode_utf8(set.ranges()[0].first)), 1};
    return {{codepoint_set_symbol(*builder_, set, "regex class")}, 1};
  }

  std::vector<Piece> parse_alternation(int32_t depth) {
    if (depth > options_.max_nesting) unsupported(fmt::format("nesting deeper than {}", options_.max_nesting));
    std::vector<Piece> options{parse_concatenation(depth)};
    while (at('|')) {
      ++offset_;
      options.push_back(parse_concatenation(depth));
    }
    return options;
  }

  Piece parse_concatenation(int32_t depth) {
    Piece piece;
    while (offset_ < pattern_.size() && !at('|') && !at(')')) {
      if (at_end_anchor()) {
        ++offset_;
        break;
      }
      Piece item = parse_repetition(depth);
      piece.sequence.insert(piece.sequence.end(), item.sequence.begin(), item.sequence.end());
      piece.max_length = add_lengths(piece.max_length, item.max_length);
    }
    return piece;
  }

  int64_t parse_number() {
    int64_t value = 0;
    const size_t start = offset_;
    while (offset_ < pattern_.size() && std::isdigit(static_cast<unsigned char>(pattern_[offset_]))) {
      value = value * 10 + (pattern_[offset_++] - '0');
      if (value > 1'000'000) unsupported("a repetition bound this large");
    }
    if (offset_ == start) unsupported("a malformed {m,n}");
    return value;
  }

  Piece parse_repetition(int32_t depth) {
    Piece atom = parse_atom(depth);
    while (offset_ < pattern_.size()) {
      int64_t min = 0, max = -1;
      if (at('?')) {
        max = 1;
      } else if (at('*')) {
      } else if (at('+')) {
        min = 1;
      } else if (at('{')) {
        ++offset_;
        min = parse_number();
        max = min;
        if (at(',')) {
          ++offset_;
          max = at('}') ? -1 : parse_number();
        }
        if (!at('}')) unsupported("a malformed {m,n}");
        if (max >= 0 && max < min) unsupported("a {m,n} with n < m");
      } else {
        break;
      }
      ++offset_;
      if (at('?') || at('+')) ++offset_;  // lazy / possessive: same language
      if (max == kUnbounded && options_.open_repeat_cap >= 0) max = min + options_.open_repeat_cap;
      if (builder_) atom.sequence = builder_->repeat(atom.sequence, min, max, "regex repetition");
      atom.max_length = times(max, atom.max_length);
    }
    return atom;
  }

  Piece parse_atom(int32_t depth) {
    const char c = pattern_[offset_];
    switch (c) {
      case '(': {
        ++offset_;
        if (at('?')) {
          ++offset_;
          if (at(':')) {
            ++offset_;
          } else if (at('P') || at('<')) {
            if (at('P')) ++offset_;
            if (!at('<') || (offset_ + 1 < pattern_.size() && (pattern_[offset_ + 1] == '=' || pattern_[offset_ + 1] == '!')))
              unsupported("lookbehind or a named backreference");
            while (offset_ < pattern_.size() && !at('>')) ++offset_;
            if (!at('>')) unsupported("an unterminated group name");
            ++offset_;
          } else if (at('=') || at('!')) {
            unsupported("lookahead");
          } else {
            unsupported("this group syntax (inline flags, atomic groups, ...)");
          }
        }
        std::vector<Piece> options = parse_alternation(depth + 1);
        if (!at(')')) unsupported("an unclosed '('");
        ++offset_;
        if (options.size() == 1) return options[0];
        int64_t max_length = 0;
        for (const Piece& option : options) max_length = longest(max_length, option.max_length);
        if (!builder_) return {{}, max_length};
        return {{builder_->alternatives(sequences(options), "regex group")}, max_length};
      }
      case '[':
        ++offset_;
        return set_sequence(parse_class());
      case '.': {
        ++offset_;
        CodepointSet newline;
        newline.add('\n', '\n');
        return set_sequence(newline.complement());
      }
      case '\\':
        ++offset_;
        return set_sequence(parse_escape(false));
      case '^': unsupported("'^' inside the pattern");
      case '$': unsupported("'$' inside the pattern");
      case '*': case '+': case '?': case '{': unsupported(fmt::format("a quantifier '{}' with nothing before it", c));
      default: {
        CodepointSet set;
        const uint32_t cp = next_codepoint();
        set.add(cp, cp);
        return set_sequence(set);
      }
    }
  }

  GrammarBuilder* builder_;  // null: measuring only
  std::string_view pattern_;
  RegexOptions options_;
  size_t offset_ = 0;
  int64_t max_length_ = 0;
};

}  // namespace

Symbol compile_regex(GrammarBuilder& builder, std::string_view pattern, const RegexOptions& options) {
  return RegexParser(&builder, pattern, options).parse();
}

int64_t regex_max_length(std::string_view pattern, const RegexOptions& options) {
  RegexParser parser(nullptr, pattern, options);
  parser.parse();
  return parser.max_length();
}

Grammar regex_grammar(std::string_view pattern, GrammarLimits limits) {
  GrammarBuilder builder(limits);
  const Symbol symbol = compile_regex(builder, pattern);
  return builder.build(symbol.id);
}

}  // namespace loom::grammar
