#include "template/jinja_parser.h"

#include <initializer_list>

#include "util/error.h"

namespace loom::jinja {
namespace {

// Templates come from requests: bound the parser's and the renderer's
// recursion and the AST's depth (its destruction recurses). One count covers
// blocks inside blocks, parentheses, and each link of a chain of operators,
// filters, attributes, subscripts and calls (a + b + c ... nests to the left).
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
  Body parse_body(std::initializer_list<std::string_view> enders) {
    Body body;
    while (true) {
      const Token& token = current();
      if (token.kind == Kind::kEnd) {
        if (enders.size() == 0) return body;
        fail_at(token, "unexpected end of template: expected '{% " + std::string(*(enders.end() - 1)) + " %}'");
      }
      if (token.kind == Kind::kText) {
        auto statement = make_statement(Statement::Kind::kText, token);
        statement->text = token.value;
        body.push_back(std::move(statement));
        advance();
      } else if (token.kind == Kind::kVariableBegin) {
        advance();
        auto statement = make_statement(Statement::Kind::kOutput, token);
        statement->expression = parse_tuple();
        expect(Kind::kVariableEnd, "'}}'");
        body.push_back(std::move(statement));
      } else if (token.kind == Kind::kBlockBegin) {
        const Token& name = peek();
        for (std::string_view ender : enders)
          if (name.kind == Kind::kName && name.value == ender) {
            advance();
            return body;
          }
        advance();
        body.push_back(parse_statement());
      } else {
        fail_at(token, "unexpected " + describe(token));
      }
    }
  }

  static StatementPointer make_statement(Statement::Kind kind, const Token& token) {
    auto statement = std::make_unique<Statement>();
    statement->kind = kind;
    statement->line = token.line;
    return statement;
  }

  // Consumes "{% name %}"'s name and "%}" after parse_body stopped at it.
  void end_block(std::string_view name) {
    if (!skip_name(name)) fail_at(current(), "expected '" + std::string(name) + "'");
    expect_block_end();
  }

  StatementPointer parse_statement() {
    NestingGuard guard(*this, "blocks nested too deeply");
    const Token& keyword = current();
    if (keyword.kind != Kind::kName) fail_at(keyword, "expected a tag name, got " + describe(keyword));
    std::string name = advance().value;
    if (name == "if") return parse_if(keyword);
    if (name == "for") return parse_for(keyword);
    if (name == "set") return parse_set(keyword);
    if (name == "macro") return parse_macro(keyword);
    if (name == "call") return parse_call_block(keyword);
    if (name == "filter") return parse_filter_block(keyword);
    if (name == "generation") {
      auto statement = make_statement(Statement::Kind::kScopeless, keyword);
      expect_block_end();
      statement->body = parse_body({"endgeneration"});
      end_block("endgeneration");
      return statement;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail_at(keyword, "'" + name + "' outside of a loop");
      expect_block_end();
      return make_statement(name == "break" ? Statement::Kind::kBreak : Statement::Kind::kContinue, keyword);
    }
    fail_at(keyword, "unknown tag '" + name + "'");
  }

  StatementPointer parse_if(const Token& keyword) {
    auto statement = make_statement(Statement::Kind::kIf, keyword);
    statement->conditions.push_back(parse_expression());
    expect_block_end();
    while (true) {
      statement->bodies.push_back(parse_body({"elif", "else", "endif"}));
      if (skip_name("elif")) {
        statement->conditions.push_back(parse_expression());
        expect_block_end();
        continue;
      }
      if (skip_name("else")) {
        expect_block_end();
        statement->bodies.push_back(parse_body({"endif"}));
      }
      end_block("endif");
      return statement;
    }
  }

  std::vector<std::string> parse_targets() {
    bool parenthesized = skip_operator("(");
    std::vector<std::string> targets{expect_name()};
    while (skip_operator(",")) {
      if (current().kind != Kind::kName) break;  // trailing comma
      targets.push_back(expect_name());
    }
    if (parenthesized) expect_operator(")");
    return targets;
  }

