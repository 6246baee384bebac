#include "server/completion_handler.h"

#include <chrono>
#include <memory>

#include <spdlog/spdlog.h>

#include "server/api_error.h"
#include "server/generation.h"
#include "server/openai_response.h"

namespace loom::server {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A stream silent this long gets an SSE comment, so a vanished client is noticed.
constexpr auto kKeepAliveInterval = std::chrono::seconds(2);

HttpResponse respond_whole(const CompletionContext& context, Generation& generation, const HttpRequest& request) {
  if (!wait_for_generation(generation, *context.ending_requests, request, context.log_requests)) {
    HttpResponse response;
    response.abandon = true;
    return response;
  }
  HttpResponse response;
  response.body = generation.builder->full_body(generation.results, generation.usage());
  return response;
}

// Writes every event of the stream, then [DONE]; stops early when the client leaves.
void write_stream(const CompletionContext& context, Generation& generation, ResponseSink& sink) {
  auto write = [&](const std::string& event) { return sink.write(event); };
  auto client_left = [&] {
    spdlog::debug("client left stream {}: cancelling", generation.builder->id());
    generation.cancel_all();
    log_finished(context.log_requests, generation, "cancelled");
  };
  const bool is_chat = generation.request.endpoint == Endpoint::kChatCompletions;
  if (is_chat)
    for (int32_t index = 0; index < generation.request.num_choices(); ++index)
      if (!write(generation.builder->role_event(index))) return client_left();

  auto last_write = Clock::now();
  while (generation.num_unfinished > 0) {
    auto outputs = generation.poll(milliseconds(100));
    for (auto& [index, output] : outputs) {
      generation.record(index, output);
      const std::string event = output.error
                                    ? ResponseBuilder::error_event(api_error_from(*output.error).body())
                                    : generation.builder->delta_event(index, output);
      if (event.empty()) continue;  // held back (a tool call in the making)
      if (!write(event)) return client_left();
      last_write = Clock::now();
    }
    if (outputs.empty() && sink.client_gone()) return client_left();
    if (outputs.empty() && Clock::now() - last_write > kKeepAliveInterval) {
      if (!write(": keep-alive\n\n")) return client_left();
      last_write = Clock::now();
    }
    if (context.ending_requests->load()) {
      generation.cancel_all();
      write(ResponseBuilder::error_event(shutting_down_error().body()));
      write(ResponseBuilder::done_event());
      log_finished(context.log_requests, generation, "503");
      return;
    }
  }
  if (generation.request.include_usage && !write(generation.builder->usage_event(generation.usage())))
    return client_left();
  write(ResponseBuilder::done_event());
  log_finished(context.log_requests, generation, generation.error ? "200 (stream error)" : "200");
}

}  // namespace

HttpResponse handle_completion(Endpoint endpoint, const CompletionContext& context, const HttpRequest& request) {
  if (left_before_handling(request, context.log_requests)) {
    HttpResponse abandoned;
    abandoned.abandon = true;
    return abandoned;
  }
  ParsedRequest parsed = parse_openai_request(endpoint, request.body, context.parse);
  apply_device_kv_fields(request, context.device_kv, parsed);
  const bool stream = parsed.stream;
  const std::string unenforced = note_unenforced_keywords(parsed.unenforced_schema_keywords);
  std::shared_ptr<Generation> generation = submit_generation(*context.engine, *context.tokenizer, std::move(parsed),
                                                             make_response_id(endpoint), context.system_fingerprint);
  HttpResponse response;
  if (!stream) response = respond_whole(context, *generation, request);
  if (!unenforced.empty()) response.headers.emplace_back(kSchemaUnenforcedHeader, unenforced);
  if (!stream) return response;
  response.content_type = "text/event-stream";
  response.headers.emplace_back("Cache-Control", "no-cache");
  response.stream = [context, generation](ResponseSink& sink) { write_stream(context, *generation, sink); };
  return response;
}

}  // namespace loom::server
