#include "template/jinja_lexer.h"

#include <cctype>

#include "util/error.h"

namespace loom::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

std::string normalize_newlines(std::string_view source, bool keep_trailing_newline) {
  std::string text;
  text.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      text += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      text += source[i];
    }
  }
  if (!keep_trailing_newline && !text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

void append_utf8(std::string& out, uint32_t code_point) {
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xc0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3f));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xe0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (code_point & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (code_point & 0x3f));
  }
}

class Lexer {
 public:
  Lexer(std::string_view source, const LexOptions& options)
      : source_(normalize_newlines(source, options.keep_trailing_newline)), options_(options) {}

  std::vector<Token> run() {
    bool line_starting = true;  // the text so far ends at a line start (lstrip_blocks)
    while (pos_ < source_.size()) {
      size_t start = find_tag_start(pos_);
      std::string text = source_.substr(pos_, start - pos_);
      int text_line = line_;
      advance_to(start);
      if (start == source_.size()) {
        emit_text(std::move(text), text_line);
        break;
      }
      char kind = source_[start + 1];  // '{', '%' or '#'
      char left = source_[start + 2];
      if (left == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (options_.lstrip_blocks && kind != '{' && left != '+') {
        size_t line_begin = text.rfind('\n');
        line_begin = line_begin == std::string::npos ? 0 : line_begin + 1;
        if ((line_begin > 0 || line_starting) &&
            text.find_first_not_of(" \t\f\v\r", line_begin) == std::string::npos)
          text.resize(line_begin);
      }
      emit_text(std::move(text), text_line);
      size_t inner = start + 2 + ((left == '-' || (left == '+' && kind != '{')) ? 1 : 0);
      char right = 0;
      if (kind == '#') {
        size_t end = source_.find("#}", inner);
        if (end == std::string::npos) fail_here("missing end of comment tag");
        right = end > inner && source_[end - 1] == '-' ? '-' : (end > inner && source_[end - 1] == '+' ? '+' : 0);
        advance_to(end + 2);
      } else if (kind == '%' && try_raw(inner)) {
        right = raw_right_;
      } else {
        right = lex_tag(kind, inner);
      }
      if (right == '-') {
        size_t end = pos_;
        while (end < source_.size() && is_space(source_[end])) ++end;
        advance_to(end);
      } else if (kind != '{' && right != '+' && options_.trim_blocks && pos_ < source_.size() &&
                 source_[pos_] == '\n') {
        advance_to(pos_ + 1);
      }
      line_starting = pos_ > 0 && source_[pos_ - 1] == '\n';
    }
    tokens_.push_back({Token::Kind::kEnd, "", line_});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail_here(const std::string& message) {
    fail(ErrorKind::kInvalidArgument, "template line {}: {}", line_, message);
  }

  void advance_to(size_t target) {
    for (; pos_ < target; ++pos_)
      if (source_[pos_] == '\n') ++line_;
  }

  size_t find_tag_start(size_t from) const {
    for (size_t i = from; i + 1 < source_.size(); ++i)
      if (source_[i] == '{' && (source_[i + 1] == '{' || source_[i + 1] == '%' || source_[i + 1] == '#')) return i;
    return source_.size();
  }

  void emit_text(std::string text, int line) {
    if (!text.empty()) tokens_.push_back({Token::Kind::kText, std::move(text), line});
  }

  size_t skip_spaces(size_t at) const {
    while (at < source_.size() && is_space(source_[at])) ++at;
    return at;
  }

  // "{% raw %}...{% endraw %}" at `inner` (just after "{%" and its modifier):
  // emits the body as text and returns true, leaving pos_ after the end tag.
  bool try_raw(size_t inner) {
    size_t at = skip_spaces(inner);
    if (source_.compare(at, 3, "raw") != 0 || (at + 3 < source_.size() && is_name_char(source_[at + 3])))
      return false;
    at = skip_spaces(at + 3);
    bool strip_after_begin = false;
    if (source_.compare(at, 3, "-%}") == 0) {
      strip_after_begin = true;
      at += 3;
    } else if (source_.compare(at, 2, "%}") == 0) {
      at += 2;
    } else {
      return false;
    }
    if (strip_after_begin) at = skip_spaces(at);
    for (size_t search = at;; ++search) {
      search = source_.find("{%", search);
      if (search == std::string::npos) fail_here("missing {% endraw %}");
      size_t cursor = search + 2;
      bool strip_before_end = cursor < source_.size() && source_[cursor] == '-';
      if (cursor < source_.size() && (source_[cursor] == '-' || source_[cursor] == '+')) ++cursor;
      cursor = skip_spaces(cursor);
      if (source_.compare(cursor, 6, "endraw") != 0) continue;
      cursor = skip_spaces(cursor + 6);
      raw_right_ = 0;
      if (cursor < source_.size() && (source_[cursor] == '-' || source_[cursor] == '+')) raw_right_ = source_[cursor++];
      if (source_.compare(cursor, 2, "%}") != 0) continue;
      std::string body = source_.substr(at, search - at);
      if (strip_before_end)
        while (!body.empty() && is_space(body.back())) body.pop_back();
      advance_to(at);
      emit_text(std::move(body), line_);
      advance_to(cursor + 2);
      return true;
    }
  }

  // Lexes the inside of a "{{" or "{%" tag from `at`; returns the right
  // modifier ('-', '+' or 0) of its end delimiter and leaves pos_ after it.
  char lex_tag(char kind, size_t at) {
    Token::Kind begin = kind == '{' ? Token::Kind::kVariableBegin : Token::Kind::kBlockBegin;
    Token::Kind end = kind == '{' ? Token::Kind::kVariableEnd : Token::Kind::kBlockEnd;
    std::string_view end_delimiter = kind == '{' ? "}}" : "%}";
    tokens_.push_back({begin, "", line_});
    advance_to(at);
    int depth = 0;  // open brackets: "}}" inside a dict literal does not end the tag
    while (true) {
      advance_to(skip_spaces(pos_));
      if (pos_ >= source_.size()) fail_here(kind == '{' ? "missing '}}'" : "missing '%}'");
      if (depth == 0) {
        for (char modifier : {'-', '+'}) {
          if (modifier == '+' && kind == '{') continue;
          if (source_[pos_] == modifier && source_.compare(pos_ + 1, 2, end_delimiter) == 0) {
            tokens_.push_back({end, "", line_});
            advance_to(pos_ + 3);
            return modifier;
          }
        }
        if (source_.compare(pos_, 2, end_delimiter) == 0) {
          tokens_.push_back({end, "", line_});
          advance_to(pos_ + 2);
          return 0;
        }
      }
      lex_token(depth);
    }
  }

  void lex_token(int& depth) {
    char c = source_[pos_];
    size_t start = pos_;
    if (is_name_start(c)) {
      while (pos_ < source_.size() && is_name_char(source_[pos_])) ++pos_;
      tokens_.push_back({Token::Kind::kName, source_.substr(start, pos_ - start), line_});
      return;
    }
    bool after_dot = !tokens_.empty() && tokens_.back().kind == Token::Kind::kOperator && tokens_.back().value == ".";
    if (std::isdigit(static_cast<unsigned char>(c))) {
      lex_number(after_dot);
      return;
    }
    if (c == '\'' || c == '"') {
      lex_string(c);
      return;
    }
    static const char* const kOperators[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                             ">", "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
    for (const char* op : kOperators) {
      std::string_view text(op);
      if (source_.compare(pos_, text.size(), text) != 0) continue;
      if (text == "(" || text == "[" || text == "{") ++depth;
      if (text == ")" || text == "]" || text == "}") {
        if (depth == 0) fail_here(std::string("unexpected '") + op + "'");
        --depth;
      }
      tokens_.push_back({Token::Kind::kOperator, std::string(text), line_});
      pos_ += text.size();
      return;
    }
    fail_here(std::string("unexpected character '") + c + "'");
  }

  void lex_number(bool after_dot) {
    size_t start = pos_;
    auto digits = [&] {
      while (pos_ < source_.size() && (std::isdigit(static_cast<unsigned char>(source_[pos_])) || source_[pos_] == '_'))
        ++pos_;
    };
    digits();
    bool is_float = false;
    // "items.0.1" is two subscripts, not the float 0.1.
    if (!after_dot && pos_ + 1 < source_.size() && source_[pos_] == '.' &&
        std::isdigit(static_cast<unsigned char>(source_[pos_ + 1]))) {
      is_float = true;
      ++pos_;
      digits();
    }
    if (!after_dot && pos_ < source_.size() && (source_[pos_] == 'e' || source_[pos_] == 'E')) {
      size_t exponent = pos_ + 1;
      if (exponent < source_.size() && (source_[exponent] == '+' || source_[exponent] == '-')) ++exponent;
      if (exponent < source_.size() && std::isdigit(static_cast<unsigned char>(source_[exponent]))) {
        is_float = true;
        pos_ = exponent;
        digits();
      }
    }
    std::string text;
    for (size_t i = start; i < pos_; ++i)
      if (source_[i] != '_') text += source_[i];
    tokens_.push_back({is_float ? Token::Kind::kFloat : Token::Kind::kInteger, text, line_});
  }

  void lex_string(char quote) {
    int line = line_;
    std::string value;
    size_t at = pos_ + 1;
    while (true) {
      if (at >= source_.size()) fail_here("unterminated string");
      char c = source_[at];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++at;
        continue;
      }
      if (at + 1 >= source_.size()) fail_here("unterminated string");
      char escaped = source_[at + 1];
      at += 2;
      switch (escaped) {
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case '0': value += '\0'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case '\n': break;  // a backslash-newline continues the string
        case 'x':
        case 'u':
        case 'U': {
          size_t length = escaped == 'x' ? 2 : escaped == 'u' ? 4 : 8;
          if (at + length > source_.size()) fail_here("truncated escape in string");
          std::string hex = source_.substr(at, length);
          if (hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) fail_here("bad escape in string");
          append_utf8(value, static_cast<uint32_t>(std::stoul(hex, nullptr, 16)));
          at += length;
          break;
        }
        default: value += '\\'; value += escaped;  // Python keeps unknown escapes
      }
    }
    tokens_.push_back({Token::Kind::kString, std::move(value), line});
    advance_to(at + 1);
  }

  std::string source_;
  LexOptions options_;
  size_t pos_ = 0;
  int line_ = 1;
  char raw_right_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexOptions& options) {
  return Lexer(source, options).run();
}

}  // namespace loom::jinja