  StatementPointer parse_for(const Token& keyword) {
    auto statement = make_statement(Statement::Kind::kFor, keyword);
    statement->targets = parse_targets();
    if (!skip_name("in")) fail_at(current(), "expected 'in' in for loop, got " + describe(current()));
    statement->expression = parse_tuple(/*with_conditional=*/false);
    if (skip_name("if")) statement->condition = parse_expression();
    if (at_name("recursive")) fail_at(current(), "recursive loops are not supported");
    expect_block_end();
    ++loop_depth_;
    statement->body = parse_body({"else", "endfor"});
    --loop_depth_;
    if (skip_name("else")) {
      expect_block_end();
      statement->else_body = parse_body({"endfor"});
    }
    end_block("endfor");
    return statement;
  }

  std::vector<FilterCall> parse_filter_chain(bool leading_pipe) {
    std::vector<FilterCall> filters;
    while (!leading_pipe || skip_operator("|")) {
      FilterCall filter{expect_filter_name(), {}};
      if (at_operator("(")) filter.arguments = parse_call_arguments();
      filters.push_back(std::move(filter));
      leading_pipe = true;
    }
    return filters;
  }

  StatementPointer parse_set(const Token& keyword) {
    if (current().kind == Kind::kName && peek().kind == Kind::kOperator && peek().value == ".") {
      auto statement = make_statement(Statement::Kind::kSet, keyword);
      statement->target_object = advance().value;
      advance();
      statement->targets.push_back(expect_name());
      expect_operator("=");
      statement->expression = parse_tuple();
      expect_block_end();
      return statement;
    }
    std::vector<std::string> targets = parse_targets();
    if (skip_operator("=")) {
      auto statement = make_statement(Statement::Kind::kSet, keyword);
      statement->targets = std::move(targets);
      statement->expression = parse_tuple();
      expect_block_end();
      return statement;
    }
    if (targets.size() != 1) fail_at(current(), "a block set assigns one name");
    auto statement = make_statement(Statement::Kind::kSetBlock, keyword);
    statement->targets = std::move(targets);
    statement->filters = parse_filter_chain(/*leading_pipe=*/true);
    expect_block_end();
    statement->body = parse_body({"endset"});
    end_block("endset");
    return statement;
  }

  std::shared_ptr<MacroDefinition> parse_macro_signature(std::string name) {
    auto macro = std::make_shared<MacroDefinition>();
    macro->name = std::move(name);
    expect_operator("(");
    while (!at_operator(")")) {
      MacroParameter parameter{expect_name(), nullptr};
      if (skip_operator("=")) parameter.default_value = parse_expression();
      macro->parameters.push_back(std::move(parameter));
      if (!skip_operator(",")) break;
    }
    expect_operator(")");
    return macro;
  }

  StatementPointer parse_macro(const Token& keyword) {
    auto statement = make_statement(Statement::Kind::kMacro, keyword);
    statement->macro = parse_macro_signature(expect_name());
    expect_block_end();
    int saved_loop_depth = std::exchange(loop_depth_, 0);
    statement->macro->body = parse_body({"endmacro"});
    loop_depth_ = saved_loop_depth;
    end_block("endmacro");
    return statement;
  }

  StatementPointer parse_call_block(const Token& keyword) {
    auto statement = make_statement(Statement::Kind::kCallBlock, keyword);
    if (at_operator("(")) statement->macro = parse_macro_signature("caller");
    else statement->macro = std::make_shared<MacroDefinition>(MacroDefinition{"caller", {}, {}});
    statement->expression = parse_expression();
    if (statement->expression->kind != Expression::Kind::kCall) fail_at(keyword, "expected a call after 'call'");
    expect_block_end();
    statement->macro->body = parse_body({"endcall"});
    end_block("endcall");
    return statement;
  }

  StatementPointer parse_filter_block(const Token& keyword) {
    auto statement = make_statement(Statement::Kind::kFilterBlock, keyword);
    statement->filters = parse_filter_chain(/*leading_pipe=*/false);
    expect_block_end();
    statement->body = parse_body({"endfilter"});
    end_block("endfilter");
    return statement;
  }

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
  ExpressionPointer parse_tuple(bool with_conditional = true) {
    int line = current().line;
    ExpressionPointer first = parse_expression(with_conditional);
    if (!at_operator(",")) return first;
    auto tuple = make(Expression::Kind::kTuple, line);
    tuple->operands.push_back(std::move(first));
    while (skip_operator(",")) {
      if (current().kind == Kind::kBlockEnd || current().kind == Kind::kVariableEnd || at_name("if")) break;
      tuple->operands.push_back(parse_expression(with_conditional));
    }
    return tuple;
  }

