// The prompt of a /v1/chat/completions request: its chat fields validated
// (400 naming the field) and rendered by the chat template (chat/chat_renderer.h),
// as vLLM's OpenAI server does. Called by parse_openai_request on HTTP worker
// threads; pure apart from the renderer's template cache.
//
// Fields read:
//   messages                [{role: system|developer|user|assistant|tool, content, ...}, ...] (non-empty);
//                           content: a string, a list of {"type": "text", "text"} parts, or null;
//                           assistant tool_calls: [{id?, type: "function", function: {name, arguments}}],
//                           arguments a JSON string (parsed into an object for the template) or an object;
//                           tool: tool_call_id (string), content; name (string) on any message.
//                           Other fields are passed to the template as sent.
//   tools                   [{type: "function", function: {name, description?, parameters?}}, ...]
//   documents               [object, ...] (RAG templates)
//   chat_template           a Jinja template replacing the model's for this request
//   chat_template_kwargs    {name: value}: extra template variables (e.g. enable_thinking)
//   add_generation_prompt   default true
//   continue_final_message  default false; needs a final assistant message and add_generation_prompt false
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat_renderer.h"
#include "tokenizer/tokenizer.h"

namespace loom::server {

struct ChatPrompt {
  std::vector<TokenId> tokens;  // the rendered prompt, tokenized without added special tokens
  nlohmann::json tools;         // the validated `tools` list; empty when none
  std::string tail;             // the rendered prompt's last bytes (where a think block may close)
  bool enable_thinking = true;  // chat_template_kwargs.enable_thinking (a boolean), else true
};

// `body_text` is the request body, already accepted by parse_json_object_body
// (it is read again keeping key order, which tojson in templates preserves).
// Throws ApiError(400): a bad field (param = its path), or a template error
// (param "chat_template"; the message names the template line).
ChatPrompt read_chat_prompt(std::string_view body_text, const Tokenizer& tokenizer, const ChatRenderer& renderer);

}  // namespace loom::server
