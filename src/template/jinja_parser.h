// Jinja parser (internal to src/template): tokens -> AST.
//
// Recursive descent with jinja2's precedence, lowest first: "x if c else y",
// or, and, not, comparisons (==, !=, <, <=, >, >=, in, not in; chained),
// + and -, ~, * / // %, **, unary - and +, then postfix (.name, [index],
// [slice], (call)) and "| filter" / "is test".
#pragma once

#include <vector>

#include "template/jinja_ast.h"
#include "template/jinja_lexer.h"

namespace loom::jinja {

// Throws Error(kInvalidArgument, "template line N: ...") on a syntax error
// (unknown tag, unclosed block, unexpected token, expressions nested too deep).
Body parse(const std::vector<Token>& tokens);

}  // namespace loom::jinja
