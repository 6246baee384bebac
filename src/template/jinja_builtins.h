// Jinja's operators, filters, tests, methods and global functions (internal to
// src/template). Pure functions of their arguments: each throws EvalError
// (which the renderer turns into "template line N: ...") on a bad argument.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "template/jinja_value.h"

namespace loom::jinja {

// Python's str.isspace() for one ASCII character.
bool is_ascii_space(char c);
// str.strip() / lstrip() / rstrip() without arguments: ASCII whitespace off
// the left and / or the right end.
std::string strip_whitespace(const std::string& text, bool left, bool right);

// The evaluated arguments of a call, filter or test.
struct CallArguments {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// Binds CallArguments to a signature: parameter i is positional[i] or the
// keyword of that name. Throws on a keyword not in `parameters`, on a
// parameter given twice, and on more positional arguments than parameters.
class BoundArguments {
 public:
  BoundArguments(const CallArguments& arguments, std::string_view callee, std::vector<std::string_view> parameters);
  // The argument for parameter `index`, or nullptr when not given.
  const Value* get(size_t index) const { return values_[index]; }
  // The argument, or `fallback` when not given.
  Value get_or(size_t index, Value fallback) const { return values_[index] ? *values_[index] : std::move(fallback); }
  // The argument as a JSON value of the expected type; throws when missing and required.
  const Value& required(size_t index) const;
  std::string string_or(size_t index, std::string fallback) const;
  int64_t integer_or(size_t index, int64_t fallback) const;
  bool bool_or(size_t index, bool fallback) const;

 private:
  std::string callee_;
  std::vector<std::string_view> parameters_;
  std::vector<const Value*> values_;
};

// ---- operators (jinja_operators.cc) ----
// Integer arithmetic that throws EvalError("integer overflow") instead of
// overflowing (Python ints are unbounded; Loom's are 64-bit); // and % with
// Python's floor semantics.
int64_t checked_add(int64_t a, int64_t b);
int64_t checked_subtract(int64_t a, int64_t b);
int64_t checked_multiply(int64_t a, int64_t b);
int64_t checked_negate(int64_t a);
int64_t floor_divide(int64_t a, int64_t b);
int64_t floor_modulo(int64_t a, int64_t b);
int64_t checked_power(int64_t base, int64_t exponent);  // exponent >= 0
Value binary_operation(std::string_view op, const Value& left, const Value& right);  // + - * / // % ** ~
Value negate(const Value& operand);
bool contains(const Value& container, const Value& item);  // item in container
// x.name: a dict's key or a namespace's attribute; Undefined when missing
// (also for x Undefined: lenient, where jinja2 would raise).
Value get_attribute(const Value& object, const std::string& name);
// x[key]: list/string index (negative from the end), dict key; Undefined when missing.
Value get_item(const Value& object, const Value& key);
// x[start:stop:step] on lists and strings, with Python's rules.
Value get_slice(const Value& object, const Value* start, const Value* stop, const Value* step);
// The items a for loop visits: a list's elements, a dict's keys, a string's
// characters; nothing for Undefined. Throws for other values.
std::vector<Json> iterate(const Value& value);
// The same without copying a list's elements.
std::vector<Value> iterate_values(const Value& value);
// "a.b.0" attribute paths of selectattr/map/sort(attribute=...).
Value get_attribute_path(const Value& object, const std::string& path);

// ---- filters and tests (jinja_filters.cc, jinja_tests.cc) ----
Value apply_filter(const std::string& name, const Value& input, const CallArguments& arguments);
bool apply_test(const std::string& name, const Value& input, const CallArguments& arguments);

// ---- methods and global functions (jinja_methods.cc) ----
// object.name(arguments) for str, dict and list methods ("strip", "get", "items", ...).
Value call_method(const Value& object, const std::string& name, const CallArguments& arguments);
bool is_global_function(std::string_view name);  // range, namespace, dict, raise_exception, strftime_now
// raise_exception throws EvalError with its message.
Value call_global_function(const std::string& name, const CallArguments& arguments);

}  // namespace loom::jinja
