// A /v1/responses body read and turned into the /v1/chat/completions body it
// is served as (the chat path then renders, constrains and samples it; see
// server/responses_handler.h). Pure functions; HTTP handler threads.
//
//   input                 a string (one user message) or a list of items:
//                           {type?: "message", role: user|system|developer|assistant,
//                            content: string | [{type: input_text|output_text|text, text}, ...]}
//                           {type: "function_call", call_id, name, arguments}
//                           {type: "function_call_output", call_id, output: string | [text parts]}
//                           {type: "reasoning", ...}   accepted, not rendered
//   instructions          a system message before everything (not carried to the next turn, as OpenAI)
//   previous_response_id  the stored conversation goes before `input` (the caller looks it up)
//   tools                 [{type: "function", name, description?, parameters?, strict?}]
//   tool_choice           "none" | "auto" | "required" | {type: "function", name}
//   text.format           {type: "text"} | {type: "json_object"} | {type: "json_schema", name?, schema, strict?}
//   max_output_tokens     chat's max_completion_tokens
//   passed on as sent     model, temperature, top_p, parallel_tool_calls and vLLM's extras (seed, top_k,
//                         min_p, penalties, stop, logit_bias, structured_outputs, chat_template_kwargs, ...),
//                         Loom's workflow hints (workflow, agent, fixed_prefix_tokens)
//   refused (400)         background: true, prompt, conversation, top_logprobs > 0, truncation other than
//                         "disabled", max_tool_calls, hosted tools, image / file / audio content, other item types
//   accepted, ignored     include, reasoning, metadata (echoed), user, service_tier, prompt_cache_key,
//                         safety_identifier, stream_options
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace loom::server {

struct ResponsesRequest {
  nlohmann::ordered_json body;         // as sent, key order kept (schemas keep their member order)
  nlohmann::ordered_json input_items;  // `input` as items: a string becomes one user message item
  std::string previous_response_id;    // "" = none
  bool store = true;                   // OpenAI's default
  bool stream = false;
};

// Throws ApiError(400) naming the field (input[2].call_id, text.format.type, ...).
ResponsesRequest parse_responses_request(std::string_view body_text);

// The chat-completions body: `instructions` as a system message, then
// `history` (the previous response's conversation: items), then the input
// items, as chat messages; the other fields mapped as the table above says.
nlohmann::ordered_json to_chat_body(const ResponsesRequest& request, const nlohmann::ordered_json& history);

// Chat messages of Responses items (checked by parse_responses_request, or our
// own output items): consecutive function_call items join one assistant
// message's tool_calls (the assistant message just before, if any);
// function_call_output becomes a tool message (named when its call is known).
nlohmann::ordered_json items_to_messages(const nlohmann::ordered_json& items);

}  // namespace loom::server
