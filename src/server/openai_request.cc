#include "server/openai_request.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/chat_request.h"
#include "server/json_input.h"
#include "server/json_output.h"
#include "server/structured_output_request.h"
#include "server/workflow_request.h"
#include "server/workflow_routes.h"

namespace loom::server {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

constexpr int32_t kMaxTopLogprobs = 20;
constexpr int32_t kDefaultCompletionMaxTokens = 16;  // OpenAI's legacy completions default

// Field readers. `object` is a JSON object; absent or null -> the fallback; a
// wrong type or an out-of-range value -> 400 naming `param` (the field's path).
// Nothing here lets an nlohmann exception out: every get<T>() follows a type check.
bool has(const Json& object, const char* key) { return field(object, key) != nullptr; }

[[noreturn]] void throw_out_of_range(const std::string& param, const std::string& range, const Json& value,
                                     const std::string& note = {}) {
  throw_bad_request(param, fmt::format("'{}' must be {}{}, got {}", param, range, note, dump_json(value)));
}

bool read_bool_value(const Json& value, const std::string& param) {
  if (!value.is_boolean()) throw_bad_request(param, fmt::format("'{}' must be a boolean", param));
  return value.get<bool>();
}

bool read_bool(const Json& object, const char* key, bool fallback, const std::string& param) {
  const Json* value = field(object, key);
  return value ? read_bool_value(*value, param) : fallback;
}
}  // namespace

bool read_bool(const Json& object, const char* key, bool fallback) { return read_bool(object, key, fallback, key); }

namespace {

// An integer in [min, max]. JSON has one number type: 3.0 is accepted as 3;
// 3.5, 1e30 and integers beyond int64 are not (no cast of an out-of-range double).
int64_t read_integer_value(const Json& value, const std::string& param, int64_t min, int64_t max,
                           const std::string& note = {}) {
  const std::string range = fmt::format("an integer between {} and {}", min, max);
  if (value.is_number_unsigned()) {
    const uint64_t number = value.get<uint64_t>();
    if (max < 0 || number > static_cast<uint64_t>(max)) throw_out_of_range(param, range, value, note);
    if (static_cast<int64_t>(number) < min) throw_out_of_range(param, range, value, note);
    return static_cast<int64_t>(number);
  }
  if (value.is_number_integer()) {
    const int64_t number = value.get<int64_t>();
    if (number < min || number > max) throw_out_of_range(param, range, value, note);
    return number;
  }
  if (value.is_number_float()) {
    const double number = value.get<double>();
    if (!std::isfinite(number) || number != std::trunc(number))
      throw_bad_request(param, fmt::format("'{}' must be an integer, got {}", param, dump_json(value)));
    // [-2^63, 2^63) is exactly int64's range; compare before casting.
    if (number < -0x1p63 || number >= 0x1p63) throw_out_of_range(param, range, value, note);
    const auto integer = static_cast<int64_t>(number);
    if (integer < min || integer > max) throw_out_of_range(param, range, value, note);
    return integer;
  }
  throw_bad_request(param, fmt::format("'{}' must be an integer", param));
}

int64_t read_int(const Json& object, const char* key, int64_t fallback, int64_t min, int64_t max,
                 const std::string& note = {}) {
  const Json* value = field(object, key);
  return value ? read_integer_value(*value, key, min, max, note) : fallback;
}

// A finite number in [min, max].
double read_number(const Json& object, const char* key, double fallback, double min, double max) {
  const Json* value = field(object, key);
  if (!value) return fallback;
  if (!value->is_number()) throw_bad_request(key, fmt::format("'{}' must be a number", key));
  const double number = value->get<double>();
  if (!(std::isfinite(number) && number >= min && number <= max))  // NaN fails too
    throw_out_of_range(key, fmt::format("between {} and {}", min, max), *value);
  return number;
}

std::string read_string(const Json& object, const char* key, const std::string& fallback) {
  const Json* value = field(object, key);
  if (!value) return fallback;
  if (!value->is_string()) throw_bad_request(key, fmt::format("'{}' must be a string", key));
  return value->get<std::string>();
}

}  // namespace

// [id, ...] with every id in [0, vocab_size); param names the list.
std::vector<TokenId> read_token_ids(const Json& list, const std::string& param, int vocab_size) {
  std::vector<TokenId> ids;
  ids.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string item_param = field_path(param, i);
    if (!list[i].is_number_integer())
      throw_bad_request(item_param, fmt::format("'{}' token lists must hold integers", param));
    ids.push_back(static_cast<TokenId>(read_integer_value(list[i], item_param, 0, vocab_size - 1,
                                                          " (a token id of the vocabulary)")));
  }
  return ids;
}

