// POST /v1/completions and /v1/chat/completions: parse -> submit one engine
// request per choice -> a whole JSON body, or an SSE stream that ends with
// "data: [DONE]". A client that disconnects mid-stream cancels its requests.
//
// Runs on HTTP worker threads; the engine is shared, everything else is per call.
#pragma once

#include <atomic>

#include <httplib.h>

#include "engine/engine.h"
#include "server/openai_request.h"

namespace loom::server {

struct CompletionContext {
  Engine* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;
  ParseContext parse;
  const std::atomic<bool>* stopping = nullptr;  // set on shutdown
};

// Fills `response` (status, body or chunked provider). Throws ApiError for a
// request that cannot start; errors after streaming began go into the stream.
void handle_completion(Endpoint endpoint, const CompletionContext& context, const httplib::Request& request,
                       httplib::Response& response);

}  // namespace loom::server
