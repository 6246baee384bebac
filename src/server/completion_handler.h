// POST /v1/completions and /v1/chat/completions: parse -> submit one engine
// request per choice -> a whole JSON body, or an SSE stream that ends with
// "data: [DONE]". A client that disconnects cancels its requests within one
// poll (100 ms), streamed or whole; one that left while its request waited for a
// handler thread gets nothing submitted.
//
// Runs on HTTP handler threads; the engine is shared, everything else is per call.
#pragma once

#include <atomic>
#include <string>

#include "engine/engine.h"
#include "server/device_kv_fields.h"
#include "server/generation.h"  // kSchemaUnenforcedHeader
#include "server/http_types.h"
#include "server/openai_request.h"

namespace loom::server {

struct CompletionContext {
  Engine* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;
  ParseContext parse;
  // Set when requests in flight must end now (shutdown timeout passed): they
  // are cancelled and answered 503, or get an SSE error event then [DONE].
  const std::atomic<bool>* ending_requests = nullptr;
  // OpenAI's system_fingerprint of every response ("" = none): the build and model served.
  std::string system_fingerprint;
  bool log_requests = true;  // a log line per finished request (ServerConfig::log_requests)
  // Who may name device-to-device KV transfers in a body (server/device_kv_fields.h).
  DeviceKvFieldsPolicy device_kv;
};

// The response: a whole body, or a stream. Throws ApiError for a request that
// cannot start; errors after streaming began go into the stream.
HttpResponse handle_completion(Endpoint endpoint, const CompletionContext& context, const HttpRequest& request);

}  // namespace loom::server
