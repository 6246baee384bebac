// The parsed form of a Jinja template (internal to src/template).
//
// Built once by parse() and never changed afterwards, so one AST may be
// rendered from several threads at once. Every node carries the 1-based line
// it starts on, for error messages. Children are owned by their parent.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "template/jinja_value.h"

namespace loom::jinja {

struct Expression;
using ExpressionPointer = std::unique_ptr<Expression>;

// One argument of a call, filter or test: positional when `keyword` is empty.
struct Argument {
  std::string keyword;
  ExpressionPointer value;
};

struct Expression {
  enum class Kind {
    kLiteral,      // literal
    kName,         // name
    kList,         // [operands...]
    kTuple,        // (operands...), stored as a list
    kDict,         // {operands[0]: operands[1], ...}: keys and values alternate
    kAttribute,    // operands[0].name
    kSubscript,    // operands[0][operands[1]]
    kSlice,        // operands[0][start:stop:step]; operands[1..3], nullptr where left out
    kCall,         // operands[0](arguments)
    kFilter,       // operands[0] | name(arguments)
    kTest,         // operands[0] is name(arguments)
    kUnary,        // name ("-", "+", "not") operands[0]
    kBinary,       // operands[0] name operands[1]; name: + - * / // % ** ~
    kAnd,          // operands[0] and operands[1]
    kOr,           // operands[0] or operands[1]
    kCompare,      // operands[0] comparisons[0] operands[1] comparisons[1] ...; chained as Python does
    kConditional,  // operands[0] if operands[1] else operands[2] (operands[2] may be null: Undefined)
  };
  Kind kind;
  int line = 0;
  std::string name;
  Json literal;
  std::vector<ExpressionPointer> operands;
  std::vector<Argument> arguments;
  std::vector<std::string> comparisons;  // "==", "!=", "<", "<=", ">", ">=", "in", "not in"
};

struct Statement;
using StatementPointer = std::unique_ptr<Statement>;
using Body = std::vector<StatementPointer>;

struct MacroParameter {
  std::string name;
  ExpressionPointer default_value;  // null: required
};

struct MacroDefinition {
  std::string name;
  std::vector<MacroParameter> parameters;
  Body body;
};

struct FilterCall {
  std::string name;
  std::vector<Argument> arguments;
};

struct Statement {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expression }}
    kIf,           // conditions[i] -> bodies[i]; a trailing extra body is the else
    kFor,          // for targets in expression [if condition]: body [else: else_body]
    kSet,          // set targets = expression, or set target_object.targets[0] = expression
    kSetBlock,     // set targets[0] [| filters] = rendered body
    kMacro,        // macro definition
    kCallBlock,    // call[(macro.parameters)] expression: body is caller()'s body (macro)
    kFilterBlock,  // filter filters: body
    kBreak,
    kContinue,
    kScopeless,    // a body rendered in place: {% generation %}
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExpressionPointer expression;
  ExpressionPointer condition;
  std::string target_object;  // set ns.attribute: "ns"
  std::vector<std::string> targets;
  std::vector<ExpressionPointer> conditions;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
  std::vector<FilterCall> filters;
  std::shared_ptr<MacroDefinition> macro;  // shared so macro values can point at it
};

}  // namespace loom::jinja
