#include "toolcall/forced_calls.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "toolcall/call_format_util.h"
#include "util/json_nesting.h"

namespace loom::toolcall {

std::optional<std::vector<ToolCall>> parse_required_output(std::string_view text,
                                                           const std::vector<std::string>& tool_names,
                                                           CallIdGenerator& ids) {
  if (json_nesting_depth(text) > kMaxJsonNesting) return std::nullopt;
  const nlohmann::ordered_json value = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!value.is_array() || value.empty()) return std::nullopt;
  std::vector<ToolCall> calls;
  for (const auto& element : value) {
    if (!element.is_object() || !element.contains("parameters")) return std::nullopt;
    std::optional<CallText> call =
        parse_call_object(element.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
    if (!call || std::find(tool_names.begin(), tool_names.end(), call->name) == tool_names.end()) return std::nullopt;
    calls.push_back({ids.next(), std::move(call->name), std::move(call->arguments)});
  }
  return calls;
}

std::optional<ToolCall> parse_named_output(std::string_view name, std::string_view text, CallIdGenerator& ids) {
  std::optional<std::string> arguments = parse_arguments_object(text);
  if (!arguments) return std::nullopt;
  return ToolCall{ids.next(), std::string(name), std::move(*arguments)};
}

}  // namespace loom::toolcall
