// /v1/responses (OpenAI's Responses API as vLLM serves it): POST creates a
// response, GET /v1/responses/{id} returns a stored one, DELETE removes it.
//
// A POST is served as a chat completion: its body becomes the chat body of
// server/responses_request.h (the previous response's conversation, from the
// store, before the input), which parse_openai_request reads as any chat
// request (template, tools, tool_choice, structured output, adapters by
// `model`, workflow hints); one choice is generated (server/generation.h) and
// its output becomes Responses items (server/responses_output.h), whole or
// streamed. With `store` (the default) the response and its conversation are
// kept in the bounded ResponseStore; an unknown, expired, evicted or deleted
// id is a 404 (code previous_response_not_found for previous_response_id,
// not_found on the GET / DELETE route).
//
// Errors of the chat parse name the Responses field where one maps
// (max_completion_tokens -> max_output_tokens, response_format -> text.format,
// messages -> input). HTTP handler threads.
#pragma once

#include <string>

#include "server/completion_handler.h"
#include "server/http_types.h"
#include "server/response_store.h"

namespace loom::server {

struct ResponsesContext {
  const CompletionContext* completion = nullptr;  // engine, parse context, shutdown flag, logging
  ResponseStore* store = nullptr;
};

HttpResponse handle_create_response(const ResponsesContext& context, const HttpRequest& request);
// GET /v1/responses/{id}: the stored response body. Throws ApiError(404).
HttpResponse handle_get_response(const ResponsesContext& context, const std::string& id);
// DELETE /v1/responses/{id}: {"id", "object": "response", "deleted": true}. Throws ApiError(404).
HttpResponse handle_delete_response(const ResponsesContext& context, const std::string& id);

}  // namespace loom::server
