#include "server/structured_output_request.h"

#include <functional>
#include <vector>

#include <fmt/format.h>

#include "server/api_error.h"
#include "server/json_input.h"
#include "server/json_output.h"

namespace loom::server {
namespace {

using Json = nlohmann::ordered_json;
using grammar::SchemaStrictness;
using Constraint = std::shared_ptr<const grammar::CompiledGrammar>;

// Compile errors become 400s naming the field; limits too (a schema that is too big is the client's).
template <typename Compile>
Constraint compile_or_400(const std::string& param, Compile&& compile) {
  try {
    return compile();
  } catch (const Error& error) {
    throw_bad_request(param, fmt::format("'{}': {}", param, error.message()));
  }
}

std::string require_string(const Json& value, const std::string& param) {
  if (!value.is_string()) throw_bad_request(param, fmt::format("'{}' must be a string", param));
  return value.get<std::string>();
}

// A schema given as an object, or as JSON text (vLLM accepts both).
Json schema_value(const Json& value, const std::string& param) {
  if (value.is_object() || value.is_boolean()) return value;
  if (value.is_string()) {
    JsonSyntaxError error;
    const std::string& text = value.get_ref<const std::string&>();
    if (!parse_json_text(text, error))
      throw_bad_request(param, fmt::format("'{}' is not valid JSON: {}", param, error.message));
    return Json::parse(text);  // again, keeping key order: checked above
  }
  throw_bad_request(param, fmt::format("'{}' must be a JSON schema (an object)", param));
}

Constraint choice_constraint(grammar::ConstraintCompiler& compiler, const Json& value, const std::string& param) {
  if (!value.is_array() || value.empty())
    throw_bad_request(param, fmt::format("'{}' must be a non-empty list of strings", param));
  std::vector<std::string> choices;
  for (size_t i = 0; i < value.size(); ++i) choices.push_back(require_string(value[i], field_path(param, i)));
  return compile_or_400(param, [&] { return compiler.choice(choices); });
}

Constraint response_format(grammar::ConstraintCompiler& compiler, const Json& format) {
  if (!format.is_object())
    throw_bad_request("response_format", "'response_format' must be an object such as {\"type\": \"json_object\"}");
  const Json* type = field(format, "type");
  if (!type || !type->is_string()) throw_bad_request("response_format.type", "'response_format.type' must be a string");
  const std::string& name = type->get_ref<const std::string&>();
  if (name == "text") return nullptr;
  if (name == "json_object") return compile_or_400("response_format", [&] { return compiler.json_object(); });
  if (name == "json_schema") {
    const Json* spec = field(format, "json_schema");
    if (!spec || !spec->is_object())
      throw_bad_request("response_format.json_schema", "'response_format.json_schema' must be an object with a 'schema'");
    const Json* schema = field(*spec, "schema");
    if (!schema) throw_bad_request("response_format.json_schema.schema", "'response_format.json_schema.schema' is required");
    const Json* strict = field(*spec, "strict");
    if (strict && !strict->is_boolean())
      throw_bad_request("response_format.json_schema.strict", "'response_format.json_schema.strict' must be a boolean");
    return compile_json_schema_constraint(compiler, schema_value(*schema, "response_format.json_schema.schema"),
                                          "response_format.json_schema.schema",
                                          strict && strict->get<bool>() ? SchemaStrictness::kStrict
                                                                        : SchemaStrictness::kLenient);
  }
  throw_bad_request("response_format.type",
                    fmt::format("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got {}",
                                dump_json(*type)));
}

}  // namespace

Constraint compile_json_schema_constraint(grammar::ConstraintCompiler& compiler, const Json& schema,
                                          const std::string& param, SchemaStrictness strictness) {
  return compile_or_400(param, [&] { return compiler.json_schema(schema, strictness); });
}

Constraint read_structured_output(const Json& body, grammar::ConstraintCompiler& compiler) {
  // (param, compile) for every constraint field present; at most one may be.
  struct Request {
    std::string param;
    std::function<Constraint()> compile;
  };
  std::vector<Request> requests;
  if (const Json* format = field(body, "response_format"))
    requests.push_back({"response_format", [&compiler, format] { return response_format(compiler, *format); }});
  if (const Json* outputs = field(body, "structured_outputs")) {
    if (!outputs->is_object()) throw_bad_request("structured_outputs", "'structured_outputs' must be an object");
    for (const auto& [key, value] : outputs->items()) {
      if (value.is_null()) continue;
      const std::string param = "structured_outputs." + key;
      const Json* v = &value;
      if (key == "json") {
        requests.push_back({param, [&compiler, v, param] {
                              return compile_json_schema_constraint(compiler, schema_value(*v, param), param, SchemaStrictness::kLenient);
                            }});
      } else if (key == "regex") {
        requests.push_back({param, [&compiler, v, param] {
                              const std::string pattern = require_string(*v, param);
                              return compile_or_400(param, [&] { return compiler.regex(pattern); });
                            }});
      } else if (key == "choice") {
        requests.push_back({param, [&compiler, v, param] { return choice_constraint(compiler, *v, param); }});
      } else if (key == "grammar") {
        requests.push_back({param, [&compiler, v, param] {
                              const std::string text = require_string(*v, param);
                              return compile_or_400(param, [&] { return compiler.gbnf(text); });
                            }});
      } else if (key == "json_object") {
        if (!v->is_boolean()) throw_bad_request(param, fmt::format("'{}' must be a boolean", param));
        if (v->get<bool>())
          requests.push_back({param, [&compiler, param] { return compile_or_400(param, [&] { return compiler.json_object(); }); }});
      } else if (key == "disable_any_whitespace" || key == "disable_additional_properties" || key == "whitespace_pattern" ||
                 key == "backend" || key == "disable_fallback") {
        // Options of vLLM's backends; ours always emits compact JSON.
      } else {
        throw_bad_request(param, fmt::format("'{}' is not supported (structured_outputs takes json, regex, choice, "
                                             "grammar or json_object)", param));
      }
    }
  }
  if (const Json* v = field(body, "guided_json"))
    requests.push_back({"guided_json", [&compiler, v] {
                          return compile_json_schema_constraint(compiler, schema_value(*v, "guided_json"), "guided_json",
                                                SchemaStrictness::kLenient);
                        }});
  if (const Json* v = field(body, "guided_regex"))
    requests.push_back({"guided_regex", [&compiler, v] {
                          const std::string pattern = require_string(*v, "guided_regex");
                          return compile_or_400("guided_regex", [&] { return compiler.regex(pattern); });
                        }});
  if (const Json* v = field(body, "guided_choice"))
    requests.push_back({"guided_choice", [&compiler, v] { return choice_constraint(compiler, *v, "guided_choice"); }});
  if (const Json* v = field(body, "guided_grammar"))
    requests.push_back({"guided_grammar", [&compiler, v] {
                          const std::string text = require_string(*v, "guided_grammar");
                          return compile_or_400("guided_grammar", [&] { return compiler.gbnf(text); });
                        }});
  if (const Json* v = field(body, "guided_decoding_backend"); v && !v->is_string())
    throw_bad_request("guided_decoding_backend", "'guided_decoding_backend' must be a string");

  // response_format {"type": "text"} asks for nothing; it still counts as a field for the check below only when it constrains.
  std::vector<Constraint> constraints;
  std::vector<std::string> params;
  for (const Request& request : requests) {
    Constraint constraint = request.compile();
    if (!constraint) continue;
    constraints.push_back(std::move(constraint));
    params.push_back(request.param);
    if (constraints.size() > 1)
      throw_bad_request(params[1], fmt::format("only one structured-output constraint per request: got '{}' and '{}'",
                                               params[0], params[1]));
  }
  return constraints.empty() ? nullptr : constraints[0];
}

}  // namespace loom::server
