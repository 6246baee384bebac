// The JSON-schema string formats the compiler enforces, as regexes over the
// string's content (compiled with RegexOptions::json_string), with the
// length bounds their languages have, so that minLength / maxLength beside a
// format can be checked for being implied.
//
//   date, time, date-time (RFC 3339: full-date, full-time with a required
//   offset, date "T" time), duration (ISO 8601 / RFC 3339 appendix A: weeks
//   alone or Y M D and T H M S parts, at least one), uuid, email (a practical
//   subset of RFC 5321 addresses), ipv4, ipv6 (RFC 4291 text forms without
//   an embedded IPv4 tail), hostname (RFC 1123 labels of at most 49
//   characters, at most 5 labels: always under the 253-character limit),
//   uri (RFC 3986: scheme ":" then an authority and path, or a path; query
//   and fragment), uri-reference (a uri or a relative reference), json-pointer.
// Every string a pattern generates is valid for its format; for ipv6 and
// hostname not every valid string is generated.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace loom::grammar {

struct StringFormat {
  std::string regex;
  int64_t min_length = 0;   // characters
  int64_t max_length = -1;  // -1: unbounded
};

// The format's pattern, or null for a format not listed above.
const StringFormat* find_string_format(std::string_view name);

}  // namespace loom::grammar
