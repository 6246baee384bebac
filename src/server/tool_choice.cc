#include "server/tool_choice.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "grammar/json_schema_compiler.h"
#include "server/api_error.h"
#include "server/json_input.h"
#include "server/json_output.h"
#include "util/error.h"

namespace loom::server {
namespace {

using Json = nlohmann::ordered_json;

// A function without parameters takes an empty object (as vLLM fills it in).
const Json kNoParameters = {{"type", "object"}, {"properties", Json::object()}};

struct Tool {
  std::string name;
  Json parameters;
  bool strict = false;  // function.strict: what no grammar enforces is a 400
};

// [{"type": "function", "function": {"name", "description"?, "parameters"?}}, ...]
std::vector<Tool> read_tools(const Json& tools) {
  if (!tools.is_array()) throw_bad_request("tools", "'tools' must be a list of {\"type\": \"function\", ...} objects");
  std::vector<Tool> list;
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& tool = tools[i];
    const std::string param = field_path("tools", i);
    if (!tool.is_object()) throw_bad_request(param, "each tool must be an object");
    const Json* type = field(tool, "type");
    if (!type || *type != "function")
      throw_bad_request(field_path(param, "type"), "only tools of \"type\": \"function\" are supported");
    const Json* function = field(tool, "function");
    if (!function || !function->is_object())
      throw_bad_request(field_path(param, "function"), "a tool needs a 'function' object");
    const std::string function_param = field_path(param, "function");
    const Json* name = field(*function, "name");
    if (!name || !name->is_string() || name->get_ref<const std::string&>().empty())
      throw_bad_request(field_path(function_param, "name"), "a function needs a non-empty string 'name'");
    const Json* parameters = field(*function, "parameters");
    if (parameters && !parameters->is_object())
      throw_bad_request(field_path(function_param, "parameters"), "'parameters' must be a JSON schema object");
    const Json* strict = field(*function, "strict");
    if (strict && !strict->is_boolean())
      throw_bad_request(field_path(function_param, "strict"), "'strict' must be a boolean");
    list.push_back({name->get<std::string>(), parameters && !parameters->empty() ? *parameters : kNoParameters,
                    strict && strict->get<bool>()});
  }
  return list;
}

// vLLM's schema for "required": a non-empty array of {"name", "parameters"}
// objects, one anyOf branch per tool. Each tool's "$defs" move to the root, so
// "#/$defs/..." references still resolve; two tools defining one name differently is a 400.
Json required_schema(const std::vector<Tool>& tools, bool parallel_tool_calls) {
  Json branches = Json::array();
  Json definitions = Json::object();
  for (size_t i = 0; i < tools.size(); ++i) {
    Json parameters = tools[i].parameters;
    if (const auto defs = parameters.find("$defs"); defs != parameters.end()) {
      if (!defs->is_object())
        throw_bad_request(fmt::format("tools[{}].function.parameters.$defs", i), "'$defs' must be an object");
      for (const auto& [key, definition] : defs->items()) {
        if (definitions.contains(key) && nlohmann::json(definitions[key]) != nlohmann::json(definition))
          throw_bad_request(fmt::format("tools[{}].function.parameters.$defs.{}", i, key),
                            fmt::format("tools define '$defs.{}' differently; tool_choice \"required\" needs one "
                                        "definition per name",
                                        key));
        definitions[key] = definition;
      }
      parameters.erase("$defs");
    }
    branches.push_back({{"properties", {{"name", {{"type", "string"}, {"enum", {tools[i].name}}}},
                                        {"parameters", parameters}}},
                        {"required", {"name", "parameters"}}});
  }
  Json schema = {{"type", "array"}, {"minItems", 1}, {"items", {{"type", "object"}, {"anyOf", branches}}}};
  if (!parallel_tool_calls) schema["maxItems"] = 1;
  if (!definitions.empty()) schema["$defs"] = definitions;
  return schema;
}

// A strict function's parameters alone: what no grammar enforces is a 400
// naming it (OpenAI's rule), even inside the lenient "required" list.
void check_strict_parameters(const Tool& tool, size_t index) {
  try {
    grammar::json_schema_grammar(tool.parameters, {}, grammar::SchemaStrictness::kStrict);
  } catch (const Error& error) {
    if (error.kind() != ErrorKind::kUnsupported) return;  // the list's compile reports other problems
    const std::string param = fmt::format("tools[{}].function.parameters", index);
    throw_bad_request(param, fmt::format("'{}': {}", param, error.message()));
  }
}

}  // namespace

