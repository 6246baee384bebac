#include "template/jinja_value.h"

#include <charconv>
#include <cmath>
#include <utility>

#include <fmt/format.h>

namespace loom::jinja {

void eval_fail(const std::string& message) { throw EvalError(message); }

namespace {
thread_local RenderBudget* current_budget = nullptr;
}

BudgetScope::BudgetScope(RenderBudget& budget) : previous_(std::exchange(current_budget, &budget)) {}
BudgetScope::~BudgetScope() { current_budget = previous_; }

void charge_steps(int64_t steps) {
  if (!current_budget) return;
  current_budget->steps += steps;
  if (current_budget->steps > kMaxSteps)
    eval_fail(fmt::format("template ran more than {} steps (loop iterations, statements and calls)", kMaxSteps));
}

void charge_work(const Value& value) {
  if (!current_budget || !value.is_json()) return;
  const Json& json = value.json();
  if (json.is_string()) charge_steps(static_cast<int64_t>(json.get_ref<const std::string&>().size() / 4096));
  else if (json.is_structured()) charge_steps(static_cast<int64_t>(json.size() / 64));
}

void charge_value(size_t bytes) {
  if (bytes > kMaxValueSize) eval_fail(fmt::format("result too large (more than {} bytes)", kMaxValueSize));
  if (!current_budget) return;
  current_budget->bytes += bytes;
  if (current_budget->bytes > kMaxAllocatedBytes)
    eval_fail(fmt::format("template built more than {} bytes of values", kMaxAllocatedBytes));
}

void append_bounded(std::string& out, std::string_view piece) {
  if (out.size() + piece.size() > kMaxValueSize)
    eval_fail(fmt::format("result too large (more than {} bytes)", kMaxValueSize));
  charge_value(piece.size());
  out += piece;
}

static void add_size(const Json& value, size_t cap, size_t& total) {
  total += 16;
  if (value.is_string()) total += value.get_ref<const std::string&>().size();
  if (!value.is_structured()) return;
  for (const auto& item : value) {
    if (total > cap) return;
    add_size(item, cap, total);
  }
}

size_t approximate_size(const Json& value, size_t cap) {
  size_t total = 0;
  add_size(value, cap, total);
  return total;
}

const Json& Value::null_json() {
  static const Json null;
  return null;
}

Value Value::borrowed(const Json& json) {
  Value value;
  value.kind_ = Kind::kJson;
  value.json_ = std::shared_ptr<const Json>(std::shared_ptr<const Json>(), &json);  // aliasing, owns nothing
  return value;
}

Value Value::element(const Json& element) const {
  Value value;
  value.kind_ = Kind::kJson;
  value.json_ = std::shared_ptr<const Json>(json_, &element);  // keeps the whole alive
  return value;
}

Value Value::undefined(std::string name) {
  Value value;
  value.name_ = std::move(name);
  return value;
}

Value Value::from_namespace(std::shared_ptr<NamespaceObject> object) {
  Value value;
  value.kind_ = Kind::kNamespace;
  value.namespace_ = std::move(object);
  return value;
}

Value Value::from_macro(std::shared_ptr<MacroObject> macro) {
  Value value;
  value.kind_ = Kind::kMacro;
  value.macro_ = std::move(macro);
  return value;
}

Value Value::function(std::string name) {
  Value value;
  value.kind_ = Kind::kFunction;
  value.name_ = std::move(name);
  return value;
}

const Json& Value::require_json(std::string_view what) const {
  if (kind_ == Kind::kJson) return json();
  if (kind_ == Kind::kUndefined) {
    if (name_.empty()) eval_fail(fmt::format("{} got an undefined value", what));
    eval_fail(fmt::format("'{}' is undefined", name_));
  }
  eval_fail(fmt::format("{} needs data, not a {}", what,
                        kind_ == Kind::kNamespace ? "namespace" : kind_ == Kind::kMacro ? "macro" : "function"));
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined: return false;
    case Kind::kNamespace:
    case Kind::kMacro:
    case Kind::kFunction: return true;
    case Kind::kJson: break;
  }
  switch (json().type()) {
    case Json::value_t::null: return false;
    case Json::value_t::boolean: return json().get<bool>();
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return json().get<int64_t>() != 0;
    case Json::value_t::number_float: return json().get<double>() != 0.0;
    case Json::value_t::string: return !json().get_ref<const std::string&>().empty();
    case Json::value_t::array:
    case Json::value_t::object: return !json().empty();
    default: return true;
  }
}

