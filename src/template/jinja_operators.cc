// Operators and element access with Python's semantics.
#include <charconv>
#include <cmath>

#include <fmt/format.h>

#include "template/jinja_builtins.h"

namespace loom::jinja {
namespace {

constexpr size_t kMaxRepeatedSize = size_t{16} << 20;  // "x" * n: bound what a template can allocate

const char* kind_name(const Value& value) {
  if (value.is_undefined()) return "Undefined";
  if (!value.is_json()) return value.is_callable() ? "function" : "namespace";
  return python_type_name(value.json());
}

bool numeric(const Value& value) { return value.is_json() && (value.json().is_number() || value.json().is_boolean()); }
bool integral(const Value& value) {
  return value.is_json() && (value.json().is_number_integer() || value.json().is_boolean());
}
int64_t as_integer(const Value& value) {
  return value.json().is_boolean() ? int64_t{value.json().get<bool>()} : value.json().get<int64_t>();
}

[[noreturn]] void unsupported(std::string_view op, const Value& left, const Value& right) {
  if (left.is_undefined() || right.is_undefined()) {
    const Value& undefined = left.is_undefined() ? left : right;
    eval_fail(undefined.name().empty() ? std::string("undefined value in '") + std::string(op) + "'"
                                       : fmt::format("'{}' is undefined", undefined.name()));
  }
  eval_fail(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, kind_name(left), kind_name(right)));
}

Value repeat(const Value& sequence, int64_t count) {
  size_t element_size = sequence.is_string() ? sequence.json().get_ref<const std::string&>().size() : sequence.json().size();
  if (count <= 0 || element_size == 0) return sequence.is_string() ? Value(Json("")) : Value(Json::array());
  if (static_cast<uint64_t>(count) > kMaxRepeatedSize / element_size) eval_fail("repetition result too large");
  size_t bytes = sequence.is_string() ? element_size : approximate_size(sequence.json());
  if (static_cast<uint64_t>(count) > kMaxAllocatedBytes / bytes) eval_fail("repetition result too large");
  charge_value(bytes * static_cast<size_t>(count));
  if (sequence.is_string()) {
    std::string out;
    for (int64_t i = 0; i < count; ++i) out += sequence.json().get_ref<const std::string&>();
    return Json(out);
  }
  Json out = Json::array();
  for (int64_t i = 0; i < count; ++i)
    for (const auto& item : sequence.json()) out.push_back(item);
  return out;
}

}  // namespace

int64_t checked_add(int64_t a, int64_t b) {
  int64_t result;
  if (__builtin_add_overflow(a, b, &result)) eval_fail("integer overflow");
  return result;
}
int64_t checked_subtract(int64_t a, int64_t b) {
  int64_t result;
  if (__builtin_sub_overflow(a, b, &result)) eval_fail("integer overflow");
  return result;
}
int64_t checked_multiply(int64_t a, int64_t b) {
  int64_t result;
  if (__builtin_mul_overflow(a, b, &result)) eval_fail("integer overflow");
  return result;
}
int64_t checked_negate(int64_t a) { return checked_subtract(0, a); }
int64_t floor_divide(int64_t a, int64_t b) {
  if (b == 0) eval_fail("integer division or modulo by zero");
  if (b == -1) return checked_negate(a);  // INT64_MIN / -1 overflows (and traps)
  int64_t quotient = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --quotient;
  return quotient;
}
int64_t floor_modulo(int64_t a, int64_t b) {
  if (b == 0) eval_fail("modulo by zero");
  if (b == -1) return 0;  // INT64_MIN % -1 traps
  int64_t remainder = a % b;
  if (remainder != 0 && ((remainder < 0) != (b < 0))) remainder += b;
  return remainder;
}
int64_t checked_power(int64_t base, int64_t exponent) {  // exponent >= 0; by squaring
  int64_t result = 1;
  while (exponent > 0) {
    if (exponent & 1) result = checked_multiply(result, base);
    exponent >>= 1;
    if (exponent > 0) base = checked_multiply(base, base);
  }
  return result;
}

