// Filters ("x | name(args)") with jinja2 3.1's semantics, tojson as
// transformers overrides it (json.dumps, key order kept, no HTML escaping).
#include <algorithm>
#include <cmath>
#include <functional>
#include <unordered_map>

#include <fmt/format.h>

#include "template/jinja_builtins.h"

namespace loom::jinja {

BoundArguments::BoundArguments(const CallArguments& arguments, std::string_view callee,
                               std::vector<std::string_view> parameters)
    : callee_(callee), parameters_(std::move(parameters)), values_(parameters_.size(), nullptr) {
  if (arguments.positional.size() > parameters_.size())
    eval_fail(fmt::format("{} takes at most {} argument(s), got {}", callee_, parameters_.size(),
                          arguments.positional.size()));
  for (size_t i = 0; i < arguments.positional.size(); ++i) values_[i] = &arguments.positional[i];
  for (const auto& [name, value] : arguments.keyword) {
    auto found = std::find(parameters_.begin(), parameters_.end(), name);
    if (found == parameters_.end()) eval_fail(fmt::format("{} got an unexpected keyword argument '{}'", callee_, name));
    size_t index = static_cast<size_t>(found - parameters_.begin());
    if (values_[index]) eval_fail(fmt::format("{} got multiple values for argument '{}'", callee_, name));
    values_[index] = &value;
  }
}

const Value& BoundArguments::required(size_t index) const {
  if (!values_[index]) eval_fail(fmt::format("{} is missing argument '{}'", callee_, parameters_[index]));
  return *values_[index];
}

std::string BoundArguments::string_or(size_t index, std::string fallback) const {
  if (!values_[index] || values_[index]->is_none()) return fallback;
  if (!values_[index]->is_string()) eval_fail(fmt::format("{}: '{}' must be a string", callee_, parameters_[index]));
  return values_[index]->json().get<std::string>();
}

int64_t BoundArguments::integer_or(size_t index, int64_t fallback) const {
  if (!values_[index]) return fallback;
  const Value& value = *values_[index];
  if (value.is_json() && value.json().is_boolean()) return value.json().get<bool>();
  if (!value.is_integer()) eval_fail(fmt::format("{}: '{}' must be an integer", callee_, parameters_[index]));
  return value.json().get<int64_t>();
}

bool BoundArguments::bool_or(size_t index, bool fallback) const {
  return values_[index] ? values_[index]->truthy() : fallback;
}

namespace {

using Filter = std::function<Value(const Value&, const CallArguments&)>;

std::string text_of(const Value& value) { return value.to_string(); }

std::string ascii_upper(std::string text) {
  for (char& c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return text;
}
std::string ascii_lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string replace_all(const std::string& text, const std::string& old, const std::string& replacement, int64_t count) {
  std::string out;
  size_t position = 0;
  int64_t done = 0;
  if (old.empty()) {  // Python inserts the replacement between characters
    for (const auto& character : utf8_characters(text)) {
      if (count < 0 || done < count) { append_bounded(out, replacement); ++done; }
      append_bounded(out, character);
    }
    if (count < 0 || done < count) append_bounded(out, replacement);
    return out;
  }
  while (count < 0 || done < count) {
    size_t found = text.find(old, position);
    if (found == std::string::npos) break;
    append_bounded(out, std::string_view(text).substr(position, found - position));
    append_bounded(out, replacement);
    position = found + old.size();
    ++done;
  }
  append_bounded(out, std::string_view(text).substr(position));
  return out;
}

std::vector<std::string> split_lines(const std::string& text) {  // Python's str.splitlines() for \n, \r\n, \r
  std::vector<std::string> lines;
  std::string line;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\n' || text[i] == '\r') {
      if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      lines.push_back(line);
      line.clear();
    } else {
      line += text[i];
    }
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

size_t indent_width(int64_t width) {  // Python: " " * -1 is ""
  if (width > static_cast<int64_t>(kMaxValueSize)) eval_fail("indent: width too large");
  return width < 0 ? 0 : static_cast<size_t>(width);
}

Value do_indent(const Value& input, const CallArguments& arguments) {
  BoundArguments bound(arguments, "indent", {"width", "first", "blank"});
  std::string indentation = bound.get(0) && bound.get(0)->is_string() ? bound.get(0)->json().get<std::string>()
                                                                       : std::string(indent_width(bound.integer_or(0, 4)), ' ');
  std::vector<std::string> lines = split_lines(text_of(input) + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      append_bounded(out, "\n");
      if (bound.bool_or(2, false) || !lines[i].empty()) append_bounded(out, indentation);
    }
    append_bounded(out, lines[i]);
  }
  if (bound.bool_or(1, false)) {
    std::string indented = indentation;
    append_bounded(indented, out);
    out = std::move(indented);
  }
  return Json(out);
}

std::string title_case(const std::string& text) {  // jinja2's title: words start after spaces - ( { [ <
  std::string out;
  bool word_start = true;
  for (char c : text) {
    unsigned char u = static_cast<unsigned char>(c);
    out += static_cast<char>(word_start ? std::toupper(u) : std::tolower(u));
    word_start = is_ascii_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
  }
  return out;
}

// Sort key: strings lowercased unless case_sensitive.
Json sort_key(const Json& value, bool case_sensitive) {
  if (!case_sensitive && value.is_string()) return ascii_lower(value.get<std::string>());
  return value;
}

Json attribute_or_self(const Json& item, const Value* attribute) {
  if (!attribute) return item;
  Value value = get_attribute_path(item, attribute->to_string());
  return value.require_json("attribute");
}

Value do_sort(const Value& input, const CallArguments& arguments) {
  BoundArguments bound(arguments, "sort", {"reverse", "case_sensitive", "attribute"});
  std::vector<Json> items = iterate(input);
  bool case_sensitive = bound.bool_or(1, false);
  std::vector<std::pair<Json, Json>> keyed;
  for (auto& item : items) keyed.emplace_back(sort_key(attribute_or_self(item, bound.get(2)), case_sensitive), item);
  bool reverse = bound.bool_or(0, false);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? json_less(b.first, a.first) : json_less(a.first, b.first);
  });
  Json out = Json::array();
  for (auto& [key, item] : keyed) out.push_back(std::move(item));
  return out;
}

