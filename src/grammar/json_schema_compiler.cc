#include "grammar/json_schema_compiler.h"

#include <nlohmann/json.hpp>

#include "grammar/schema_compiler.h"
#include "util/error.h"

namespace loom::grammar {

Grammar json_schema_grammar(const nlohmann::ordered_json& schema, GrammarLimits limits, SchemaStrictness strictness) {
  GrammarBuilder builder(limits);
  SchemaCompiler compiler(builder, schema, strictness == SchemaStrictness::kStrict);
  const Symbol root = compiler.compile(schema, "", 0);
  const int32_t start = builder.declare_rule("root");
  builder.add_alternative(start, {root});
  Grammar grammar = builder.build(start);
  grammar.unenforced = compiler.take_unenforced();
  return grammar;
}

Grammar json_object_grammar(GrammarLimits limits) {
  GrammarBuilder builder(limits);
  const nlohmann::ordered_json empty = nlohmann::ordered_json::object();
  SchemaCompiler compiler(builder, empty, true);
  const Symbol object = compiler.any_object();
  const int32_t start = builder.declare_rule("root");
  builder.add_alternative(start, {object});
  return builder.build(start);
}

Grammar choice_grammar(const std::vector<std::string>& choices, GrammarLimits limits) {
  if (choices.empty()) fail(ErrorKind::kInvalidArgument, "the list of choices is empty");
  GrammarBuilder builder(limits);
  std::vector<Sequence> options;
  for (const std::string& choice : choices) options.push_back(builder.literal(choice));
  const Symbol symbol = builder.alternatives(options, "choice");
  return builder.build(symbol.id);
}

}  // namespace loom::grammar