  ExpressionPointer parse_expression(bool with_conditional = true) {
    NestingGuard guard(*this);
    int line = current().line;
    ExpressionPointer value = parse_or();
    if (!with_conditional) return value;
    ChainGuard chain(*this);
    while (skip_name("if")) {
      chain.extend();
      auto conditional = make(Expression::Kind::kConditional, line);
      conditional->operands.push_back(std::move(value));
      conditional->operands.push_back(parse_or());
      conditional->operands.push_back(skip_name("else") ? parse_expression() : nullptr);
      value = std::move(conditional);
    }
    return value;
  }

  ExpressionPointer parse_or() {
    ExpressionPointer left = parse_and();
    ChainGuard chain(*this);
    while (at_name("or")) {
      chain.extend();
      int line = advance().line;
      auto node = make(Expression::Kind::kOr, line);
      node->operands.push_back(std::move(left));
      node->operands.push_back(parse_and());
      left = std::move(node);
    }
    return left;
  }

  ExpressionPointer parse_and() {
    ExpressionPointer left = parse_not();
    ChainGuard chain(*this);
    while (at_name("and")) {
      chain.extend();
      int line = advance().line;
      auto node = make(Expression::Kind::kAnd, line);
      node->operands.push_back(std::move(left));
      node->operands.push_back(parse_not());
      left = std::move(node);
    }
    return left;
  }

  ExpressionPointer parse_not() {
    if (at_name("not")) {
      NestingGuard guard(*this);
      auto node = make(Expression::Kind::kUnary, advance().line);
      node->name = "not";
      node->operands.push_back(parse_not());
      return node;
    }
    return parse_compare();
  }

  ExpressionPointer parse_compare() {
    int line = current().line;
    ExpressionPointer first = parse_additive();
    ExpressionPointer node;
    while (true) {
      std::string op;
      if (current().kind == Kind::kOperator &&
          (current().value == "==" || current().value == "!=" || current().value == "<" || current().value == "<=" ||
           current().value == ">" || current().value == ">=")) {
        op = advance().value;
      } else if (at_name("in")) {
        advance();
        op = "in";
      } else if (at_name("not") && peek().kind == Kind::kName && peek().value == "in") {
        advance();
        advance();
        op = "not in";
      } else {
        break;
      }
      if (!node) {
        node = make(Expression::Kind::kCompare, line);
        node->operands.push_back(std::move(first));
      }
      node->comparisons.push_back(op);
      node->operands.push_back(parse_additive());
    }
    return node ? std::move(node) : std::move(first);
  }

  ExpressionPointer binary(std::string op, int line, ExpressionPointer left, ExpressionPointer right) {
    auto node = make(Expression::Kind::kBinary, line);
    node->name = std::move(op);
    node->operands.push_back(std::move(left));
    node->operands.push_back(std::move(right));
    return node;
  }

  ExpressionPointer parse_additive() {
    ExpressionPointer left = parse_concat();
    ChainGuard chain(*this);
    while (at_operator("+") || at_operator("-")) {
      chain.extend();
      const Token& op = advance();
      left = binary(op.value, op.line, std::move(left), parse_concat());
    }
    return left;
  }

  ExpressionPointer parse_concat() {
    ExpressionPointer left = parse_multiplicative();
    ChainGuard chain(*this);
    while (at_operator("~")) {
      chain.extend();
      const Token& op = advance();
      left = binary("~", op.line, std::move(left), parse_multiplicative());
    }
    return left;
  }

  ExpressionPointer parse_multiplicative() {
    ExpressionPointer left = parse_power();
    ChainGuard chain(*this);
    while (at_operator("*") || at_operator("/") || at_operator("//") || at_operator("%")) {
      chain.extend();
      const Token& op = advance();
      left = binary(op.value, op.line, std::move(left), parse_power());
    }
    return left;
  }

