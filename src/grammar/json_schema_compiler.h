// JSON schema (and "any JSON object") into a grammar that generates compact
// JSON: no whitespace between tokens ({"a":1,"b":[true]}), the choice xgrammar
// offers as any_whitespace=false. Compact output is valid JSON and cannot
// waste the token budget on blanks (which a weak model otherwise does).
//
// Supported (the subset of OpenAI strict mode and of common vLLM use):
//   type (a name or a list), object (properties in key order — the parsed
//   schema object sorts its keys; member order does not affect validity —, required,
//   additionalProperties false / true / a schema — absent counts as false when
//   `properties` is given, as xgrammar's strict mode; an object schema without
//   properties takes any members), array (items, prefixItems, minItems,
//   maxItems), string (minLength, maxLength, pattern, format: date, time,
//   date-time, uuid, email, ipv4), number, integer, boolean, null, enum, const,
//   anyOf / oneOf (as alternatives: oneOf's exclusivity is not enforced), allOf
//   with one entry, $ref to #, #/$defs/... and #/definitions/... (recursion allowed).
// Ignored (annotations): title, description, default, examples, $schema, $id,
//   $comment, deprecated, readOnly, writeOnly, $defs/definitions themselves.
// Refused with Error(kUnsupported) naming the keyword and where it is:
//   minimum, maximum, exclusiveMinimum, exclusiveMaximum, multipleOf,
//   uniqueItems, contains, minContains, maxContains, patternProperties,
//   propertyNames, minProperties, maxProperties, not, if/then/else, allOf of
//   several, dependentRequired, dependentSchemas, unevaluatedProperties,
//   unevaluatedItems, other formats, other $ref targets.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "grammar/grammar.h"

namespace loom::grammar {

Grammar json_schema_grammar(const nlohmann::json& schema, GrammarLimits limits = {});
// Any JSON object (response_format json_object).
Grammar json_object_grammar(GrammarLimits limits = {});
// Exactly one of `choices` (vLLM's guided_choice). Error(kInvalidArgument) when empty.
Grammar choice_grammar(const std::vector<std::string>& choices, GrammarLimits limits = {});

}  // namespace loom::grammar
