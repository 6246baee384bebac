// Renders a parsed template (internal to src/template).
//
// Scopes follow jinja2: the context is the outermost scope; "set" assigns in
// the innermost one; each for-loop iteration and each macro call opens a new
// scope (so "set" inside a loop is not seen after it: use namespace()); if
// blocks open none. One Renderer renders once, on one thread.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include "template/jinja_ast.h"
#include "template/jinja_builtins.h"

namespace loom::jinja {

class Scope {
 public:
  explicit Scope(std::shared_ptr<Scope> parent) : parent_(std::move(parent)) {}
  // The variable in this scope or the nearest enclosing one; nullptr if none.
  const Value* find(const std::string& name) const;
  void set(const std::string& name, Value value) { variables_[name] = std::move(value); }

 private:
  std::shared_ptr<Scope> parent_;
  std::unordered_map<std::string, Value> variables_;
};

class Renderer {
 public:
  // Throws Error(kInvalidArgument, "template line N: ...") for any evaluation
  // error and for raise_exception(message); `context` must be a JSON object.
  std::string render(const Body& body, const Json& context);

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using ScopePointer = std::shared_ptr<Scope>;

  Flow render_body(const Body& body, const ScopePointer& scope, std::string& out);
  Flow render_statement(const Statement& statement, const ScopePointer& scope, std::string& out);
  Flow render_for(const Statement& statement, const ScopePointer& scope, std::string& out);
  void assign(const Statement& statement, const ScopePointer& scope, Value value);
  Value apply_filters(const std::vector<FilterCall>& filters, Value value, const ScopePointer& scope);

  Value evaluate(const Expression& expression, const ScopePointer& scope);
  Value evaluate_node(const Expression& expression, const ScopePointer& scope);
  Value evaluate_call(const Expression& expression, const ScopePointer& scope);
  bool evaluate_compare(const Expression& expression, const ScopePointer& scope);
  CallArguments evaluate_arguments(const std::vector<Argument>& arguments, const ScopePointer& scope);
  Value call(const Value& callee, const CallArguments& arguments, const Value& caller);
  Value call_macro(const MacroObject& macro, const CallArguments& arguments, const Value& caller);

  int call_depth_ = 0;
  int render_depth_ = 0;  // render_statement and evaluate calls on the stack
};

}  // namespace loom::jinja