  ExpressionPointer parse_power() {
    ExpressionPointer left = parse_unary(/*with_filter=*/true);
    ChainGuard chain(*this);
    while (at_operator("**")) {
      chain.extend();
      const Token& op = advance();
      left = binary("**", op.line, std::move(left), parse_unary(true));
    }
    return left;
  }

  ExpressionPointer parse_unary(bool with_filter) {
    NestingGuard guard(*this);
    ExpressionPointer node;
    if (at_operator("-") || at_operator("+")) {
      const Token& op = advance();
      node = make(Expression::Kind::kUnary, op.line);
      node->name = op.value;
      node->operands.push_back(parse_unary(/*with_filter=*/false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    return with_filter ? parse_filters_and_tests(std::move(node)) : std::move(node);
  }

  ExpressionPointer parse_primary() {
    const Token& token = current();
    switch (token.kind) {
      case Kind::kName: {
        advance();
        auto node = make(Expression::Kind::kLiteral, token.line);
        if (token.value == "true" || token.value == "True") node->literal = true;
        else if (token.value == "false" || token.value == "False") node->literal = false;
        else if (token.value == "none" || token.value == "None") node->literal = nullptr;
        else {
          node->kind = Expression::Kind::kName;
          node->name = token.value;
        }
        return node;
      }
      case Kind::kString: {
        auto node = make(Expression::Kind::kLiteral, token.line);
        std::string text;
        while (current().kind == Kind::kString) text += advance().value;  // "a" "b" is "ab"
        node->literal = text;
        return node;
      }
      case Kind::kInteger: {
        advance();
        auto node = make(Expression::Kind::kLiteral, token.line);
        try {
          node->literal = std::stoll(token.value);
        } catch (const std::exception&) {
          fail_at(token, "integer literal out of range");
        }
        return node;
      }
      case Kind::kFloat: {
        advance();
        auto node = make(Expression::Kind::kLiteral, token.line);
        node->literal = std::strtod(token.value.c_str(), nullptr);  // 1e999 is inf, as in Python
        return node;
      }
      case Kind::kOperator:
        if (token.value == "(") return parse_parenthesized();
        if (token.value == "[") return parse_list();
        if (token.value == "{") return parse_dict();
        break;
      default: break;
    }
    fail_at(token, "unexpected " + describe(token));
  }

  ExpressionPointer parse_parenthesized() {
    int line = advance().line;
    if (skip_operator(")")) return make(Expression::Kind::kTuple, line);
    ExpressionPointer first = parse_expression();
    if (skip_operator(")")) return first;
    auto tuple = make(Expression::Kind::kTuple, line);
    tuple->operands.push_back(std::move(first));
    while (skip_operator(",")) {
      if (at_operator(")")) break;
      tuple->operands.push_back(parse_expression());
    }
    expect_operator(")");
    return tuple;
  }

  ExpressionPointer parse_list() {
    auto list = make(Expression::Kind::kList, advance().line);
    while (!at_operator("]")) {
      list->operands.push_back(parse_expression());
      if (!skip_operator(",")) break;
    }
    expect_operator("]");
    return list;
  }

  ExpressionPointer parse_dict() {
    auto dict = make(Expression::Kind::kDict, advance().line);
    while (!at_operator("}")) {
      dict->operands.push_back(parse_expression());
      expect_operator(":");
      dict->operands.push_back(parse_expression());
      if (!skip_operator(",")) break;
    }
    expect_operator("}");
    return dict;
  }

  ExpressionPointer parse_postfix(ExpressionPointer node) {
    ChainGuard chain(*this);
    while (true) {
      chain.extend();
      if (at_operator(".")) {
        int line = advance().line;
        auto attribute = make(Expression::Kind::kAttribute, line);
        if (current().kind == Kind::kInteger) {  // items.0 is items[0]
          attribute->kind = Expression::Kind::kSubscript;
          auto index = make(Expression::Kind::kLiteral, line);
          const Token& index_token = advance();
          try {
            index->literal = std::stoll(index_token.value);
          } catch (const std::exception&) {
            fail_at(index_token, "integer literal out of range");
          }
          attribute->operands.push_back(std::move(node));
          attribute->operands.push_back(std::move(index));
        } else {
          attribute->name = expect_name();
          attribute->operands.push_back(std::move(node));
        }
        node = std::move(attribute);
      } else if (at_operator("[")) {
        node = parse_subscript(std::move(node));
      } else if (at_operator("(")) {
        auto call = make(Expression::Kind::kCall, current().line);
        call->arguments = parse_call_arguments();
        call->operands.push_back(std::move(node));
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  ExpressionPointer parse_subscript(ExpressionPointer object) {
    int line = advance().line;
    ExpressionPointer parts[3];
    int part = 0;
    bool is_slice = false;
    while (!at_operator("]")) {
      if (skip_operator(":")) {
        is_slice = true;
        if (++part > 2) fail_at(current(), "too many ':' in slice");
        continue;
      }
      if (parts[part]) fail_at(current(), "expected ']' or ':', got " + describe(current()));
      parts[part] = parse_expression();
    }
    expect_operator("]");
    auto node = make(is_slice ? Expression::Kind::kSlice : Expression::Kind::kSubscript, line);
    node->operands.push_back(std::move(object));
    if (!is_slice) {
      if (!parts[0]) fail_at(current(), "empty subscript");
      node->operands.push_back(std::move(parts[0]));
    } else {
      for (auto& item : parts) node->operands.push_back(std::move(item));
    }
    return node;
  }

  std::vector<Argument> parse_call_arguments() {
    expect_operator("(");
    std::vector<Argument> arguments;
    bool seen_keyword = false;
    while (!at_operator(")")) {
      Argument argument;
      if (current().kind == Kind::kName && peek().kind == Kind::kOperator && peek().value == "=") {
        argument.keyword = advance().value;
        advance();
        seen_keyword = true;
      } else if (seen_keyword) {
        fail_at(current(), "positional argument after a keyword argument");
      }
      argument.value = parse_expression();
      arguments.push_back(std::move(argument));
      if (!skip_operator(",")) break;
    }
    expect_operator(")");
    return arguments;
  }

  std::string expect_filter_name() {
    std::string name = expect_name();
    while (at_operator(".") && peek().kind == Kind::kName) {
      advance();
      name += "." + advance().value;
    }
    return name;
  }

  ExpressionPointer parse_filters_and_tests(ExpressionPointer node) {
    ChainGuard chain(*this);
    while (true) {
      chain.extend();
      if (at_operator("|")) {
        int line = advance().line;
        auto filter = make(Expression::Kind::kFilter, line);
        filter->name = expect_filter_name();
        if (at_operator("(")) filter->arguments = parse_call_arguments();
        filter->operands.push_back(std::move(node));
        node = std::move(filter);
      } else if (at_name("is")) {
        int line = advance().line;
        bool negated = skip_name("not");
        auto test = make(Expression::Kind::kTest, line);
        test->name = expect_filter_name();
        if (at_operator("(")) {
          test->arguments = parse_call_arguments();
        } else if (starts_test_argument()) {
          ExpressionPointer argument = parse_postfix(parse_primary());
          test->arguments.push_back({"", std::move(argument)});
        }
        test->operands.push_back(std::move(node));
        node = std::move(test);
        if (negated) {
          auto negation = make(Expression::Kind::kUnary, line);
          negation->name = "not";
          negation->operands.push_back(std::move(node));
          node = std::move(negation);
        }
      } else if (at_operator("(")) {
        auto call = make(Expression::Kind::kCall, current().line);
        call->arguments = parse_call_arguments();
        call->operands.push_back(std::move(node));
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  // "x is divisibleby 3": a test's one argument may follow without parentheses.
  bool starts_test_argument() const {
    const Token& token = current();
    if (token.kind == Kind::kName)
      return token.value != "else" && token.value != "or" && token.value != "and" && token.value != "if" &&
             token.value != "in" && token.value != "not" && token.value != "is";
    if (token.kind == Kind::kString || token.kind == Kind::kInteger || token.kind == Kind::kFloat) return true;
    return token.kind == Kind::kOperator && (token.value == "[" || token.value == "{");
  }

  const std::vector<Token>& tokens_;
  size_t position_ = 0;
  int loop_depth_ = 0;
  int nesting_ = 0;
};

}  // namespace

Body parse(const std::vector<Token>& tokens) { return Parser(tokens).parse_template(); }

}  // namespace loom::jinja
