// Request bodies into JSON values, safely. Every JSON body the
// server reads goes through here:
//
//   1. the nesting guard (util/json_nesting.h) runs on the raw text first, so
//      nothing recursive ever sees [[[[... deeper than kMaxJsonNesting;
//   2. nlohmann's SAX parser builds the value while this file tracks where it
//      is, so a failure names the field it hit: invalid UTF-8 in a string or a
//      key ("messages[0].content[1].text"), a number outside double's range
//      such as 1e999 or -1e999 ("temperature"), bad syntax;
//   3. messages never echo raw body bytes (a body's invalid UTF-8 must not
//      reach an error body): the parser's "last read" text is dropped and any
//      other byte outside printable ASCII is written \xNN.
//
// What comes out is valid JSON with valid UTF-8 strings and finite numbers
// only; types and ranges are the caller's to check. Field paths: keys joined
// with '.', array elements as [i]; "" for the body itself.
//
// Pure functions; any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace loom::server {

struct JsonSyntaxError {
  std::string field;    // where it failed ("" = the body as a whole)
  // "invalid JSON: parse error at line 1, column 7: ...", or the nesting
  // guard's message; no body bytes besides `field`'s keys, a few hundred bytes.
  std::string message;
};

// The value of `text`, or nullopt with `error` filled. Throws nothing but
// std::bad_alloc.
std::optional<nlohmann::json> parse_json_text(std::string_view text, JsonSyntaxError& error);

// A request body that must be a JSON object. Throws ApiError(400) with `param`
// naming the field for malformed JSON, nesting deeper than kMaxJsonNesting, or
// a non-object body.
nlohmann::json parse_json_object_body(std::string_view body);

// The member `key` of `object` (nlohmann::json or ordered_json), or nullptr
// when it is absent or null: what OpenAI's API reads as "not given".
template <typename JsonValue>
const JsonValue* field(const JsonValue& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

// Throws ApiError(400) naming parent.key when that member is given and is not a string.
void check_optional_string(const nlohmann::ordered_json& object, const char* key, const std::string& parent);

// Appends `key` / `[index]` to a field path ("messages" + 0 -> "messages[0]").
std::string field_path(std::string_view parent, std::string_view key);
std::string field_path(std::string_view parent, size_t index);

}  // namespace loom::server
