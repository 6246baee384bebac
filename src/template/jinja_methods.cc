// Python methods templates call on str and dict values, and the globals that
// transformers' apply_chat_template provides (raise_exception, strftime_now)
// beside jinja2's own (range, namespace, dict).
#include <charconv>
#include <algorithm>
#include <ctime>
#include <utility>
#include <unordered_set>

#include <fmt/format.h>

#include "template/jinja_builtins.h"

namespace loom::jinja {
bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string strip_whitespace(const std::string& text, bool left, bool right) {
  size_t begin = 0, end = text.size();
  if (left)
    while (begin < end && is_ascii_space(text[begin])) ++begin;
  if (right)
    while (end > begin && is_ascii_space(text[end - 1])) --end;
  return text.substr(begin, end - begin);
}

namespace {

constexpr int64_t kMaxRange = 100000;  // jinja2's sandbox limit

std::string strip_characters(const std::string& text, const Value* characters, bool left, bool right) {
  if (!characters || characters->is_none()) return strip_whitespace(text, left, right);
  if (!characters->is_string()) eval_fail("strip arg must be None or str");
  std::vector<std::string> set = utf8_characters(characters->json().get_ref<const std::string&>());
  std::vector<std::string> pieces = utf8_characters(text);
  auto in_set = [&](const std::string& piece) { return std::find(set.begin(), set.end(), piece) != set.end(); };
  size_t begin = 0, end = pieces.size();
  if (left)
    while (begin < end && in_set(pieces[begin])) ++begin;
  if (right)
    while (end > begin && in_set(pieces[end - 1])) --end;
  std::string out;
  for (size_t i = begin; i < end; ++i) out += pieces[i];
  return out;
}

bool affix_matches(const std::string& text, const Value& affix, bool prefix) {
  auto matches = [&](const Json& candidate) {
    if (!candidate.is_string()) eval_fail("startswith/endswith need a string or a tuple of strings");
    const std::string& value = candidate.get_ref<const std::string&>();
    if (value.size() > text.size()) return false;
    return prefix ? text.compare(0, value.size(), value) == 0
                  : text.compare(text.size() - value.size(), value.size(), value) == 0;
  };
  const Json& json = affix.require_json("startswith/endswith");
  if (json.is_array()) {
    for (const auto& candidate : json)
      if (matches(candidate)) return true;
    return false;
  }
  return matches(json);
}

Json split(const std::string& text, const Value* separator, int64_t max_split) {
  Json out = Json::array();
  if (!separator || separator->is_none()) {  // runs of whitespace, no empty strings
    size_t i = 0;
    while (true) {
      while (i < text.size() && is_ascii_space(text[i])) ++i;
      if (i >= text.size()) break;
      if (max_split >= 0 && static_cast<int64_t>(out.size()) == max_split) {
        size_t end = text.size();
        while (end > i && is_ascii_space(text[end - 1])) --end;
        out.push_back(text.substr(i, end - i));
        break;
      }
      size_t end = i;
      while (end < text.size() && !is_ascii_space(text[end])) ++end;
      out.push_back(text.substr(i, end - i));
      i = end;
    }
    return out;
  }
  if (!separator->is_string()) eval_fail("split: separator must be a string or None");
  const std::string& delimiter = separator->json().get_ref<const std::string&>();
  if (delimiter.empty()) eval_fail("empty separator");
  size_t position = 0;
  while (max_split < 0 || static_cast<int64_t>(out.size()) < max_split) {
    size_t found = text.find(delimiter, position);
    if (found == std::string::npos) break;
    out.push_back(text.substr(position, found - position));
    position = found + delimiter.size();
  }
  out.push_back(text.substr(position));
  return out;
}

std::string python_title(const std::string& text) {  // str.title: a letter after a non-letter starts a word
  std::string out;
  bool previous_cased = false;
  for (char c : text) {
    unsigned char u = static_cast<unsigned char>(c);
    bool letter = std::isalpha(u);
    out += static_cast<char>(letter ? (previous_cased ? std::tolower(u) : std::toupper(u)) : c);
    previous_cased = letter;
  }
  return out;
}

std::string format_string(const std::string& pattern, const CallArguments& arguments) {
  std::string out;
  size_t automatic = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if ((c == '{' || c == '}') && i + 1 < pattern.size() && pattern[i + 1] == c) {
      out += c;
      ++i;
      continue;
    }
    if (c == '}') eval_fail("single '}' encountered in format string");
    if (c != '{') {
      out += c;
      continue;
    }
    size_t close = pattern.find('}', i);
    if (close == std::string::npos) eval_fail("single '{' encountered in format string");
    std::string field = pattern.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!") != std::string::npos) eval_fail("format specs are not supported in str.format");
    const Value* value = nullptr;
    if (field.empty() || field.find_first_not_of("0123456789") == std::string::npos) {
      size_t index = SIZE_MAX;  // a number too large for size_t is out of range too
      if (field.empty()) index = automatic++;
      else std::from_chars(field.data(), field.data() + field.size(), index);
      if (index >= arguments.positional.size()) eval_fail("Replacement index out of range for positional args tuple");
      value = &arguments.positional[index];
    } else {
      for (const auto& [name, keyword_value] : arguments.keyword)
        if (name == field) value = &keyword_value;
      if (!value) eval_fail(fmt::format("KeyError: '{}'", field));
    }
    append_bounded(out, value->to_string());
    i = close;
  }
  return out;
}

Value string_method(const std::string& text, const std::string& name, const CallArguments& arguments) {
  auto text_json = [](std::string value) { return Value(Json(std::move(value))); };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    BoundArguments bound(arguments, name, {"chars"});
    return text_json(strip_characters(text, bound.get(0), name != "rstrip", name != "lstrip"));
  }
  if (name == "startswith" || name == "endswith") {
    BoundArguments bound(arguments, name, {"prefix"});
    return Json(affix_matches(text, bound.required(0), name == "startswith"));
  }
  if (name == "split") {
    BoundArguments bound(arguments, name, {"sep", "maxsplit"});
    return split(text, bound.get(0), bound.integer_or(1, -1));
  }
  if (name == "upper" || name == "lower") {
    BoundArguments bound(arguments, name, {});
    std::string out = text;
    for (char& c : out)
      c = static_cast<char>(name == "upper" ? std::toupper(static_cast<unsigned char>(c))
                                            : std::tolower(static_cast<unsigned char>(c)));
    return text_json(out);
  }
  if (name == "title") return text_json(python_title(text));
  if (name == "capitalize") {
    std::string out = text;
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
    return text_json(out);
  }
  if (name == "replace") {
    BoundArguments bound(arguments, name, {"old", "new", "count"});
    CallArguments filter_arguments{{bound.required(0), bound.required(1)}, {}};
    if (bound.get(2)) filter_arguments.positional.push_back(*bound.get(2));
    return apply_filter("replace", Json(text), filter_arguments);
  }
  if (name == "format") return text_json(format_string(text, arguments));
  if (name == "join") {
    BoundArguments bound(arguments, name, {"iterable"});
    std::string out;
    bool first = true;
    for (const auto& item : iterate(bound.required(0))) {
      if (!item.is_string()) eval_fail("str.join needs strings");
      if (!first) append_bounded(out, text);
      append_bounded(out, item.get_ref<const std::string&>());
      first = false;
    }
    return text_json(out);
  }
  if (name == "find" || name == "count") {
    BoundArguments bound(arguments, name, {"sub"});
    std::string needle = bound.required(0).to_string();
    if (name == "find") {
      size_t found = text.find(needle);
      return Json(found == std::string::npos ? int64_t{-1} : static_cast<int64_t>(utf8_length(text.substr(0, found))));
    }
    if (needle.empty()) return Json(static_cast<int64_t>(utf8_length(text) + 1));
    int64_t count = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++count;
    return Json(count);
  }
  if (name == "splitlines") {
    Json out = Json::array();
    std::string line;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] != '\n' && text[i] != '\r') {
        line += text[i];
        continue;
      }
      if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      out.push_back(std::exchange(line, std::string()));
    }
    if (!line.empty()) out.push_back(line);
    return out;
  }
  if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum") {
    if (text.empty()) return Json(false);
    for (char c : text) {
      unsigned char u = static_cast<unsigned char>(c);
      bool ok = name == "isdigit" ? std::isdigit(u) : name == "isalpha" ? std::isalpha(u)
                                                      : name == "isspace" ? is_ascii_space(c) : std::isalnum(u);
      if (!ok) return Json(false);
    }
    return Json(true);
  }
  eval_fail(fmt::format("'str' object has no attribute '{}'", name));
}

