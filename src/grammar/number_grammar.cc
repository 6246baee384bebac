#include "grammar/number_grammar.h"

#include <cmath>
#include <string>
#include <vector>

#include "util/error.h"

namespace loom::grammar {
namespace {

constexpr double kLargestBound = 9e18;  // well inside int64, so k +- 1 cannot overflow

class DigitRanges {
 public:
  explicit DigitRanges(GrammarBuilder& builder) : builder_(builder) {}

  Symbol digit() { return builder_.byte_class(ByteClass::range('0', '9')); }
  Sequence any_digits(size_t count) { return Sequence(count, digit()); }

  // Digit strings of s.size() digits that are >= s.
  Sequence at_least(std::string_view s) {
    if (s.empty()) return {};
    if (s.find_first_not_of('0') == std::string_view::npos) return any_digits(s.size());
    std::vector<Sequence> options{prefixed(s[0], at_least(s.substr(1)))};
    if (s[0] < '9') options.push_back(first_then_any(s[0] + 1, '9', s.size() - 1));
    return {builder_.alternatives(options, "digits >=")};
  }

  // Digit strings of s.size() digits that are <= s.
  Sequence at_most(std::string_view s) {
    if (s.empty()) return {};
    if (s.find_first_not_of('9') == std::string_view::npos) return any_digits(s.size());
    std::vector<Sequence> options{prefixed(s[0], at_most(s.substr(1)))};
    if (s[0] > '0') options.push_back(first_then_any('0', s[0] - 1, s.size() - 1));
    return {builder_.alternatives(options, "digits <=")};
  }

  // Digit strings of lo.size() digits in [lo, hi] (same length, lo <= hi).
  Sequence between(std::string_view lo, std::string_view hi) {
    if (lo.empty()) return {};
    if (lo[0] == hi[0]) return prefixed(lo[0], between(lo.substr(1), hi.substr(1)));
    std::vector<Sequence> options{prefixed(lo[0], at_least(lo.substr(1)))};
    if (hi[0] - lo[0] >= 2) options.push_back(first_then_any(lo[0] + 1, hi[0] - 1, lo.size() - 1));
    options.push_back(prefixed(hi[0], at_most(hi.substr(1))));
    return {builder_.alternatives(options, "digits in range")};
  }

  // Canonical non-negative integers in [lo, hi] (hi absent: unbounded), as alternatives.
  std::vector<Sequence> non_negative(uint64_t lo, std::optional<uint64_t> hi) {
    std::vector<Sequence> options;
    if (hi && *hi < lo) return options;
    const std::string lo_text = std::to_string(lo);
    const size_t lo_digits = lo_text.size();
    const size_t hi_digits = hi ? std::to_string(*hi).size() : lo_digits;
    for (size_t d = lo_digits; d <= hi_digits; ++d) {
      const std::string first = d == lo_digits ? lo_text : "1" + std::string(d - 1, '0');
      const std::string last = hi && d == hi_digits ? std::to_string(*hi) : std::string(d, '9');
      options.push_back(between(first, last));
    }
    if (!hi) {  // more digits than lo has: any such number is larger
      Sequence longer = first_then_any('1', '9', lo_digits);
      longer.push_back(builder_.star({digit()}, "digits"));
      options.push_back(longer);
    }
    return options;
  }

  // Canonical integers in [lo, hi] (either side absent: unbounded); "-0" never.
  std::vector<Sequence> signed_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
    std::vector<Sequence> options;
    if (!hi || *hi >= 0) options = non_negative(lo ? static_cast<uint64_t>(std::max<int64_t>(*lo, 0)) : 0,
                                                hi ? std::optional<uint64_t>(static_cast<uint64_t>(*hi)) : std::nullopt);
    if (!lo || *lo < 0) {
      const uint64_t magnitude_lo = hi && *hi < 0 ? static_cast<uint64_t>(-*hi) : 1;
      std::optional<uint64_t> magnitude_hi;
      if (lo) magnitude_hi = static_cast<uint64_t>(-*lo);
      for (const Sequence& magnitude : non_negative(magnitude_lo, magnitude_hi))
        options.push_back(prefixed('-', magnitude));
    }
    return options;
  }

  Sequence prefixed(char c, const Sequence& rest) {
    Sequence sequence{builder_.byte(static_cast<uint8_t>(c))};
    sequence.insert(sequence.end(), rest.begin(), rest.end());
    return sequence;
  }

 private:
  Sequence first_then_any(char first, char last, size_t more) {
    Sequence sequence{builder_.byte_class(ByteClass::range(static_cast<uint8_t>(first), static_cast<uint8_t>(last)))};
    const Sequence rest = any_digits(more);
    sequence.insert(sequence.end(), rest.begin(), rest.end());
    return sequence;
  }

