// Expressions, by recursive descent in jinja2's precedence (jinja_parser.h).
#include "template/jinja_parser_internal.h"

namespace loom::jinja {

// An expression, or several separated by commas (a tuple, as in "set a, b = 1, 2").
ExpressionPointer Parser::parse_tuple(bool with_conditional) {
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

ExpressionPointer Parser::parse_expression(bool with_conditional) {
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

ExpressionPointer Parser::parse_or() {
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

ExpressionPointer Parser::parse_and() {
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

ExpressionPointer Parser::parse_not() {
  if (at_name("not")) {
    NestingGuard guard(*this);
    auto node = make(Expression::Kind::kUnary, advance().line);
    node->name = "not";
    node->operands.push_back(parse_not());
    return node;
  }
  return parse_compare();
}

ExpressionPointer Parser::parse_compare() {
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

ExpressionPointer Parser::binary_chain(std::initializer_list<std::string_view> ops,
                                       ExpressionPointer (Parser::*next)()) {
  ExpressionPointer left = (this->*next)();
  ChainGuard chain(*this);
  auto at_one_of = [&] {
    for (std::string_view op : ops)
      if (at_operator(op)) return true;
    return false;
  };
  while (at_one_of()) {
    chain.extend();
    const Token& op = advance();
    auto node = make(Expression::Kind::kBinary, op.line);
    node->name = op.value;
    node->operands.push_back(std::move(left));
    node->operands.push_back((this->*next)());
    left = std::move(node);
  }
  return left;
}

ExpressionPointer Parser::parse_additive() { return binary_chain({"+", "-"}, &Parser::parse_concat); }
ExpressionPointer Parser::parse_concat() { return binary_chain({"~"}, &Parser::parse_multiplicative); }
ExpressionPointer Parser::parse_multiplicative() {
  return binary_chain({"*", "/", "//", "%"}, &Parser::parse_power);
}
ExpressionPointer Parser::parse_power() { return binary_chain({"**"}, &Parser::parse_filtered_unary); }

ExpressionPointer Parser::parse_unary(bool with_filter) {
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

ExpressionPointer Parser::parse_primary() {
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

ExpressionPointer Parser::parse_parenthesized() {
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

ExpressionPointer Parser::parse_list() {
  auto list = make(Expression::Kind::kList, advance().line);
  while (!at_operator("]")) {
    list->operands.push_back(parse_expression());
    if (!skip_operator(",")) break;
  }
  expect_operator("]");
  return list;
}

ExpressionPointer Parser::parse_dict() {
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

ExpressionPointer Parser::parse_postfix(ExpressionPointer node) {
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

ExpressionPointer Parser::parse_subscript(ExpressionPointer object) {
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

std::vector<Argument> Parser::parse_call_arguments() {
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

std::string Parser::expect_filter_name() {
  std::string name = expect_name();
  while (at_operator(".") && peek().kind == Kind::kName) {
    advance();
    name += "." + advance().value;
  }
  return name;
}

ExpressionPointer Parser::parse_filters_and_tests(ExpressionPointer node) {
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
bool Parser::starts_test_argument() const {
  const Token& token = current();
  if (token.kind == Kind::kName)
    return token.value != "else" && token.value != "or" && token.value != "and" && token.value != "if" &&
           token.value != "in" && token.value != "not" && token.value != "is";
  if (token.kind == Kind::kString || token.kind == Kind::kInteger || token.kind == Kind::kFloat) return true;
  return token.kind == Kind::kOperator && (token.value == "[" || token.value == "{");
}

}  // namespace loom::jinja
