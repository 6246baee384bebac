// JSON schema (and "any JSON object") into a grammar that generates compact
// JSON: no whitespace between tokens ({"a":1,"b":[true]}), the choice xgrammar
// offers as any_whitespace=false. Compact output is valid JSON and cannot
// waste the token budget on blanks (which a weak model otherwise does).
//
// Object members come in the order of the schema's `properties` (the schema
// must be an nlohmann::ordered_json parsed from the client's text for that
// order to be the client's), then members named only in `required`, then
// additional members.
//
// Enforced exactly:
//   type (a name or a list), enum, const, anyOf, $ref to #, #/$defs/... and
//   #/definitions/... (recursion allowed), allOf with one entry;
//   object: properties, required, additionalProperties false / true / a schema
//   (absent counts as false when `properties` or `patternProperties` is given,
//   as xgrammar's strict mode; an object schema without them takes any members),
//   minProperties / maxProperties (up to 64), patternProperties (without
//   `properties` beside it: only pattern-named members are generated),
//   propertyNames (on additional members, when nothing else names members);
//   array: items, prefixItems, minItems, maxItems, uniqueItems when the items
//   are one of at most 8 values (enum, const, boolean, null, an integer range)
//   or maxItems <= 1;
//   string: minLength, maxLength, pattern (anchored), format (string_formats.h),
//   a length bound beside pattern/format when the pattern implies it;
//   integer: minimum, maximum, exclusiveMinimum, exclusiveMaximum (bounds within +-9e18).
// Enforced soundly but not completely (every output is valid, some valid values
//   are never produced): number bounds (number_grammar.h), oneOf (as anyOf:
//   exclusivity is not checked), a keyword such as minimum without `type` (its type is implied),
//   uniqueItems over 9 to 64 values (items in the order of the enum / range),
//   maxLength beside a pattern or format that does not imply it (HttpUrl's
//   format uri + maxLength 2083): the pattern's open repetitions (x*, x+, x{m,})
//   are bounded by one cap, the largest under which no string is too long (at least 8).
// Ignored (annotations): title, description, default, examples, $schema, $id,
//   $comment, deprecated, readOnly, writeOnly, $defs/definitions themselves.
// Not enforceable here: multipleOf, contains, minContains, maxContains, not,
//   if/then/else, dependentRequired, dependentSchemas, dependencies,
//   unevaluatedProperties, unevaluatedItems, additionalItems, contentEncoding,
//   contentMediaType, $dynamicRef, $recursiveRef, allOf of several, other $ref
//   targets, other formats, uniqueItems over an open set of items (strings,
//   numbers, objects: no context-free grammar tells items apart, xgrammar and
//   llguidance leave it too) or more values than above, minLength beside a
//   pattern that does not imply it, maxLength beside a pattern that leaves a
//   cap under 8. Strict: Error(kUnsupported) naming the keyword and
//   where it is. Lenient: compiled as if absent (allOf: its first entry; an
//   unresolved $ref: any value) and listed in Grammar::unenforced.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "grammar/grammar.h"

namespace loom::grammar {

enum class SchemaStrictness { kStrict, kLenient };

Grammar json_schema_grammar(const nlohmann::ordered_json& schema, GrammarLimits limits = {},
                            SchemaStrictness strictness = SchemaStrictness::kStrict);
// Any JSON object (response_format json_object).
Grammar json_object_grammar(GrammarLimits limits = {});
// Exactly one of `choices` (vLLM's guided_choice). Error(kInvalidArgument) when empty.
Grammar choice_grammar(const std::vector<std::string>& choices, GrammarLimits limits = {});

}  // namespace loom::grammar
