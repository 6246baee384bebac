// Jinja lexer (internal to src/template): source text -> tokens.
//
// Whitespace control is applied here, as jinja2's lexer does: "{%-" / "{{-" /
// "{#-" strip the whitespace before a tag, "-%}" / "-}}" / "-#}" the whitespace
// after it; trim_blocks drops the first newline after a block or comment tag,
// lstrip_blocks the spaces and tabs between a line's start and a block or
// comment tag; "+%}" and "{%+" switch those two off for one tag. Comments
// become nothing; {% raw %}...{% endraw %} becomes one text token. Newlines are
// normalised to "\n", and one trailing newline is dropped unless
// keep_trailing_newline is set.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace loom::jinja {

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

struct Token {
  enum class Kind {
    kText,           // raw template text (value: the text)
    kVariableBegin,  // "{{"
    kVariableEnd,    // "}}"
    kBlockBegin,     // "{%"
    kBlockEnd,       // "%}"
    kName,           // identifier or keyword
    kString,         // literal, escapes resolved (value: the string)
    kInteger,        // value: the digits (underscores removed)
    kFloat,
    kOperator,       // value: "+", "//", "==", "(", ...
    kEnd,            // end of the source; always the last token
  };
  Kind kind;
  std::string value;
  int line;  // 1-based line of the token's first character
};

// Throws Error(kInvalidArgument, "template line N: ...") on an unterminated
// tag, comment or string, or a character that starts no token.
std::vector<Token> tokenize(std::string_view source, const LexOptions& options);

}  // namespace loom::jinja
