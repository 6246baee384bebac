// Run-time values of the Jinja interpreter (internal to src/template).
//
// A Value is JSON data (nlohmann::ordered_json, so object keys keep the order
// they were given in, as Python dicts do) or one of the few things templates
// create at run time that JSON cannot hold: Undefined (a missing variable,
// key or attribute), a namespace() object, a macro, or a global function.
// Lists and dicts hold JSON only: putting a namespace or macro into a list
// literal is an error.
//
// Python semantics are followed where templates can see them: truthiness,
// == between ints, floats and bools, str() of floats ("1.0", "1e-05"),
// str() of containers (Python repr: "['a', None, True]").
#pragma once

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom::jinja {

using Json = nlohmann::ordered_json;

// An evaluation error without a line; the renderer adds "template line N: ".
class EvalError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
[[noreturn]] void eval_fail(const std::string& message);

struct MacroDefinition;  // jinja_ast.h
class Scope;             // jinja_renderer.h
class Value;

// namespace(): the one mutable object; shared by every Value that refers to it.
struct NamespaceObject {
  std::map<std::string, std::shared_ptr<Value>> attributes;
};

// A macro together with the scope it was defined in (its closure). The scope
// is held weakly: it usually holds the macro, and a strong pointer would make
// a cycle that outlives the render.
struct MacroObject {
  const MacroDefinition* definition = nullptr;  // owned by the template's AST
  std::weak_ptr<Scope> closure;
};

class Value {
 public:
  enum class Kind { kUndefined, kJson, kNamespace, kMacro, kFunction };

  Value() = default;                                      // Undefined
  Value(Json json) : kind_(Kind::kJson), json_(std::make_shared<const Json>(std::move(json))) {}  // NOLINT: implicit on purpose
  // JSON owned elsewhere (the render's context, which outlives the render): not copied.
  static Value borrowed(const Json& json);
  // `element`, a part of this value's JSON: shares it instead of copying.
  Value element(const Json& element) const;
  static Value undefined(std::string name = {});
  static Value from_namespace(std::shared_ptr<NamespaceObject> object);
  static Value from_macro(std::shared_ptr<MacroObject> macro);
  static Value function(std::string name);  // a global such as range or raise_exception

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_json() const { return kind_ == Kind::kJson; }
  // Only for is_json() values.
  const Json& json() const { return json_ ? *json_ : null_json(); }
  // The JSON, or an EvalError naming what `what` needed ("tojson", "a list").
  const Json& require_json(std::string_view what) const;
  // Undefined's variable name, a function's name.
  const std::string& name() const { return name_; }
  const std::shared_ptr<NamespaceObject>& namespace_object() const { return namespace_; }
  const std::shared_ptr<MacroObject>& macro() const { return macro_; }

  bool is_string() const { return is_json() && json().is_string(); }
  bool is_number() const { return is_json() && json().is_number(); }   // never a bool
  bool is_integer() const { return is_json() && json().is_number_integer(); }
  bool is_none() const { return is_json() && json().is_null(); }
  bool is_list() const { return is_json() && json().is_array(); }
  bool is_dict() const { return is_json() && json().is_object(); }
  bool is_callable() const { return kind_ == Kind::kMacro || kind_ == Kind::kFunction; }

  bool truthy() const;            // Python bool()
  std::string to_string() const;  // Python str(); Undefined is ""
  std::string repr() const;       // Python repr()

 private:
  Kind kind_ = Kind::kUndefined;
  static const Json& null_json();
  std::shared_ptr<const Json> json_;  // immutable, so copies of a Value share it
  std::string name_;
  std::shared_ptr<NamespaceObject> namespace_;
  std::shared_ptr<MacroObject> macro_;
};

// The most bytes (of a string) or items (of a list) one value built by a
// template may have; the rendered output too. Bounds what a per-request
// template can allocate.
constexpr size_t kMaxValueSize = size_t{64} << 20;

// What one render may do: kMaxSteps statements, loop iterations and calls,
// and kMaxAllocatedBytes of strings and lists built (counted as they are
// built, so a loop that doubles a string or copies a large list is stopped).
// The renderer installs a RenderBudget for the render's thread; outside a
// render the charges below do nothing.
constexpr int64_t kMaxSteps = 1'000'000;  // about a second of loop iterations; chat templates take thousands
constexpr size_t kMaxAllocatedBytes = size_t{1} << 30;
struct RenderBudget {
  int64_t steps = 0;
  size_t bytes = 0;
};
class BudgetScope {  // installs `budget` for this thread while alive
 public:
  explicit BudgetScope(RenderBudget& budget);
  ~BudgetScope();
  BudgetScope(const BudgetScope&) = delete;
  BudgetScope& operator=(const BudgetScope&) = delete;

 private:
  RenderBudget* previous_;
};
void charge_steps(int64_t steps = 1);
// Steps for an operation that goes over `value` (a filter, a method, "in",
// ==): one per 64 items of a list or dict, one per 4 KiB of a string.
void charge_work(const Value& value);
// Charges `bytes` to the budget; EvalError "result too large" when one value
// would exceed kMaxValueSize bytes or items.
void charge_value(size_t bytes);
// out += piece, bounded by kMaxValueSize and charged.
void append_bounded(std::string& out, std::string_view piece);
// Roughly how many bytes `value` occupies (16 per node plus string bytes),
// counting no further than `cap`.
size_t approximate_size(const Json& value, size_t cap = kMaxAllocatedBytes);

// The deepest nesting of lists and dicts a render accepts (in the context and
// in values a template stores): copying, comparing and printing JSON recurse.
constexpr int kMaxDataDepth = 128;
// EvalError when `value` nests lists/dicts deeper than kMaxDataDepth
// (visits at most that many levels).
void check_data_depth(const Json& value, std::string_view what);

// Python == (1 == 1.0 == True; dicts compare regardless of key order).
bool values_equal(const Value& left, const Value& right);
bool json_equal(const Json& left, const Json& right);
// Python <: numbers with numbers, strings with strings, lists lexicographically;
// anything else is an EvalError.
bool json_less(const Json& left, const Json& right);
// Numbers as double (bools are 0/1); precondition: is_number() or is_boolean().
double json_number(const Json& value);

std::string python_float_repr(double value);
std::string python_repr(const Json& value);
std::string python_str(const Json& value);
// json.dumps(value, ensure_ascii=False, indent=indent) with Python's separators
// (", " and ": "; "," before newlines when indented); indent < 0 means None.
std::string python_json_dumps(const Json& value, int indent = -1);

// UTF-8 strings indexed by code point, as Python str is.
std::vector<std::string> utf8_characters(std::string_view text);
size_t utf8_length(std::string_view text);

// Python's name of a JSON value's type: "NoneType", "bool", "str", "list", "dict", "float", "int".
const char* python_type_name(const Json& value);

}  // namespace loom::jinja
