#include "server/openai_response.h"

#include <algorithm>
#include <cmath>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "server/json_output.h"

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

std::string token_string(const Tokenizer& tokenizer, TokenId id) { return tokenizer.decode({id}, false); }

// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}
Json chat_logprobs(const Tokenizer& tokenizer, const std::vector<SampledToken>& tokens, int32_t num_top) {
  Json content = Json::array();
  for (const auto& sampled : tokens) {
    Json top = Json::array();
    for (const auto& [id, logprob] : sampled.top_logprobs) {
      if (static_cast<int32_t>(top.size()) >= num_top) break;
      top.push_back({{"token", token_string(tokenizer, id)},
                     {"logprob", finite_logprob(logprob)},
                     {"bytes", token_bytes_json(tokenizer, id)}});
    }
    content.push_back({{"token", token_string(tokenizer, sampled.token_id)},
                       {"logprob", finite_logprob(sampled.logprob)},
                       {"bytes", token_bytes_json(tokenizer, sampled.token_id)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

// Completions: {"tokens", "token_logprobs", "top_logprobs": [{text: logprob}], "text_offset"}.
// The sampled token is among each position's alternatives, as vLLM reports it.
Json completion_logprobs(const Tokenizer& tokenizer, const std::vector<SampledToken>& tokens, int32_t num_top,
                         int64_t& text_offset) {
  Json strings = Json::array(), logprobs = Json::array(), tops = Json::array(), offsets = Json::array();
  for (const auto& sampled : tokens) {
    const std::string text = token_string(tokenizer, sampled.token_id);
    strings.push_back(text);
    logprobs.push_back(finite_logprob(sampled.logprob));
    offsets.push_back(text_offset);
    text_offset += static_cast<int64_t>(text.size());
    Json top = Json::object();
    int32_t num_added = 0;
    for (const auto& [id, logprob] : sampled.top_logprobs) {
      if (num_added++ >= num_top) break;
      top.emplace(token_string(tokenizer, id), finite_logprob(logprob));
    }
    top.emplace(text, finite_logprob(sampled.logprob));  // no-op when already present
    tops.push_back(num_top > 0 ? top : Json(nullptr));
  }
  return {{"tokens", strings}, {"token_logprobs", logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

Json usage_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

}  // namespace

std::string make_response_id(Endpoint endpoint) {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  return fmt::format("{}-{:016x}", endpoint == Endpoint::kChatCompletions ? "chatcmpl" : "cmpl", generator());
}

ResponseBuilder::ResponseBuilder(const ParsedRequest& request, const Tokenizer& tokenizer, std::string id,
                                 int64_t created_unix)
    : request_(request), tokenizer_(tokenizer), id_(std::move(id)), created_(created_unix),
      text_offsets_(static_cast<size_t>(request.num_choices()), 0),
      echoed_(static_cast<size_t>(request.num_choices()), false) {}

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
      if (request_.logprobs.enabled) logprobs = chat_logprobs(tokenizer_, choice.tokens, request_.logprobs.num_top);
      item["message"] = {{"role", "assistant"}, {"content", choice.text}};
    } else {
      int64_t offset = 0;
      if (request_.logprobs.enabled)
        logprobs = completion_logprobs(tokenizer_, choice.tokens, request_.logprobs.num_top, offset);
      item["text"] = echo_text(static_cast<int32_t>(index)) + choice.text;
    }
    item["logprobs"] = logprobs;
    item["finish_reason"] = finish_reason_name(choice.finish_reason);
    list.push_back(std::move(item));
  }
  Json body = {{"id", id_},
               {"object", is_chat ? "chat.completion" : "text_completion"},
               {"created", created_},
               {"model", request_.model},
               {"choices", list},
               {"usage", usage_json(usage)}};
  return dump_json(body);
}

std::string ResponseBuilder::role_event(int32_t index) const {
  Json choice = {{"index", index},
                 {"delta", {{"role", "assistant"}, {"content", ""}}},
                 {"logprobs", nullptr},
                 {"finish_reason", nullptr}};
  return sse({{"id", id_},
              {"object", "chat.completion.chunk"},
              {"created", created_},
              {"model", request_.model},
              {"choices", Json::array({choice})}});
}

std::string ResponseBuilder::delta_event(int32_t index, const RequestOutput& output) {
  const bool is_chat = request_.endpoint == Endpoint::kChatCompletions;
  Json choice = {{"index", index}};
  Json logprobs = nullptr;
  if (is_chat) {
    choice["delta"] = output.text_delta.empty() && output.finished ? Json::object()
                                                                    : Json{{"content", output.text_delta}};
    if (request_.logprobs.enabled) logprobs = chat_logprobs(tokenizer_, output.new_tokens, request_.logprobs.num_top);
  } else {
    const size_t slot = static_cast<size_t>(index);
    choice["text"] = echoed_.at(slot) ? output.text_delta : echo_text(index) + output.text_delta;
    echoed_[slot] = true;
    if (request_.logprobs.enabled)
      logprobs = completion_logprobs(tokenizer_, output.new_tokens, request_.logprobs.num_top,
                                     text_offsets_.at(static_cast<size_t>(index)));
  }
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = output.finished ? Json(finish_reason_name(output.finish_reason)) : Json(nullptr);
  Json chunk = {{"id", id_},
                {"object", is_chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created_},
                {"model", request_.model},
                {"choices", Json::array({choice})}};
  if (request_.include_usage) chunk["usage"] = nullptr;
  return sse(chunk);
}

std::string ResponseBuilder::usage_event(const Usage& usage) const {
  const bool is_chat = request_.endpoint == Endpoint::kChatCompletions;
  return sse({{"id", id_},
              {"object", is_chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created_},
              {"model", request_.model},
              {"choices", Json::array()},
              {"usage", usage_json(usage)}});
}

std::string ResponseBuilder::error_event(const std::string& body_json) { return "data: " + body_json + "\n\n"; }

}  // namespace loom::server
