// One HTTP request's engine streams and what they produced, shared by the
// completions handler (server/completion_handler.h) and the Responses handler
// (server/responses_handler.h): submit one engine request per choice, poll
// their outputs, record them per choice, cancel them all. Shared between a
// handler and its chunked content provider, which outlives the handler call.
//
// Runs on HTTP handler threads; one Generation per request, not thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "server/api_error.h"
#include "server/http_types.h"
#include "server/openai_request.h"
#include "server/openai_response.h"

namespace loom::server {

// Names, comma-separated, the JSON-schema keywords of the request's schema that
// the output may not satisfy (served without "strict": true; see
// structured_output_request.h). Absent when every keyword is enforced.
inline constexpr const char* kSchemaUnenforcedHeader = "x-loom-schema-unenforced";

struct Generation {
  using Clock = std::chrono::steady_clock;

  ParsedRequest request;
  std::unique_ptr<ResponseBuilder> builder;
  std::vector<std::unique_ptr<RequestStream>> streams;  // one per choice
  std::vector<ChoiceResult> results;
  std::optional<Error> error;  // the first failure reported by a stream
  int32_t num_unfinished = 0;
  Clock::time_point started = Clock::now();
  std::optional<Clock::time_point> first_token_at;
  // With a reasoning parser: per choice, the text so far split, to count the thinking's tokens.
  std::vector<reasoning::ReasoningSplitter> reasoning_trackers;

  ~Generation() { cancel_all(); }  // no-op for finished streams

  Usage usage() const;
  // Adds `output` to choice `index`'s result (its tokens count as reasoning while the choice's
  // text has not left the thinking before it).
  void record(int32_t index, const RequestOutput& output);
  // Waits up to `timeout` for outputs of unfinished choices; returns (choice, output) pairs.
  std::vector<std::pair<int32_t, RequestOutput>> poll(std::chrono::milliseconds timeout);
  void cancel_all();
};

// Submits every choice of `parsed` (one engine request each); `id` names the
// response (its builder's id, the log line's). All or none are queued
// (Engine::submit_all): throws ApiError when any is refused, leaving nothing queued.
std::shared_ptr<Generation> submit_generation(Engine& engine, const Tokenizer& tokenizer, ParsedRequest parsed,
                                              std::string id, const std::string& system_fingerprint);

// True (and logged) when the client left while its request waited for a handler
// thread: the caller, checking first, neither parses nor submits it and answers
// with HttpResponse::abandon, so a queue of abandoned requests costs no prefill.
bool left_before_handling(const HttpRequest& request, bool log_requests);

// Waits until every choice finished (whole bodies) and logs the request.
// Returns false when the client left first (its requests cancelled). Throws
// shutting_down_error() once `ending` is set, and the ApiError of an engine failure.
bool wait_for_generation(Generation& generation, const std::atomic<bool>& ending, const HttpRequest& request,
                         bool log_requests);

// One log line per finished request (vLLM logs each request too); nothing when `enabled` is false.
void log_finished(bool enabled, const Generation& generation, std::string_view status);

// The 503 of a request ended by the shutdown timeout.
ApiError shutting_down_error();

// Each keyword is logged once per process (a client sending one schema with
// every request must not flood the log); returns them comma-separated ("" for none).
std::string note_unenforced_keywords(const std::vector<std::string>& keywords);

}  // namespace loom::server