Value do_unique(const Value& input, const CallArguments& arguments) {
  BoundArguments bound(arguments, "unique", {"case_sensitive", "attribute"});
  std::vector<Json> seen;
  Json out = Json::array();
  for (auto& item : iterate(input)) {
    Json key = sort_key(attribute_or_self(item, bound.get(1)), bound.bool_or(0, false));
    charge_steps(1 + static_cast<int64_t>(seen.size() / 64));  // quadratic: bounded by the step budget
    if (std::any_of(seen.begin(), seen.end(), [&](const Json& other) { return json_equal(other, key); })) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return out;
}

Value do_dictsort(const Value& input, const CallArguments& arguments) {
  BoundArguments bound(arguments, "dictsort", {"case_sensitive", "by", "reverse"});
  if (!input.is_dict()) eval_fail("dictsort needs a dict");
  std::string by = bound.string_or(1, "key");
  if (by != "key" && by != "value") eval_fail("dictsort: 'by' must be 'key' or 'value'");
  Json pairs = Json::array();
  for (const auto& [key, value] : input.json().items()) pairs.push_back(Json::array({key, value}));
  std::vector<Json> items(pairs.begin(), pairs.end());
  bool case_sensitive = bound.bool_or(0, false), reverse = bound.bool_or(2, false);
  size_t index = by == "key" ? 0 : 1;
  std::stable_sort(items.begin(), items.end(), [&](const Json& a, const Json& b) {
    Json x = sort_key(a[index], case_sensitive), y = sort_key(b[index], case_sensitive);
    return reverse ? json_less(y, x) : json_less(x, y);
  });
  return Json(items);
}

// select/reject/selectattr/rejectattr: filter_arguments after the attribute are (test name, test args...).
Value select(const Value& input, const CallArguments& arguments, bool by_attribute, bool keep_when) {
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (arguments.positional.empty()) eval_fail("selectattr/rejectattr need an attribute name");
    attribute = arguments.positional[next++].to_string();
  }
  std::string test;
  CallArguments test_arguments;
  if (next < arguments.positional.size()) test = arguments.positional[next++].to_string();
  for (; next < arguments.positional.size(); ++next) test_arguments.positional.push_back(arguments.positional[next]);
  test_arguments.keyword = arguments.keyword;
  Json out = Json::array();
  for (auto& item : iterate(input)) {
    Value subject = by_attribute ? get_attribute_path(item, attribute) : Value(item);
    bool passed = test.empty() ? subject.truthy() : apply_test(test, subject, test_arguments);
    if (passed == keep_when) out.push_back(item);
  }
  return out;
}

