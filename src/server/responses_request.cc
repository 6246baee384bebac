#include "server/responses_request.h"

#include <fmt/format.h>

#include <unordered_map>

#include "server/api_error.h"
#include "server/json_input.h"

namespace loom::server {
namespace {

using OrderedJson = nlohmann::ordered_json;

const std::string& require_string(const OrderedJson& object, const char* key, const std::string& parent) {
  const OrderedJson* value = field(object, key);
  if (!value || !value->is_string())
    throw_bad_request(field_path(parent, key), fmt::format("'{}' must be a string", key));
  return value->get_ref<const std::string&>();
}

// The text of content parts ([{type: input_text|output_text|text, text}, ...]).
void check_text_parts(const OrderedJson& parts, const std::string& param) {
  if (!parts.is_array()) throw_bad_request(param, "content must be a string or a list of text parts");
  for (size_t j = 0; j < parts.size(); ++j) {
    const OrderedJson& part = parts[j];
    const std::string part_param = field_path(param, j);
    if (!part.is_object()) throw_bad_request(part_param, "each content part must be an object");
    const std::string& type = require_string(part, "type", part_param);
    if (type == "refusal") {
      require_string(part, "refusal", part_param);
      continue;
    }
    if (type != "input_text" && type != "output_text" && type != "text")
      throw_bad_request(field_path(part_param, "type"),
                        fmt::format("content parts of type \"{}\" are not supported (text only: input_text, "
                                    "output_text)",
                                    type));
    require_string(part, "text", part_param);
  }
}

void check_item(const OrderedJson& item, const std::string& param) {
  if (!item.is_object()) throw_bad_request(param, "each input item must be an object");
  check_optional_string(item, "type", param);
  const std::string type = field(item, "type") ? item["type"].get<std::string>() : "message";
  if (type == "message") {
    const std::string& role = require_string(item, "role", param);
    if (role != "user" && role != "system" && role != "developer" && role != "assistant")
      throw_bad_request(field_path(param, "role"),
                        fmt::format("a message's role must be user, system, developer or assistant, got \"{}\"", role));
    const OrderedJson* content = field(item, "content");
    if (!content) throw_bad_request(field_path(param, "content"), "a message needs 'content'");
    if (!content->is_string()) check_text_parts(*content, field_path(param, "content"));
  } else if (type == "function_call") {
    require_string(item, "call_id", param);
    require_string(item, "name", param);
    const OrderedJson* arguments = field(item, "arguments");
    if (!arguments || !arguments->is_string())
      throw_bad_request(field_path(param, "arguments"), "'arguments' must be a JSON string");
  } else if (type == "function_call_output") {
    require_string(item, "call_id", param);
    const OrderedJson* output = field(item, "output");
    if (!output) throw_bad_request(field_path(param, "output"), "a function_call_output needs 'output'");
    if (!output->is_string()) check_text_parts(*output, field_path(param, "output"));
  } else if (type != "reasoning") {
    throw_bad_request(field_path(param, "type"),
                      fmt::format("input items of type \"{}\" are not supported (message, function_call, "
                                  "function_call_output, reasoning)",
                                  type));
  }
}

// [{type: "function", name, description?, parameters?, strict?}, ...]
void check_tools(const OrderedJson& tools) {
  if (!tools.is_array()) throw_bad_request("tools", "'tools' must be a list");
  for (size_t i = 0; i < tools.size(); ++i) {
    const OrderedJson& tool = tools[i];
    const std::string param = field_path("tools", i);
    if (!tool.is_object()) throw_bad_request(param, "each tool must be an object");
    const OrderedJson* type = field(tool, "type");
    if (!type || *type != "function")
      throw_bad_request(field_path(param, "type"),
                        fmt::format("only tools of type \"function\" are supported, got {}",
                                    type ? type->dump() : std::string("none")));
    if (field(tool, "function")) continue;  // the chat shape, passed on as it is (the chat path checks it)
    require_string(tool, "name", param);
    check_optional_string(tool, "description", param);
    if (const OrderedJson* parameters = field(tool, "parameters"); parameters && !parameters->is_object())
      throw_bad_request(field_path(param, "parameters"), "'parameters' must be a JSON Schema object");
  }
}

OrderedJson chat_tool_choice(const OrderedJson& choice) {
  if (choice.is_string()) return choice;  // none / auto / required, or a 400 from the chat path
  if (choice.is_object() && field(choice, "type") && choice["type"] == "function") {
    if (field(choice, "function")) return choice;  // the chat shape
    const std::string& name = require_string(choice, "name", "tool_choice");
    return {{"type", "function"}, {"function", {{"name", name}}}};
  }
  throw_bad_request("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                   "{\"type\": \"function\", \"name\": ...} (hosted tools and allowed_tools are not "
                                   "supported)");
}

// text.format as chat's response_format (null for plain text).
OrderedJson chat_response_format(const OrderedJson& text) {
  if (!text.is_object()) throw_bad_request("text", "'text' must be an object");
  const OrderedJson* format = field(text, "format");
  if (!format) return nullptr;
  if (!format->is_object()) throw_bad_request("text.format", "'text.format' must be an object");
  const std::string& type = require_string(*format, "type", "text.format");
  if (type == "text") return nullptr;
  if (type == "json_object") return {{"type", "json_object"}};
  if (type != "json_schema")
    throw_bad_request("text.format.type",
                      fmt::format("'text.format.type' must be text, json_object or json_schema, got \"{}\"", type));
  const OrderedJson* schema = field(*format, "schema");
  if (!schema || !schema->is_object()) throw_bad_request("text.format.schema", "'schema' must be a JSON Schema object");
  OrderedJson json_schema = {{"name", field(*format, "name") ? (*format)["name"] : OrderedJson("response")},
                             {"schema", *schema}};
  if (const OrderedJson* strict = field(*format, "strict")) json_schema["strict"] = *strict;
  if (const OrderedJson* description = field(*format, "description")) json_schema["description"] = *description;
  return {{"type", "json_schema"}, {"json_schema", std::move(json_schema)}};
}

// Fields the chat path reads the same way (OpenAI's and vLLM's sampling
// fields, constraints, templates, Loom's workflow hints).
constexpr const char* kPassedOn[] = {
    "model", "temperature", "top_p", "parallel_tool_calls", "seed", "top_k", "min_p", "repetition_penalty",
    "presence_penalty", "frequency_penalty", "stop", "stop_token_ids", "logit_bias", "ignore_eos", "min_tokens",
    "skip_special_tokens", "include_stop_str_in_output", "priority", "chat_template", "chat_template_kwargs",
    "structured_outputs", "workflow", "agent", "fixed_prefix_tokens", "agent_hints", "kv_hints"};

void refuse_unsupported(const OrderedJson& body) {
  if (const OrderedJson* background = field(body, "background"); background && *background != false)
    throw_bad_request("background", "'background' responses are not supported");
  for (const char* key : {"prompt", "conversation", "max_tool_calls"})
    if (field(body, key)) throw_bad_request(key, fmt::format("'{}' is not supported", key));
  if (const OrderedJson* top = field(body, "top_logprobs"); top && *top != 0)
    throw_bad_request("top_logprobs", "'top_logprobs' is not supported on /v1/responses");
  if (const OrderedJson* truncation = field(body, "truncation"); truncation && *truncation != "disabled")
    throw_bad_request("truncation", "only 'truncation': \"disabled\" is supported");
}

OrderedJson text_of(const OrderedJson& content) {
  if (content.is_string()) return content;
  std::string text;
  for (const OrderedJson& part : content)
    text += part.contains("text") ? part["text"].get<std::string>() : part.value("refusal", std::string());
  return text;
}

}  // namespace

ResponsesRequest parse_responses_request(std::string_view body_text) {
  parse_json_object_body(body_text);  // nesting, UTF-8 and syntax checks; names the field
  ResponsesRequest request;
  request.body = OrderedJson::parse(body_text);
  const OrderedJson& body = request.body;
  refuse_unsupported(body);
  const OrderedJson* input = field(body, "input");
  if (!input) throw_bad_request("input", "'input' is required");
  if (input->is_string()) {
    request.input_items = OrderedJson::array({{{"type", "message"}, {"role", "user"}, {"content", *input}}});
  } else if (input->is_array()) {
    for (size_t i = 0; i < input->size(); ++i) check_item((*input)[i], field_path("input", i));
    request.input_items = *input;
  } else {
    throw_bad_request("input", "'input' must be a string or a list of items");
  }
  check_optional_string(body, "instructions", "");
  check_optional_string(body, "previous_response_id", "");
  if (const OrderedJson* id = field(body, "previous_response_id")) request.previous_response_id = id->get<std::string>();
  for (const char* key : {"store", "stream"})
    if (const OrderedJson* value = field(body, key); value && !value->is_boolean())
      throw_bad_request(key, fmt::format("'{}' must be a boolean", key));
  if (const OrderedJson* store = field(body, "store")) request.store = store->get<bool>();
  if (const OrderedJson* stream = field(body, "stream")) request.stream = stream->get<bool>();
  if (const OrderedJson* tools = field(body, "tools")) check_tools(*tools);
  if (const OrderedJson* metadata = field(body, "metadata"); metadata && !metadata->is_object())
    throw_bad_request("metadata", "'metadata' must be an object");
  return request;
}

OrderedJson items_to_messages(const OrderedJson& items) {
  OrderedJson messages = OrderedJson::array();
  std::unordered_map<std::string, std::string> call_names;  // call_id -> function name
  for (const OrderedJson& item : items) {
    const std::string type = item.contains("type") && item["type"].is_string() ? item["type"].get<std::string>()
                                                                                : "message";
    if (type == "message") {
      messages.push_back({{"role", item["role"]}, {"content", text_of(item["content"])}});
    } else if (type == "function_call") {
      const std::string& call_id = item["call_id"].get_ref<const std::string&>();
      call_names[call_id] = item["name"].get<std::string>();
      OrderedJson call = {{"id", call_id},
                          {"type", "function"},
                          {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}};
      const bool joins = !messages.empty() && messages.back()["role"] == "assistant";
      if (!joins) messages.push_back({{"role", "assistant"}, {"content", nullptr}});
      OrderedJson& message = messages.back();
      if (!message.contains("tool_calls")) message["tool_calls"] = OrderedJson::array();
      message["tool_calls"].push_back(std::move(call));
    } else if (type == "function_call_output") {
      const std::string& call_id = item["call_id"].get_ref<const std::string&>();
      OrderedJson message = {{"role", "tool"}, {"tool_call_id", call_id}, {"content", text_of(item["output"])}};
      if (const auto name = call_names.find(call_id); name != call_names.end()) message["name"] = name->second;
      messages.push_back(std::move(message));
    }  // reasoning items: not rendered
  }
  return messages;
}

OrderedJson to_chat_body(const ResponsesRequest& request, const OrderedJson& history) {
  const OrderedJson& body = request.body;
  OrderedJson chat = OrderedJson::object();
  for (const char* key : kPassedOn)
    if (const OrderedJson* value = field(body, key)) chat[key] = *value;
  OrderedJson messages = OrderedJson::array();
  if (const OrderedJson* instructions = field(body, "instructions"); instructions && !instructions->empty())
    messages.push_back({{"role", "system"}, {"content", *instructions}});
  OrderedJson items = history.is_array() ? history : OrderedJson::array();
  for (const OrderedJson& item : request.input_items) items.push_back(item);
  for (OrderedJson& message : items_to_messages(items)) messages.push_back(std::move(message));
  chat["messages"] = std::move(messages);
  if (const OrderedJson* tools = field(body, "tools")) {
    OrderedJson list = OrderedJson::array();
    for (const OrderedJson& tool : *tools) {
      if (field(tool, "function")) {
        list.push_back(tool);
        continue;
      }
      OrderedJson function = {{"name", tool["name"]}};
      for (const char* key : {"description", "parameters", "strict"})
        if (const OrderedJson* value = field(tool, key)) function[key] = *value;
      list.push_back({{"type", "function"}, {"function", std::move(function)}});
    }
    if (!list.empty()) chat["tools"] = std::move(list);
  }
  if (const OrderedJson* choice = field(body, "tool_choice")) chat["tool_choice"] = chat_tool_choice(*choice);
  if (const OrderedJson* text = field(body, "text"))
    if (OrderedJson format = chat_response_format(*text); !format.is_null()) chat["response_format"] = std::move(format);
  if (const OrderedJson* max_tokens = field(body, "max_output_tokens")) chat["max_completion_tokens"] = *max_tokens;
  return chat;
}

}  // namespace loom::server
