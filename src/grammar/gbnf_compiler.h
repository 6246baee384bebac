// GBNF (llama.cpp's grammar format, as its users write it) into a Grammar.
//
//   # comment
//   root   ::= object
//   object ::= "{" ws ( pair ( "," ws pair )* )? "}"
//   pair   ::= string ":" ws value
//   digit  ::= [0-9]   name ::= [^"\\\x00-\x1f]+   any ::= .
//
// Rules: `name ::= alternatives`, a rule runs until the next `name ::=`.
// Elements: "literals" and [classes] (with ^, ranges and the escapes \n \r \t
// \\ \" \] \- \xHH \uHHHH \UHHHHHHHH), `.` (any character), rule names, ( groups ),
// postfix * + ? {m} {m,} {m,n}. The start rule is `root`. Rules may recurse,
// but not left-recursively (Error(kInvalidArgument) naming the rule, as for
// references to undefined rules); syntax errors name the line.
#pragma once

#include <string_view>

#include "grammar/grammar.h"

namespace loom::grammar {

Grammar gbnf_grammar(std::string_view text, GrammarLimits limits = {});

}  // namespace loom::grammar
