#include "server/chat_request.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "server/api_error.h"
#include "server/json_input.h"
#include "util/error.h"

namespace loom::server {
namespace {

using OrderedJson = nlohmann::ordered_json;

const OrderedJson& require_string(const OrderedJson& object, const char* key, const std::string& parent,
                                  const std::string& what) {
  const OrderedJson* value = field(object, key);
  if (!value || !value->is_string()) throw_bad_request(field_path(parent, key), what);
  return *value;
}

// content: "text" | [{"type": "text", "text": "..."}, ...] | null
void check_content(const OrderedJson& message, const std::string& message_param) {
  const std::string param = field_path(message_param, "content");
  const OrderedJson* content = field(message, "content");
  if (!content || content->is_string()) return;
  if (!content->is_array()) throw_bad_request(param, "message content must be a string or a list of text parts");
  for (size_t j = 0; j < content->size(); ++j) {
    const OrderedJson& part = (*content)[j];
    const std::string part_param = field_path(param, j);
    if (!part.is_object()) throw_bad_request(part_param, "each content part must be an object");
    const OrderedJson* type = field(part, "type");
    if (!type || !type->is_string())
      throw_bad_request(field_path(part_param, "type"), "each content part needs a string 'type'");
    if (type->get_ref<const std::string&>() != "text")
      throw_bad_request(field_path(part_param, "type"),
                        fmt::format("only \"text\" content parts are supported, got {}", type->dump()));
    require_string(part, "text", part_param, "a text content part needs a string 'text'");
  }
}

// [{id?, type: "function", function: {name, arguments: string | object}}, ...]
void check_tool_calls(const OrderedJson& calls, const std::string& param) {
  if (!calls.is_array()) throw_bad_request(param, "'tool_calls' must be a list");
  for (size_t j = 0; j < calls.size(); ++j) {
    const OrderedJson& call = calls[j];
    const std::string call_param = field_path(param, j);
    if (!call.is_object()) throw_bad_request(call_param, "each tool call must be an object");
    check_optional_string(call, "id", call_param);
    if (const OrderedJson* type = field(call, "type"); type && *type != "function")
      throw_bad_request(field_path(call_param, "type"), "a tool call's 'type' must be \"function\"");
    const OrderedJson* function = field(call, "function");
    const std::string function_param = field_path(call_param, "function");
    if (!function || !function->is_object())
      throw_bad_request(function_param, "a tool call needs a 'function' object with 'name' and 'arguments'");
    require_string(*function, "name", function_param, "a tool call's function needs a string 'name'");
    if (const OrderedJson* arguments = field(*function, "arguments");
        arguments && !arguments->is_string() && !arguments->is_object())
      throw_bad_request(field_path(function_param, "arguments"),
                        "'arguments' must be a JSON string (as OpenAI sends it) or an object");
  }
}

void check_messages(const OrderedJson& body) {
  const OrderedJson* list = field(body, "messages");
  if (!list) throw_bad_request("messages", "'messages' is required");
  if (!list->is_array()) throw_bad_request("messages", "'messages' must be a list");
  if (list->empty()) throw_bad_request("messages", "'messages' must not be empty");
  static const char* const kRoles[] = {"system", "developer", "user", "assistant", "tool"};
  for (size_t i = 0; i < list->size(); ++i) {
    const OrderedJson& message = (*list)[i];
    const std::string param = field_path("messages", i);
    if (!message.is_object()) throw_bad_request(param, "each message must be an object");
    const std::string& role =
        require_string(message, "role", param, "each message needs a string 'role'").get_ref<const std::string&>();
    if (std::find(std::begin(kRoles), std::end(kRoles), role) == std::end(kRoles))
      throw_bad_request(field_path(param, "role"), fmt::format("unknown role {}", OrderedJson(role).dump()));
    check_content(message, param);
    check_optional_string(message, "name", param);
    if (const OrderedJson* calls = field(message, "tool_calls")) {
      if (role != "assistant")
        throw_bad_request(field_path(param, "tool_calls"), "only assistant messages may have 'tool_calls'");
      check_tool_calls(*calls, field_path(param, "tool_calls"));
    }
    check_optional_string(message, "tool_call_id", param);
  }
}

// [{type: "function", function: {name, description?, parameters?}}, ...]
void check_tools(const OrderedJson& tools) {
  if (!tools.is_array()) throw_bad_request("tools", "'tools' must be a list of {\"type\": \"function\", ...}");
  for (size_t i = 0; i < tools.size(); ++i) {
    const OrderedJson& tool = tools[i];
    const std::string param = field_path("tools", i);
    if (!tool.is_object()) throw_bad_request(param, "each tool must be an object");
    const OrderedJson* type = field(tool, "type");
    if (!type || *type != "function")
      throw_bad_request(field_path(param, "type"), "only tools of \"type\": \"function\" are supported");
    const OrderedJson* function = field(tool, "function");
    const std::string function_param = field_path(param, "function");
    if (!function || !function->is_object())
      throw_bad_request(function_param, "a tool needs a 'function' object with a 'name'");
    const std::string& name = require_string(*function, "name", function_param, "a tool's function needs a string 'name'")
                                  .get_ref<const std::string&>();
    if (name.empty()) throw_bad_request(field_path(function_param, "name"), "a function name must not be empty");
    check_optional_string(*function, "description", function_param);
    if (const OrderedJson* parameters = field(*function, "parameters"); parameters && !parameters->is_object())
      throw_bad_request(field_path(function_param, "parameters"), "'parameters' must be a JSON Schema object");
  }
}

bool read_flag(const OrderedJson& body, const char* key, bool fallback) {
  const OrderedJson* value = field(body, key);
  if (!value) return fallback;
  if (!value->is_boolean()) throw_bad_request(key, fmt::format("'{}' must be a boolean", key));
  return value->get<bool>();
}

}  // namespace

ChatPrompt read_chat_prompt(std::string_view body_text, const Tokenizer& tokenizer, const ChatRenderer& renderer) {
  OrderedJson body;
  try {
    body = OrderedJson::parse(body_text);
  } catch (const nlohmann::json::exception&) {
    throw_bad_request("", "invalid JSON body");  // not reached: the caller parsed it already
  }
  check_messages(body);

  ChatRequest request;
  request.messages = body["messages"];
  if (const OrderedJson* tools = field(body, "tools")) {
    check_tools(*tools);
    request.tools = *tools;
  }
  if (const OrderedJson* documents = field(body, "documents")) {
    if (!documents->is_array()) throw_bad_request("documents", "'documents' must be a list of objects");
    for (size_t i = 0; i < documents->size(); ++i)
      if (!(*documents)[i].is_object())
        throw_bad_request(field_path("documents", i), "each document must be an object");
    request.documents = *documents;
  }
  if (const OrderedJson* kwargs = field(body, "chat_template_kwargs")) {
    if (!kwargs->is_object()) throw_bad_request("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    for (const char* reserved : {"messages", "tools", "documents", "add_generation_prompt"})
      if (kwargs->contains(reserved))
        throw_bad_request("chat_template_kwargs",
                          fmt::format("'chat_template_kwargs' may not set '{}' (it comes from the request itself)",
                                      reserved));
    request.template_kwargs = *kwargs;
  }
  bool enable_thinking = true;
  if (const OrderedJson* kwargs = field(body, "chat_template_kwargs"))
    if (const OrderedJson* thinking = field(*kwargs, "enable_thinking"); thinking && thinking->is_boolean())
      enable_thinking = thinking->get<bool>();
  std::string request_template;
  if (const OrderedJson* source = field(body, "chat_template")) {
    if (!source->is_string()) throw_bad_request("chat_template", "'chat_template' must be a string (Jinja source)");
    request_template = source->get<std::string>();
    if (request_template.empty()) throw_bad_request("chat_template", "'chat_template' must not be empty");
  }
  request.add_generation_prompt = read_flag(body, "add_generation_prompt", true);
  request.continue_final_message = read_flag(body, "continue_final_message", false);
  if (request.continue_final_message) {
    if (request.add_generation_prompt)
      throw_bad_request("continue_final_message",
                        "'continue_final_message' and 'add_generation_prompt' cannot both be true "
                        "(set add_generation_prompt to false)");
    if (request.messages.back().value("role", "") != "assistant")
      throw_bad_request("continue_final_message", "'continue_final_message' needs a final assistant message");
  }

  std::string prompt;
  try {
    prompt = renderer.render(request, request_template);
  } catch (const Error& error) {
    const bool about_messages = error.message().rfind("messages[", 0) == 0;
    throw_bad_request(about_messages ? error.message().substr(0, error.message().find(' ')) : "chat_template",
                      error.message());
  }
  ChatPrompt result;
  constexpr size_t kTailBytes = 64;
  result.tail = prompt.substr(prompt.size() - std::min(prompt.size(), kTailBytes));
  result.enable_thinking = enable_thinking;
  result.tokens = tokenizer.encode(prompt, false);
  if (result.tokens.empty()) throw_bad_request("messages", "the chat template rendered an empty prompt");
  if (request.tools.is_array()) result.tools = request.tools;  // sorted keys from here on: the order is the template's concern
  return result;
}

}  // namespace loom::server