Value do_map(const Value& input, const CallArguments& arguments) {
  Json out = Json::array();
  const Value* attribute = nullptr;
  const Value* fallback = nullptr;
  for (const auto& [name, value] : arguments.keyword) {
    if (name == "attribute") attribute = &value;
    else if (name == "default") fallback = &value;
  }
  if (attribute) {
    for (auto& item : iterate(input)) {
      Value value = get_attribute_path(item, attribute->to_string());
      if (value.is_undefined() && fallback) value = *fallback;
      out.push_back(value.is_undefined() ? Json() : value.require_json("map"));
    }
    return out;
  }
  if (arguments.positional.empty()) eval_fail("map needs a filter name or attribute=");
  std::string filter = arguments.positional[0].to_string();
  CallArguments filter_arguments;
  filter_arguments.positional.assign(arguments.positional.begin() + 1, arguments.positional.end());
  filter_arguments.keyword = arguments.keyword;
  for (auto& item : iterate(input)) out.push_back(apply_filter(filter, item, filter_arguments).require_json("map"));
  return out;
}

Value do_join(const Value& input, const CallArguments& arguments) {
  BoundArguments bound(arguments, "join", {"d", "attribute"});
  std::string separator = bound.get(0) ? bound.get(0)->to_string() : "";
  std::string out;
  bool first = true;
  for (auto& item : iterate(input)) {
    if (!first) append_bounded(out, separator);
    first = false;
    append_bounded(out, bound.get(1) ? get_attribute_path(item, bound.get(1)->to_string()).to_string() : python_str(item));
  }
  return Json(out);
}

Value do_default(const Value& input, const CallArguments& arguments) {
  BoundArguments bound(arguments, "default", {"default_value", "boolean"});
  bool use_default = input.is_undefined() || (bound.bool_or(1, false) && !input.truthy());
  return use_default ? bound.get_or(0, Json("")) : input;
}

Value do_round(const Value& input, const CallArguments& arguments) {
  BoundArguments bound(arguments, "round", {"precision", "method"});
  int64_t precision = bound.integer_or(0, 0);
  std::string method = bound.string_or(1, "common");
  if (!input.is_number() && !(input.is_json() && input.json().is_boolean())) eval_fail("round needs a number");
  if (method == "common" && input.is_integer()) return input;  // Python's round(int, n) is the int
  double scale = std::pow(10.0, static_cast<double>(precision));
  double value = json_number(input.json()) * scale;
  if (method == "common") value = std::nearbyint(value);  // round half to even, as Python's round
  else if (method == "floor") value = std::floor(value);
  else if (method == "ceil") value = std::ceil(value);
  else eval_fail("round: method must be 'common', 'ceil' or 'floor'");
  return Json(value / scale);
}

int64_t double_to_integer(double value) {  // Python's int(float), within 64 bits
  if (std::isnan(value)) eval_fail("cannot convert float NaN to integer");
  double truncated = std::trunc(value);
  if (!(truncated >= -9223372036854775808.0 && truncated < 9223372036854775808.0)) eval_fail("integer overflow");
  return static_cast<int64_t>(truncated);
}

