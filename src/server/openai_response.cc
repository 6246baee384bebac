#include "server/openai_response.h"

#include <algorithm>
#include <cmath>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "server/json_output.h"
#include "toolcall/forced_call_reader.h"

namespace loom::server {
namespace {

using Json = nlohmann::json;

// Token text may be a partial UTF-8 character: dump_json replaces rather than throws.
std::string sse(const Json& json) { return "data: " + dump_json(json) + "\n\n"; }

// OpenAI reports -9999.0 where a probability underflows; JSON has no -inf.
double finite_logprob(float logprob) { return std::isfinite(logprob) ? logprob : -9999.0; }

Json token_bytes_json(const Tokenizer& tokenizer, TokenId id) {
  Json bytes = Json::array();
  for (unsigned char byte : tokenizer.token_bytes(id)) bytes.push_back(static_cast<int>(byte));
  return bytes;
}

std::string token_text(const Tokenizer& tokenizer, TokenId id) { return tokenizer.decode({id}, false); }

// How logprobs name a token: its text, or "token_id:<id>" (vLLM's return_tokens_as_token_ids).
std::string token_string(const Tokenizer& tokenizer, TokenId id, bool as_id) {
  return as_id ? fmt::format("token_id:{}", id) : token_text(tokenizer, id);
}

// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}
Json chat_logprobs(const Tokenizer& tokenizer, const std::vector<SampledToken>& tokens, const LogprobsRequest& request) {
  const int32_t num_top = request.num_top;
  const bool as_id = request.as_token_ids;
  Json content = Json::array();
  for (const auto& sampled : tokens) {
    Json top = Json::array();
    for (const auto& [id, logprob] : sampled.top_logprobs) {
      if (static_cast<int32_t>(top.size()) >= num_top) break;
      top.push_back({{"token", token_string(tokenizer, id, as_id)},
                     {"logprob", finite_logprob(logprob)},
                     {"bytes", token_bytes_json(tokenizer, id)}});
    }
    content.push_back({{"token", token_string(tokenizer, sampled.token_id, as_id)},
                       {"logprob", finite_logprob(sampled.logprob)},
                       {"bytes", token_bytes_json(tokenizer, sampled.token_id)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

// Completions: {"tokens", "token_logprobs", "top_logprobs": [{text: logprob}], "text_offset"}.
// The sampled token is among each position's alternatives, as vLLM reports it.
Json completion_logprobs(const Tokenizer& tokenizer, const std::vector<SampledToken>& tokens,
                         const LogprobsRequest& request, int64_t& text_offset) {
  const int32_t num_top = request.num_top;
  const bool as_id = request.as_token_ids;
  Json strings = Json::array(), logprobs = Json::array(), tops = Json::array(), offsets = Json::array();
  for (const auto& sampled : tokens) {
    const std::string text = token_string(tokenizer, sampled.token_id, as_id);
    strings.push_back(text);
    logprobs.push_back(finite_logprob(sampled.logprob));
    offsets.push_back(text_offset);
    text_offset += static_cast<int64_t>(token_text(tokenizer, sampled.token_id).size());
    Json top = Json::object();
    int32_t num_added = 0;
    for (const auto& [id, logprob] : sampled.top_logprobs) {
      if (num_added++ >= num_top) break;
      top.emplace(token_string(tokenizer, id, as_id), finite_logprob(logprob));
    }
    top.emplace(text, finite_logprob(sampled.logprob));  // no-op when already present
    tops.push_back(num_top > 0 ? top : Json(nullptr));
  }
  return {{"tokens", strings}, {"token_logprobs", logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

// Chat's usage carries completion_tokens_details (reasoning_tokens), as OpenAI's; completions' does not.
Json usage_json(const Usage& usage, bool is_chat) {
  Json json = {{"prompt_tokens", usage.prompt_tokens},
               {"completion_tokens", usage.completion_tokens},
               {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
               {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
  if (is_chat) json["completion_tokens_details"] = {{"reasoning_tokens", usage.reasoning_tokens}};
  return json;
}

Json tool_calls_json(const std::vector<toolcall::ToolCall>& calls) {
  Json list = Json::array();
  for (const auto& call : calls)
    list.push_back({{"id", call.id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
  return list;
}

// OpenAI's streamed shape: the first delta of a call names it, later ones carry arguments.
Json tool_call_deltas_json(const std::vector<toolcall::ToolCallDelta>& deltas) {
  Json list = Json::array();
  for (const auto& delta : deltas) {
    if (delta.is_first())
      list.push_back({{"index", delta.index},
                      {"id", delta.id},
                      {"type", "function"},
                      {"function", {{"name", delta.name}, {"arguments", delta.arguments}}}});
    else
      list.push_back({{"index", delta.index}, {"function", {{"arguments", delta.arguments}}}});
  }
  return list;
}

// A message's or a delta's thinking, under vLLM's old and new names.
void set_reasoning(Json& message, const std::string& reasoning) {
  const Json value = reasoning.empty() ? Json(nullptr) : Json(reasoning);
  message["reasoning_content"] = value;
  message["reasoning"] = value;
}

// finish_reason "tool_calls" when calls were returned, except for a named
// tool_choice, where OpenAI keeps "stop", and for an output cut short by
// max_tokens, which stays "length" (its last call is partial).
const char* finish_reason_with_calls(FinishReason reason, bool has_tool_calls, const ToolChoice& choice) {
  return has_tool_calls && choice.mode != ToolChoiceMode::kNamed && reason != FinishReason::kLength
             ? "tool_calls"
             : finish_reason_name(reason);
}

}  // namespace

std::string make_response_id(Endpoint endpoint) {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  return fmt::format("{}-{:016x}", endpoint == Endpoint::kChatCompletions ? "chatcmpl" : "cmpl", generator());
}

toolcall::ParsedOutput read_tool_calls(const ToolChoice& choice, const std::string& text, uint64_t id_seed) {
  toolcall::ParsedOutput output =
      choice.mode == ToolChoiceMode::kAuto
          ? toolcall::parse_tool_calls(choice.parser, text, id_seed)
          : toolcall::read_forced_output(choice.mode == ToolChoiceMode::kNamed ? choice.function_name : std::string(),
                                         text, id_seed);
  if (!choice.parallel_tool_calls && output.tool_calls.size() > 1) output.tool_calls.resize(1);
  return output;
}

ToolCallReader::ToolCallReader(const ToolChoice& choice, uint64_t id_seed) : choice_(choice) {
  if (choice.mode == ToolChoiceMode::kAuto) parser_.emplace(choice.parser, id_seed);
  else forced_.emplace(choice.mode == ToolChoiceMode::kNamed ? choice.function_name : std::string(), id_seed);
}

toolcall::StreamDelta ToolCallReader::next(const RequestOutput& output) {
  toolcall::StreamDelta released;
  if (parser_) released = output.finished ? parser_->finish(output.text_delta) : parser_->feed(output.text_delta);
  else released = output.finished ? forced_->finish(output.text_delta) : forced_->feed(output.text_delta);
  if (!choice_.parallel_tool_calls)
    std::erase_if(released.tool_calls, [](const toolcall::ToolCallDelta& delta) { return delta.index > 0; });
  return released;
}

ResponseBuilder::ResponseBuilder(const ParsedRequest& request, const Tokenizer& tokenizer, std::string id,
                                 int64_t created_unix, std::string system_fingerprint)
    : request_(request), tokenizer_(tokenizer), id_(std::move(id)), created_(created_unix),
      system_fingerprint_(std::move(system_fingerprint)),
      text_offsets_(static_cast<size_t>(request.num_choices()), 0),
      echoed_(static_cast<size_t>(request.num_choices()), false) {
  const ToolChoice& choice = request.tool_choice;
  const auto num_choices = static_cast<size_t>(request.num_choices());
  if (request.endpoint == Endpoint::kChatCompletions && request.reasoning.active())
    reasoning_splitters_.assign(num_choices,
                                reasoning::ReasoningSplitter(request.reasoning.kind, request.reasoning.starts_in_answer));
  if (request.endpoint != Endpoint::kChatCompletions || !choice.parses_output()) return;
  tool_call_id_seed_ = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  sent_tool_calls_.assign(num_choices, false);
  for (size_t index = 0; index < num_choices; ++index)
    tool_call_readers_.push_back(std::make_unique<ToolCallReader>(choice, tool_call_id_seed_ + index));
}

std::string ResponseBuilder::echo_text(int32_t index) const {
  if (request_.echo_texts.empty()) return {};
  return request_.echo_texts.at(static_cast<size_t>(index / request_.n));
}

std::string ResponseBuilder::full_body(const std::vector<ChoiceResult>& choices, const Usage& usage) const {
  const bool is_chat = request_.endpoint == Endpoint::kChatCompletions;
  Json list = Json::array();
  for (size_t index = 0; index < choices.size(); ++index) {
    const ChoiceResult& choice = choices[index];
    Json logprobs = nullptr;
    Json item = {{"index", index}};
    if (is_chat) {
      if (request_.logprobs.enabled) logprobs = chat_logprobs(tokenizer_, choice.tokens, request_.logprobs);
      item["message"] = {{"role", "assistant"}, {"content", choice.text}};
      std::string answer = choice.text;
      if (request_.reasoning.active()) {
        reasoning::ReasoningDelta split =
            reasoning::split_reasoning(request_.reasoning.kind, request_.reasoning.starts_in_answer, choice.text);
        answer = std::move(split.content);
        item["message"]["content"] = answer.empty() ? Json(nullptr) : Json(answer);
        set_reasoning(item["message"], split.reasoning);
      }
      if (request_.tool_choice.parses_output()) {
        // A fresh seed per call of full_body is fine: ids need only be unique.
        const toolcall::ParsedOutput parsed = read_tool_calls(request_.tool_choice, answer,
                                                              std::random_device{}() + static_cast<uint64_t>(index));
        // A forced call's JSON is never content, even when max_tokens cut it before a name was written.
        const bool forced = request_.tool_choice.mode != ToolChoiceMode::kAuto;
        if (!parsed.tool_calls.empty() || forced)
          item["message"]["content"] = parsed.content.empty() ? Json(nullptr) : Json(parsed.content);
        if (!parsed.tool_calls.empty()) item["message"]["tool_calls"] = tool_calls_json(parsed.tool_calls);
      }
    } else {
      int64_t offset = 0;
      if (request_.logprobs.enabled)
        logprobs = completion_logprobs(tokenizer_, choice.tokens, request_.logprobs, offset);
      item["text"] = echo_text(static_cast<int32_t>(index)) + choice.text;
    }
    item["logprobs"] = logprobs;
    item["finish_reason"] = is_chat && item["message"].contains("tool_calls")
                                ? finish_reason_with_calls(choice.finish_reason, true, request_.tool_choice)
                                : finish_reason_name(choice.finish_reason);
    list.push_back(std::move(item));
  }
  Json body = head(is_chat ? "chat.completion" : "text_completion");
  body["choices"] = std::move(list);
  body["usage"] = usage_json(usage, is_chat);
  return dump_json(body);
}

Json ResponseBuilder::head(const char* object) const {
  Json fields = {{"id", id_}, {"object", object}, {"created", created_}, {"model", request_.model}};
  if (!system_fingerprint_.empty()) fields["system_fingerprint"] = system_fingerprint_;
  return fields;
}

std::string ResponseBuilder::role_event(int32_t index) const {
  Json choice = {{"index", index},
                 {"delta", {{"role", "assistant"}, {"content", ""}}},
                 {"logprobs", nullptr},
                 {"finish_reason", nullptr}};
  Json chunk = head("chat.completion.chunk");
  chunk["choices"] = Json::array({choice});
  return sse(chunk);
}

std::string ResponseBuilder::delta_event(int32_t index, const RequestOutput& output) {
  if (!reasoning_splitters_.empty()) return reasoning_events(index, output);
  return answer_events(index, output);
}

std::string ResponseBuilder::reasoning_events(int32_t index, const RequestOutput& output) {
  reasoning::ReasoningSplitter& splitter = reasoning_splitters_.at(static_cast<size_t>(index));
  reasoning::ReasoningDelta split = output.finished ? splitter.finish(output.text_delta) : splitter.feed(output.text_delta);
  RequestOutput answer = output;
  answer.text_delta = std::move(split.content);
  std::string events;
  if (!split.reasoning.empty()) {
    Json delta = Json::object();
    set_reasoning(delta, split.reasoning);
    events += chunk(index, std::move(delta),
                    request_.logprobs.enabled ? chat_logprobs(tokenizer_, output.new_tokens, request_.logprobs) : Json(),
                    nullptr);
    answer.new_tokens.clear();  // their logprobs went with the thinking
  }
  if (answer.text_delta.empty() && !answer.finished && (!request_.logprobs.enabled || answer.new_tokens.empty()))
    return events;
  return events + answer_events(index, answer);
}

std::string ResponseBuilder::answer_events(int32_t index, const RequestOutput& output) {
  const bool is_chat = request_.endpoint == Endpoint::kChatCompletions;
  if (is_chat && !sent_tool_calls_.empty()) return tool_call_events(index, output);
  Json choice = {{"index", index}};
  Json logprobs = nullptr;
  const char* finish_reason = output.finished ? finish_reason_name(output.finish_reason) : nullptr;
  if (is_chat) {
    choice["delta"] = output.text_delta.empty() && output.finished ? Json::object()
                                                                    : Json{{"content", output.text_delta}};
    if (request_.logprobs.enabled) logprobs = chat_logprobs(tokenizer_, output.new_tokens, request_.logprobs);
  } else {
    const size_t slot = static_cast<size_t>(index);
    choice["text"] = echoed_.at(slot) ? output.text_delta : echo_text(index) + output.text_delta;
    echoed_[slot] = true;
    if (request_.logprobs.enabled)
      logprobs = completion_logprobs(tokenizer_, output.new_tokens, request_.logprobs,
                                     text_offsets_.at(static_cast<size_t>(index)));
  }
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish_reason ? Json(finish_reason) : Json(nullptr);
  Json body = head(is_chat ? "chat.completion.chunk" : "text_completion");
  body["choices"] = Json::array({choice});
  if (request_.include_usage) body["usage"] = nullptr;
  return sse(body);
}

std::string ResponseBuilder::chunk(int32_t index, Json delta, Json logprobs, const char* finish_reason) const {
  Json choice = {{"index", index},
                 {"delta", std::move(delta)},
                 {"logprobs", std::move(logprobs)},
                 {"finish_reason", finish_reason ? Json(finish_reason) : Json(nullptr)}};
  Json body = head("chat.completion.chunk");
  body["choices"] = Json::array({std::move(choice)});
  if (request_.include_usage) body["usage"] = nullptr;
  return sse(body);
}

// OpenAI's order: content, then per call delta one chunk (a call's first delta
// never carries arguments), then the finish alone.
std::string ResponseBuilder::tool_call_events(int32_t index, const RequestOutput& output) {
  const auto slot = static_cast<size_t>(index);
  toolcall::StreamDelta released = tool_call_readers_.at(slot)->next(output);
  Json logprobs = request_.logprobs.enabled ? chat_logprobs(tokenizer_, output.new_tokens, request_.logprobs) : Json();
  std::string events;
  if (!released.content.empty() || (released.empty() && !logprobs.is_null())) {
    events += chunk(index, released.content.empty() ? Json::object() : Json{{"content", released.content}}, logprobs,
                    nullptr);
    logprobs = nullptr;
  }
  for (const toolcall::ToolCallDelta& delta : released.tool_calls) {
    events += chunk(index, {{"tool_calls", tool_call_deltas_json({delta})}}, logprobs, nullptr);
    logprobs = nullptr;
    sent_tool_calls_[slot] = true;
  }
  if (output.finished)
    events += chunk(index, Json::object(), logprobs,
                    finish_reason_with_calls(output.finish_reason, sent_tool_calls_[slot], request_.tool_choice));
  return events;
}

std::string ResponseBuilder::usage_event(const Usage& usage) const {
  const bool is_chat = request_.endpoint == Endpoint::kChatCompletions;
  Json chunk = head(is_chat ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = Json::array();
  chunk["usage"] = usage_json(usage, is_chat);
  return sse(chunk);
}

std::string ResponseBuilder::error_event(const std::string& body_json) { return "data: " + body_json + "\n\n"; }

}  // namespace loom::server
