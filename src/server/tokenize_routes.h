// vLLM's tokenizer routes, on HTTP handler threads (pure functions of the
// request and the ParseContext's tokenizer, chat renderer and model names):
//
//   POST /tokenize    {"prompt": "text", "add_special_tokens": true}
//                  or {"messages": [...], "add_generation_prompt": true, "continue_final_message": false,
//                      "add_special_tokens": false, "chat_template", "chat_template_kwargs", "tools", "documents"}
//                     (+ "model", "return_token_strs": false)
//                  -> {"count": N, "max_model_len": M, "tokens": [...], "token_strs": [...] | null}
//   POST /detokenize  {"tokens": [...]} (+ "model") -> {"prompt": "text"}
//
// The chat form renders exactly as /v1/chat/completions does (chat_request.h).
// `model`, when given, must name the base model or a loaded adapter (404
// model_not_found, as the completion routes). Bad fields are ApiError(400)
// naming them.
#pragma once

#include <string>
#include <string_view>

#include "server/openai_request.h"

namespace loom::server {

std::string tokenize_body(const ParseContext& context, std::string_view body);
std::string detokenize_body(const ParseContext& context, std::string_view body);

}  // namespace loom::server