namespace {

// prompt: "text" | ["text", ...] | [id, ...] | [[id, ...], ...]. How many
// prompts the shape holds, before anything is tokenized (0 = not one of these).
size_t count_prompts(const Json& prompt) {
  if (prompt.is_string()) return 1;
  if (!prompt.is_array() || prompt.empty()) return 0;
  return prompt[0].is_number() ? 1 : prompt.size();
}

std::vector<std::vector<TokenId>> read_prompts(const Json& body, const Tokenizer& tokenizer) {
  const Json& prompt = body["prompt"];  // present: checked by the caller
  const int vocab_size = tokenizer.vocab_size();
  std::vector<std::vector<TokenId>> prompts;
  if (prompt.is_string()) {
    prompts.push_back(tokenizer.encode(prompt.get<std::string>(), true));
  } else if (prompt.is_array() && !prompt.empty()) {
    if (prompt[0].is_number()) {
      prompts.push_back(read_token_ids(prompt, "prompt", vocab_size));
    } else {
      for (size_t i = 0; i < prompt.size(); ++i) {
        const Json& item = prompt[i];
        const std::string param = field_path("prompt", i);
        if (item.is_string()) prompts.push_back(tokenizer.encode(item.get<std::string>(), true));
        else if (item.is_array()) prompts.push_back(read_token_ids(item, param, vocab_size));
        else throw_bad_request(param, "'prompt' must be a string, a list of strings, or token id list(s)");
      }
    }
  } else {
    throw_bad_request("prompt", "'prompt' must be a non-empty string, list of strings, or token id list(s)");
  }
  for (size_t i = 0; i < prompts.size(); ++i)
    if (prompts[i].empty())
      throw_bad_request(prompts.size() == 1 ? std::string("prompt") : field_path("prompt", i), "a prompt is empty");
  return prompts;
}

// stop: "text" | ["text", ...], at most limits.max_stop_strings entries of at
// most limits.max_stop_string_bytes bytes each.
std::vector<std::string> read_stop(const Json& body, const RequestLimits& limits) {
  const Json* stop = field(body, "stop");
  if (!stop) return {};
  auto check_bytes = [&](const std::string& text, const std::string& param) {
    if (text.size() > static_cast<size_t>(std::max(limits.max_stop_string_bytes, 0)))
      throw_bad_request(param, fmt::format("a stop string may have at most {} bytes (the server's "
                                           "--max-stop-string-bytes), got {}",
                                           limits.max_stop_string_bytes, text.size()));
  };
  std::vector<std::string> stops;
  if (stop->is_string()) {
    stops.push_back(stop->get<std::string>());
    check_bytes(stops.back(), "stop");
  } else if (stop->is_array()) {
    for (size_t i = 0; i < stop->size(); ++i) {
      const Json& item = (*stop)[i];
      const std::string param = field_path("stop", i);
      if (!item.is_string()) throw_bad_request(param, "'stop' must be a string or a list of strings");
      stops.push_back(item.get<std::string>());
      check_bytes(stops.back(), param);
    }
  } else {
    throw_bad_request("stop", "'stop' must be a string or a list of strings");
  }
  if (stops.size() > static_cast<size_t>(std::max(limits.max_stop_strings, 0)))
    throw_bad_request("stop", fmt::format("'stop' may have at most {} entries (the server's --max-stop-strings), "
                                          "got {}",
                                          limits.max_stop_strings, stops.size()));
  stops.erase(std::remove(stops.begin(), stops.end(), std::string()), stops.end());
  return stops;
}

// logit_bias: {"token id": bias in [-100, 100], ...} (OpenAI's shape; ids as strings).
std::vector<std::pair<int32_t, float>> read_logit_bias(const Json& body, int vocab_size) {
  std::vector<std::pair<int32_t, float>> biases;
  const Json* value = field(body, "logit_bias");
  if (!value || value->is_null()) return biases;
  if (!value->is_object()) throw_bad_request("logit_bias", "'logit_bias' must be an object of token id -> bias");
  for (const auto& [key, bias] : value->items()) {
    const std::string param = "logit_bias." + key;
    int64_t id = -1;
    const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (error != std::errc() || end != key.data() + key.size() || id < 0 || id >= vocab_size)
      throw_bad_request(param, fmt::format("'logit_bias' keys must be token ids in [0, {})", vocab_size));
    if (!bias.is_number()) throw_bad_request(param, "a logit_bias value must be a number");
    const double number = bias.get<double>();
    if (!(std::isfinite(number) && number >= -100.0 && number <= 100.0))
      throw_out_of_range(param, "between -100 and 100", bias);
    biases.emplace_back(static_cast<int32_t>(id), static_cast<float>(number));
  }
  return biases;
}

// A seed: any integer of int64 or uint64 (clients pick random 64-bit values).
uint64_t read_seed(const Json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  return static_cast<uint64_t>(read_integer_value(value, "seed", INT64_MIN, INT64_MAX));
}

// Knobs we do not implement are refused unless they hold their neutral value,
// so a client never silently gets different semantics.
void refuse_unsupported(const Json& body) {
  if (has(body, "suffix")) throw_bad_request("suffix", "'suffix' is not supported");
  read_int(body, "best_of", 1, 1, 1, " (best_of other than 1 is not supported)");
}

}  // namespace

