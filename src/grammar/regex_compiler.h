// Regular expressions (a practical subset, anchored at both ends) into grammar rules.
//
// Supported: literals, escapes (\d \w \s \D \W \S \n \r \t \f \v \0 \xHH
// \uHHHH and escaped punctuation), classes [a-z] [^...] with those escapes,
// `.` (any character but newline), groups ( ), (?: ), (?P<name> ) and
// (?<name> ), alternation |, quantifiers ? * + {m} {m,} {m,n} (a lazy `?` or
// possessive `+` after them changes nothing: the language is the same), and
// ^ / $ at the very start / end (matching is anchored anyway).
// Anything else (backreferences, lookaround, \b, inline flags, anchors inside)
// throws Error(kUnsupported) naming the construct and its offset.
#pragma once

#include <string>
#include <string_view>

#include "grammar/grammar.h"

namespace loom::grammar {

struct RegexOptions {
  // Inside a JSON string (schema "pattern"): `"` and `\` come out escaped (\" \\),
  // classes and `.` leave out `"`, `\` and control characters.
  bool json_string = false;
  int32_t max_nesting = 100;  // group depth
  // >= 0: an unbounded quantifier (x*, x+, x{m,}) repeats at most this many times more than its
  // minimum, so that the language is a finite subset of the pattern's (a length bound beside it).
  int64_t open_repeat_cap = -1;
};

// A rule matching exactly the strings of `pattern`.
Symbol compile_regex(GrammarBuilder& builder, std::string_view pattern, const RegexOptions& options = {});

// The most characters a string of `pattern` has under `options` (an escape such as \" counts
// one, as the JSON string's decoded length does), or -1 when unbounded. Builds nothing; throws
// as compile_regex does for a pattern it does not support.
int64_t regex_max_length(std::string_view pattern, const RegexOptions& options = {});

// A whole grammar for `pattern`.
Grammar regex_grammar(std::string_view pattern, GrammarLimits limits = {});

}  // namespace loom::grammar
