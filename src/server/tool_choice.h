// The request side of tool calling on /v1/chat/completions: `tool_choice`,
// `parallel_tool_calls`, and what of `tools` the output side needs (names,
// parameter schemas). The `tools` list as such (the chat template renders it)
// is read by the chat request code; here it is only checked far enough to
// resolve tool_choice. Runs on HTTP handler threads; pure functions.
//
//   tool_choice      tools given         no tools
//   (absent)         auto                none
//   "none"           none: no parsing    none
//   "auto"           auto: the server's --tool-call-parser reads the output
//   "required"       the output is forced to [{"name", "parameters"}, ...]
//   {"type": "function", "function": {"name": N}}
//                    the output is forced to N's arguments (N must be a tool)
//   anything else with no tools: 400 (as OpenAI and vLLM)
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "toolcall/tool_call.h"

namespace loom::server {

enum class ToolChoiceMode { kNone, kAuto, kRequired, kNamed };

struct ToolChoice {
  ToolChoiceMode mode = ToolChoiceMode::kNone;
  std::string function_name;            // kNamed: the forced function
  std::vector<std::string> tool_names;  // every function in `tools`, in order
  bool parallel_tool_calls = true;      // false: at most one call is returned
  // kAuto: the convention the output is parsed with (kNone: it is content).
  toolcall::ParserKind parser = toolcall::ParserKind::kNone;
  // kRequired / kNamed: the JSON schema the output must match (vLLM's shapes:
  // an array of calls, or the named function's parameters), its members in
  // the request's order. Enforcing it is the structured-output constraint's
  // job; see parse_openai_request. Strict when the named function says
  // "strict": true; for "required" each strict function's parameters were
  // checked alone (a 400 naming what no grammar enforces), the list is lenient.
  std::optional<nlohmann::ordered_json> output_schema;
  bool output_schema_strict = false;

  // Whether the output is read for tool calls at all.
  bool parses_output() const {
    return mode == ToolChoiceMode::kRequired || mode == ToolChoiceMode::kNamed ||
           (mode == ToolChoiceMode::kAuto && parser != toolcall::ParserKind::kNone);
  }
};

// Reads `tools` (names, parameters, strict), `tool_choice` and
// `parallel_tool_calls` from a chat body (parsed keeping key order, so that
// forced calls keep the parameters' member order). `server_parser` is the
// server's resolved --tool-call-parser. Throws ApiError (400) naming the field.
ToolChoice parse_tool_choice(const nlohmann::ordered_json& body, toolcall::ParserKind server_parser);

// Under tool_choice auto the tools reach the model only through the chat
// template and come back only through a parser: a template that never reads
// `tools`, or no parser, is a 400 (param tool_choice) naming the fix
// (--chat-template, --tool-call-parser), where they used to be dropped
// silently (vLLM answers 400 naming --enable-auto-tool-choice). Other modes
// pass: a forced call's constraint needs neither.
void check_auto_tool_choice(const ToolChoice& choice, bool template_renders_tools);
// Whether a Jinja chat template's source reads the `tools` variable.
bool chat_template_renders_tools(std::string_view source);

// --tool-call-parser NAME: a parser name, or "auto" (from the chat template's
// source text, toolcall::detect_parser). Throws Error(kInvalidArgument) for
// another name.
toolcall::ParserKind resolve_tool_call_parser(std::string_view name, std::string_view chat_template_source);

}  // namespace loom::server
