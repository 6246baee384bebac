// Objects and arrays of the JSON-schema compiler (schema_compiler.h).
#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <set>

#include "grammar/regex_compiler.h"
#include "grammar/schema_compiler.h"
#include "util/error.h"

namespace loom::grammar {
namespace {

using Json = SchemaCompiler::Json;

// Member counts tracked for minProperties / maxProperties (states per property).
constexpr int64_t kMaxCountedMembers = 64;
// Item values tracked for uniqueItems (2^n states: items in any order).
constexpr size_t kMaxUniqueValues = 8;
// Beyond that, items in the order of the values (n^2 alternatives per item count).
constexpr size_t kMaxOrderedUniqueValues = 64;
constexpr int64_t kMaxOrderedUniqueElements = 200000;

std::string where(const std::string& path) { return path.empty() ? "the root" : path; }

Sequence concat(Sequence a, const Sequence& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

// The key of an additional member under `propertyNames` (a string schema), or
// nullopt when no key is allowed.
std::optional<Symbol> SchemaCompiler::property_key(const Json& schema, const std::string& path) {
  if (schema.is_boolean()) return schema.get<bool>() ? std::optional<Symbol>(plain_string()) : std::nullopt;
  if (!schema.is_object()) fail(ErrorKind::kInvalidArgument, "JSON schema: expected an object at {}", where(path));
  std::vector<Json> values;
  if (const auto it = schema.find("const"); it != schema.end()) values.push_back(*it);
  if (const auto it = schema.find("enum"); it != schema.end() && it->is_array()) values.assign(it->begin(), it->end());
  if (schema.contains("const") || schema.contains("enum")) {
    std::vector<Sequence> options;
    for (const Json& value : values)
      if (value.is_string()) options.push_back(builder_.literal(value.dump()));
    if (options.empty()) return std::nullopt;
    return builder_.alternatives(options, "property name");
  }
  for (const char* key : {"$ref", "anyOf", "oneOf", "allOf", "not"})
    if (schema.contains(key)) unenforceable("propertyNames", path);
  return string(schema, path);
}

Symbol SchemaCompiler::object(const Json& schema, const std::string& path, int32_t depth) {
  const auto properties_it = schema.find("properties");
  const bool has_properties = properties_it != schema.end();
  if (has_properties && !properties_it->is_object())
    fail(ErrorKind::kInvalidArgument, "JSON schema: 'properties' must be an object at {}", where(path));
  const auto patterns_it = schema.find("patternProperties");
  if (patterns_it != schema.end() && !patterns_it->is_object())
    fail(ErrorKind::kInvalidArgument, "JSON schema: 'patternProperties' must be an object at {}", where(path));
  bool has_patterns = patterns_it != schema.end() && !patterns_it->empty();
  std::vector<std::string> required;
  if (const auto it = schema.find("required"); it != schema.end()) {
    if (!it->is_array()) fail(ErrorKind::kInvalidArgument, "JSON schema: 'required' must be a list at {}", where(path));
    for (const Json& name : *it) {
      if (!name.is_string()) fail(ErrorKind::kInvalidArgument, "JSON schema: 'required' entries must be strings at {}", where(path));
      required.push_back(name.get<std::string>());
    }
  }
  // A declared name may match a pattern (then both schemas apply): not checked.
  if (has_patterns && has_properties) {
    unenforceable("patternProperties", path);
    has_patterns = false;
  }
  // The members beyond `properties`: (key, value) kinds, any number of them.
  std::vector<Sequence> extra_kinds;
  std::optional<Symbol> additional;  // the value of a member named in `required` only
  if (has_patterns) {
    // Only pattern-named members (a subset: other names may be allowed too).
    for (const auto& [regex, value_schema] : patterns_it->items()) {
      RegexOptions options;
      options.json_string = true;
      std::string anchored = regex;
      if (!anchored.empty() && anchored.front() == '^') anchored.erase(0, 1);
      if (!anchored.empty() && anchored.back() == '$' && (anchored.size() < 2 || anchored[anchored.size() - 2] != '\\'))
        anchored.pop_back();
      Symbol key_content;
      try {
        key_content = compile_regex(builder_, anchored, options);
      } catch (const Error& error) {
        fail(error.kind(), "JSON schema: 'patternProperties' key at {}: {}", where(path), error.message());
      }
      const Symbol value = compile(value_schema, path + "/patternProperties/" + regex, depth + 1);
      extra_kinds.push_back({builder_.byte('"'), key_content, builder_.byte('"'), builder_.byte(':'), value});
    }
  } else if (const auto it = schema.find("additionalProperties"); it != schema.end()) {
    if (!(it->is_boolean() && !it->get<bool>())) additional = compile(*it, path + "/additionalProperties", depth + 1);
  } else if (!has_properties) {
    additional = any_value();
  }
  std::optional<Symbol> key = plain_string();
  if (const auto names = schema.find("propertyNames"); names != schema.end()) {
    // Enforced on additional members' keys; declared or pattern names are not checked against it.
    if (has_properties || has_patterns || !required.empty()) unenforceable("propertyNames", path);
    else key = property_key(*names, path + "/propertyNames");
  }
  if (additional && key) extra_kinds.push_back({*key, builder_.byte(':'), *additional});

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
  const auto n = static_cast<int64_t>(properties.size());
  const auto num_required = std::count_if(properties.begin(), properties.end(), [](const Property& p) { return p.required; });

  // Member counts: only what changes the language is tracked.
  int64_t min_members = read_count(schema, "minProperties", 0, path);
  int64_t max_members = read_count(schema, "maxProperties", -1, path);
  if (max_members >= 0 && max_members < min_members)
    fail(ErrorKind::kInvalidArgument, "JSON schema: maxProperties < minProperties at {}", where(path));
  if (min_members <= num_required) min_members = 0;
  if (max_members >= 0 && extra_kinds.empty() && max_members >= n) max_members = -1;
  if (std::max(min_members, max_members) > kMaxCountedMembers) {
    if (min_members > kMaxCountedMembers) unenforceable("minProperties", path);
    if (max_members > kMaxCountedMembers) unenforceable("maxProperties", path);
    min_members = 0;
    max_members = -1;
  }
  // state(i, c): the members from property i on, c written so far (capped at
  // `cap`: more than that changes nothing). Counts 0 / more than 0 decide the comma.
  const int64_t cap = std::max<int64_t>({max_members, min_members, 1});
  const auto capped = [&](int64_t c) { return std::min(c, cap); };
  // feasible[i][c]: whether state(i, c) can finish (rules must not be empty).
  std::vector<std::vector<char>> feasible(static_cast<size_t>(n + 1), std::vector<char>(static_cast<size_t>(cap + 1), 0));
  const auto room = [&](int64_t c) { return max_members < 0 || c < max_members; };
  for (int64_t c = 0; c <= cap; ++c)
    feasible[n][c] = c >= min_members || (!extra_kinds.empty() && (max_members < 0 || max_members >= min_members));
  for (int64_t i = n - 1; i >= 0; --i)
    for (int64_t c = 0; c <= cap; ++c)
      feasible[i][c] = (room(c) && feasible[i + 1][capped(c + 1)]) || (!properties[i].required && feasible[i + 1][c]);
  if (!feasible[0][0]) fail(ErrorKind::kInvalidArgument, "JSON schema: no object satisfies the member counts at {}", where(path));

  std::vector<std::vector<int32_t>> state(static_cast<size_t>(n + 1), std::vector<int32_t>(static_cast<size_t>(cap + 1), -1));
  const Symbol comma = builder_.byte(',');
  std::optional<Symbol> extra;
  if (!extra_kinds.empty()) extra = builder_.alternatives(extra_kinds, path + " additional member");
  // Built on demand from the end, so that only reachable states exist.
  std::function<Symbol(int64_t, int64_t)> rule_for = [&](int64_t i, int64_t c) -> Symbol {
    int32_t& id = state[i][c];
    if (id >= 0) return GrammarBuilder::rule(id);
    id = builder_.declare_rule(path + (c == 0 ? " members" : " more members"));
    const int32_t self = id;
    if (i == n) {
      const int64_t at_least = std::max<int64_t>(min_members - c, 0);
      const int64_t at_most = max_members < 0 ? -1 : max_members - c;
      if (at_least == 0) builder_.add_alternative(self, {});
      if (extra && at_most != 0) {
        if (c == 0) {
          const Sequence rest = builder_.repeat({comma, *extra}, std::max<int64_t>(at_least - 1, 0),
                                                at_most < 0 ? -1 : at_most - 1, path + " additional members");
          builder_.add_alternative(self, concat({*extra}, rest));
        } else {
          builder_.add_alternative(self, builder_.repeat({comma, *extra}, std::max<int64_t>(at_least, 1), at_most,
                                                         path + " additional members"));
        }
      }
      return GrammarBuilder::rule(self);
    }
    const Property& property = properties[static_cast<size_t>(i)];
    if (room(c) && feasible[i + 1][capped(c + 1)]) {
      Sequence present = builder_.literal(Json(property.name).dump());
      present.push_back(builder_.byte(':'));
      present.push_back(property.value);
      if (c > 0) present.insert(present.begin(), comma);
      present.push_back(rule_for(i + 1, capped(c + 1)));
      builder_.add_alternative(self, present);
    }
    if (!property.required && feasible[i + 1][c]) builder_.add_alternative(self, {rule_for(i + 1, c)});
    return GrammarBuilder::rule(self);
  };
  const Symbol members = rule_for(0, 0);
  return builder_.alternatives({{builder_.byte('{'), members, builder_.byte('}')}}, path + " object");
}

// The JSON texts of every value `schema` allows, when they are few (enum,
// const, boolean, null, an integer range of at most kMaxOrderedUniqueValues,
// through $ref), distinct as JSON values (1 and 1.0 are one); nullopt otherwise.
std::optional<std::vector<std::string>> SchemaCompiler::finite_values(const Json& schema, int32_t depth) {
  if (!schema.is_object() || depth > 8) return std::nullopt;
  if (const auto ref = schema.find("$ref"); ref != schema.end()) {
    const Json* target = ref->is_string() ? resolve(ref->get<std::string>()) : nullptr;
    return target ? finite_values(*target, depth + 1) : std::nullopt;
  }
  std::vector<Json> values;
  const Json type = schema.value("type", Json());
  if (const auto it = schema.find("const"); it != schema.end()) {
    values.push_back(*it);
  } else if (const auto list = schema.find("enum"); list != schema.end() && list->is_array()) {
    values.assign(list->begin(), list->end());
  } else if (type == "boolean") {
    values = {Json(true), Json(false)};
  } else if (type == "null") {
    values = {Json(nullptr)};
  } else if (type == "integer") {
    const NumberBounds bounds = number_bounds(schema, "");
    if (!bounds.lo || !bounds.hi || std::abs(*bounds.lo) > 1e15 || std::abs(*bounds.hi) > 1e15) return std::nullopt;
    const auto lo = static_cast<int64_t>(bounds.lo_exclusive ? std::floor(*bounds.lo) + 1 : std::ceil(*bounds.lo));
    const auto hi = static_cast<int64_t>(bounds.hi_exclusive ? std::ceil(*bounds.hi) - 1 : std::floor(*bounds.hi));
    if (hi < lo || hi - lo >= static_cast<int64_t>(kMaxOrderedUniqueValues)) return std::nullopt;
    for (int64_t value = lo; value <= hi; ++value) values.push_back(value);
  } else {
    return std::nullopt;
  }
  std::vector<Json> distinct;
  for (Json& value : values)
    if (std::find(distinct.begin(), distinct.end(), value) == distinct.end()) distinct.push_back(std::move(value));
  std::vector<std::string> texts;
  for (const Json& value : distinct) texts.push_back(value.dump());
  return texts;
}

// Arrays of distinct values out of `values`, in any order: one state per set
// of values written so far.
Symbol SchemaCompiler::unique_array(const std::vector<std::string>& values, int64_t min_items, int64_t max_items,
                                    const std::string& path) {
  const size_t k = values.size();
  const int64_t most = max_items < 0 ? static_cast<int64_t>(k) : std::min<int64_t>(max_items, static_cast<int64_t>(k));
  if (min_items > most) fail(ErrorKind::kInvalidArgument, "JSON schema: minItems needs more distinct items than allowed at {}", where(path));
  std::vector<Sequence> literals;
  for (const std::string& value : values) literals.push_back(builder_.literal(value));
  std::vector<int32_t> rules(size_t{1} << k, -1);
  std::function<Symbol(uint32_t)> after = [&](uint32_t used) -> Symbol {
    int32_t& id = rules[used];
    if (id >= 0) return GrammarBuilder::rule(id);
    id = builder_.declare_rule(path + " unique items");
    const int32_t self = id;
    const int64_t count = std::popcount(used);
    if (count >= min_items) builder_.add_alternative(self, {builder_.byte(']')});
    if (count < most)
      for (size_t j = 0; j < k; ++j)
        if (!(used & (1u << j)))
          builder_.add_alternative(self, concat(concat({builder_.byte(',')}, literals[j]), {after(used | (1u << j))}));
    return GrammarBuilder::rule(self);
  };
  std::vector<Sequence> first;
  if (min_items == 0) first.push_back({builder_.byte('['), builder_.byte(']')});
  if (most > 0)
    for (size_t j = 0; j < k; ++j) first.push_back(concat(concat({builder_.byte('[')}, literals[j]), {after(1u << j)}));
  return builder_.alternatives(first, path + " unique array");
}

// Arrays of distinct values out of `values`, each item after the one before
// it in `values` (a subset of the unique arrays, linear in the items instead
// of exponential): one state per (last value, items written, capped where more
// change nothing). nullopt when that is over kMaxOrderedUniqueElements.
std::optional<Symbol> SchemaCompiler::ordered_unique_array(const std::vector<std::string>& values, int64_t min_items,
                                                           int64_t max_items, const std::string& path) {
  const auto k = static_cast<int64_t>(values.size());
  const int64_t most = max_items < 0 ? k : std::min(max_items, k);
  if (min_items > most) fail(ErrorKind::kInvalidArgument, "JSON schema: minItems needs more distinct items than allowed at {}", where(path));
  // Counts past `cap` behave alike: past minItems when there is no maxItems.
  const int64_t cap = max_items < 0 ? std::max<int64_t>(min_items, 1) : most;
  int64_t literal_bytes = 0;
  for (const std::string& value : values) literal_bytes += static_cast<int64_t>(value.size()) + 2;
  if (cap * k * literal_bytes > kMaxOrderedUniqueElements) return std::nullopt;
  std::vector<Sequence> literals;
  for (const std::string& value : values) literals.push_back(builder_.literal(value));
  // Whether an array whose last item is value `last` and that has `count` items can reach minItems.
  const auto feasible = [&](int64_t last, int64_t count) { return count + (k - 1 - last) >= min_items; };
  std::vector<int32_t> rules(static_cast<size_t>(k * (cap + 1)), -1);
  std::function<Symbol(int64_t, int64_t)> after = [&](int64_t last, int64_t count) -> Symbol {
    int32_t& id = rules[static_cast<size_t>(last * (cap + 1) + count)];
    if (id >= 0) return GrammarBuilder::rule(id);
    id = builder_.declare_rule(path + " ordered unique items");
    const int32_t self = id;
    if (count >= min_items) builder_.add_alternative(self, {builder_.byte(']')});
    if (max_items < 0 || count < most) {
      const int64_t next = std::min(count + 1, cap);
      for (int64_t j = last + 1; j < k; ++j)
        if (feasible(j, count + 1))
          builder_.add_alternative(self, concat(concat({builder_.byte(',')}, literals[static_cast<size_t>(j)]), {after(j, next)}));
    }
    return GrammarBuilder::rule(self);
  };
  std::vector<Sequence> first;
  if (min_items == 0) first.push_back({builder_.byte('['), builder_.byte(']')});
  if (most > 0)
    for (int64_t j = 0; j < k; ++j)
      if (feasible(j, 1))
        first.push_back(concat(concat({builder_.byte('[')}, literals[static_cast<size_t>(j)]), {after(j, std::min<int64_t>(1, cap))}));
  return builder_.alternatives(first, path + " ordered unique array");
}

Symbol SchemaCompiler::array(const Json& schema, const std::string& path, int32_t depth) {
  std::vector<Symbol> prefix;
  const auto prefix_it = schema.find("prefixItems");
  if (prefix_it != schema.end()) {
    if (!prefix_it->is_array()) fail(ErrorKind::kInvalidArgument, "JSON schema: 'prefixItems' must be a list at {}", where(path));
    for (size_t i = 0; i < prefix_it->size(); ++i)
      prefix.push_back(compile((*prefix_it)[i], path + "/prefixItems/" + std::to_string(i), depth + 1));
  }
  const auto items_it = schema.find("items");
  const int64_t min_items = read_count(schema, "minItems", 0, path);
  const int64_t max_items = read_count(schema, "maxItems", -1, path);
  if (max_items >= 0 && max_items < min_items) fail(ErrorKind::kInvalidArgument, "JSON schema: maxItems < minItems at {}", where(path));
  const auto unique = schema.find("uniqueItems");
  if (unique != schema.end() && !unique->is_boolean())
    fail(ErrorKind::kInvalidArgument, "JSON schema: 'uniqueItems' must be a boolean at {}", where(path));
  if (unique != schema.end() && unique->get<bool>() && (max_items < 0 || max_items > 1)) {
    std::optional<std::vector<std::string>> values;
    if (prefix.empty() && items_it != schema.end()) values = finite_values(*items_it, 0);
    if (values && values->size() <= kMaxUniqueValues) return unique_array(*values, min_items, max_items, path);
    if (values && values->size() <= kMaxOrderedUniqueValues)
      if (const std::optional<Symbol> ordered = ordered_unique_array(*values, min_items, max_items, path)) return *ordered;
    // Items of an open set (strings, numbers, objects): telling them apart needs the whole array, which
    // no context-free grammar holds (xgrammar and llguidance do not enforce it either).
    unenforceable("uniqueItems", path);
  }
  std::optional<Symbol> item;
  if (items_it != schema.end()) {
    if (!(items_it->is_boolean() && !items_it->get<bool>())) item = compile(*items_it, path + "/items", depth + 1);
  } else {
    item = any_value();
  }
  const auto num_prefix = static_cast<int64_t>(prefix.size());
  if (max_items >= 0 && num_prefix > max_items)
    fail(ErrorKind::kUnsupported, "JSON schema: more prefixItems than maxItems at {}", where(path));
  // The prefix items always come (a valid subset of what minItems allows), then the rest.
  Sequence body{builder_.byte('[')};
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (i > 0) body.push_back(builder_.byte(','));
    body.push_back(prefix[i]);
  }
  const int64_t rest_min = std::max<int64_t>(min_items - num_prefix, 0);
  const int64_t rest_max = max_items < 0 ? -1 : max_items - num_prefix;
  if (!item && rest_min > 0) fail(ErrorKind::kInvalidArgument, "JSON schema: minItems needs more items than allowed at {}", where(path));
  if (item && rest_max != 0) {
    if (prefix.empty()) {
      // item ("," item){rest_min-1, rest_max-1}, optional when rest_min == 0
      const Sequence items = concat({*item}, builder_.repeat({builder_.byte(','), *item}, std::max<int64_t>(rest_min - 1, 0),
                                                              rest_max < 0 ? -1 : rest_max - 1, path + " items"));
      if (rest_min == 0) body.push_back(builder_.optional(items, path + " items?"));
      else body.insert(body.end(), items.begin(), items.end());
    } else {
      body = concat(body, builder_.repeat({builder_.byte(','), *item}, rest_min, rest_max, path + " items"));
    }
  }
  body.push_back(builder_.byte(']'));
  return builder_.alternatives({body}, path + " array");
}

}  // namespace loom::grammar
