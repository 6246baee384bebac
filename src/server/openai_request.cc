#include "server/openai_request.h"

#include <algorithm>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/workflow_request.h"
#include "server/workflow_routes.h"

namespace loom::server {
namespace {

using Json = nlohmann::json;

constexpr int32_t kMaxTopLogprobs = 20;
constexpr int32_t kDefaultCompletionMaxTokens = 16;  // OpenAI's legacy completions default

// Field readers: absent or null -> default; a wrong type -> 400 naming the field.
bool has(const Json& body, const char* key) { return body.contains(key) && !body[key].is_null(); }

bool read_bool(const Json& body, const char* key, bool fallback) {
  if (!has(body, key)) return fallback;
  if (!body[key].is_boolean()) throw_bad_request(key, fmt::format("'{}' must be a boolean", key));
  return body[key].get<bool>();
}

int64_t read_int(const Json& body, const char* key, int64_t fallback, int64_t min, int64_t max) {
  if (!has(body, key)) return fallback;
  const Json& value = body[key];
  // JSON has one number type: 3.0 is accepted as 3, 3.5 is not.
  if (value.is_number_float() && value.get<double>() == static_cast<double>(static_cast<int64_t>(value.get<double>())))
    return read_int(Json{{key, static_cast<int64_t>(value.get<double>())}}, key, fallback, min, max);
  if (!value.is_number_integer()) throw_bad_request(key, fmt::format("'{}' must be an integer", key));
  const int64_t number = value.is_number_unsigned() && value.get<uint64_t>() > INT64_MAX ? INT64_MAX : value.get<int64_t>();
  if (number < min || number > max)
    throw_bad_request(key, fmt::format("'{}' must be between {} and {}, got {}", key, min, max, number));
  return number;
}

double read_number(const Json& body, const char* key, double fallback, double min, double max) {
  if (!has(body, key)) return fallback;
  if (!body[key].is_number()) throw_bad_request(key, fmt::format("'{}' must be a number", key));
  const double number = body[key].get<double>();
  if (!(number >= min && number <= max))
    throw_bad_request(key, fmt::format("'{}' must be between {} and {}, got {}", key, min, max, number));
  return number;
}

std::string read_string(const Json& body, const char* key, const std::string& fallback) {
  if (!has(body, key)) return fallback;
  if (!body[key].is_string()) throw_bad_request(key, fmt::format("'{}' must be a string", key));
  return body[key].get<std::string>();
}

std::vector<TokenId> read_token_ids(const Json& list, const char* param, int vocab_size) {
  std::vector<TokenId> ids;
  for (const Json& item : list) {
    if (!item.is_number_integer()) throw_bad_request(param, fmt::format("'{}' token lists must hold integers", param));
    const int64_t id = item.get<int64_t>();
    if (id < 0 || id >= vocab_size)
      throw_bad_request(param, fmt::format("token id {} is outside the vocabulary [0, {})", id, vocab_size));
    ids.push_back(static_cast<TokenId>(id));
  }
  return ids;
}

// prompt: "text" | ["text", ...] | [id, ...] | [[id, ...], ...]
std::vector<std::vector<TokenId>> read_prompts(const Json& body, const Tokenizer& tokenizer) {
  if (!has(body, "prompt")) throw_bad_request("prompt", "'prompt' is required");
  const Json& prompt = body["prompt"];
  const int vocab_size = tokenizer.vocab_size();
  std::vector<std::vector<TokenId>> prompts;
  if (prompt.is_string()) {
    prompts.push_back(tokenizer.encode(prompt.get<std::string>(), true));
  } else if (prompt.is_array() && !prompt.empty()) {
    if (prompt[0].is_number_integer()) {
      prompts.push_back(read_token_ids(prompt, "prompt", vocab_size));
    } else {
      for (const Json& item : prompt) {
        if (item.is_string()) prompts.push_back(tokenizer.encode(item.get<std::string>(), true));
        else if (item.is_array()) prompts.push_back(read_token_ids(item, "prompt", vocab_size));
        else throw_bad_request("prompt", "'prompt' must be a string, a list of strings, or token id list(s)");
      }
    }
  } else {
    throw_bad_request("prompt", "'prompt' must be a non-empty string, list of strings, or token id list(s)");
  }
  for (const auto& tokens : prompts)
    if (tokens.empty()) throw_bad_request("prompt", "a prompt is empty");
  return prompts;
}

// content: "text" | [{"type": "text", "text": "..."}, ...]
std::string read_message_content(const Json& message, size_t index) {
  const std::string param = fmt::format("messages[{}].content", index);
  if (!message.contains("content") || message["content"].is_null()) return {};
  const Json& content = message["content"];
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw_bad_request(param, "message content must be a string or a list of text parts");
  std::string text;
  for (const Json& part : content) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
      throw_bad_request(param, "only {\"type\": \"text\", \"text\": ...} content parts are supported");
    text += part["text"].get<std::string>();
  }
  return text;
}

std::vector<TokenId> read_chat_prompt(const Json& body, const Tokenizer& tokenizer) {
  if (!has(body, "messages")) throw_bad_request("messages", "'messages' is required");
  const Json& list = body["messages"];
  if (!list.is_array()) throw_bad_request("messages", "'messages' must be a list");
  if (list.empty()) throw_bad_request("messages", "'messages' must not be empty");
  static const char* const kRoles[] = {"system", "developer", "user", "assistant", "tool"};
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& message = list[i];
    if (!message.is_object()) throw_bad_request(fmt::format("messages[{}]", i), "each message must be an object");
    if (!message.contains("role") || !message["role"].is_string())
      throw_bad_request(fmt::format("messages[{}].role", i), "each message needs a string 'role'");
    std::string role = message["role"].get<std::string>();
    if (std::find(std::begin(kRoles), std::end(kRoles), role) == std::end(kRoles))
      throw_bad_request(fmt::format("messages[{}].role", i), fmt::format("unknown role '{}'", role));
    if (role == "developer") role = "system";
    messages.push_back({role, read_message_content(message, i)});
  }
  return tokenizer.encode(tokenizer.chat_template().render(messages, true), false);
}