ToolChoice parse_tool_choice(const Json& body, toolcall::ParserKind server_parser) {
  ToolChoice choice;
  if (const Json* parallel = field(body, "parallel_tool_calls")) {
    if (!parallel->is_boolean()) throw_bad_request("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    choice.parallel_tool_calls = parallel->get<bool>();
  }
  const Json* tools_value = field(body, "tools");
  const std::vector<Tool> tools = tools_value ? read_tools(*tools_value) : std::vector<Tool>{};
  for (const Tool& tool : tools) choice.tool_names.push_back(tool.name);

  const Json* value = field(body, "tool_choice");
  if (!value) {
    choice.mode = tools.empty() ? ToolChoiceMode::kNone : ToolChoiceMode::kAuto;
  } else if (value->is_string()) {
    const std::string& name = value->get_ref<const std::string&>();
    if (name == "none") choice.mode = ToolChoiceMode::kNone;
    else if (name == "auto") choice.mode = ToolChoiceMode::kAuto;
    else if (name == "required") choice.mode = ToolChoiceMode::kRequired;
    else
      throw_bad_request("tool_choice", fmt::format("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                                   "{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {}",
                                                   dump_json(*value)));
  } else if (value->is_object()) {
    const Json* type = field(*value, "type");
    if (!type || *type != "function")
      throw_bad_request("tool_choice.type", "a named 'tool_choice' must have \"type\": \"function\"");
    const Json* function = field(*value, "function");
    const Json* name = function && function->is_object() ? field(*function, "name") : nullptr;
    if (!name || !name->is_string())
      throw_bad_request("tool_choice.function.name", "a named 'tool_choice' needs 'function': {\"name\": ...}");
    choice.mode = ToolChoiceMode::kNamed;
    choice.function_name = name->get<std::string>();
  } else {
    throw_bad_request("tool_choice", "'tool_choice' must be a string or an object");
  }

  if (tools.empty()) {
    if (choice.mode == ToolChoiceMode::kNone) return choice;
    throw_bad_request("tool_choice", "'tool_choice' is only allowed when 'tools' are specified");
  }
  switch (choice.mode) {
    case ToolChoiceMode::kNone:
      break;
    case ToolChoiceMode::kAuto:
      choice.parser = server_parser;
      break;
    case ToolChoiceMode::kRequired:
      for (size_t i = 0; i < tools.size(); ++i)
        if (tools[i].strict) check_strict_parameters(tools[i], i);
      choice.output_schema = required_schema(tools, choice.parallel_tool_calls);
      break;
    case ToolChoiceMode::kNamed: {
      const auto tool = std::find_if(tools.begin(), tools.end(),
                                     [&](const Tool& candidate) { return candidate.name == choice.function_name; });
      if (tool == tools.end())
        throw_bad_request("tool_choice.function.name",
                          fmt::format("tool_choice names the function {}, which is not in 'tools'",
                                      dump_json(choice.function_name)));
      if (tool->strict) check_strict_parameters(*tool, static_cast<size_t>(tool - tools.begin()));
      choice.output_schema = tool->parameters;
      choice.output_schema_strict = tool->strict;
      break;
    }
  }
  return choice;
}

void check_auto_tool_choice(const ToolChoice& choice, bool template_renders_tools) {
  if (choice.mode != ToolChoiceMode::kAuto) return;
  if (choice.parser == toolcall::ParserKind::kNone)
    throw_bad_request("tool_choice",
                      "tool_choice \"auto\" (the default with 'tools') needs a tool-call parser and this server has "
                      "none: start loom serve with --tool-call-parser hermes|llama3_json|mistral (vLLM's "
                      "--enable-auto-tool-choice --tool-call-parser), or send tool_choice \"required\", a named "
                      "function or \"none\"");
  if (!template_renders_tools)
    throw_bad_request("tool_choice",
                      "the chat template never reads 'tools', so the model would not see them: start loom serve "
                      "with a --chat-template that renders tools (or send one as 'chat_template'), or send "
                      "tool_choice \"required\", a named function or \"none\"");
}

bool chat_template_renders_tools(std::string_view source) {
  const auto is_word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t at = source.find("tools"); at != std::string_view::npos; at = source.find("tools", at + 1)) {
    const size_t end = at + 5;
    if ((at == 0 || !is_word(source[at - 1])) && (end == source.size() || !is_word(source[end]))) return true;
  }
  return false;
}

toolcall::ParserKind resolve_tool_call_parser(std::string_view name, std::string_view chat_template_source) {
  if (name == "auto") return toolcall::detect_parser(chat_template_source);
  if (const auto kind = toolcall::parser_from_name(name)) return *kind;
  fail(ErrorKind::kInvalidArgument, "unknown --tool-call-parser '{}' (auto, none, hermes, llama3_json, mistral)", name);
}

}  // namespace loom::server