std::string Value::to_string() const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kJson: return python_str(json());
    case Kind::kNamespace: return "<Namespace>";
    case Kind::kMacro: return "<Macro>";
    case Kind::kFunction: return "<function " + name_ + ">";
  }
  return "";
}

std::string Value::repr() const { return kind_ == Kind::kJson ? python_repr(json()) : to_string(); }

double json_number(const Json& value) {
  if (value.is_boolean()) return value.get<bool>() ? 1.0 : 0.0;
  return value.get<double>();
}

static bool is_numeric(const Json& value) { return value.is_number() || value.is_boolean(); }

bool json_equal(const Json& left, const Json& right) {
  if (is_numeric(left) && is_numeric(right)) {
    if (left.is_number_float() || right.is_number_float()) return json_number(left) == json_number(right);
    auto as_int = [](const Json& v) { return v.is_boolean() ? int64_t{v.get<bool>()} : v.get<int64_t>(); };
    return as_int(left) == as_int(right);
  }
  if (left.type() != right.type()) return false;
  if (left.is_array()) {
    if (left.size() != right.size()) return false;
    for (size_t i = 0; i < left.size(); ++i)
      if (!json_equal(left[i], right[i])) return false;
    return true;
  }
  if (left.is_object()) {
    if (left.size() != right.size()) return false;
    for (const auto& [key, item] : left.items()) {
      auto found = right.find(key);
      if (found == right.end() || !json_equal(item, *found)) return false;
    }
    return true;
  }
  return left == right;
}

bool values_equal(const Value& left, const Value& right) {
  if (left.is_json() && right.is_json()) return json_equal(left.json(), right.json());
  if (left.kind() != right.kind()) return false;
  switch (left.kind()) {
    case Value::Kind::kUndefined: return true;  // jinja2: every Undefined equals every other
    case Value::Kind::kNamespace: return left.namespace_object() == right.namespace_object();
    case Value::Kind::kMacro: return left.macro() == right.macro();
    case Value::Kind::kFunction: return left.name() == right.name();
    case Value::Kind::kJson: break;
  }
  return false;
}

const char* python_type_name(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null: return "NoneType";
    case Json::value_t::boolean: return "bool";
    case Json::value_t::string: return "str";
    case Json::value_t::array: return "list";
    case Json::value_t::object: return "dict";
    case Json::value_t::number_float: return "float";
    default: return "int";
  }
}

bool json_less(const Json& left, const Json& right) {
  if (is_numeric(left) && is_numeric(right)) {
    if (left.is_number_float() || right.is_number_float()) return json_number(left) < json_number(right);
    auto as_int = [](const Json& v) { return v.is_boolean() ? int64_t{v.get<bool>()} : v.get<int64_t>(); };
    return as_int(left) < as_int(right);
  }
  if (left.is_string() && right.is_string())
    return left.get_ref<const std::string&>() < right.get_ref<const std::string&>();  // UTF-8 orders as code points
  if (left.is_array() && right.is_array()) {
    for (size_t i = 0; i < left.size() && i < right.size(); ++i) {
      if (json_less(left[i], right[i])) return true;
      if (json_less(right[i], left[i])) return false;
    }
    return left.size() < right.size();
  }
  eval_fail(fmt::format("'<' not supported between instances of '{}' and '{}'", python_type_name(left),
                        python_type_name(right)));
}

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  // Shortest round-trip digits, then Python's layout: fixed notation when the
  // decimal exponent is in [-4, 16), else "1e+16" / "1e-05".
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  std::string scientific(buffer, result.ptr);
  size_t e = scientific.find('e');
  std::string mantissa = scientific.substr(0, e);
  int exponent = std::stoi(scientific.substr(e + 1));
  bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits += c;
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) {
      out += '.';
      out += digits.substr(1);
    }
    out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out;
  }
  if (exponent < 0) {
    out += "0.";
    out.append(static_cast<size_t>(-exponent - 1), '0');
    return out += digits;
  }
  size_t integer_digits = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= integer_digits) {
    out += digits;
    out.append(integer_digits - digits.size(), '0');
    return out += ".0";
  }
  out += digits.substr(0, integer_digits);
  out += '.';
  return out += digits.substr(integer_digits);
}