Value dict_method(const Json& dict, const std::string& name, const CallArguments& arguments) {
  if (name == "get") {
    BoundArguments bound(arguments, name, {"key", "default"});
    Value found = get_item(dict, bound.required(0));
    return found.is_undefined() ? bound.get_or(1, Json()) : found;
  }
  BoundArguments bound(arguments, name, {});
  Json out = Json::array();
  if (name == "items") {
    for (const auto& [key, value] : dict.items()) out.push_back(Json::array({key, value}));
    return out;
  }
  if (name == "keys") {
    for (const auto& [key, value] : dict.items()) out.push_back(key);
    return out;
  }
  if (name == "values") {
    for (const auto& [key, value] : dict.items()) out.push_back(value);
    return out;
  }
  eval_fail(fmt::format("'dict' object has no attribute '{}'", name));
}

}  // namespace

Value call_method(const Value& object, const std::string& name, const CallArguments& arguments) {
  if (object.is_undefined()) {
    if (!object.name().empty()) eval_fail(fmt::format("'{}' is undefined", object.name()));
    eval_fail(fmt::format("cannot call '{}' on an undefined value", name));
  }
  if (object.is_string()) return string_method(object.json().get_ref<const std::string&>(), name, arguments);
  if (object.is_dict()) return dict_method(object.json(), name, arguments);
  if (object.is_list() && (name == "index" || name == "count")) {
    BoundArguments bound(arguments, name, {"value"});
    int64_t count = 0;
    for (size_t i = 0; i < object.json().size(); ++i) {
      if (!json_equal(object.json()[i], bound.required(0).require_json(name))) continue;
      if (name == "index") return Json(static_cast<int64_t>(i));
      ++count;
    }
    if (name == "index") eval_fail("value is not in list");
    return Json(count);
  }
  const char* type = object.is_list() ? "list" : object.is_none() ? "NoneType" : object.is_json() ? "object" : "value";
  eval_fail(fmt::format("'{}' object has no attribute '{}'", type, name));
}