std::string resolve_adapter(const std::string& model, const ParseContext& context) {
  if (model.empty()) return {};
  for (const auto& name : context.base_model_names)
    if (model == name) return {};
  if (context.has_adapter && context.has_adapter(model)) return model;
  throw ApiError(404, fmt::format("The model '{}' does not exist.", model), "invalid_request_error", "model",
                 "model_not_found");
}

namespace {

// a * b * c for positive factors, saturating at INT64_MAX.
int64_t saturating_product(std::initializer_list<int64_t> factors) {
  int64_t product = 1;
  for (const int64_t factor : factors) {
    if (factor > 0 && product > INT64_MAX / factor) return INT64_MAX;
    product *= factor;
  }
  return product;
}

// Deliver 8: prompts x n x max_tokens is what one request may make the engine
// produce (and hold KV for); n and the prompt count also bound the streams.
void check_output_tokens(size_t num_prompts, int32_t n, int64_t max_tokens, bool max_tokens_is_default,
                         const char* max_tokens_key, const RequestLimits& limits) {
  const int64_t prompts = static_cast<int64_t>(num_prompts);
  if (saturating_product({prompts, n}) > INT32_MAX)
    throw_bad_request("n", fmt::format("{} prompts x n {} is too many choices", prompts, n));
  const int64_t total = saturating_product({prompts, n, max_tokens});
  if (total <= limits.max_request_output_tokens) return;
  throw_bad_request(
      max_tokens_key,
      fmt::format("this request may produce {} tokens ({} prompt(s) x n {} x {} {}{}), more than the server allows "
                  "one request ({}, --max-request-output-tokens); lower n or {}",
                  total, prompts, n, max_tokens_key, max_tokens,
                  max_tokens_is_default ? " by default: the rest of the context" : "",
                  limits.max_request_output_tokens, max_tokens_key));
}

}  // namespace

EngineRequest ParsedRequest::engine_request(int32_t choice_index) const {
  EngineRequest request = engine_template;
  request.prompt_tokens = prompts.at(choice_index / n);
  request.sampling.seed += static_cast<uint64_t>(choice_index % n);
  return request;
}

