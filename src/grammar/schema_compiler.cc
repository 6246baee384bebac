#include "grammar/schema_compiler.h"

#include <algorithm>

#include "grammar/regex_compiler.h"
#include "grammar/string_formats.h"
#include "grammar/utf8_ranges.h"
#include "util/error.h"

namespace loom::grammar {
namespace {

constexpr int32_t kMaxSchemaDepth = 64;
// The least cap on a pattern's open repetitions that a maxLength beside it may impose (open_repeat_cap).
constexpr int64_t kMinOpenRepeatCap = 8;

std::string where(const std::string& path) { return path.empty() ? "the root" : path; }

bool has_any(const nlohmann::ordered_json& schema, std::initializer_list<const char*> keys) {
  return std::any_of(keys.begin(), keys.end(), [&](const char* key) { return schema.contains(key); });
}

}  // namespace

int64_t read_count(const nlohmann::ordered_json& schema, const char* key, int64_t fallback, const std::string& path) {
  const auto it = schema.find(key);
  if (it == schema.end()) return fallback;
  if (!it->is_number_integer() || it->get<int64_t>() < 0)
    fail(ErrorKind::kInvalidArgument, "JSON schema: '{}' must be a non-negative integer at {}", key, where(path));
  return it->get<int64_t>();
}

void SchemaCompiler::unenforceable(const char* keyword, const std::string& path) {
  if (strict_)
    fail(ErrorKind::kUnsupported, "JSON schema: the keyword '{}' (at {}) is not supported (no grammar can enforce it "
         "here; without \"strict\": true it is served unenforced)", keyword, where(path));
  unenforced_.push_back({keyword, path});
}

void SchemaCompiler::check_unenforceable_keywords(const Json& schema, const std::string& path) {
  static const char* const kUnenforceable[] = {
      "multipleOf", "contains", "minContains", "maxContains", "not", "if", "then", "else", "dependentRequired",
      "dependentSchemas", "unevaluatedProperties", "unevaluatedItems", "dependencies", "additionalItems",
      "contentEncoding", "contentMediaType", "$dynamicRef", "$recursiveRef"};
  for (const char* keyword : kUnenforceable)
    if (schema.contains(keyword)) unenforceable(keyword, path);
}

Symbol SchemaCompiler::compile(const Json& schema, const std::string& path, int32_t depth) {
  if (depth > kMaxSchemaDepth) fail(ErrorKind::kCapacity, "JSON schema: nesting deeper than {} at {}", kMaxSchemaDepth, where(path));
  if (schema.is_boolean()) {
    if (!schema.get<bool>()) fail(ErrorKind::kUnsupported, "JSON schema: the schema 'false' (matches nothing) at {}", where(path));
    return any_value();
  }
  if (!schema.is_object()) fail(ErrorKind::kInvalidArgument, "JSON schema: expected an object at {}", where(path));
  check_unenforceable_keywords(schema, path);
  if (const auto it = schema.find("$ref"); it != schema.end()) return reference(*it, path, depth);
  if (const auto it = schema.find("const"); it != schema.end())
    return builder_.alternatives({builder_.literal(it->dump())}, "const");
  if (const auto it = schema.find("enum"); it != schema.end()) return enumeration(*it, path + "/enum");
  for (const char* key : {"anyOf", "oneOf"})
    if (const auto it = schema.find(key); it != schema.end()) return any_of(*it, path + "/" + key, depth);
  if (const auto it = schema.find("allOf"); it != schema.end()) {
    if (!it->is_array() || it->empty())
      fail(ErrorKind::kInvalidArgument, "JSON schema: 'allOf' must be a non-empty list at {}", where(path));
    if (it->size() > 1) unenforceable("allOf", path);  // lenient: the first entry alone
    return compile((*it)[0], path + "/allOf/0", depth + 1);
  }
  const std::vector<std::string> types = types_of(schema, path);
  if (types.empty()) return any_value();
  std::vector<Sequence> options;
  for (const std::string& type : types) options.push_back({typed(schema, type, path, depth)});
  return options.size() == 1 ? options[0][0] : builder_.alternatives(options, path + " types");
}

// `type`, or the one its keywords imply (a subset of what the schema allows);
// empty: any value.
std::vector<std::string> SchemaCompiler::types_of(const Json& schema, const std::string& path) {
  std::vector<std::string> types;
  if (const auto it = schema.find("type"); it != schema.end()) {
    if (it->is_string()) {
      types.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const Json& type : *it) {
        if (!type.is_string()) fail(ErrorKind::kInvalidArgument, "JSON schema: 'type' entries must be strings at {}", where(path));
        types.push_back(type.get<std::string>());
      }
      if (types.empty()) fail(ErrorKind::kInvalidArgument, "JSON schema: an empty 'type' list at {}", where(path));
    } else {
      fail(ErrorKind::kInvalidArgument, "JSON schema: 'type' must be a string or a list at {}", where(path));
    }
  } else if (has_any(schema, {"properties", "additionalProperties", "required", "patternProperties", "propertyNames",
                              "minProperties", "maxProperties"})) {
    types.push_back("object");
  } else if (has_any(schema, {"items", "prefixItems", "minItems", "maxItems", "uniqueItems"})) {
    types.push_back("array");
  } else if (has_any(schema, {"pattern", "format", "minLength", "maxLength"})) {
    types.push_back("string");
  } else if (has_any(schema, {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) {
    types.push_back("number");
  }
  return types;
}

Symbol SchemaCompiler::typed(const Json& schema, const std::string& type, const std::string& path, int32_t depth) {
  if (type == "string") return string(schema, path);
  if (type == "integer") return integer(schema, path);
  if (type == "number") return number(schema, path);
  if (type == "boolean") return builder_.alternatives({builder_.literal("true"), builder_.literal("false")}, "boolean");
  if (type == "null") return builder_.alternatives({builder_.literal("null")}, "null");
  if (type == "object") return object(schema, path, depth);
  if (type == "array") return array(schema, path, depth);
  fail(ErrorKind::kInvalidArgument, "JSON schema: unknown type '{}' at {}", type, where(path));
}

const SchemaCompiler::Json* SchemaCompiler::resolve(const std::string& target) const {
  if (target == "#") return &root_;
  for (const std::string prefix : {"#/$defs/", "#/definitions/"}) {
    if (target.rfind(prefix, 0) != 0) continue;
    const auto defs = root_.find(prefix.substr(2, prefix.size() - 3));
    const std::string name = target.substr(prefix.size());
    if (defs != root_.end() && defs->is_object() && defs->contains(name)) return &(*defs)[name];
  }
  return nullptr;
}

Symbol SchemaCompiler::reference(const Json& ref, const std::string& path, int32_t depth) {
  if (!ref.is_string()) fail(ErrorKind::kInvalidArgument, "JSON schema: '$ref' must be a string at {}", where(path));
  const std::string target = ref.get<std::string>();
  if (const auto it = refs_.find(target); it != refs_.end()) return GrammarBuilder::rule(it->second);
  const Json* resolved = resolve(target);
  if (!resolved) {
    if (strict_)
      fail(ErrorKind::kUnsupported, "JSON schema: '$ref' {} at {} (only #, #/$defs/NAME and #/definitions/NAME "
           "of this schema are supported)", ref.dump(), where(path));
    unenforceable("$ref", path);
    return any_value();
  }
  // Declared before it is compiled, so that a recursive reference finds it.
  const int32_t rule = builder_.declare_rule("ref " + target);
  refs_.emplace(target, rule);
  const Symbol body = compile(*resolved, target.substr(1), depth + 1);
  builder_.add_alternative(rule, {body});
  return GrammarBuilder::rule(rule);
}

Symbol SchemaCompiler::enumeration(const Json& values, const std::string& path) {
  if (!values.is_array() || values.empty())
    fail(ErrorKind::kInvalidArgument, "JSON schema: 'enum' must be a non-empty list at {}", where(path));
  std::vector<Sequence> options;
  for (const Json& value : values) options.push_back(builder_.literal(value.dump()));
  return builder_.alternatives(options, "enum");
}

Symbol SchemaCompiler::any_of(const Json& schemas, const std::string& path, int32_t depth) {
  if (!schemas.is_array() || schemas.empty())
    fail(ErrorKind::kInvalidArgument, "JSON schema: expected a non-empty list at {}", where(path));
  std::vector<Sequence> options;
  for (size_t i = 0; i < schemas.size(); ++i)
    options.push_back({compile(schemas[i], path + "/" + std::to_string(i), depth + 1)});
  return builder_.alternatives(options, path);
}

Symbol SchemaCompiler::string_character() {
  if (string_char_) return *string_char_;
  CodepointSet safe;  // U+0020 and up, without '"' and '\'
  safe.add(0x20, '"' - 1);
  safe.add('"' + 1, '\\' - 1);
  safe.add('\\' + 1, kMaxCodepoint);
  const Symbol plain = codepoint_set_symbol(builder_, safe, "string char");
  ByteClass hex;
  hex.add_range('0', '9');
  hex.add_range('a', 'f');
  hex.add_range('A', 'F');
  ByteClass escapable;
  for (char c : std::string("\"\\/bfnrt")) escapable.add(static_cast<uint8_t>(c));
  const Symbol h = builder_.byte_class(hex);
  string_char_ = builder_.alternatives(
      {{plain}, {builder_.byte('\\'), builder_.byte_class(escapable)}, {builder_.byte('\\'), builder_.byte('u'), h, h, h, h}},
      "string character");
  return *string_char_;
}

Symbol SchemaCompiler::plain_string() {
  if (!plain_string_) {
    const Symbol quote = builder_.byte('"');
    plain_string_ = builder_.alternatives({{quote, builder_.star({string_character()}, "string chars"), quote}}, "string");
  }
  return *plain_string_;
}

Symbol SchemaCompiler::string(const Json& schema, const std::string& path) {
  const Symbol quote = builder_.byte('"');
  const int64_t min = read_count(schema, "minLength", 0, path);
  const int64_t max = read_count(schema, "maxLength", -1, path);
  if (max >= 0 && max < min) fail(ErrorKind::kInvalidArgument, "JSON schema: maxLength < minLength at {}", where(path));
  std::optional<std::string> pattern;
  int64_t implied_min = 0, implied_max = -1;  // what the pattern's language guarantees
  RegexOptions options;
  options.json_string = true;
  if (const auto it = schema.find("pattern"); it != schema.end()) {
    if (!it->is_string()) fail(ErrorKind::kInvalidArgument, "JSON schema: 'pattern' must be a string at {}", where(path));
    pattern = it->get<std::string>();
    if (!pattern->empty() && pattern->front() == '^') pattern->erase(0, 1);
    if (!pattern->empty() && pattern->back() == '$' && (pattern->size() < 2 || (*pattern)[pattern->size() - 2] != '\\'))
      pattern->pop_back();
    if (max >= 0) implied_max = checked_regex_max_length(*pattern, options, path);
  } else if (const auto format = schema.find("format"); format != schema.end()) {
    if (!format->is_string()) fail(ErrorKind::kInvalidArgument, "JSON schema: 'format' must be a string at {}", where(path));
    if (const StringFormat* known = find_string_format(format->get_ref<const std::string&>())) {
      pattern = known->regex;
      implied_min = known->min_length;
      implied_max = known->max_length;
    } else if (strict_) {
      fail(ErrorKind::kUnsupported, "JSON schema: the string format '{}' (at {}) is not supported",
           format->get<std::string>(), where(path));
    } else {
      unenforceable("format", path);
    }
  }
  if (pattern) {
    // minLength beside a pattern: enforced only when the pattern implies it. maxLength: implied, or
    // enforced by bounding the pattern's open repetitions (a subset of its strings, all short enough).
    if (min > implied_min) unenforceable("minLength", path);
    if (max >= 0 && (implied_max < 0 || implied_max > max)) {
      if (const std::optional<int64_t> cap = open_repeat_cap(*pattern, options, max, path)) options.open_repeat_cap = *cap;
      else unenforceable("maxLength", path);
    }
    Symbol content;
    try {
      content = compile_regex(builder_, *pattern, options);
    } catch (const Error& error) {
      fail(error.kind(), "JSON schema: 'pattern' at {}: {}", where(path), error.message());
    }
    return builder_.alternatives({{quote, content, quote}}, "string pattern");
  }
  if (min == 0 && max < 0) return plain_string();
  Sequence body{quote};
  const Sequence chars = builder_.repeat({string_character()}, min, max, "string chars");
  body.insert(body.end(), chars.begin(), chars.end());
  body.push_back(quote);
  return builder_.alternatives({body}, "string");
}

int64_t SchemaCompiler::checked_regex_max_length(const std::string& pattern, const RegexOptions& options,
                                                 const std::string& path) {
  try {
    return regex_max_length(pattern, options);
  } catch (const Error& error) {
    fail(error.kind(), "JSON schema: 'pattern' at {}: {}", where(path), error.message());
  }
}

// The largest cap on the open repetitions of `pattern` (RegexOptions::open_repeat_cap) under which
// no string is longer than `max_length` characters; nullopt when that cap is under
// kMinOpenRepeatCap (the strings left would be too cramped to be of use, or a bounded repetition of
// the pattern's own is too long). All of the budget goes to one cap shared by every open
// repetition: a URI of at most 2083 characters keeps up to 23 characters in each part (host, each
// path segment, query...) and up to 23 path segments; one of at most 48 is left unenforced.
std::optional<int64_t> SchemaCompiler::open_repeat_cap(const std::string& pattern, RegexOptions options,
                                                       int64_t max_length, const std::string& path) {
  const auto fits = [&](int64_t cap) {
    options.open_repeat_cap = cap;
    const int64_t longest = checked_regex_max_length(pattern, options, path);
    return longest >= 0 && longest <= max_length;
  };
  if (!fits(kMinOpenRepeatCap)) return std::nullopt;
  // Each repetition adds at least one character (or none anywhere): no cap past max_length matters,
  // and the grammar's repetition limit bounds it too.
  int64_t lo = kMinOpenRepeatCap, hi = std::max<int64_t>(
      lo, std::min<int64_t>(max_length, builder_.limits().max_repetition / 2));
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// minimum / maximum / exclusiveMinimum / exclusiveMaximum (draft 4's boolean
// exclusive* beside minimum / maximum too); the tighter bound wins on each side.
NumberBounds SchemaCompiler::number_bounds(const Json& schema, const std::string& path) {
  NumberBounds bounds;
  auto read = [&](const char* key) -> std::optional<double> {
    const auto it = schema.find(key);
    if (it == schema.end() || it->is_boolean()) return std::nullopt;
    if (!it->is_number()) fail(ErrorKind::kInvalidArgument, "JSON schema: '{}' must be a number at {}", key, where(path));
    return it->get<double>();
  };
  auto flag = [&](const char* key) { return schema.contains(key) && schema[key].is_boolean() && schema[key].get<bool>(); };
  auto tighten = [](std::optional<double>& bound, bool& exclusive, std::optional<double> value, bool value_exclusive,
                    bool lower) {
    if (!value) return;
    const bool tighter = !bound || (lower ? *value > *bound : *value < *bound) || (*value == *bound && value_exclusive);
    if (tighter) {
      bound = value;
      exclusive = value_exclusive;
    }
  };
  tighten(bounds.lo, bounds.lo_exclusive, read("minimum"), flag("exclusiveMinimum"), true);
  tighten(bounds.lo, bounds.lo_exclusive, read("exclusiveMinimum"), true, true);
  tighten(bounds.hi, bounds.hi_exclusive, read("maximum"), flag("exclusiveMaximum"), false);
  tighten(bounds.hi, bounds.hi_exclusive, read("exclusiveMaximum"), true, false);
  return bounds;
}

Sequence SchemaCompiler::integer_part() {
  Sequence nonzero{builder_.byte_class(ByteClass::range('1', '9')),
                   builder_.star({builder_.byte_class(ByteClass::range('0', '9'))}, "digits")};
  return {builder_.optional({builder_.byte('-')}, "minus"),
          builder_.alternatives({builder_.literal("0"), nonzero}, "integer digits")};
}

Symbol SchemaCompiler::integer(const Json& schema, const std::string& path) {
  const NumberBounds bounds = number_bounds(schema, path);
  if (bounds.lo || bounds.hi) {
    if (const std::optional<Symbol> bounded = bounded_integer(builder_, bounds)) return *bounded;
    for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
      if (schema.contains(key)) unenforceable(key, path);
  }
  if (!integer_) integer_ = builder_.alternatives({integer_part()}, "integer");
  return *integer_;
}

Symbol SchemaCompiler::number(const Json& schema, const std::string& path) {
  const NumberBounds bounds = number_bounds(schema, path);
  if (bounds.lo || bounds.hi) {
    if (const std::optional<Symbol> bounded = bounded_number(builder_, bounds)) return *bounded;
    for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
      if (schema.contains(key)) unenforceable(key, path);
  }
  if (number_) return *number_;
  const Symbol digit = builder_.byte_class(ByteClass::range('0', '9'));
  const Symbol more = builder_.star({digit}, "digits");
  Sequence body = integer_part();
  body.push_back(builder_.optional({builder_.byte('.'), digit, more}, "fraction"));
  ByteClass e = ByteClass::of('e');
  e.add('E');
  ByteClass sign = ByteClass::of('+');
  sign.add('-');
  body.push_back(builder_.optional(
      {builder_.byte_class(e), builder_.optional({builder_.byte_class(sign)}, "exponent sign"), digit, more}, "exponent"));
  number_ = builder_.alternatives({body}, "number");
  return *number_;
}

Symbol SchemaCompiler::any_value() {
  if (any_value_) return *any_value_;
  const int32_t value = builder_.declare_rule("value");
  any_value_ = GrammarBuilder::rule(value);
  const Symbol str = plain_string();
  const Symbol val = *any_value_;
  Sequence member_seq{str, builder_.byte(':'), val};
  Sequence more_members{builder_.byte(',')};
  more_members.insert(more_members.end(), member_seq.begin(), member_seq.end());
  Sequence members = member_seq;
  members.push_back(builder_.star(more_members, "more members"));
  any_object_ = builder_.alternatives({{builder_.byte('{'), builder_.optional(members, "members"), builder_.byte('}')}}, "object");
  Sequence elements{val, builder_.star({builder_.byte(','), val}, "more elements")};
  const Symbol array_rule = builder_.alternatives(
      {{builder_.byte('['), builder_.optional(elements, "elements"), builder_.byte(']')}}, "array");
  for (const Sequence& option : std::vector<Sequence>{{*any_object_}, {array_rule}, {str}, {number(Json::object(), "")},
                                                       builder_.literal("true"), builder_.literal("false"),
                                                       builder_.literal("null")})
    builder_.add_alternative(value, option);
  return val;
}

Symbol SchemaCompiler::any_object() {
  any_value();
  return *any_object_;
}

}  // namespace loom::grammar
