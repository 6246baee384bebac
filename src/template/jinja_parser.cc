// Statements: {% if %}, {% for %}, {% set %}, {% macro %}, ... (the
// expressions inside them: jinja_expression_parser.cc).
#include "template/jinja_parser.h"

#include "template/jinja_parser_internal.h"

namespace loom::jinja {

// Statements up to a "{% name %}" whose name is in `enders` (left unconsumed,
// positioned at the name), or to the end of the template when `enders` is empty.
Body Parser::parse_body(std::initializer_list<std::string_view> enders) {
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

StatementPointer Parser::make_statement(Statement::Kind kind, const Token& token) {
  auto statement = std::make_unique<Statement>();
  statement->kind = kind;
  statement->line = token.line;
  return statement;
}

// Consumes "{% name %}"'s name and "%}" after parse_body stopped at it.
void Parser::end_block(std::string_view name) {
  if (!skip_name(name)) fail_at(current(), "expected '" + std::string(name) + "'");
  expect_block_end();
}

StatementPointer Parser::parse_statement() {
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

StatementPointer Parser::parse_if(const Token& keyword) {
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

std::vector<std::string> Parser::parse_targets() {
  bool parenthesized = skip_operator("(");
  std::vector<std::string> targets{expect_name()};
  while (skip_operator(",")) {
    if (current().kind != Kind::kName) break;  // trailing comma
    targets.push_back(expect_name());
  }
  if (parenthesized) expect_operator(")");
  return targets;
}

StatementPointer Parser::parse_for(const Token& keyword) {
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

std::vector<FilterCall> Parser::parse_filter_chain(bool leading_pipe) {
  std::vector<FilterCall> filters;
  while (!leading_pipe || skip_operator("|")) {
    FilterCall filter{expect_filter_name(), {}};
    if (at_operator("(")) filter.arguments = parse_call_arguments();
    filters.push_back(std::move(filter));
    leading_pipe = true;
  }
  return filters;
}

StatementPointer Parser::parse_set(const Token& keyword) {
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

std::shared_ptr<MacroDefinition> Parser::parse_macro_signature(std::string name) {
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

StatementPointer Parser::parse_macro(const Token& keyword) {
  auto statement = make_statement(Statement::Kind::kMacro, keyword);
  statement->macro = parse_macro_signature(expect_name());
  expect_block_end();
  int saved_loop_depth = std::exchange(loop_depth_, 0);
  statement->macro->body = parse_body({"endmacro"});
  loop_depth_ = saved_loop_depth;
  end_block("endmacro");
  return statement;
}

StatementPointer Parser::parse_call_block(const Token& keyword) {
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

StatementPointer Parser::parse_filter_block(const Token& keyword) {
  auto statement = make_statement(Statement::Kind::kFilterBlock, keyword);
  statement->filters = parse_filter_chain(/*leading_pipe=*/false);
  expect_block_end();
  statement->body = parse_body({"endfilter"});
  end_block("endfilter");
  return statement;
}

Body parse(const std::vector<Token>& tokens) { return Parser(tokens).parse_template(); }

}  // namespace loom::jinja