ParsedRequest parse_openai_request(Endpoint endpoint, std::string_view body_text, const ParseContext& context) {
  const Json body = parse_json_object_body(body_text);
  const bool is_chat = endpoint == Endpoint::kChatCompletions;
  const RequestLimits& limits = context.limits;

  ParsedRequest parsed;
  parsed.endpoint = endpoint;
  parsed.model = read_string(body, "model", context.base_model_names.empty() ? "" : context.base_model_names[0]);
  parsed.adapter = resolve_adapter(parsed.model, context);
  refuse_unsupported(body);

  EngineRequest& request = parsed.engine_template;
  request.adapter = parsed.adapter;
  parsed.n = static_cast<int32_t>(
      read_int(body, "n", 1, 1, std::max(limits.max_n, 1), fmt::format(" (the server's --max-n)")));
  parsed.stream = read_bool(body, "stream", false);
  if (const Json* options = field(body, "stream_options")) {
    if (!options->is_object()) throw_bad_request("stream_options", "'stream_options' must be an object");
    if (!parsed.stream) throw_bad_request("stream_options", "'stream_options' is only allowed with stream: true");
    parsed.include_usage = read_bool(*options, "include_usage", false, "stream_options.include_usage");
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
  parsed.logprobs.as_token_ids = read_bool(body, "return_tokens_as_token_ids", false);

  SamplingParams& sampling = request.sampling;
  const SamplingDefaults& defaults = context.sampling_defaults;
  sampling.temperature = static_cast<float>(read_number(body, "temperature", defaults.temperature, 0.0, 2.0));
  sampling.top_p = static_cast<float>(read_number(body, "top_p", defaults.top_p, 0.0, 1.0));
  if (sampling.top_p <= 0.0f) throw_bad_request("top_p", "'top_p' must be in (0, 1]");
  const int64_t top_k = read_int(body, "top_k", defaults.top_k, -1, INT32_MAX);
  sampling.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);  // vLLM spells "no limit" -1
  const Json* seed = field(body, "seed");
  sampling.seed = seed                         ? read_seed(*seed)
                  : context.next_default_seed ? context.next_default_seed()
                                              : std::random_device{}() * 0x100000000ull + std::random_device{}();
  sampling.num_top_logprobs = parsed.logprobs.enabled ? parsed.logprobs.num_top : 0;
  sampling.presence_penalty = static_cast<float>(read_number(body, "presence_penalty", 0.0, -2.0, 2.0));
  sampling.frequency_penalty = static_cast<float>(read_number(body, "frequency_penalty", 0.0, -2.0, 2.0));
  sampling.repetition_penalty =
      static_cast<float>(read_number(body, "repetition_penalty", defaults.repetition_penalty, 0.0, 100.0));
  if (sampling.repetition_penalty <= 0.0f)
    throw_bad_request("repetition_penalty", "'repetition_penalty' must be > 0 (1: none)");
  sampling.min_p = static_cast<float>(read_number(body, "min_p", defaults.min_p, 0.0, 1.0));
  sampling.logit_bias = read_logit_bias(body, context.tokenizer->vocab_size());

  request.stop_strings = read_stop(body, limits);
  if (const Json* ids = field(body, "stop_token_ids")) {
    if (!ids->is_array()) throw_bad_request("stop_token_ids", "'stop_token_ids' must be a list");
    request.stop_token_ids = read_token_ids(*ids, "stop_token_ids", context.tokenizer->vocab_size());
  }
  request.ignore_eos = read_bool(body, "ignore_eos", false);
  request.include_stop_str_in_output = read_bool(body, "include_stop_str_in_output", false);
  request.skip_special_tokens = read_bool(body, "skip_special_tokens", true);
  // Schemas (tools, response_format...) are read keeping the client's key order.
  const bool asks_for_constraint = has(body, "response_format") || has(body, "structured_outputs") ||
                                   has(body, "guided_json") || has(body, "guided_regex") ||
                                   has(body, "guided_choice") || has(body, "guided_grammar");
  const OrderedJson ordered_body =
      (is_chat && (has(body, "tools") || has(body, "tool_choice") || has(body, "parallel_tool_calls"))) ||
              asks_for_constraint
          ? OrderedJson::parse(body_text)
          : OrderedJson::object();
  if (is_chat) {
    parsed.tool_choice = parse_tool_choice(ordered_body, context.tool_call_parser);
    const auto request_template = body.find("chat_template");
    check_auto_tool_choice(parsed.tool_choice, request_template != body.end() && request_template->is_string()
                                                   ? chat_template_renders_tools(request_template->get<std::string>())
                                                   : context.chat_template_renders_tools);
    // vLLM's rule: call markers are special tokens in most vocabularies
    // ([TOOL_CALLS], <|python_tag|>), so the parser needs their text.
    if (parsed.tool_choice.mode == ToolChoiceMode::kAuto && parsed.tool_choice.parses_output() &&
        !has(body, "skip_special_tokens"))
      request.skip_special_tokens = false;
  }
  request.priority = static_cast<int32_t>(read_int(body, "priority", 0, INT32_MIN, INT32_MAX));
  try {
    WorkflowHints hints = parse_workflow_hints(body);
    request.workflow = std::move(hints.workflow);
    request.agent = std::move(hints.agent);
    request.fixed_prefix_tokens = hints.fixed_prefix_tokens;
  } catch (const Error& error) {
    throw workflow_api_error(error);
  }

  // max_tokens: OpenAI's default 16 for completions; the rest of the context
  // for chat. Both spellings are checked when both are given (chat uses
  // max_completion_tokens then).
  const int64_t explicit_max_tokens = read_int(body, "max_tokens", 0, 1, INT32_MAX);
  const char* max_tokens_key = "max_tokens";
  int64_t max_tokens = explicit_max_tokens;
  if (is_chat && has(body, "max_completion_tokens")) {
    max_tokens_key = "max_completion_tokens";
    max_tokens = read_int(body, "max_completion_tokens", 0, 1, INT32_MAX);
  }
  const bool has_max_tokens = max_tokens > 0;

  // The output bound before any tokenizing work where it is already known.
  size_t num_prompts = 1;
  if (!is_chat) {
    if (!has(body, "prompt")) throw_bad_request("prompt", "'prompt' is required");
    num_prompts = count_prompts(body["prompt"]);
    if (num_prompts == 0)
      throw_bad_request("prompt", "'prompt' must be a non-empty string, list of strings, or token id list(s)");
    check_output_tokens(num_prompts, parsed.n, has_max_tokens ? max_tokens : kDefaultCompletionMaxTokens, false,
                        max_tokens_key, limits);
  } else if (has_max_tokens) {
    check_output_tokens(1, parsed.n, max_tokens, false, max_tokens_key, limits);
  }

  if (is_chat) {
    std::optional<ChatRenderer> own_renderer;
    if (!context.chat_renderer) own_renderer.emplace(context.tokenizer->model_chat_templates());
    ChatPrompt chat = read_chat_prompt(body_text, *context.tokenizer,
                                       context.chat_renderer ? *context.chat_renderer : *own_renderer);
    parsed.prompts.push_back(std::move(chat.tokens));
    parsed.tools = std::move(chat.tools);
    if (context.reasoning_parser != reasoning::ReasoningKind::kNone) {
      parsed.reasoning.kind = context.reasoning_parser;
      parsed.reasoning.starts_in_answer =
          reasoning::starts_in_answer(context.reasoning_parser, chat.tail, chat.enable_thinking);
    }
  } else {
    parsed.prompts = read_prompts(body, *context.tokenizer);
  }
  const bool echo = read_bool(body, "echo", false);
  if (is_chat && echo) throw_bad_request("echo", "'echo' is supported on /v1/completions only");
  if (!is_chat && echo) {
    if (parsed.logprobs.enabled)
      throw_bad_request("echo", "'echo' with 'logprobs' is not supported (the prompt's logprobs are not computed)");
    const Json& prompt = body["prompt"];
    for (size_t i = 0; i < parsed.prompts.size(); ++i) {
      const Json& item = prompt.is_string() || (prompt.is_array() && prompt[0].is_number()) ? prompt : prompt[i];
      parsed.echo_texts.push_back(item.is_string() ? item.get<std::string>()
                                                   : context.tokenizer->decode(parsed.prompts[i], true));
    }
  }

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
                               context_tokens, static_cast<int64_t>(longest_prompt) + max_tokens, longest_prompt, where,
                               max_tokens, where),
                   "invalid_request_error", where, "context_length_exceeded");
  }
  check_output_tokens(parsed.prompts.size(), parsed.n, max_tokens, !has_max_tokens && is_chat, max_tokens_key, limits);
  request.max_new_tokens = static_cast<int32_t>(max_tokens);
  request.min_new_tokens = static_cast<int32_t>(read_int(body, "min_tokens", 0, 0, max_tokens));
  std::shared_ptr<grammar::ConstraintCompiler> constraints = context.constraints;
  const bool forces_tool_calls = parsed.tool_choice.output_schema.has_value();
  if (!constraints && (asks_for_constraint || forces_tool_calls))
    constraints = std::make_shared<grammar::ConstraintCompiler>(
        grammar::TokenVocabulary::from_tokenizer(*context.tokenizer), 0);
  if (forces_tool_calls) {
    // tool_choice "required" / a named function: the output is forced to the
    // calls' JSON (as vLLM does), read back by forced_tool_calls in the
    // response. It governs: response_format and the other constraint fields
    // are not read (vLLM's behaviour; docs/api.md).
    request.constraint = compile_json_schema_constraint(
        *constraints, *parsed.tool_choice.output_schema, "tool_choice",
        parsed.tool_choice.output_schema_strict ? grammar::SchemaStrictness::kStrict : grammar::SchemaStrictness::kLenient);
  } else if (asks_for_constraint) {
    request.constraint = read_structured_output(ordered_body, *constraints);
  }
  // vLLM's reasoning + structured output: the grammar governs the answer only.
  if (request.constraint && !parsed.reasoning.starts_in_answer) request.constraint_after = reasoning::kThinkEnd;
  if (request.constraint)
    for (const grammar::UnenforcedKeyword& unenforced : request.constraint->grammar().unenforced)
      if (std::find(parsed.unenforced_schema_keywords.begin(), parsed.unenforced_schema_keywords.end(),
                    unenforced.keyword) == parsed.unenforced_schema_keywords.end())
        parsed.unenforced_schema_keywords.push_back(unenforced.keyword);
  return parsed;
}

}  // namespace loom::server