Value binary_operation(std::string_view op, const Value& left, const Value& right) {
  if (op == "~") {
    std::string out = left.to_string();
    append_bounded(out, right.to_string());
    return Json(std::move(out));
  }
  if (numeric(left) && numeric(right)) {
    bool integers = integral(left) && integral(right);
    double a = json_number(left.json()), b = json_number(right.json());
    if (op == "+") return integers ? Json(checked_add(as_integer(left), as_integer(right))) : Json(a + b);
    if (op == "-") return integers ? Json(checked_subtract(as_integer(left), as_integer(right))) : Json(a - b);
    if (op == "*") return integers ? Json(checked_multiply(as_integer(left), as_integer(right))) : Json(a * b);
    if (op == "/") {
      if (b == 0) eval_fail("division by zero");
      return Json(a / b);
    }
    if (op == "//" || op == "%") {
      if (b == 0) eval_fail(op == "//" ? "integer division or modulo by zero" : "modulo by zero");
      if (integers) {
        int64_t x = as_integer(left), y = as_integer(right);
        return op == "//" ? Json(floor_divide(x, y)) : Json(floor_modulo(x, y));
      }
      double quotient = std::floor(a / b);
      return op == "//" ? Json(quotient) : Json(a - quotient * b);
    }
    if (op == "**") {
      if (integers && as_integer(right) >= 0) return Json(checked_power(as_integer(left), as_integer(right)));
      return Json(std::pow(a, b));
    }
  }
  if (op == "+" && left.is_string() && right.is_string()) {
    std::string out = left.json().get<std::string>();
    append_bounded(out, right.json().get_ref<const std::string&>());
    return Json(std::move(out));
  }
  if (op == "+" && left.is_list() && right.is_list()) {
    if (left.json().size() + right.json().size() > kMaxValueSize) eval_fail("result too large");
    charge_value(approximate_size(left.json()));
    charge_value(approximate_size(right.json()));
    Json out = left.json();
    for (const auto& item : right.json()) out.push_back(item);
    return out;
  }
  if (op == "*" && (left.is_string() || left.is_list()) && integral(right)) return repeat(left, as_integer(right));
  if (op == "*" && (right.is_string() || right.is_list()) && integral(left)) return repeat(right, as_integer(left));
  unsupported(op, left, right);
}

Value negate(const Value& operand) {
  if (integral(operand)) return Json(checked_negate(as_integer(operand)));
  if (operand.is_number()) return Json(-operand.json().get<double>());
  eval_fail(fmt::format("bad operand type for unary -: '{}'", kind_name(operand)));
}

bool contains(const Value& container, const Value& item) {
  if (container.is_undefined()) return false;
  if (container.is_string()) {
    if (!item.is_string()) eval_fail(fmt::format("'in <string>' requires string as left operand, not {}", kind_name(item)));
    return container.json().get_ref<const std::string&>().find(item.json().get_ref<const std::string&>()) !=
           std::string::npos;
  }
  if (container.is_list()) {
    for (const auto& element : container.json())
      if (item.is_json() && json_equal(element, item.json())) return true;
    return false;
  }
  if (container.is_dict()) return item.is_string() && container.json().contains(item.json().get<std::string>());
  if (container.kind() == Value::Kind::kNamespace)
    return item.is_string() && container.namespace_object()->attributes.count(item.json().get<std::string>()) > 0;
  eval_fail(fmt::format("argument of type '{}' is not iterable", kind_name(container)));
}

Value get_attribute(const Value& object, const std::string& name) {
  if (object.is_dict()) {
    auto found = object.json().find(name);
    if (found != object.json().end()) return object.element(*found);
  } else if (object.kind() == Value::Kind::kNamespace) {
    auto& attributes = object.namespace_object()->attributes;
    auto found = attributes.find(name);
    if (found != attributes.end()) return *found->second;
  }
  return Value::undefined(name);
}

Value get_item(const Value& object, const Value& key) {
  if ((object.is_list() || object.is_string()) && integral(key)) {
    int64_t index = as_integer(key);
    if (object.is_list()) {
      int64_t size = static_cast<int64_t>(object.json().size());
      if (index < 0) index += size;
      if (index < 0 || index >= size) return Value::undefined();
      return object.element(object.json()[static_cast<size_t>(index)]);
    }
    std::vector<std::string> characters = utf8_characters(object.json().get_ref<const std::string&>());
    int64_t size = static_cast<int64_t>(characters.size());
    if (index < 0) index += size;
    if (index < 0 || index >= size) return Value::undefined();
    return Json(characters[static_cast<size_t>(index)]);
  }
  if (key.is_string()) return get_attribute(object, key.json().get<std::string>());
  if (object.is_dict() && key.is_json()) {
    auto found = object.json().find(python_str(key.json()));  // JSON keys are strings: d[1] finds "1"
    if (found != object.json().end()) return object.element(*found);
  }
  return Value::undefined();
}