  GrammarBuilder& builder_;
};

bool representable(const NumberBounds& bounds) {
  for (const std::optional<double>& bound : {bounds.lo, bounds.hi})
    if (bound && !(std::fabs(*bound) <= kLargestBound)) return false;
  return true;
}

// The smallest / largest integer within the bounds.
std::optional<int64_t> lowest_integer(const NumberBounds& b) {
  if (!b.lo) return std::nullopt;
  return static_cast<int64_t>(b.lo_exclusive ? std::floor(*b.lo) + 1 : std::ceil(*b.lo));
}
std::optional<int64_t> highest_integer(const NumberBounds& b) {
  if (!b.hi) return std::nullopt;
  return static_cast<int64_t>(b.hi_exclusive ? std::ceil(*b.hi) - 1 : std::floor(*b.hi));
}

void require_options(const std::vector<Sequence>& options) {
  if (options.empty()) fail(ErrorKind::kInvalidArgument, "no value satisfies the schema's numeric bounds");
}

}  // namespace

std::optional<Symbol> bounded_integer(GrammarBuilder& builder, const NumberBounds& bounds) {
  if (!representable(bounds)) return std::nullopt;
  DigitRanges digits(builder);
  const std::vector<Sequence> options = digits.signed_range(lowest_integer(bounds), highest_integer(bounds));
  require_options(options);
  return builder.alternatives(options, "bounded integer");
}

std::optional<Symbol> bounded_number(GrammarBuilder& builder, const NumberBounds& bounds) {
  if (!representable(bounds)) return std::nullopt;
  DigitRanges digits(builder);
  const std::optional<int64_t> int_lo = lowest_integer(bounds), int_hi = highest_integer(bounds);
  std::vector<Sequence> options = digits.signed_range(int_lo, int_hi);
  const Symbol digit = digits.digit();
  const Symbol fraction = builder.alternatives({{builder.byte('.'), digit, builder.star({digit}, "digits")}}, "fraction");
  const Symbol nonzero_fraction = builder.alternatives(
      {{builder.byte('.'), builder.star({builder.byte('0')}, "zeros"), builder.byte_class(ByteClass::range('1', '9')),
        builder.star({digit}, "digits")}},
      "non-zero fraction");
  auto add_all = [&](const std::vector<Sequence>& integer_parts, std::optional<char> sign, Symbol tail) {
    for (const Sequence& part : integer_parts) {
      Sequence option = sign ? digits.prefixed(*sign, part) : part;
      option.push_back(tail);
      options.push_back(option);
    }
  };
  // k.F in [k, k+1): k >= the lowest integer, k + 1 <= hi.
  const std::optional<int64_t> positive_hi =
      bounds.hi ? std::optional<int64_t>(static_cast<int64_t>(std::floor(*bounds.hi)) - 1) : std::nullopt;
  if (!positive_hi || *positive_hi >= 0)
    add_all(digits.non_negative(static_cast<uint64_t>(std::max<int64_t>(int_lo.value_or(0), 0)),
                                positive_hi ? std::optional<uint64_t>(*positive_hi) : std::nullopt),
            std::nullopt, fraction);
  // -k.F in (-k-1, -k]: -k <= the highest integer, -k - 1 >= lo.
  const std::optional<int64_t> negative_hi =
      bounds.lo ? std::optional<int64_t>(-static_cast<int64_t>(std::ceil(*bounds.lo)) - 1) : std::nullopt;
  if (!negative_hi || *negative_hi >= 0)
    add_all(digits.non_negative(static_cast<uint64_t>(std::max<int64_t>(int_hi ? -*int_hi : 0, 0)),
                                negative_hi ? std::optional<uint64_t>(*negative_hi) : std::nullopt),
            '-', fraction);
  // An exclusive integer bound k: k.F with F non-zero is still inside.
  if (bounds.lo && bounds.lo_exclusive && *bounds.lo >= 0 && std::floor(*bounds.lo) == *bounds.lo &&
      (!bounds.hi || *bounds.lo + 1 <= *bounds.hi))
    add_all(digits.non_negative(static_cast<uint64_t>(*bounds.lo), static_cast<uint64_t>(*bounds.lo)), std::nullopt,
            nonzero_fraction);
  if (bounds.hi && bounds.hi_exclusive && *bounds.hi <= 0 && std::floor(*bounds.hi) == *bounds.hi &&
      (!bounds.lo || *bounds.hi - 1 >= *bounds.lo))
    add_all(digits.non_negative(static_cast<uint64_t>(-*bounds.hi), static_cast<uint64_t>(-*bounds.hi)), '-',
            nonzero_fraction);
  if (options.empty()) {
    const bool empty_range = bounds.lo && bounds.hi &&
                             (*bounds.lo > *bounds.hi || (*bounds.lo == *bounds.hi && (bounds.lo_exclusive || bounds.hi_exclusive)));
    if (empty_range) require_options(options);
    return std::nullopt;  // a range without an integer or a whole unit: not handled
  }
  return builder.alternatives(options, "bounded number");
}

}  // namespace loom::grammar
