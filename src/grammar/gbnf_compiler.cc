#include "grammar/gbnf_compiler.h"

#include <algorithm>
#include <map>

#include "grammar/utf8_ranges.h"
#include "util/error.h"

namespace loom::grammar {
namespace {

constexpr int32_t kMaxNesting = 100;

bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; }

class GbnfParser {
 public:
  GbnfParser(GrammarBuilder& builder, std::string_view text) : builder_(builder), text_(text) {}

  Grammar parse() {
    skip_space(true);
    while (offset_ < text_.size()) {
      const std::string name = parse_name();
      skip_space(true);
      if (text_.substr(offset_, 3) != "::=") error("expected '::=' after the rule name '" + name + "'");
      offset_ += 3;
      const int32_t rule = rule_id(name);
      if (defined_.contains(name)) error("the rule '" + name + "' is defined twice");
      defined_.emplace(name, true);
      for (const Sequence& option : parse_alternatives(0)) builder_.add_alternative(rule, option);
      skip_space(true);
    }
    for (const auto& [name, id] : rules_)
      if (!defined_.contains(name)) fail(ErrorKind::kInvalidArgument, "grammar: the rule '{}' is used but never defined", name);
    const auto root = rules_.find("root");
    if (root == rules_.end()) fail(ErrorKind::kInvalidArgument, "grammar: no 'root' rule");
    return builder_.build(root->second);
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    const auto line = 1 + std::count(text_.begin(), text_.begin() + static_cast<ptrdiff_t>(std::min(offset_, text_.size())), '\n');
    fail(ErrorKind::kInvalidArgument, "grammar: {} on line {}", what, line);
  }

  // Blanks and comments; newlines only when `newlines` (inside a rule they end
  // nothing by themselves: the next `name ::=` does).
  void skip_space(bool newlines) {
    while (offset_ < text_.size()) {
      const char c = text_[offset_];
      if (c == '#') {
        while (offset_ < text_.size() && text_[offset_] != '\n') ++offset_;
      } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++offset_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t start = offset_;
    while (offset_ < text_.size() && is_name_char(text_[offset_])) ++offset_;
    if (offset_ == start) error("expected a rule name");
    return std::string(text_.substr(start, offset_ - start));
  }

  int32_t rule_id(const std::string& name) {
    if (const auto it = rules_.find(name); it != rules_.end()) return it->second;
    const int32_t id = builder_.declare_rule(name);
    rules_.emplace(name, id);
    return id;
  }

  // Is a `name ::=` next (the start of the following rule)?
  bool at_rule_start() const {
    size_t i = offset_;
    while (i < text_.size() && is_name_char(text_[i])) ++i;
    if (i == offset_) return false;
    while (i < text_.size() && (text_[i] == ' ' || text_[i] == '\t' || text_[i] == '\r' || text_[i] == '\n')) ++i;
    return text_.substr(i, 3) == "::=";
  }

  uint32_t parse_hex(size_t digits) {
    uint32_t value = 0;
    for (size_t i = 0; i < digits; ++i) {
      if (offset_ >= text_.size() || !std::isxdigit(static_cast<unsigned char>(text_[offset_]))) error("a malformed hex escape");
      const char c = text_[offset_++];
      value = value * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    if (value > kMaxCodepoint) error("a code point beyond U+10FFFF");
    if (is_surrogate(value)) error("a surrogate code point (U+D800 to U+DFFF)");
    return value;
  }

  uint32_t parse_char() {
    if (offset_ >= text_.size()) error("unexpected end of the grammar");
    const auto lead = static_cast<uint8_t>(text_[offset_++]);
    if (lead == '\\') {
      if (offset_ >= text_.size()) error("a trailing backslash");
      const char c = text_[offset_++];
      switch (c) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case 'x': return parse_hex(2);
        case 'u': return parse_hex(4);
        case 'U': return parse_hex(8);
        case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': case '/': case '.': return static_cast<uint8_t>(c);
        default: error(std::string("the escape \\") + c + " is not supported");
      }
    }
    if (lead < 0x80) return lead;
    --offset_;
    const std::optional<uint32_t> cp = decode_utf8(text_, offset_);
    if (!cp) error("invalid UTF-8");
    return *cp;
  }

  Sequence set_sequence(const CodepointSet& set) {
    if (set.empty()) error("a character class that matches nothing");
    if (set.ranges().size() == 1 && set.ranges()[0].first == set.ranges()[0].second)
      return builder_.literal(encode_utf8(set.ranges()[0].first));
    return {codepoint_set_symbol(builder_, set, "class")};
  }

  std::vector<Sequence> parse_alternatives(int32_t depth) {
    if (depth > kMaxNesting) error("groups nested too deeply");
    std::vector<Sequence> options{parse_sequence(depth)};
    while (offset_ < text_.size() && text_[offset_] == '|') {
      ++offset_;
      options.push_back(parse_sequence(depth));
    }
    return options;
  }

  Sequence parse_sequence(int32_t depth) {
    Sequence sequence;
    while (true) {
      skip_space(true);
      if (offset_ >= text_.size() || text_[offset_] == '|' || text_[offset_] == ')') break;
      if (depth == 0 && at_rule_start()) break;
      Sequence item = parse_item(depth);
      item = parse_postfix(std::move(item));
      sequence.insert(sequence.end(), item.begin(), item.end());
    }
    return sequence;
  }

  int64_t parse_number() {
    const size_t start = offset_;
    int64_t value = 0;
    while (offset_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[offset_]))) {
      value = value * 10 + (text_[offset_++] - '0');
      if (value > 1'000'000) error("a repetition bound this large");
    }
    if (offset_ == start) error("a malformed {m,n}");
    return value;
  }

