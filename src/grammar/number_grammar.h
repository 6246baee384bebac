// Numeric bounds (minimum, maximum, exclusiveMinimum, exclusiveMaximum) as
// grammar rules over digit strings, for the JSON-schema compiler.
//
// Integers: exact. A range [lo, hi] is split by sign and by digit count, and
// each fixed-length range [x, y] by the first digit where x and y differ
// (x's digit then "at least x's rest", the digits strictly between then any
// digits, y's digit then "at most y's rest"): O(digits^2) rules. Output is
// canonical JSON: no leading zeros, no "-0".
//
// Numbers: sound, not complete. Every string produced is in range; produced
// are the integers in range, and decimals k.F (-k.F) only where the whole
// unit interval [k, k+1) ((-k-1, -k]) lies in range, with a non-zero
// fraction where k is an exclusive bound; no exponent notation. So with
// integer-valued bounds only the decimals of the last unit below a bound are
// missing (maximum 1 gives 0.5 and 1, not 1.0); a range without a whole
// unit, such as [0.25, 0.75], has no decimals.
#pragma once

#include <cstdint>
#include <optional>

#include "grammar/grammar.h"

namespace loom::grammar {

struct NumberBounds {
  std::optional<double> lo, hi;  // absent: unbounded on that side
  bool lo_exclusive = false;
  bool hi_exclusive = false;
};

// The integers within `bounds`. nullopt when a bound is beyond +-9e18 (not
// handled). Throws Error(kInvalidArgument) when no integer is in range.
std::optional<Symbol> bounded_integer(GrammarBuilder& builder, const NumberBounds& bounds);

// The numbers within `bounds`, as described above. nullopt as bounded_integer,
// and for a range that holds neither an integer nor a whole unit; throws
// Error(kInvalidArgument) for an empty range.
std::optional<Symbol> bounded_number(GrammarBuilder& builder, const NumberBounds& bounds);

}  // namespace loom::grammar