Value get_slice(const Value& object, const Value* start, const Value* stop, const Value* step) {
  if (object.is_undefined()) return Value::undefined();
  if (!object.is_list() && !object.is_string()) eval_fail(fmt::format("'{}' object is not subscriptable", kind_name(object)));
  auto bound = [](const Value* value, int64_t fallback) {
    if (!value || value->is_none()) return fallback;
    if (!integral(*value)) eval_fail("slice indices must be integers or None");
    return as_integer(*value);
  };
  std::vector<std::string> characters;
  int64_t size;
  if (object.is_string()) {
    characters = utf8_characters(object.json().get_ref<const std::string&>());
    size = static_cast<int64_t>(characters.size());
  } else {
    size = static_cast<int64_t>(object.json().size());
  }
  int64_t stride = bound(step, 1);
  if (stride == 0) eval_fail("slice step cannot be zero");
  // Python's slice.indices (PySlice_AdjustIndices), then a count of the
  // selected elements, so that no index is ever stepped past the sequence.
  auto clamp = [&](int64_t index) {
    if (index < 0) {
      index = index < -size ? (stride < 0 ? -1 : 0) : index + size;
    } else if (index >= size) {
      index = stride < 0 ? size - 1 : size;
    }
    return index;
  };
  int64_t first = start && !start->is_none() ? clamp(bound(start, 0)) : (stride < 0 ? size - 1 : 0);
  int64_t last = stop && !stop->is_none() ? clamp(bound(stop, 0)) : (stride < 0 ? -1 : size);
  // first and last lie in [-1, size]: their difference cannot overflow.
  uint64_t count = 0;
  if (stride > 0 && first < last) count = static_cast<uint64_t>(last - first - 1) / static_cast<uint64_t>(stride) + 1;
  if (stride < 0 && first > last)
    count = static_cast<uint64_t>(first - last - 1) / (uint64_t{0} - static_cast<uint64_t>(stride)) + 1;
  std::string text;
  Json list = Json::array();
  int64_t i = first;
  for (uint64_t n = 0; n < count; ++n) {
    if (object.is_string()) text += characters[static_cast<size_t>(i)];
    else list.push_back(object.json()[static_cast<size_t>(i)]);
    if (n + 1 < count) i += stride;  // stays inside the sequence: the count says so
  }
  return object.is_string() ? Value(Json(text)) : Value(list);
}

std::vector<Value> iterate_values(const Value& value) {
  std::vector<Value> items;
  if (value.is_list()) {
    items.reserve(value.json().size());
    for (const auto& item : value.json()) items.push_back(value.element(item));
    return items;
  }
  for (auto& item : iterate(value)) items.emplace_back(std::move(item));
  return items;
}

std::vector<Json> iterate(const Value& value) {
  std::vector<Json> items;
  if (value.is_undefined()) return items;
  if (value.is_list()) {
    items.assign(value.json().begin(), value.json().end());
  } else if (value.is_dict()) {
    for (const auto& [key, item] : value.json().items()) items.emplace_back(key);
  } else if (value.is_string()) {
    for (auto& character : utf8_characters(value.json().get_ref<const std::string&>())) items.emplace_back(character);
  } else {
    eval_fail(fmt::format("'{}' object is not iterable", kind_name(value)));
  }
  return items;
}

Value get_attribute_path(const Value& object, const std::string& path) {
  Value current = object;
  size_t begin = 0;
  while (true) {
    size_t end = path.find('.', begin);
    std::string part = path.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    bool is_index = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    if (is_index) {
      int64_t index = 0;
      auto [end_of_number, error] = std::from_chars(part.data(), part.data() + part.size(), index);
      current = error == std::errc() ? get_item(current, Json(index)) : Value::undefined();  // too large: no such item
    } else {
      current = get_attribute(current, part);
    }
    if (end == std::string::npos) return current;
    begin = end + 1;
  }
}

}  // namespace loom::jinja