  Sequence parse_postfix(Sequence item) {
    while (offset_ < text_.size()) {
      const char c = text_[offset_];
      int64_t min = 0, max = -1;
      if (c == '*') {
      } else if (c == '+') {
        min = 1;
      } else if (c == '?') {
        max = 1;
      } else if (c == '{') {
        ++offset_;
        skip_space(false);
        min = max = parse_number();
        skip_space(false);
        if (offset_ < text_.size() && text_[offset_] == ',') {
          ++offset_;
          skip_space(false);
          max = (offset_ < text_.size() && text_[offset_] == '}') ? -1 : parse_number();
          skip_space(false);
        }
        if (offset_ >= text_.size() || text_[offset_] != '}') error("a malformed {m,n}");
        if (max >= 0 && max < min) error("a {m,n} with n < m");
      } else {
        break;
      }
      ++offset_;
      item = builder_.repeat(item, min, max, "repetition");
    }
    return item;
  }

  Sequence parse_item(int32_t depth) {
    const char c = text_[offset_];
    if (c == '"') {
      ++offset_;
      Sequence sequence;
      while (true) {
        if (offset_ >= text_.size()) error("an unterminated string literal");
        if (text_[offset_] == '"') {
          ++offset_;
          break;
        }
        const Sequence piece = builder_.literal(encode_utf8(parse_char()));
        sequence.insert(sequence.end(), piece.begin(), piece.end());
      }
      return sequence.empty() ? Sequence{builder_.alternatives({{}}, "empty")} : sequence;
    }
    if (c == '[') {
      ++offset_;
      bool negated = false;
      if (offset_ < text_.size() && text_[offset_] == '^') {
        negated = true;
        ++offset_;
      }
      CodepointSet set;
      while (true) {
        if (offset_ >= text_.size()) error("an unterminated character class");
        if (text_[offset_] == ']') {
          ++offset_;
          break;
        }
        const uint32_t low = parse_char();
        uint32_t high = low;
        if (offset_ + 1 < text_.size() && text_[offset_] == '-' && text_[offset_ + 1] != ']') {
          ++offset_;
          high = parse_char();
          if (high < low) error("a reversed range in a character class");
        }
        set.add(low, high);
      }
      return set_sequence(negated ? set.complement() : set);
    }
    if (c == '.') {
      ++offset_;
      CodepointSet any;
      any.add(0, kMaxCodepoint);
      return set_sequence(any);
    }
    if (c == '(') {
      ++offset_;
      std::vector<Sequence> options = parse_alternatives(depth + 1);
      skip_space(true);
      if (offset_ >= text_.size() || text_[offset_] != ')') error("an unclosed '('");
      ++offset_;
      return {builder_.alternatives(options, "group")};
    }
    if (is_name_char(c)) return {GrammarBuilder::rule(rule_id(parse_name()))};
    error(std::string("unexpected '") + c + "'");
  }

  GrammarBuilder& builder_;
  std::string_view text_;
  size_t offset_ = 0;
  std::map<std::string, int32_t> rules_;
  std::map<std::string, bool> defined_;
};

}  // namespace

Grammar gbnf_grammar(std::string_view text, GrammarLimits limits) {
  GrammarBuilder builder(limits);
  return GbnfParser(builder, text).parse();
}

}  // namespace loom::grammar
