// The Jinja parser's class (internal to src/template/jinja_parser*.cc):
// statements are parsed in jinja_parser.cc, expressions in
// jinja_expression_parser.cc.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "template/jinja_ast.h"
#include "template/jinja_lexer.h"
#include "util/error.h"

namespace loom::jinja {

// Templates come from requests: bound the parser's recursion and the AST's
// depth (its destruction and evaluation recurse; the renderer has its own
// limit besides). One count covers blocks inside blocks, parentheses, and each
// link of a chain of operators, filters, attributes, subscripts and calls
// (a + b + c ... nests to the left).
constexpr int kMaxNesting = 200;

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  Body parse_template() {
    Body body = parse_body({});
    if (current().kind != Token::Kind::kEnd) fail_at(current(), "unexpected '" + current().value + "'");
    return body;
  }

 private:
  using Kind = Token::Kind;
  const Token& current() const { return tokens_[position_]; }
  const Token& peek(size_t ahead = 1) const {
    return tokens_[std::min(position_ + ahead, tokens_.size() - 1)];
  }
  const Token& advance() {
    const Token& token = tokens_[position_];
    if (token.kind != Kind::kEnd) ++position_;
    return token;
  }
  [[noreturn]] void fail_at(const Token& token, const std::string& message) const {
    fail(ErrorKind::kInvalidArgument, "template line {}: {}", token.line, message);
  }
  static std::string describe(const Token& token) {
    switch (token.kind) {
      case Kind::kEnd: return "end of template";
      case Kind::kBlockEnd: return "'%}'";
      case Kind::kVariableEnd: return "'}}'";
      case Kind::kString: return "string";
      default: return "'" + token.value + "'";
    }
  }
  bool at_operator(std::string_view op) const { return current().kind == Kind::kOperator && current().value == op; }
  bool at_name(std::string_view name) const { return current().kind == Kind::kName && current().value == name; }
  bool skip_operator(std::string_view op) {
    if (!at_operator(op)) return false;
    advance();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!at_name(name)) return false;
    advance();
    return true;
  }
  void expect_operator(std::string_view op) {
    if (!skip_operator(op)) fail_at(current(), "expected '" + std::string(op) + "', got " + describe(current()));
  }
  void expect(Kind kind, const char* what) {
    if (current().kind != kind) fail_at(current(), std::string("expected ") + what + ", got " + describe(current()));
    advance();
  }
  std::string expect_name() {
    if (current().kind != Kind::kName) fail_at(current(), "expected a name, got " + describe(current()));
    return advance().value;
  }
  void expect_block_end() { expect(Kind::kBlockEnd, "'%}'"); }

  // Statements up to a "{% name %}" whose name is in `enders` (left unconsumed,
  // positioned at the name), or to the end of the template when `enders` is empty.
  Body parse_body(std::initializer_list<std::string_view> enders);
  static StatementPointer make_statement(Statement::Kind kind, const Token& token);

  // Consumes "{% name %}"'s name and "%}" after parse_body stopped at it.
  void end_block(std::string_view name);
  StatementPointer parse_statement();
  StatementPointer parse_if(const Token& keyword);
  std::vector<std::string> parse_targets();
  StatementPointer parse_for(const Token& keyword);
  std::vector<FilterCall> parse_filter_chain(bool leading_pipe);
  StatementPointer parse_set(const Token& keyword);
  std::shared_ptr<MacroDefinition> parse_macro_signature(std::string name);
  StatementPointer parse_macro(const Token& keyword);
  StatementPointer parse_call_block(const Token& keyword);
  StatementPointer parse_filter_block(const Token& keyword);

  // ---- expressions ----

  ExpressionPointer make(Expression::Kind kind, int line) {
    auto expression = std::make_unique<Expression>();
    expression->kind = kind;
    expression->line = line;
    return expression;
  }

  struct NestingGuard {
    explicit NestingGuard(Parser& parser) : parser(parser) {
      if (++parser.nesting_ > kMaxNesting) parser.fail_at(parser.current(), "expression nested too deeply");
    }
    NestingGuard(Parser& parser, const char* message) : parser(parser) {
      if (++parser.nesting_ > kMaxNesting) parser.fail_at(parser.current(), message);
    }
    ~NestingGuard() { --parser.nesting_; }
    Parser& parser;
  };

  // One more level per link of a left-leaning chain (a + b + c, x|f|g, a.b.c).
  struct ChainGuard {
    explicit ChainGuard(Parser& parser) : parser(parser) {}
    void extend() {
      ++links;
      if (++parser.nesting_ > kMaxNesting) parser.fail_at(parser.current(), "expression nested too deeply");
    }
    ~ChainGuard() { parser.nesting_ -= links; }
    Parser& parser;
    int links = 0;
  };

  // An expression, or several separated by commas (a tuple, as in "set a, b = 1, 2").
  ExpressionPointer parse_tuple(bool with_conditional = true);
  ExpressionPointer parse_expression(bool with_conditional = true);
  ExpressionPointer parse_or();
  ExpressionPointer parse_and();
  ExpressionPointer parse_not();
  ExpressionPointer parse_compare();
  // A left-associative chain `next (op next)*` of the binary operators `ops`,
  // each link counted against the nesting limit (ChainGuard).
  ExpressionPointer binary_chain(std::initializer_list<std::string_view> ops, ExpressionPointer (Parser::*next)());
  ExpressionPointer parse_additive();        // + -
  ExpressionPointer parse_concat();          // ~
  ExpressionPointer parse_multiplicative();  // * / // %
  ExpressionPointer parse_power();           // **
  ExpressionPointer parse_filtered_unary() { return parse_unary(/*with_filter=*/true); }
  ExpressionPointer parse_unary(bool with_filter);
  ExpressionPointer parse_primary();
  ExpressionPointer parse_parenthesized();
  ExpressionPointer parse_list();
  ExpressionPointer parse_dict();
  ExpressionPointer parse_postfix(ExpressionPointer node);
  ExpressionPointer parse_subscript(ExpressionPointer object);
  std::vector<Argument> parse_call_arguments();
  std::string expect_filter_name();
  ExpressionPointer parse_filters_and_tests(ExpressionPointer node);

  // "x is divisibleby 3": a test's one argument may follow without parentheses.
  bool starts_test_argument() const;
  const std::vector<Token>& tokens_;
  size_t position_ = 0;
  int loop_depth_ = 0;
  int nesting_ = 0;
};

}  // namespace loom::jinja
