// Outputs that a token constraint forces into a tool call (tool_choice
// "required" or a named function; the schema is built by the server,
// server/tool_choice.h), validated whole: nullopt when the text is not such an
// output. The server reads forced outputs as they stream with
// forced_call_reader.h (which keeps partial calls); these check complete ones.
//
//   required: [{"name": "f", "parameters": {...}}, ...]   (at least one; vLLM's shape)
//   named:    {...}                                       (the arguments of that function)
//
// Pure functions; never throw on any text.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "toolcall/tool_call.h"

namespace loom::toolcall {

// The calls of a "required" output; nullopt unless every element is a call to
// one of `tool_names` with an object for arguments (whitespace around is fine).
std::optional<std::vector<ToolCall>> parse_required_output(std::string_view text,
                                                           const std::vector<std::string>& tool_names,
                                                           CallIdGenerator& ids);

// The call to `name` when the whole output (whitespace aside) is a JSON object.
std::optional<ToolCall> parse_named_output(std::string_view name, std::string_view text, CallIdGenerator& ids);

}  // namespace loom::toolcall
