// Tests ("x is name(args)") with jinja2 3.1's semantics.
#include <functional>
#include <unordered_map>

#include <fmt/format.h>

#include "template/jinja_builtins.h"

namespace loom::jinja {
namespace {

using Test = std::function<bool(const Value&, const CallArguments&)>;

const Value& only_argument(const CallArguments& arguments, std::string_view test) {
  if (arguments.positional.size() != 1 || !arguments.keyword.empty())
    eval_fail(fmt::format("test '{}' takes one argument", test));
  return arguments.positional[0];
}

bool is_bool(const Value& value) { return value.is_json() && value.json().is_boolean(); }

Test comparison(std::string_view name, std::function<bool(const Value&, const Value&)> compare) {
  return [name, compare](const Value& value, const CallArguments& arguments) {
    return compare(value, only_argument(arguments, name));
  };
}

bool less(const Value& left, const Value& right) {
  return json_less(left.require_json("comparison"), right.require_json("comparison"));
}

bool ascii_case_is(const Value& value, bool upper) {
  std::string text = value.to_string();
  bool has_cased = false;
  for (char c : text) {
    if (std::islower(static_cast<unsigned char>(c))) {
      if (upper) return false;
      has_cased = true;
    } else if (std::isupper(static_cast<unsigned char>(c))) {
      if (!upper) return false;
      has_cased = true;
    }
  }
  return has_cased;
}

const std::unordered_map<std::string_view, Test>& tests() {
  static const auto* table = new std::unordered_map<std::string_view, Test>{
      {"defined", [](const Value& v, const CallArguments&) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, const CallArguments&) { return v.is_undefined(); }},
      {"none", [](const Value& v, const CallArguments&) { return v.is_none(); }},
      {"string", [](const Value& v, const CallArguments&) { return v.is_string(); }},
      {"number", [](const Value& v, const CallArguments&) { return v.is_number() || is_bool(v); }},
      {"integer", [](const Value& v, const CallArguments&) { return v.is_integer(); }},
      {"float", [](const Value& v, const CallArguments&) { return v.is_json() && v.json().is_number_float(); }},
      {"boolean", [](const Value& v, const CallArguments&) { return is_bool(v); }},
      {"true", [](const Value& v, const CallArguments&) { return is_bool(v) && v.json().get<bool>(); }},
      {"false", [](const Value& v, const CallArguments&) { return is_bool(v) && !v.json().get<bool>(); }},
      {"mapping", [](const Value& v, const CallArguments&) { return v.is_dict(); }},
      {"iterable", [](const Value& v, const CallArguments&) {
         return v.is_undefined() || v.is_list() || v.is_dict() || v.is_string();
       }},
      {"sequence", [](const Value& v, const CallArguments&) {
         return v.is_undefined() || v.is_list() || v.is_dict() || v.is_string();
       }},
      {"callable", [](const Value& v, const CallArguments&) { return v.is_callable() || v.is_undefined(); }},  // jinja2's Undefined has __call__
      {"odd", [](const Value& v, const CallArguments&) {
         if (!v.is_integer()) eval_fail("test 'odd' needs an integer");
         return v.json().get<int64_t>() % 2 != 0;
       }},
      {"even", [](const Value& v, const CallArguments&) {
         if (!v.is_integer()) eval_fail("test 'even' needs an integer");
         return v.json().get<int64_t>() % 2 == 0;
       }},
      {"divisibleby", [](const Value& v, const CallArguments& a) {
         const Value& divisor = only_argument(a, "divisibleby");
         if (!v.is_integer() || !divisor.is_integer() || divisor.json().get<int64_t>() == 0)
           eval_fail("test 'divisibleby' needs integers (and a divisor other than 0)");
         return floor_modulo(v.json().get<int64_t>(), divisor.json().get<int64_t>()) == 0;
       }},
      {"equalto", comparison("equalto", values_equal)},
      {"eq", comparison("eq", values_equal)},
      {"==", comparison("==", values_equal)},
      {"ne", comparison("ne", [](const Value& a, const Value& b) { return !values_equal(a, b); })},
      {"!=", comparison("!=", [](const Value& a, const Value& b) { return !values_equal(a, b); })},
      {"lt", comparison("lt", less)},
      {"<", comparison("<", less)},
      {"le", comparison("le", [](const Value& a, const Value& b) { return !less(b, a); })},
      {"<=", comparison("<=", [](const Value& a, const Value& b) { return !less(b, a); })},
      {"gt", comparison("gt", [](const Value& a, const Value& b) { return less(b, a); })},
      {">", comparison(">", [](const Value& a, const Value& b) { return less(b, a); })},
      {"ge", comparison("ge", [](const Value& a, const Value& b) { return !less(a, b); })},
      {">=", comparison(">=", [](const Value& a, const Value& b) { return !less(a, b); })},
      {"in", [](const Value& v, const CallArguments& a) { return contains(only_argument(a, "in"), v); }},
      {"sameas", [](const Value& v, const CallArguments& a) {
         // Python's "is": identical singletons (None, True, False) or the same object.
         const Value& other = only_argument(a, "sameas");
         if (v.is_json() && other.is_json() && (v.json().is_null() || v.json().is_boolean()))
           return v.json() == other.json();
         return !v.is_json() && values_equal(v, other);
       }},
      {"lower", [](const Value& v, const CallArguments&) { return ascii_case_is(v, false); }},
      {"upper", [](const Value& v, const CallArguments&) { return ascii_case_is(v, true); }},
  };
  return *table;
}

}  // namespace


bool apply_test(const std::string& name, const Value& input, const CallArguments& arguments) {
  auto found = tests().find(name);
  if (found == tests().end()) eval_fail(fmt::format("no test named '{}'", name));
  return found->second(input, arguments);
}

}  // namespace loom::jinja