static std::string python_string_repr(const std::string& text) {
  char quote = text.find('\'') != std::string::npos && text.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : text) {
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<unsigned char>(quote)) out += std::string("\\") + quote;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  return out + quote;
}

std::string python_repr(const Json& value) {
  switch (value.type()) {
    case Json::value_t::string: return python_string_repr(value.get_ref<const std::string&>());
    case Json::value_t::array: {
      std::string out = "[";
      for (size_t i = 0; i < value.size(); ++i) out += (i ? ", " : "") + python_repr(value[i]);
      return out + "]";
    }
    case Json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, item] : value.items()) {
        out += (first ? "" : ", ") + python_string_repr(key) + ": " + python_repr(item);
        first = false;
      }
      return out + "}";
    }
    default: return python_str(value);
  }
}

std::string python_str(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null: return "None";
    case Json::value_t::boolean: return value.get<bool>() ? "True" : "False";
    case Json::value_t::number_integer: return std::to_string(value.get<int64_t>());
    case Json::value_t::number_unsigned: return std::to_string(value.get<uint64_t>());
    case Json::value_t::number_float: return python_float_repr(value.get<double>());
    case Json::value_t::string: return value.get<std::string>();
    default: return python_repr(value);
  }
}

static void append_json_string(std::string& out, const std::string& text) {
  out += '"';
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += static_cast<char>(c);
    }
  }
  out += '"';
}

static bool deeper_than(const Json& value, int levels) {
  if (!value.is_structured()) return false;
  if (levels == 0) return true;
  for (const auto& item : value) if (deeper_than(item, levels - 1)) return true;
  return false;
}

void check_data_depth(const Json& value, std::string_view what) {
  if (deeper_than(value, kMaxDataDepth)) eval_fail(fmt::format("{} nested deeper than {}", what, kMaxDataDepth));
}

static void dump_json(std::string& out, const Json& value, int indent, int depth) {
  auto newline = [&](int level) {
    if (indent < 0) return;
    out += '\n';
    size_t width = static_cast<size_t>(indent) * static_cast<size_t>(level);
    if (out.size() + width > kMaxValueSize) eval_fail("tojson: result too large");
    out.append(width, ' ');
  };
  const char* item_separator = indent >= 0 ? "," : ", ";
  switch (value.type()) {
    case Json::value_t::null: out += "null"; return;
    case Json::value_t::boolean: out += value.get<bool>() ? "true" : "false"; return;
    case Json::value_t::number_float: {
      double number = value.get<double>();
      if (std::isnan(number)) out += "NaN";
      else if (std::isinf(number)) out += number < 0 ? "-Infinity" : "Infinity";
      else out += python_float_repr(number);
      return;
    }
    case Json::value_t::string: append_json_string(out, value.get_ref<const std::string&>()); return;
    case Json::value_t::array:
      if (value.empty()) { out += "[]"; return; }
      out += '[';
      for (size_t i = 0; i < value.size(); ++i) {
        if (i) out += item_separator;
        newline(depth + 1);
        dump_json(out, value[i], indent, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    case Json::value_t::object: {
      if (value.empty()) { out += "{}"; return; }
      out += '{';
      bool first = true;
      for (const auto& [key, item] : value.items()) {
        if (!first) out += item_separator;
        first = false;
        newline(depth + 1);
        append_json_string(out, key);
        out += ": ";
        dump_json(out, item, indent, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    default: out += python_str(value); return;
  }
}

std::string python_json_dumps(const Json& value, int indent) {
  std::string out;
  dump_json(out, value, indent, 0);
  return out;
}

static size_t utf8_sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xe) return 3;
  if ((lead >> 3) == 0x1e) return 4;
  return 1;  // a stray byte stands for itself
}

std::vector<std::string> utf8_characters(std::string_view text) {
  std::vector<std::string> characters;
  for (size_t i = 0; i < text.size();) {
    size_t length = std::min(utf8_sequence_length(static_cast<unsigned char>(text[i])), text.size() - i);
    characters.emplace_back(text.substr(i, length));
    i += length;
  }
  return characters;
}

size_t utf8_length(std::string_view text) {
  size_t count = 0;
  for (unsigned char c : text) count += (c & 0xc0) != 0x80;
  return count;
}

}  // namespace loom::jinja
