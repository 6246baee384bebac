#include "template/jinja_renderer.h"

#include <fmt/format.h>

#include "util/error.h"

namespace loom::jinja {
namespace {

constexpr int kMaxCallDepth = 64;  // nested macro calls: templates from model files must not exhaust the stack
// Statements and expressions being rendered, one inside another, macro calls
// included: bounds the renderer's stack (a few KiB a level at most) whatever
// macro recursion and nesting combine to.
constexpr int kMaxRenderDepth = 300;

struct RenderDepthGuard {
  explicit RenderDepthGuard(int& depth) : depth(depth) {
    if (++depth > kMaxRenderDepth) {
      --depth;
      eval_fail(fmt::format("template nested too deeply when rendered (more than {} levels)", kMaxRenderDepth));
    }
  }
  ~RenderDepthGuard() { --depth; }
  int& depth;
};

[[noreturn]] void fail_at_line(int line, const char* message) {
  fail(ErrorKind::kInvalidArgument, "template line {}: {}", line, message);
}

Json loop_object(const std::vector<Value>& items, size_t index) {
  size_t length = items.size();
  Json loop = {{"index", index + 1},        {"index0", index},
               {"revindex", length - index}, {"revindex0", length - index - 1},
               {"first", index == 0},        {"last", index + 1 == length},
               {"length", length},           {"depth", 1},
               {"depth0", 0}};
  if (index > 0) {
    charge_value(approximate_size(items[index - 1].json()));  // copies
    loop["previtem"] = items[index - 1].json();
  }
  if (index + 1 < length) {
    charge_value(approximate_size(items[index + 1].json()));
    loop["nextitem"] = items[index + 1].json();
  }
  return loop;
}

}  // namespace

const Value* Scope::find(const std::string& name) const {
  for (const Scope* scope = this; scope; scope = scope->parent_.get()) {
    auto found = scope->variables_.find(name);
    if (found != scope->variables_.end()) return &found->second;
  }
  return nullptr;
}

std::string Renderer::render(const Body& body, const Json& context) {
  if (!context.is_object()) fail(ErrorKind::kInvalidArgument, "template context must be a JSON object");
  try {
    check_data_depth(context, "template context");
  } catch (const EvalError& error) {
    fail(ErrorKind::kInvalidArgument, "{}", error.what());
  }
  auto globals = std::make_shared<Scope>(nullptr);
  for (const auto& [key, value] : context.items()) globals->set(key, Value::borrowed(value));  // not copied
  auto scope = std::make_shared<Scope>(globals);
  RenderBudget budget;
  BudgetScope budget_scope(budget);
  std::string out;
  render_body(body, scope, out);
  return out;
}

Renderer::Flow Renderer::render_body(const Body& body, const ScopePointer& scope, std::string& out) {
  for (const auto& statement : body) {
    Flow flow = render_statement(*statement, scope, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Renderer::Flow Renderer::render_statement(const Statement& statement, const ScopePointer& scope, std::string& out) {
  try {
    RenderDepthGuard depth_guard(render_depth_);
    charge_steps();
    switch (statement.kind) {
      case Statement::Kind::kText: append_bounded(out, statement.text); return Flow::kNormal;
      case Statement::Kind::kOutput: append_bounded(out, evaluate(*statement.expression, scope).to_string()); return Flow::kNormal;
      case Statement::Kind::kIf:
        for (size_t i = 0; i < statement.bodies.size(); ++i) {
          if (i < statement.conditions.size() && !evaluate(*statement.conditions[i], scope).truthy()) continue;
          return render_body(statement.bodies[i], scope, out);
        }
        return Flow::kNormal;
      case Statement::Kind::kFor: return render_for(statement, scope, out);
      case Statement::Kind::kSet: assign(statement, scope, evaluate(*statement.expression, scope)); return Flow::kNormal;
      case Statement::Kind::kSetBlock: {
        std::string text;
        render_body(statement.body, scope, text);
        assign(statement, scope, apply_filters(statement.filters, Json(text), scope));
        return Flow::kNormal;
      }
      case Statement::Kind::kMacro: {
        auto macro = std::make_shared<MacroObject>(MacroObject{statement.macro.get(), scope});
        scope->set(statement.macro->name, Value::from_macro(std::move(macro)));
        return Flow::kNormal;
      }
      case Statement::Kind::kCallBlock: {
        const Expression& call_expression = *statement.expression;
        Value callee = evaluate(*call_expression.operands[0], scope);
        CallArguments arguments = evaluate_arguments(call_expression.arguments, scope);
        Value caller = Value::from_macro(std::make_shared<MacroObject>(MacroObject{statement.macro.get(), scope}));
        append_bounded(out, call(callee, arguments, caller).to_string());
        return Flow::kNormal;
      }
      case Statement::Kind::kFilterBlock: {
        std::string text;
        render_body(statement.body, scope, text);
        append_bounded(out, apply_filters(statement.filters, Json(text), scope).to_string());
        return Flow::kNormal;
      }
      case Statement::Kind::kBreak: return Flow::kBreak;
      case Statement::Kind::kContinue: return Flow::kContinue;
      case Statement::Kind::kScopeless: return render_body(statement.body, scope, out);
    }
  } catch (const EvalError& error) {
    fail_at_line(statement.line, error.what());
  }
  return Flow::kNormal;
}

Renderer::Flow Renderer::render_for(const Statement& statement, const ScopePointer& scope, std::string& out) {
  std::vector<Value> items = iterate_values(evaluate(*statement.expression, scope));
  auto bind_targets = [&](Scope& target, const Value& item) {
    if (statement.targets.size() == 1) {
      target.set(statement.targets[0], item);
      return;
    }
    const Json& list = item.json();
    if (!list.is_array() || list.size() != statement.targets.size())
      eval_fail(fmt::format("cannot unpack {} into {} names", python_repr(list), statement.targets.size()));
    for (size_t i = 0; i < statement.targets.size(); ++i) target.set(statement.targets[i], item.element(list[i]));
  };
  if (statement.condition) {  // "for x in xs if c": filtered before loop.index and loop.length are counted
    std::vector<Value> kept;
    for (auto& item : items) {
      charge_steps();
      auto filter_scope = std::make_shared<Scope>(scope);
      bind_targets(*filter_scope, item);
      if (evaluate(*statement.condition, filter_scope).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    auto else_scope = std::make_shared<Scope>(scope);
    render_body(statement.else_body, else_scope, out);
    return Flow::kNormal;
  }
  for (size_t index = 0; index < items.size(); ++index) {
    charge_steps();
    auto iteration_scope = std::make_shared<Scope>(scope);
    bind_targets(*iteration_scope, items[index]);
    iteration_scope->set("loop", loop_object(items, index));
    if (render_body(statement.body, iteration_scope, out) == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

void Renderer::assign(const Statement& statement, const ScopePointer& scope, Value value) {
  if (value.is_json()) check_data_depth(value.json(), "a value");  // {% set x = [x] %} in a loop
  if (!statement.target_object.empty()) {
    const Value* object = scope->find(statement.target_object);
    if (!object || object->kind() != Value::Kind::kNamespace)
      eval_fail(fmt::format("cannot assign attribute on non-namespace object '{}'", statement.target_object));
    object->namespace_object()->attributes[statement.targets[0]] = std::make_shared<Value>(std::move(value));
    return;
  }
  if (statement.targets.size() == 1) {
    scope->set(statement.targets[0], std::move(value));
    return;
  }
  const Json& items = value.require_json("unpacking");
  if (!items.is_array() || items.size() != statement.targets.size())
    eval_fail(fmt::format("cannot unpack {} into {} names", python_repr(items), statement.targets.size()));
  for (size_t i = 0; i < statement.targets.size(); ++i) scope->set(statement.targets[i], items[i]);
}

Value Renderer::apply_filters(const std::vector<FilterCall>& filters, Value value, const ScopePointer& scope) {
  for (const auto& filter : filters) value = apply_filter(filter.name, value, evaluate_arguments(filter.arguments, scope));
  return value;
}

Value Renderer::evaluate(const Expression& expression, const ScopePointer& scope) {
  try {
    RenderDepthGuard depth_guard(render_depth_);
    return evaluate_node(expression, scope);
  } catch (const EvalError& error) {
    fail_at_line(expression.line, error.what());
  }
}

Value Renderer::evaluate_node(const Expression& expression, const ScopePointer& scope) {
  const auto& operands = expression.operands;
  switch (expression.kind) {
    case Expression::Kind::kLiteral: return expression.literal;
    case Expression::Kind::kName: {
      if (const Value* value = scope->find(expression.name)) return *value;  // shares the JSON: no copy
      if (is_global_function(expression.name)) return Value::function(expression.name);
      return Value::undefined(expression.name);
    }
    case Expression::Kind::kList:
    case Expression::Kind::kTuple: {
      Json list = Json::array();
      for (const auto& operand : operands) {
        Value item = evaluate(*operand, scope);
        charge_value(approximate_size(item.require_json("a list item")));  // a deep copy
        list.push_back(item.json());
      }
      return list;
    }
    case Expression::Kind::kDict: {
      Json dict = Json::object();
      for (size_t i = 0; i + 1 < operands.size(); i += 2) {
        Value key = evaluate(*operands[i], scope);
        Value item = evaluate(*operands[i + 1], scope);
        charge_value(approximate_size(item.require_json("a dict value")));  // a deep copy
        dict[key.is_string() ? key.json().get<std::string>() : key.to_string()] = item.json();
      }
      return dict;
    }
    case Expression::Kind::kAttribute: return get_attribute(evaluate(*operands[0], scope), expression.name);
    case Expression::Kind::kSubscript:
      return get_item(evaluate(*operands[0], scope), evaluate(*operands[1], scope));
    case Expression::Kind::kSlice: {
      Value object = evaluate(*operands[0], scope);
      Value bounds[3];
      for (int i = 0; i < 3; ++i)
        if (operands[i + 1]) bounds[i] = evaluate(*operands[i + 1], scope);
      return get_slice(object, operands[1] ? &bounds[0] : nullptr, operands[2] ? &bounds[1] : nullptr,
                       operands[3] ? &bounds[2] : nullptr);
    }
    case Expression::Kind::kCall: return evaluate_call(expression, scope);
    case Expression::Kind::kFilter:
      return apply_filter(expression.name, evaluate(*operands[0], scope), evaluate_arguments(expression.arguments, scope));
    case Expression::Kind::kTest:
      return Json(apply_test(expression.name, evaluate(*operands[0], scope), evaluate_arguments(expression.arguments, scope)));
    case Expression::Kind::kUnary: {
      Value operand = evaluate(*operands[0], scope);
      if (expression.name == "not") return Json(!operand.truthy());
      if (expression.name == "-") return negate(operand);
      if (!operand.is_number()) eval_fail("bad operand type for unary +");
      return operand;
    }
    case Expression::Kind::kBinary:
      return binary_operation(expression.name, evaluate(*operands[0], scope), evaluate(*operands[1], scope));
    case Expression::Kind::kAnd: {
      Value left = evaluate(*operands[0], scope);
      return left.truthy() ? evaluate(*operands[1], scope) : left;
    }
    case Expression::Kind::kOr: {
      Value left = evaluate(*operands[0], scope);
      return left.truthy() ? left : evaluate(*operands[1], scope);
    }
    case Expression::Kind::kCompare: return Json(evaluate_compare(expression, scope));
    case Expression::Kind::kConditional:
      if (evaluate(*operands[1], scope).truthy()) return evaluate(*operands[0], scope);
      return operands[2] ? evaluate(*operands[2], scope) : Value::undefined();
  }
  return Value::undefined();
}

bool Renderer::evaluate_compare(const Expression& expression, const ScopePointer& scope) {
  Value left = evaluate(*expression.operands[0], scope);
  for (size_t i = 0; i < expression.comparisons.size(); ++i) {
    Value right = evaluate(*expression.operands[i + 1], scope);
    charge_work(left);  // comparisons and "in" go over their operands
    charge_work(right);
    const std::string& op = expression.comparisons[i];
    bool result;
    if (op == "==") result = values_equal(left, right);
    else if (op == "!=") result = !values_equal(left, right);
    else if (op == "in") result = contains(right, left);
    else if (op == "not in") result = !contains(right, left);
    else {
      const Json& a = left.require_json("comparison");
      const Json& b = right.require_json("comparison");
      if (op == "<") result = json_less(a, b);
      else if (op == "<=") result = !json_less(b, a);
      else if (op == ">") result = json_less(b, a);
      else result = !json_less(a, b);
    }
    if (!result) return false;
    left = std::move(right);
  }
  return true;
}

CallArguments Renderer::evaluate_arguments(const std::vector<Argument>& arguments, const ScopePointer& scope) {
  CallArguments evaluated;
  for (const auto& argument : arguments) {
    Value value = evaluate(*argument.value, scope);
    if (argument.keyword.empty()) evaluated.positional.push_back(std::move(value));
    else evaluated.keyword.emplace_back(argument.keyword, std::move(value));
  }
  return evaluated;
}

Value Renderer::evaluate_call(const Expression& expression, const ScopePointer& scope) {
  const Expression& callee_expression = *expression.operands[0];
  if (callee_expression.kind == Expression::Kind::kAttribute) {  // object.method(...)
    Value object = evaluate(*callee_expression.operands[0], scope);
    Value member = get_attribute(object, callee_expression.name);
    CallArguments arguments = evaluate_arguments(expression.arguments, scope);
    if (member.is_callable()) return call(member, arguments, Value::undefined());
    if (callee_expression.name == "cycle" && object.is_dict() && object.json().contains("index0") &&
        object.json().contains("revindex0") && object.json()["index0"].is_number_unsigned()) {  // loop.cycle(...)
      if (arguments.positional.empty()) eval_fail("no items for cycling given");
      return arguments.positional[object.json()["index0"].get<uint64_t>() % arguments.positional.size()];
    }
    charge_steps();
    charge_work(object);
    Value result = call_method(object, callee_expression.name, arguments);
    if (result.is_json() && (!object.is_json() || &result.json() != &object.json()))
      charge_value(approximate_size(result.json()));  // what the method built, as for filters
    return result;
  }
  Value callee = evaluate(callee_expression, scope);
  return call(callee, evaluate_arguments(expression.arguments, scope), Value::undefined());
}

Value Renderer::call(const Value& callee, const CallArguments& arguments, const Value& caller) {
  charge_steps();
  switch (callee.kind()) {
    case Value::Kind::kMacro: return call_macro(*callee.macro(), arguments, caller);
    case Value::Kind::kFunction: return call_global_function(callee.name(), arguments);
    case Value::Kind::kUndefined:
      eval_fail(callee.name().empty() ? "cannot call an undefined value" : fmt::format("'{}' is undefined", callee.name()));
    default: eval_fail(fmt::format("{} is not callable", callee.repr()));
  }
}

Value Renderer::call_macro(const MacroObject& macro, const CallArguments& arguments, const Value& caller) {
  const MacroDefinition& definition = *macro.definition;
  ScopePointer closure = macro.closure.lock();
  if (!closure) eval_fail(fmt::format("macro '{}' outlived the block it was defined in", definition.name));
  if (call_depth_ >= kMaxCallDepth) eval_fail(fmt::format("macro calls nested deeper than {}", kMaxCallDepth));
  auto scope = std::make_shared<Scope>(closure);
  const auto& parameters = definition.parameters;
  std::vector<bool> bound(parameters.size(), false);
  Json varargs = Json::array();
  for (const auto& argument : arguments.positional)
    if (argument.is_json()) check_data_depth(argument.json(), "a macro argument");
  for (const auto& [name, argument] : arguments.keyword)
    if (argument.is_json()) check_data_depth(argument.json(), "a macro argument");
  for (size_t i = 0; i < arguments.positional.size(); ++i) {
    if (i < parameters.size()) {
      scope->set(parameters[i].name, arguments.positional[i]);
      bound[i] = true;
    } else {
      varargs.push_back(arguments.positional[i].require_json("a macro's extra argument"));
    }
  }
  Json kwargs = Json::object();
  for (const auto& [name, value] : arguments.keyword) {
    size_t index = 0;
    while (index < parameters.size() && parameters[index].name != name) ++index;
    if (index == parameters.size()) {
      kwargs[name] = value.require_json("a macro's extra keyword argument");
      continue;
    }
    if (bound[index]) eval_fail(fmt::format("macro '{}' got multiple values for argument '{}'", definition.name, name));
    scope->set(name, value);
    bound[index] = true;
  }
  ++call_depth_;
  struct DepthGuard {
    int& depth;
    ~DepthGuard() { --depth; }
  } guard{call_depth_};
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (bound[i]) continue;
    scope->set(parameters[i].name, parameters[i].default_value ? evaluate(*parameters[i].default_value, scope)
                                                               : Value::undefined(parameters[i].name));
  }
  scope->set("varargs", varargs);
  scope->set("kwargs", kwargs);
  if (!caller.is_undefined()) scope->set("caller", caller);
  std::string out;
  render_body(definition.body, scope, out);
  return Json(out);
}

}  // namespace loom::jinja
