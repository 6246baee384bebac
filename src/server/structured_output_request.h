// The structured-output fields of a completions / chat request, compiled into
// one grammar constraint (grammar/constraint_compiler.h) for the engine:
//
//   response_format: {"type": "text"} (none) | {"type": "json_object"}
//                    | {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
//   structured_outputs (vLLM): {"json": schema | "schema text", "regex": "...",
//                    "choice": ["a", "b"], "grammar": "GBNF", "json_object": true}
//   legacy vLLM:     guided_json, guided_regex, guided_choice, guided_grammar
//
// At most one constraint per request (400 naming the fields otherwise).
// Schemas are read keeping key order (the body as nlohmann::ordered_json), so
// object members come out in the schema's `properties` order.
// What no grammar can enforce (grammar/json_schema_compiler.h): with
// response_format's "strict": true a 400 naming the keyword (e.g. param
// "response_format.json_schema.schema", message "JSON schema: the keyword
// 'not' (at /properties/age) is not supported ..."); otherwise (strict false
// or absent, structured_outputs.json, guided_json) the request is served and
// the constraint's grammar().unenforced lists the keywords.
//
// Runs on HTTP handler threads (compiling is the expensive part of a request
// with a schema; the compiler caches recent schemas).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "grammar/compiled_grammar.h"
#include "grammar/constraint_compiler.h"

namespace loom::server {

// The request's constraint, or null when it asks for none. Throws ApiError.
std::shared_ptr<const grammar::CompiledGrammar> read_structured_output(const nlohmann::ordered_json& body,
                                                                        grammar::ConstraintCompiler& compiler);

// One call for any caller that must force output to match a JSON schema (tool
// calls with tool_choice "required" / a named function): the compiled
// constraint, or ApiError(400) naming `param` and the unsupported feature.
std::shared_ptr<const grammar::CompiledGrammar> compile_json_schema_constraint(
    grammar::ConstraintCompiler& compiler, const nlohmann::ordered_json& schema, const std::string& param,
    grammar::SchemaStrictness strictness);

}  // namespace loom::server