std::vector<std::string> read_stop(const Json& body) {
  if (!has(body, "stop")) return {};
  const Json& stop = body["stop"];
  std::vector<std::string> stops;
  if (stop.is_string()) {
    stops.push_back(stop.get<std::string>());
  } else if (stop.is_array()) {
    for (const Json& item : stop) {
      if (!item.is_string()) throw_bad_request("stop", "'stop' must be a string or a list of strings");
      stops.push_back(item.get<std::string>());
    }
  } else {
    throw_bad_request("stop", "'stop' must be a string or a list of strings");
  }
  stops.erase(std::remove(stops.begin(), stops.end(), std::string()), stops.end());
  return stops;
}

// Knobs we do not implement are refused unless they hold their neutral value,
// so a client never silently gets different semantics.
void refuse_unsupported(const Json& body, Endpoint endpoint) {
  for (const char* key : {"presence_penalty", "frequency_penalty"})
    if (has(body, key) && (!body[key].is_number() || body[key].get<double>() != 0.0))
      throw_bad_request(key, fmt::format("'{}' is not supported (use 0)", key));
  if (has(body, "repetition_penalty") &&
      (!body["repetition_penalty"].is_number() || body["repetition_penalty"].get<double>() != 1.0))
    throw_bad_request("repetition_penalty", "'repetition_penalty' is not supported (use 1)");
  if (has(body, "logit_bias") && !(body["logit_bias"].is_object() && body["logit_bias"].empty()))
    throw_bad_request("logit_bias", "'logit_bias' is not supported");
  if (read_bool(body, "echo", false)) throw_bad_request("echo", "'echo' is not supported");
  if (has(body, "suffix")) throw_bad_request("suffix", "'suffix' is not supported");
  if (has(body, "best_of") && read_int(body, "best_of", 1, 1, 1) != 1)
    throw_bad_request("best_of", "'best_of' other than 1 is not supported");
  if (endpoint == Endpoint::kChatCompletions) {
    if (has(body, "tools") && !(body["tools"].is_array() && body["tools"].empty()))
      throw_bad_request("tools", "tool calling is not supported");
    if (has(body, "response_format") &&
        !(body["response_format"].is_object() && body["response_format"].value("type", "") == "text"))
      throw_bad_request("response_format", "only response_format {\"type\": \"text\"} is supported");
  }
}

std::string resolve_adapter(const std::string& model, const ParseContext& context) {
  if (model.empty()) return {};
  for (const auto& name : context.base_model_names)
    if (model == name) return {};
  if (context.has_adapter && context.has_adapter(model)) return model;
  throw ApiError(404, fmt::format("The model '{}' does not exist.", model), "invalid_request_error", "model",
                 "model_not_found");
}

}  // namespace

EngineRequest ParsedRequest::engine_request(int32_t choice_index) const {
  EngineRequest request = engine_template;
  request.prompt_tokens = prompts.at(choice_index / n);
  request.sampling.seed += static_cast<uint64_t>(choice_index % n);
  return request;
}