Value do_int(const Value& input, const CallArguments& arguments) {
  BoundArguments bound(arguments, "int", {"default", "base"});
  Value fallback = bound.get_or(0, Json(0));
  if (input.is_json() && input.json().is_boolean()) return Json(int64_t{input.json().get<bool>()});
  if (input.is_integer()) return input;
  if (input.is_number()) return Json(double_to_integer(input.json().get<double>()));
  if (input.is_string()) {
    std::string text = strip_whitespace(input.json().get<std::string>(), true, true);
    try {
      size_t used = 0;
      int64_t value = std::stoll(text, &used, static_cast<int>(bound.integer_or(1, 10)));
      if (used == text.size()) return Json(value);
      size_t used_float = 0;
      double number = std::stod(text, &used_float);
      if (used_float == text.size()) return Json(double_to_integer(number));
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

Value do_float(const Value& input, const CallArguments& arguments) {
  BoundArguments bound(arguments, "float", {"default"});
  if (input.is_json() && (input.json().is_number() || input.json().is_boolean())) return Json(json_number(input.json()));
  if (input.is_string()) {
    std::string text = strip_whitespace(input.json().get<std::string>(), true, true);
    try {
      size_t used = 0;
      double value = std::stod(text, &used);
      if (used == text.size()) return Json(value);
    } catch (const std::exception&) {
    }
  }
  return bound.get_or(0, Json(0.0));
}

Value do_length(const Value& input, const CallArguments&) {
  if (input.is_undefined()) return Json(0);
  if (input.is_string()) return Json(static_cast<int64_t>(utf8_length(input.json().get_ref<const std::string&>())));
  if (input.is_list() || input.is_dict()) return Json(static_cast<int64_t>(input.json().size()));
  if (input.kind() == Value::Kind::kNamespace) return Json(static_cast<int64_t>(input.namespace_object()->attributes.size()));
  eval_fail(fmt::format("object of type '{}' has no len()", input.is_json() ? python_repr(input.json()) : "value"));
}

Value do_items(const Value& input, const CallArguments&) {
  Json out = Json::array();
  if (input.is_undefined()) return out;
  if (!input.is_dict()) eval_fail("items needs a dict");
  for (const auto& [key, value] : input.json().items()) out.push_back(Json::array({key, value}));
  return out;
}

Value do_tojson(const Value& input, const CallArguments& arguments) {
  BoundArguments bound(arguments, "tojson", {"indent", "ensure_ascii", "separators", "sort_keys"});
  if (bound.bool_or(1, false)) eval_fail("tojson: ensure_ascii=True is not supported");
  if (bound.bool_or(3, false)) eval_fail("tojson: sort_keys=True is not supported");
  if (bound.get(2) && !bound.get(2)->is_none()) eval_fail("tojson: separators are not supported");
  int64_t indent = bound.get(0) && !bound.get(0)->is_none() ? bound.integer_or(0, -1) : -1;
  if (indent > INT32_MAX) eval_fail("tojson: indent too large");
  if (indent < 0) indent = -1;  // None
  return Json(python_json_dumps(input.require_json("tojson"), static_cast<int>(indent)));
}

Value do_escape(const Value& input, const CallArguments&) {
  std::string out;
  for (char c : input.to_string()) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return Json(out);
}

Value do_batch(const Value& input, const CallArguments& arguments) {
  BoundArguments bound(arguments, "batch", {"linecount", "fill_with"});
  int64_t size = bound.integer_or(0, 0);
  if (size <= 0) eval_fail("batch: linecount must be positive");
  Json out = Json::array(), current = Json::array();
  for (auto& item : iterate(input)) {
    current.push_back(item);
    if (static_cast<int64_t>(current.size()) == size) out.push_back(std::exchange(current, Json::array()));
  }
  if (!current.empty()) {
    if (bound.get(1))
    {
      const Json& fill = bound.get(1)->require_json("batch");
      uint64_t missing = static_cast<uint64_t>(size) - current.size();
      if (missing > kMaxValueSize / approximate_size(fill)) eval_fail("batch: result too large");
      charge_value(static_cast<size_t>(missing) * approximate_size(fill));
      while (static_cast<int64_t>(current.size()) < size) current.push_back(fill);
    }
    out.push_back(current);
  }
  return out;
}

Value extreme(const Value& input, const CallArguments& arguments, bool maximum) {
  BoundArguments bound(arguments, maximum ? "max" : "min", {"case_sensitive", "attribute"});
  std::vector<Json> items = iterate(input);
  if (items.empty()) return Value::undefined();
  const Json* best = &items[0];
  Json best_key = sort_key(attribute_or_self(items[0], bound.get(1)), bound.bool_or(0, false));
  for (const auto& item : items) {
    Json key = sort_key(attribute_or_self(item, bound.get(1)), bound.bool_or(0, false));
    if (maximum ? json_less(best_key, key) : json_less(key, best_key)) {
      best = &item;
      best_key = key;
    }
  }
  return *best;
}

Value do_sum(const Value& input, const CallArguments& arguments) {
  BoundArguments bound(arguments, "sum", {"attribute", "start"});
  Value total = bound.get_or(1, Json(0));
  for (auto& item : iterate(input)) total = binary_operation("+", total, attribute_or_self(item, bound.get(0)));
  return total;
}

Value first_or_last(const Value& input, bool first) {
  if (input.is_undefined()) return Value::undefined();
  std::vector<Json> items = iterate(input);
  if (items.empty()) return Value::undefined();
  return first ? items.front() : items.back();
}

const std::unordered_map<std::string_view, Filter>& filters() {
  static const auto* table = new std::unordered_map<std::string_view, Filter>{
      {"tojson", do_tojson},
      {"trim", [](const Value& v, const CallArguments& a) {
         BoundArguments bound(a, "trim", {"chars"});
         return call_method(Json(text_of(v)), "strip", a);
       }},
      {"length", do_length},
      {"count", do_length},
      {"items", do_items},
      {"keys", [](const Value& v, const CallArguments& a) { return call_method(v, "keys", a); }},
      {"values", [](const Value& v, const CallArguments& a) { return call_method(v, "values", a); }},
      {"first", [](const Value& v, const CallArguments&) { return first_or_last(v, true); }},
      {"last", [](const Value& v, const CallArguments&) { return first_or_last(v, false); }},
      {"join", do_join},
      {"upper", [](const Value& v, const CallArguments&) { return Value(Json(ascii_upper(text_of(v)))); }},
      {"lower", [](const Value& v, const CallArguments&) { return Value(Json(ascii_lower(text_of(v)))); }},
      {"title", [](const Value& v, const CallArguments&) { return Value(Json(title_case(text_of(v)))); }},
      {"capitalize", [](const Value& v, const CallArguments&) {
         std::string text = ascii_lower(text_of(v));
         if (!text.empty()) text[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(text[0])));
         return Value(Json(text));
       }},
      {"replace", [](const Value& v, const CallArguments& a) {
         BoundArguments bound(a, "replace", {"old", "new", "count"});
         return Value(Json(replace_all(text_of(v), bound.required(0).to_string(), bound.required(1).to_string(),
                                       bound.get(2) && !bound.get(2)->is_none() ? bound.integer_or(2, -1) : -1)));
       }},
      {"default", do_default},
      {"d", do_default},
      {"list", [](const Value& v, const CallArguments&) { return Value(Json(iterate(v))); }},
      {"selectattr", [](const Value& v, const CallArguments& a) { return select(v, a, true, true); }},
      {"rejectattr", [](const Value& v, const CallArguments& a) { return select(v, a, true, false); }},
      {"select", [](const Value& v, const CallArguments& a) { return select(v, a, false, true); }},
      {"reject", [](const Value& v, const CallArguments& a) { return select(v, a, false, false); }},
      {"map", do_map},
      {"string", [](const Value& v, const CallArguments&) { return Value(Json(text_of(v))); }},
      {"int", do_int},
      {"float", do_float},
      {"abs", [](const Value& v, const CallArguments&) {
         if (v.is_integer()) return Value(Json(v.json().get<int64_t>() < 0 ? checked_negate(v.json().get<int64_t>()) : v.json().get<int64_t>()));
         if (v.is_number()) return Value(Json(std::fabs(v.json().get<double>())));
         eval_fail("abs needs a number");
       }},
      {"round", do_round},
      {"safe", [](const Value& v, const CallArguments&) { return v; }},
      {"escape", do_escape},
      {"e", do_escape},
      {"indent", do_indent},
      {"batch", do_batch},
      {"unique", do_unique},
      {"sort", do_sort},
      {"dictsort", do_dictsort},
      {"reverse", [](const Value& v, const CallArguments&) {
         if (v.is_string()) {
           auto characters = utf8_characters(v.json().get_ref<const std::string&>());
           std::string out;
           for (auto it = characters.rbegin(); it != characters.rend(); ++it) out += *it;
           return Value(Json(out));
         }
         std::vector<Json> items = iterate(v);
         std::reverse(items.begin(), items.end());
         return Value(Json(items));
       }},
      {"sum", do_sum},
      {"min", [](const Value& v, const CallArguments& a) { return extreme(v, a, false); }},
      {"max", [](const Value& v, const CallArguments& a) { return extreme(v, a, true); }},
      {"wordcount", [](const Value& v, const CallArguments&) {
         int64_t words = 0;
         bool in_word = false;
         for (char c : text_of(v)) {
           bool word_char = !is_ascii_space(c);
           words += word_char && !in_word;
           in_word = word_char;
         }
         return Value(Json(words));
       }},
  };
  return *table;
}

}  // namespace


Value apply_filter(const std::string& name, const Value& input, const CallArguments& arguments) {
  auto found = filters().find(name);
  if (found == filters().end()) eval_fail(fmt::format("no filter named '{}'", name));
  charge_steps();
  charge_work(input);
  Value result = found->second(input, arguments);
  // What the filter built (a list filter copies its items): charged after the
  // fact, which bounds the total as each call's work is bounded by its input.
  if (result.is_json() && (!input.is_json() || &result.json() != &input.json()))
    charge_value(approximate_size(result.json()));
  return result;
}

}  // namespace loom::jinja