bool is_global_function(std::string_view name) {
  return name == "range" || name == "namespace" || name == "dict" || name == "raise_exception" ||
         name == "strftime_now";
}

Value call_global_function(const std::string& name, const CallArguments& arguments) {
  if (name == "raise_exception") {
    BoundArguments bound(arguments, name, {"message"});
    eval_fail(bound.required(0).to_string());
  }
  if (name == "range") {
    if (!arguments.keyword.empty() || arguments.positional.empty() || arguments.positional.size() > 3)
      eval_fail("range takes 1 to 3 integer arguments");
    std::vector<int64_t> bounds;
    for (const auto& value : arguments.positional) {
      if (!value.is_integer()) eval_fail("range needs integers");
      bounds.push_back(value.json().get<int64_t>());
    }
    int64_t start = bounds.size() == 1 ? 0 : bounds[0];
    int64_t stop = bounds.size() == 1 ? bounds[0] : bounds[1];
    int64_t step = bounds.size() == 3 ? bounds[2] : 1;
    if (step == 0) eval_fail("range() arg 3 must not be zero");
    Json out = Json::array();
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
      if (static_cast<int64_t>(out.size()) >= kMaxRange) eval_fail("range too big");
      out.push_back(i);
      if (__builtin_add_overflow(i, step, &i)) break;  // past INT64_MAX/MIN: past stop too
    }
    return out;
  }
  if (name == "namespace" || name == "dict") {
    if (arguments.positional.size() > 1) eval_fail(fmt::format("{} takes at most one positional argument", name));
    Json attributes = Json::object();
    if (!arguments.positional.empty()) {
      const Json& initial = arguments.positional[0].require_json(name);
      if (!initial.is_object()) eval_fail(fmt::format("{}'s positional argument must be a dict", name));
      attributes = initial;
    }
    if (name == "dict") {
      for (const auto& [key, value] : arguments.keyword) attributes[key] = value.require_json("dict");
      check_data_depth(attributes, "a dict");
      return attributes;
    }
    auto object = std::make_shared<NamespaceObject>();
    check_data_depth(attributes, "a namespace attribute");
    for (const auto& [key, value] : attributes.items()) object->attributes[key] = std::make_shared<Value>(value);
    for (const auto& [key, value] : arguments.keyword) {
      if (value.is_json()) check_data_depth(value.json(), "a namespace attribute");
      object->attributes[key] = std::make_shared<Value>(value);
    }
    return Value::from_namespace(std::move(object));
  }
  if (name == "strftime_now") {
    BoundArguments bound(arguments, name, {"format"});
    std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buffer[256];
    size_t length = std::strftime(buffer, sizeof(buffer), bound.required(0).to_string().c_str(), &local);
    return Json(std::string(buffer, length));
  }
  eval_fail(fmt::format("'{}' is not callable", name));
}

}  // namespace loom::jinja