ParsedRequest parse_openai_request(Endpoint endpoint, std::string_view body_text, const ParseContext& context) {
  Json body;
  try {
    body = Json::parse(body_text);
  } catch (const Json::parse_error& error) {
    throw ApiError(400, std::string("the body is not valid JSON: ") + error.what());
  }
  if (!body.is_object()) throw ApiError(400, "the body must be a JSON object");
  const bool is_chat = endpoint == Endpoint::kChatCompletions;

  ParsedRequest parsed;
  parsed.endpoint = endpoint;
  parsed.model = read_string(body, "model", context.base_model_names.empty() ? "" : context.base_model_names[0]);
  parsed.adapter = resolve_adapter(parsed.model, context);
  refuse_unsupported(body, endpoint);

  EngineRequest& request = parsed.engine_template;
  request.adapter = parsed.adapter;
  parsed.n = static_cast<int32_t>(read_int(body, "n", 1, 1, context.limits.max_n));
  parsed.stream = read_bool(body, "stream", false);
  if (has(body, "stream_options")) {
    if (!body["stream_options"].is_object()) throw_bad_request("stream_options", "'stream_options' must be an object");
    if (!parsed.stream) throw_bad_request("stream_options", "'stream_options' is only allowed with stream: true");
    parsed.include_usage = read_bool(body["stream_options"], "include_usage", false);
  }

  if (is_chat) {
    parsed.logprobs.enabled = read_bool(body, "logprobs", false);
    parsed.logprobs.num_top = static_cast<int32_t>(read_int(body, "top_logprobs", 0, 0, kMaxTopLogprobs));
    if (has(body, "top_logprobs") && !parsed.logprobs.enabled)
      throw_bad_request("top_logprobs", "'top_logprobs' requires 'logprobs': true");
  } else if (has(body, "logprobs")) {
    parsed.logprobs.enabled = true;
    parsed.logprobs.num_top = static_cast<int32_t>(read_int(body, "logprobs", 0, 0, kMaxTopLogprobs));
  }

  SamplingParams& sampling = request.sampling;
  sampling.temperature = static_cast<float>(read_number(body, "temperature", 1.0, 0.0, 2.0));
  sampling.top_p = static_cast<float>(read_number(body, "top_p", 1.0, 0.0, 1.0));
  if (sampling.top_p <= 0.0f) throw_bad_request("top_p", "'top_p' must be in (0, 1]");
  const int64_t top_k = read_int(body, "top_k", 0, -1, INT32_MAX);
  sampling.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);  // vLLM spells "no limit" -1
  sampling.seed = has(body, "seed") ? static_cast<uint64_t>(read_int(body, "seed", 0, INT64_MIN, INT64_MAX))
                                    : std::random_device{}() * 0x100000000ull + std::random_device{}();
  sampling.num_top_logprobs = parsed.logprobs.enabled ? parsed.logprobs.num_top : 0;

  request.stop_strings = read_stop(body);
  if (has(body, "stop_token_ids")) {
    if (!body["stop_token_ids"].is_array()) throw_bad_request("stop_token_ids", "'stop_token_ids' must be a list");
    request.stop_token_ids = read_token_ids(body["stop_token_ids"], "stop_token_ids", context.tokenizer->vocab_size());
  }
  request.ignore_eos = read_bool(body, "ignore_eos", false);
  request.priority = static_cast<int32_t>(read_int(body, "priority", 0, INT32_MIN, INT32_MAX));
  try {
    WorkflowHints hints = parse_workflow_hints(body);
    request.workflow = std::move(hints.workflow);
    request.agent = std::move(hints.agent);
    request.fixed_prefix_tokens = hints.fixed_prefix_tokens;
  } catch (const Error& error) {
    throw workflow_api_error(error);
  }

  parsed.prompts = is_chat ? std::vector<std::vector<TokenId>>{read_chat_prompt(body, *context.tokenizer)}
                           : read_prompts(body, *context.tokenizer);

  // max_tokens: OpenAI's default 16 for completions; the rest of the context for chat.
  const char* max_tokens_key = is_chat && has(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  const bool has_max_tokens = has(body, max_tokens_key);
  int64_t max_tokens = read_int(body, max_tokens_key, 0, 1, INT32_MAX);
  size_t longest_prompt = 0;
  for (const auto& tokens : parsed.prompts) longest_prompt = std::max(longest_prompt, tokens.size());
  const int64_t context_tokens = context.max_context_tokens;
  if (!has_max_tokens)
    max_tokens = is_chat ? std::max<int64_t>(context_tokens - static_cast<int64_t>(longest_prompt), 1)
                         : kDefaultCompletionMaxTokens;
  if (static_cast<int64_t>(longest_prompt) + max_tokens > context_tokens) {
    const char* where = is_chat ? "messages" : "prompt";
    throw ApiError(400,
                   fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                               "({} in the {}, {} in the completion). Please reduce the length of the {} or completion.",
                               context_tokens, longest_prompt + max_tokens, longest_prompt, where, max_tokens, where),
                   "invalid_request_error", where, "context_length_exceeded");
  }
  request.max_new_tokens = static_cast<int32_t>(max_tokens);
  request.min_new_tokens = static_cast<int32_t>(read_int(body, "min_tokens", 0, 0, max_tokens));
  return parsed;
}

}  // namespace loom::server
