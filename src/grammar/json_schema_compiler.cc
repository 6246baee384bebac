#include "grammar/json_schema_compiler.h"

#include <algorithm>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "grammar/regex_compiler.h"
#include "grammar/utf8_ranges.h"
#include "util/error.h"

namespace loom::grammar {
namespace {

using Json = nlohmann::json;

constexpr int32_t kMaxSchemaDepth = 64;

// Regexes for the string formats we generate (content of the JSON string).
const std::map<std::string, std::string>& format_patterns() {
  static const std::map<std::string, std::string> patterns = {
      {"date", R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))"},
      {"time", R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))"},
      {"date-time",
       R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))"},
      {"uuid", R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"},
      {"email", R"([a-zA-Z0-9_.+-]+@[a-zA-Z0-9-]+(\.[a-zA-Z0-9-]+)+)"},
      {"ipv4", R"(((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))"},
  };
  return patterns;
}

class SchemaCompiler {
 public:
  SchemaCompiler(GrammarBuilder& builder, const Json& root) : builder_(builder), root_(root) {}

  Symbol compile(const Json& schema, const std::string& path, int32_t depth) {
    if (depth > kMaxSchemaDepth) fail(ErrorKind::kCapacity, "JSON schema: nesting deeper than {} at {}", kMaxSchemaDepth, path);
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) fail(ErrorKind::kUnsupported, "JSON schema: the schema 'false' (matches nothing) at {}", path);
      return any_value();
    }
    if (!schema.is_object()) fail(ErrorKind::kInvalidArgument, "JSON schema: expected an object at {}", path);
    refuse_keywords(schema, path);
    if (const auto it = schema.find("$ref"); it != schema.end()) return reference(*it, path, depth);
    if (const auto it = schema.find("const"); it != schema.end()) return literal_value(*it, path + "/const");
    if (const auto it = schema.find("enum"); it != schema.end()) return enumeration(*it, path + "/enum");
    for (const char* key : {"anyOf", "oneOf"})
      if (const auto it = schema.find(key); it != schema.end()) return any_of(*it, path + "/" + key, depth);
    if (const auto it = schema.find("allOf"); it != schema.end()) {
      if (!it->is_array() || it->size() != 1)
        fail(ErrorKind::kUnsupported, "JSON schema: 'allOf' with other than one entry at {} is not supported", path);
      return compile((*it)[0], path + "/allOf/0", depth + 1);
    }
    std::vector<std::string> types;
    if (const auto it = schema.find("type"); it != schema.end()) {
      if (it->is_string()) {
        types.push_back(it->get<std::string>());
      } else if (it->is_array()) {
        for (const Json& type : *it) {
          if (!type.is_string()) fail(ErrorKind::kInvalidArgument, "JSON schema: 'type' entries must be strings at {}", path);
          types.push_back(type.get<std::string>());
        }
      } else {
        fail(ErrorKind::kInvalidArgument, "JSON schema: 'type' must be a string or a list at {}", path);
      }
    } else if (schema.contains("properties") || schema.contains("additionalProperties") || schema.contains("required")) {
      types.push_back("object");
    } else if (schema.contains("items") || schema.contains("prefixItems")) {
      types.push_back("array");
    } else {
      return any_value();
    }
    if (types.empty()) fail(ErrorKind::kInvalidArgument, "JSON schema: an empty 'type' list at {}", path);
    std::vector<Sequence> options;
    for (const std::string& type : types) options.push_back({typed(schema, type, path, depth)});
    return options.size() == 1 ? options[0][0] : builder_.alternatives(options, path + " types");
  }

 private:
  static void refuse_keywords(const Json& schema, const std::string& path) {
    static const char* const kRefused[] = {
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "uniqueItems", "contains",
        "minContains", "maxContains", "patternProperties", "propertyNames", "minProperties", "maxProperties", "not",
        "if", "then", "else", "dependentRequired", "dependentSchemas", "unevaluatedProperties", "unevaluatedItems",
        "dependencies", "additionalItems", "contentEncoding", "contentMediaType", "$dynamicRef", "$recursiveRef"};
    for (const char* keyword : kRefused)
      if (schema.contains(keyword))
        fail(ErrorKind::kUnsupported, "JSON schema: the keyword '{}' (at {}) is not supported", keyword,
             path.empty() ? "the root" : path);
  }

  Symbol typed(const Json& schema, const std::string& type, const std::string& path, int32_t depth) {
    if (type == "string") return string(schema, path);
    if (type == "integer") return integer();
    if (type == "number") return number();
    if (type == "boolean") return builder_.alternatives({builder_.literal("true"), builder_.literal("false")}, "boolean");
    if (type == "null") return builder_.alternatives({builder_.literal("null")}, "null");
    if (type == "object") return object(schema, path, depth);
    if (type == "array") return array(schema, path, depth);
    fail(ErrorKind::kInvalidArgument, "JSON schema: unknown type '{}' at {}", type, path);
  }

  Symbol reference(const Json& ref, const std::string& path, int32_t depth) {
    if (!ref.is_string()) fail(ErrorKind::kInvalidArgument, "JSON schema: '$ref' must be a string at {}", path);
    const std::string target = ref.get<std::string>();
    if (const auto it = refs_.find(target); it != refs_.end()) return GrammarBuilder::rule(it->second);
    const Json* resolved = nullptr;
    if (target == "#") {
      resolved = &root_;
    } else {
      for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
        const std::string p = prefix;
        if (target.rfind(p, 0) != 0) continue;
        const std::string container = p.substr(2, p.size() - 3);
        const std::string name = target.substr(p.size());
        const auto defs = root_.find(container);
        if (defs != root_.end() && defs->is_object() && defs->contains(name)) resolved = &(*defs)[name];
      }
    }
    if (!resolved)
      fail(ErrorKind::kUnsupported, "JSON schema: '$ref' {} at {} (only #, #/$defs/NAME and #/definitions/NAME "
           "of this schema are supported)", ref.dump(), path);
    // Declared before it is compiled, so that a recursive reference finds it.
    const int32_t rule = builder_.declare_rule("ref " + target);
    refs_.emplace(target, rule);
    const Symbol body = compile(*resolved, target.substr(1), depth + 1);
    builder_.add_alternative(rule, {body});
    return GrammarBuilder::rule(rule);
  }

  Symbol literal_value(const Json& value, const std::string& path) {
    (void)path;
    return builder_.alternatives({builder_.literal(value.dump())}, "const");
  }

  Symbol enumeration(const Json& values, const std::string& path) {
    if (!values.is_array() || values.empty())
      fail(ErrorKind::kInvalidArgument, "JSON schema: 'enum' must be a non-empty list at {}", path);
    std::vector<Sequence> options;
    for (const Json& value : values) options.push_back(builder_.literal(value.dump()));
    return builder_.alternatives(options, "enum");
  }

  Symbol any_of(const Json& schemas, const std::string& path, int32_t depth) {
    if (!schemas.is_array() || schemas.empty())
      fail(ErrorKind::kInvalidArgument, "JSON schema: expected a non-empty list at {}", path);
    std::vector<Sequence> options;
    for (size_t i = 0; i < schemas.size(); ++i)
      options.push_back({compile(schemas[i], path + "/" + std::to_string(i), depth + 1)});
    return builder_.alternatives(options, path);
  }

  Symbol string_character() {
    if (!string_char_) {
      CodepointSet unescaped;
      unescaped.add(0x20, kMaxCodepoint);
      CodepointSet unsafe;
      unsafe.add('"', '"');
      unsafe.add('\\', '\\');
      CodepointSet safe;  // unescaped minus unsafe
      const CodepointSet rest = unsafe.complement();
      for (const auto& [first, last] : rest.ranges())
        if (last >= 0x20) safe.add(std::max<uint32_t>(first, 0x20), last);
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
    }
    return *string_char_;
  }

  static int64_t read_count(const Json& schema, const char* key, int64_t fallback, const std::string& path) {
    const auto it = schema.find(key);
    if (it == schema.end()) return fallback;
    if (!it->is_number_integer() || it->get<int64_t>() < 0)
      fail(ErrorKind::kInvalidArgument, "JSON schema: '{}' must be a non-negative integer at {}", key, path);
    return it->get<int64_t>();
  }

  Symbol string(const Json& schema, const std::string& path) {
    const Symbol quote = builder_.byte('"');
    std::string pattern;
    if (const auto it = schema.find("pattern"); it != schema.end()) {
      if (!it->is_string()) fail(ErrorKind::kInvalidArgument, "JSON schema: 'pattern' must be a string at {}", path);
      pattern = it->get<std::string>();
      if (!pattern.empty() && pattern.front() == '^') pattern.erase(0, 1);
      if (!pattern.empty() && pattern.back() == '$' && (pattern.size() < 2 || pattern[pattern.size() - 2] != '\\')) pattern.pop_back();
    } else if (const auto format = schema.find("format"); format != schema.end()) {
      if (!format->is_string()) fail(ErrorKind::kInvalidArgument, "JSON schema: 'format' must be a string at {}", path);
      const auto known = format_patterns().find(format->get<std::string>());
      if (known == format_patterns().end())
        fail(ErrorKind::kUnsupported, "JSON schema: the string format '{}' (at {}) is not supported", format->get<std::string>(), path);
      pattern = known->second;
    }
    if (!pattern.empty() || schema.contains("pattern")) {
      if (schema.contains("minLength") || schema.contains("maxLength"))
        fail(ErrorKind::kUnsupported, "JSON schema: 'pattern' or 'format' together with minLength/maxLength (at {}) is not supported", path);
      RegexOptions options;
      options.json_string = true;
      Symbol content;
      try {
        content = compile_regex(builder_, pattern, options);
      } catch (const Error& error) {
        fail(error.kind(), "JSON schema: 'pattern' at {}: {}", path, error.message());
      }
      return builder_.alternatives({{quote, content, quote}}, "string pattern");
    }
    const int64_t min = read_count(schema, "minLength", 0, path);
    const int64_t max = read_count(schema, "maxLength", -1, path);
    if (max >= 0 && max < min) fail(ErrorKind::kInvalidArgument, "JSON schema: maxLength < minLength at {}", path);
    if (min == 0 && max < 0) {
      if (!plain_string_) plain_string_ = builder_.alternatives({{quote, builder_.star({string_character()}, "string chars"), quote}}, "string");
      return *plain_string_;
    }
    Sequence body{quote};
    Sequence chars = builder_.repeat({string_character()}, min, max, "string chars");
    body.insert(body.end(), chars.begin(), chars.end());
    body.push_back(quote);
    return builder_.alternatives({body}, "string");
  }

  Sequence digits_star() { return {builder_.star({builder_.byte_class(ByteClass::range('0', '9'))}, "digits")}; }

  Sequence integer_part() {
    Sequence nonzero{builder_.byte_class(ByteClass::range('1', '9'))};
    const Sequence rest = digits_star();
    nonzero.insert(nonzero.end(), rest.begin(), rest.end());
    return {builder_.optional({builder_.byte('-')}, "minus"),
            builder_.alternatives({builder_.literal("0"), nonzero}, "integer digits")};
  }

  Symbol integer() {
    if (!integer_) integer_ = builder_.alternatives({integer_part()}, "integer");
    return *integer_;
  }

  Symbol number() {
    if (!number_) {
      const Symbol digit = builder_.byte_class(ByteClass::range('0', '9'));
      Sequence body = integer_part();
      Sequence fraction{builder_.byte('.'), digit};
      const Sequence more = digits_star();
      fraction.insert(fraction.end(), more.begin(), more.end());
      body.push_back(builder_.optional(fraction, "fraction"));
      ByteClass e = ByteClass::of('e');
      e.add('E');
      ByteClass sign = ByteClass::of('+');
      sign.add('-');
      Sequence exponent{builder_.byte_class(e), builder_.optional({builder_.byte_class(sign)}, "exponent sign"), digit};
      exponent.insert(exponent.end(), more.begin(), more.end());
      body.push_back(builder_.optional(exponent, "exponent"));
      number_ = builder_.alternatives({body}, "number");
    }
    return *number_;
  }

  // "key":value
  Sequence member(const std::string& key, Symbol value) {
    Sequence sequence = builder_.literal(Json(key).dump());
    sequence.push_back(builder_.byte(':'));
    sequence.push_back(value);
    return sequence;
  }

  Symbol object(const Json& schema, const std::string& path, int32_t depth) {
    const auto properties_it = schema.find("properties");
    const bool has_properties = properties_it != schema.end();
    if (has_properties && !properties_it->is_object())
      fail(ErrorKind::kInvalidArgument, "JSON schema: 'properties' must be an object at {}", path);
    std::vector<std::string> required;
    if (const auto it = schema.find("required"); it != schema.end()) {
      if (!it->is_array()) fail(ErrorKind::kInvalidArgument, "JSON schema: 'required' must be a list at {}", path);
      for (const Json& name : *it) {
        if (!name.is_string()) fail(ErrorKind::kInvalidArgument, "JSON schema: 'required' entries must be strings at {}", path);
        required.push_back(name.get<std::string>());
      }
    }
    // Additional members: a value schema, or none.
    std::optional<Symbol> additional;
    if (const auto it = schema.find("additionalProperties"); it != schema.end()) {
      if (!(it->is_boolean() && !it->get<bool>())) additional = compile(*it, path + "/additionalProperties", depth + 1);
    } else if (!has_properties) {
      additional = any_value();
    }
    struct Property {
      std::string name;
      Symbol value;
      bool required;
    };
    std::vector<Property> properties;
    if (has_properties)
      for (const auto& [name, value_schema] : properties_it->items())
        properties.push_back({name, compile(value_schema, path + "/properties/" + name, depth + 1),
                              std::find(required.begin(), required.end(), name) != required.end()});
    for (const std::string& name : required) {
      const bool declared = std::any_of(properties.begin(), properties.end(), [&](const Property& p) { return p.name == name; });
      if (!declared) properties.push_back({name, additional ? *additional : any_value(), true});
    }
    // first[i] / later[i]: the members from property i on, with nothing / something written before.
    const size_t n = properties.size();
    std::vector<int32_t> first(n + 1), later(n + 1);
    for (size_t i = 0; i <= n; ++i) {
      first[i] = builder_.declare_rule(path + " members");
      later[i] = builder_.declare_rule(path + " more members");
    }
    if (additional) {
      const Symbol key = string(Json::object(), path);
      Sequence extra{key, builder_.byte(':'), *additional};
      Sequence comma_extra{builder_.byte(',')};
      comma_extra.insert(comma_extra.end(), extra.begin(), extra.end());
      const Symbol more = builder_.star(comma_extra, path + " additional members");
      extra.push_back(more);
      builder_.add_alternative(static_cast<int32_t>(first[n]), extra);
      builder_.add_alternative(first[n], {});
      builder_.add_alternative(later[n], {more});
    } else {
      builder_.add_alternative(first[n], {});
      builder_.add_alternative(later[n], {});
    }
    for (size_t i = n; i-- > 0;) {
      Sequence present = member(properties[i].name, properties[i].value);
      Sequence present_first = present;
      present_first.push_back(GrammarBuilder::rule(later[i + 1]));
      Sequence present_later{builder_.byte(',')};
      present_later.insert(present_later.end(), present.begin(), present.end());
      present_later.push_back(GrammarBuilder::rule(later[i + 1]));
      builder_.add_alternative(first[i], present_first);
      builder_.add_alternative(later[i], present_later);
      if (!properties[i].required) {
        builder_.add_alternative(first[i], {GrammarBuilder::rule(first[i + 1])});
        builder_.add_alternative(later[i], {GrammarBuilder::rule(later[i + 1])});
      }
    }
    return builder_.alternatives({{builder_.byte('{'), GrammarBuilder::rule(first[0]), builder_.byte('}')}}, path + " object");
  }

  Symbol array(const Json& schema, const std::string& path, int32_t depth) {
    std::vector<Symbol> prefix;
    if (const auto it = schema.find("prefixItems"); it != schema.end()) {
      if (!it->is_array()) fail(ErrorKind::kInvalidArgument, "JSON schema: 'prefixItems' must be a list at {}", path);
      for (size_t i = 0; i < it->size(); ++i) prefix.push_back(compile((*it)[i], path + "/prefixItems/" + std::to_string(i), depth + 1));
    }
    std::optional<Symbol> item;
    if (const auto it = schema.find("items"); it != schema.end()) {
      if (!(it->is_boolean() && !it->get<bool>())) item = compile(*it, path + "/items", depth + 1);
    } else {
      item = any_value();
    }
    const int64_t min_items = read_count(schema, "minItems", 0, path);
    const int64_t max_items = read_count(schema, "maxItems", -1, path);
    if (max_items >= 0 && max_items < min_items) fail(ErrorKind::kInvalidArgument, "JSON schema: maxItems < minItems at {}", path);
    const auto num_prefix = static_cast<int64_t>(prefix.size());
    if (max_items >= 0 && num_prefix > max_items)
      fail(ErrorKind::kUnsupported, "JSON schema: more prefixItems than maxItems at {}", path);
    // The prefix items always come (a valid subset of what minItems allows), then the rest.
    Sequence body{builder_.byte('[')};
    for (size_t i = 0; i < prefix.size(); ++i) {
      if (i > 0) body.push_back(builder_.byte(','));
      body.push_back(prefix[i]);
    }
    const int64_t rest_min = std::max<int64_t>(min_items - num_prefix, 0);
    const int64_t rest_max = max_items < 0 ? -1 : max_items - num_prefix;
    if (!item && rest_min > 0) fail(ErrorKind::kInvalidArgument, "JSON schema: minItems needs more items than allowed at {}", path);
    if (item && rest_max != 0) {
      if (prefix.empty()) {
        // item ("," item){rest_min-1, rest_max-1}, optional when rest_min == 0
        Sequence items{*item};
        const Sequence more = builder_.repeat({builder_.byte(','), *item}, std::max<int64_t>(rest_min - 1, 0),
                                              rest_max < 0 ? -1 : rest_max - 1, path + " items");
        items.insert(items.end(), more.begin(), more.end());
        if (rest_min == 0) body.push_back(builder_.optional(items, path + " items?"));
        else body.insert(body.end(), items.begin(), items.end());
      } else {
        const Sequence more = builder_.repeat({builder_.byte(','), *item}, rest_min, rest_max, path + " items");
        body.insert(body.end(), more.begin(), more.end());
      }
    }
    body.push_back(builder_.byte(']'));
    return builder_.alternatives({body}, path + " array");
  }

 public:
  Symbol any_value() {
    if (any_value_) return *any_value_;
    const int32_t value = builder_.declare_rule("value");
    any_value_ = GrammarBuilder::rule(value);
    const Symbol str = string(Json::object(), "");
    const Symbol val = *any_value_;
    Sequence member_seq{str, builder_.byte(':'), val};
    Sequence more_members{builder_.byte(',')};
    more_members.insert(more_members.end(), member_seq.begin(), member_seq.end());
    Sequence members = member_seq;
    members.push_back(builder_.star(more_members, "more members"));
    const Symbol object_rule = builder_.alternatives(
        {{builder_.byte('{'), builder_.optional(members, "members"), builder_.byte('}')}}, "object");
    Sequence elements{val, builder_.star({builder_.byte(','), val}, "more elements")};
    const Symbol array_rule = builder_.alternatives(
        {{builder_.byte('['), builder_.optional(elements, "elements"), builder_.byte(']')}}, "array");
    any_object_ = object_rule;
    for (const Sequence& option : std::vector<Sequence>{{object_rule}, {array_rule}, {str}, {number()},
                                                         builder_.literal("true"), builder_.literal("false"),
                                                         builder_.literal("null")})
      builder_.add_alternative(value, option);
    return val;
  }
  Symbol any_object() {
    any_value();
    return *any_object_;
  }

 private:
  GrammarBuilder& builder_;
  const Json& root_;
  std::map<std::string, int32_t> refs_;
  std::optional<Symbol> string_char_, plain_string_, integer_, number_, any_value_, any_object_;
};

}  // namespace

Grammar json_schema_grammar(const Json& schema, GrammarLimits limits) {
  GrammarBuilder builder(limits);
  SchemaCompiler compiler(builder, schema);
  const Symbol root = compiler.compile(schema, "", 0);
  const int32_t start = builder.declare_rule("root");
  builder.add_alternative(start, {root});
  return builder.build(start);
}

Grammar json_object_grammar(GrammarLimits limits) {
  GrammarBuilder builder(limits);
  const Json empty = Json::object();
  SchemaCompiler compiler(builder, empty);
  const Symbol object = compiler.any_object();
  const int32_t start = builder.declare_rule("root");
  builder.add_alternative(start, {object});
  return builder.build(start);
}

Grammar choice_grammar(const std::vector<std::string>& choices, GrammarLimits limits) {
  if (choices.empty()) fail(ErrorKind::kInvalidArgument, "the list of choices is empty");
  GrammarBuilder builder(limits);
  std::vector<Sequence> options;
  for (const std::string& choice : choices) options.push_back(builder.literal(choice));
  const Symbol symbol = builder.alternatives(options, "choice");
  return builder.build(symbol.id);
}

}  // namespace loom::grammar
